"""Launch a Triton kernel through its compiled handle once Triton has compiled it.

Triton's ``kernel[grid](...)`` binds and specialises every argument in Python on every
launch: about 40 us for the ATMM kernels' 25-30 arguments (H200, Triton 3.6), which is
more than the kernels themselves take in a prefill forward of a 7B model, where every
LoRA-wrapped module launches two of them per layer (``docs/perf.md``). A
:class:`FastLauncher` goes through Triton's own launch once per specialisation, keeps the
compiled kernel it returns, and launches that kernel directly afterwards.

The cache key is at least as fine as Triton's specialisation: per tensor its dtype and
whether its address is 16-byte aligned; per tensor descriptor (TMA) its dtype and block
shape; per integer whether it is 1, whether it is a multiple of 16 and which integer type
holds it; the constexpr values, warps and stages, and the device. A descriptor still goes
to the compiled kernel as the object, which encodes it at each launch as Triton's does.
Two launches with the same key would get the same compiled kernel from Triton, so skipping
its binder changes nothing but host time. Under ``TRITON_INTERPRET=1``
Triton's launch returns no compiled kernel and every launch takes Triton's path.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from typing import Any

import torch
import triton
from triton.tools.tensor_descriptor import TensorDescriptor

from sglang_vlora.atmm import driver_launch
from sglang_vlora.atmm.launch_compiles import launch_counting_compiles
from sglang_vlora.config import DIRECT_LAUNCH_ENV, direct_launch_setting

logger = logging.getLogger(__name__)

_INT32 = range(-(2**31), 2**31)


def _arg_key(arg: Any) -> Any:
    if isinstance(arg, torch.Tensor):
        return arg.dtype, arg.data_ptr() % 16 == 0
    if isinstance(arg, TensorDescriptor):
        return TensorDescriptor, arg.base.dtype, tuple(arg.block_shape)
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
        # per compiled kernel (by id; they stay in _compiled): its driver_launch layout, or why none
        self._layouts: dict[int, driver_launch.KernelLayout | str] = {}
        self.direct = direct_launch_setting()

    def check(self, args: tuple, constexprs: dict[str, Any]) -> None:
        if len(args) != self.num_runtime or tuple(constexprs) != self.constexpr_names:
            raise TypeError(
                f"{self.fn.__name__} takes {self.num_runtime} runtime arguments then {self.constexpr_names}"
            )

    def __call__(
        self, grid: tuple[int, ...], args: tuple, constexprs: dict[str, Any], num_warps: int, num_stages: int
    ) -> None:
        self.check(args, constexprs)
        values = tuple(constexprs.values())
        key = (_device(args[0]), num_warps, num_stages, values, *map(_arg_key, args))
        compiled = self._compiled.get(key)
        if compiled is not None:
            compiled[(*grid, 1, 1)[:3]](*args, *values)
            return
        compiled = launch_counting_compiles(
            self.fn, lambda: self.fn[grid](*args, **constexprs, num_warps=num_warps, num_stages=num_stages,
                                           **launch_options(constexprs)),
            constexprs, num_warps, num_stages)
        if isinstance(compiled, triton.compiler.CompiledKernel):
            self._compiled[key] = compiled

    def compiled_count(self) -> int:
        """How many specialisations launch without Triton's binder (for tests)."""
        return len(self._compiled)

    def runner(self, compiled: Any, grid: tuple[int, ...], args: tuple, lead: int) -> Callable[..., None]:
        """``run(*pointers, stream=handle)``: ``compiled`` over ``grid`` with ``args`` (runtime
        then constexpr values; tensors as addresses after the first ``lead``), the first
        ``lead`` replaced by ``pointers``; through the driver where the kernel allows it
        (:mod:`sglang_vlora.atmm.driver_launch`), else through Triton's launcher."""
        layout = self._layouts.get(id(compiled))
        if layout is None:
            layout = self._layouts[id(compiled)] = self._layout(compiled)
        if isinstance(layout, driver_launch.KernelLayout):
            return driver_launch.DirectLaunch(layout, grid, args, lead, driver_launch.cu_launch_kernel())
        handle, rest = compiled[(*grid, 1, 1)[:3]], args[lead:]
        return lambda *pointers, stream: handle(*pointers, *rest, stream=stream)

    def _layout(self, compiled: Any) -> driver_launch.KernelLayout | str:
        if not self.direct:
            return f"{DIRECT_LAUNCH_ENV}=0"
        try:
            driver_launch.cu_launch_kernel()
            layout = driver_launch.kernel_layout(compiled)
        except OSError as exc:
            layout = f"no CUDA driver library ({exc})"
        if isinstance(layout, str):
            logger.info("%s launches through Triton's launcher, not the driver: %s", self.fn.__name__, layout)
        return layout

    def use_direct(self, on: bool) -> None:
        """Turn direct launches on or off for launches prepared from now on (benchmarks
        compare both ways in one process)."""
        self.direct = on
        self._layouts.clear()

    def direct_count(self) -> int:
        """How many compiled specialisations launch straight through the driver (for tests)."""
        return sum(isinstance(v, driver_launch.KernelLayout) for v in self._layouts.values())


class PreparedLaunch:
    """One launch of a :class:`FastLauncher` kernel whose arguments after the first
    ``lead`` ones are fixed: a batch's LoRA launches for the layers of one module shape
    differ only in their activations, weights and outputs. ``prepared(*lead)`` launches
    with new leading tensors (same shapes and strides as the ones it was prepared with;
    the caller's plan key makes sure) and keys only those.

    Once compiled, every tensor goes to the kernel as its device address, and the launch
    goes through :meth:`FastLauncher.runner`: straight to the driver with the parameters
    packed once, or Triton's compiled handle given addresses (its launcher otherwise asks
    each tensor for ``data_ptr()`` and the driver for the pointer's attributes, on every
    launch, for every one of the kernels' 11-12 tensor arguments; ``bench/layer_cost.py``'s
    ``host_cost`` measures each way). The fixed tensors stay referenced here, so their
    addresses stay theirs. The launch goes to the current stream, read without Triton's
    device and stream look-ups."""

    def __init__(
        self,
        launcher: FastLauncher,
        grid: tuple[int, ...],
        args: tuple,
        constexprs: dict[str, Any],
        num_warps: int,
        num_stages: int,
        lead: int,
    ):
        launcher.check(args, constexprs)
        self.launcher, self.grid, self.lead = launcher, grid, lead
        self.constexprs, self.num_warps, self.num_stages = constexprs, num_warps, num_stages
        self.tail = args[lead:]
        values = tuple(constexprs.values())
        self._device = args[0].get_device()
        self._head = (self._device, num_warps, num_stages, values)
        self._tail_key = tuple(map(_arg_key, self.tail))
        addresses = tuple(a.data_ptr() if isinstance(a, torch.Tensor) else a for a in self.tail)
        self._rest = (*addresses, *values)
        self._runners: dict[tuple, Any] = {}

    def __call__(self, *lead: torch.Tensor) -> None:
        pointers = [t.data_ptr() for t in lead]
        lead_key = tuple((t.dtype, p % 16 == 0) for t, p in zip(lead, pointers, strict=True))
        runner = self._runners.get(lead_key)
        if runner is not None:
            runner(*pointers, stream=_current_stream(self._device))
            return
        launcher = self.launcher
        compiled = launcher._compiled.get((*self._head, *lead_key, *self._tail_key))
        if compiled is not None:  # compiled before (an earlier batch's plan): no Triton launch needed
            runner = self._runners[lead_key] = launcher.runner(compiled, self.grid, (*lead, *self._rest), self.lead)
            runner(*pointers, stream=_current_stream(self._device))
            return
        launcher(self.grid, (*lead, *self.tail), self.constexprs, self.num_warps, self.num_stages)
        compiled = launcher._compiled.get((*self._head, *lead_key, *self._tail_key))
        if compiled is not None:
            self._runners[lead_key] = launcher.runner(compiled, self.grid, (*lead, *self._rest), self.lead)

    def at(self, addresses: tuple[int, ...], dtypes: tuple[torch.dtype, ...]) -> bool:
        """Launch with the leading tensors given as device addresses (and their dtypes) where a
        call with tensors of these dtypes and alignments has run before; False (nothing
        launched) where none has: the caller then calls with tensors. Views cost host time
        to make (a few us each); an address into a tensor is one addition."""
        runner = self._runners.get(tuple((d, p % 16 == 0) for d, p in zip(dtypes, addresses, strict=True)))
        if runner is None:
            return False
        runner(*addresses, stream=_current_stream(self._device))
        return True


def launch_options(constexprs: dict[str, Any]) -> dict[str, Any]:
    """Triton launch options a kernel's constexprs ask for: a true ``USE_PDL`` compiles and
    launches it with programmatic dependent launch (``launch_pdl``, part of Triton's compile
    options, so the compiled kernel carries it and its launcher sets the launch attribute)."""
    return {"launch_pdl": True} if constexprs.get("USE_PDL") else {}


def _device(arg: torch.Tensor | TensorDescriptor) -> int:
    """The device index of a kernel's first argument (a tensor or a tensor descriptor)."""
    return (arg.base if isinstance(arg, TensorDescriptor) else arg).get_device()


def _current_stream(device: int) -> int:
    """The raw handle of ``device``'s current CUDA stream (what Triton's runner looks up)."""
    return torch._C._cuda_getCurrentRawStream(device)
