"""Launch a Triton kernel through its compiled handle once Triton has compiled it.

Triton's ``kernel[grid](...)`` binds and specialises every argument in Python on every
launch: about 40 us for the ATMM kernels' 25-30 arguments (H200, Triton 3.6), which is
more than the kernels themselves take in a prefill forward of a 7B model, where every
LoRA-wrapped module launches two of them per layer (``docs/perf.md``). A
:class:`FastLauncher` goes through Triton's own launch once per specialisation, keeps the
compiled kernel it returns, and launches that kernel directly afterwards.

The cache key is at least as fine as Triton's specialisation: per tensor its dtype and
whether its address is 16-byte aligned; per integer whether it is 1, whether it is a
multiple of 16 and which integer type holds it; the constexpr values, warps and stages,
and the device. Two launches with the same key would get the same compiled kernel from
Triton, so skipping its binder changes nothing but host time. Under ``TRITON_INTERPRET=1``
Triton's launch returns no compiled kernel and every launch takes Triton's path.
"""

from __future__ import annotations

import inspect
from typing import Any

import torch
import triton

_INT32 = range(-(2**31), 2**31)


def _arg_key(arg: Any) -> Any:
    if isinstance(arg, torch.Tensor):
        return arg.dtype, arg.data_ptr() % 16 == 0
    if isinstance(arg, bool):
        return bool, arg
    if isinstance(arg, int):
        return arg == 1, arg % 16 == 0, arg in _INT32, arg >= 2**63
    if isinstance(arg, float):
        return float
    raise TypeError(f"FastLauncher cannot key an argument of type {type(arg).__name__}")


class FastLauncher:
    """``launcher(grid, args, constexprs, num_warps, num_stages)`` runs ``fn`` like
    ``fn[grid](*args, **constexprs, num_warps=..., num_stages=...)``.

    ``args`` are the kernel's runtime arguments in order; ``constexprs`` its
    ``tl.constexpr`` parameters, which must all come after the runtime ones (checked)."""

    def __init__(self, fn: triton.runtime.KernelInterface):
        self.fn = fn
        params = list(inspect.signature(fn.fn).parameters.values())
        is_constexpr = ["constexpr" in str(p.annotation) for p in params]
        self.constexpr_names = tuple(p.name for p, c in zip(params, is_constexpr, strict=True) if c)
        self.num_runtime = len(params) - len(self.constexpr_names)
        if any(is_constexpr[: self.num_runtime]):
            raise ValueError(f"{fn.__name__}: constexpr parameters must come last")
        self._compiled: dict[tuple, Any] = {}

    def __call__(
        self, grid: tuple[int, ...], args: tuple, constexprs: dict[str, Any], num_warps: int, num_stages: int
    ) -> None:
        if len(args) != self.num_runtime or tuple(constexprs) != self.constexpr_names:
            raise TypeError(
                f"{self.fn.__name__} takes {self.num_runtime} runtime arguments then {self.constexpr_names}"
            )
        values = tuple(constexprs.values())
        device = args[0].get_device()
        key = (device, num_warps, num_stages, values, *map(_arg_key, args))
        compiled = self._compiled.get(key)
        if compiled is not None:
            compiled[(*grid, 1, 1)[:3]](*args, *values)
            return
        compiled = self.fn[grid](*args, **constexprs, num_warps=num_warps, num_stages=num_stages)
        if isinstance(compiled, triton.compiler.CompiledKernel):
            self._compiled[key] = compiled

    def compiled_count(self) -> int:
        """How many specialisations launch without Triton's binder (for tests)."""
        return len(self._compiled)
