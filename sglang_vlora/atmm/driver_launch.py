"""Launch a compiled Triton kernel straight through the CUDA driver's ``cuLaunchKernel``.

Triton's launch of a compiled kernel still runs Python on every call: its runner reads the
launch hooks, builds the launch metadata, allocates scratch through closures, then its C
launcher parses every argument again. The ATMM kernels launch 112 times per eager prefill
forward of a 7B model, and that forward is bound by its host time (``docs/perf.md``). A
:class:`DirectLaunch` packs the kernel's parameters once, in the layout the compiled kernel
declares, and per launch only writes the leading pointers (the activations, weights and
outputs that change from layer to layer) and calls the driver. On the benchmark H200's
host that saves about 2 us of a launch's 11-16 us; the rest is the driver's own
``cuLaunchKernel`` (``bench/layer_cost.py --host-only``).

The layout comes from the kernel's own PTX entry (``.param`` declarations), matched
against Triton's signature of the specialisation: every argument Triton did not fold
into a constant is a parameter, in order, then Triton's scratch pointers. A kernel whose
declared parameters do not match, that needs scratch memory, clusters, cooperative or
programmatic launches, or takes an argument type not handled here gets no direct launch
(:func:`kernel_layout` says why) and stays on Triton's launcher.
"""

from __future__ import annotations

import ctypes
import functools
import re
from dataclasses import dataclass
from typing import Any

# Triton's scalar types -> the C type of the kernel parameter.
_SCALAR_CTYPES: dict[str, type[ctypes._SimpleCData]] = {
    "i8": ctypes.c_int8,
    "i16": ctypes.c_int16,
    "i32": ctypes.c_int32,
    "i64": ctypes.c_int64,
    "u8": ctypes.c_uint8,
    "u16": ctypes.c_uint16,
    "u32": ctypes.c_uint32,
    "u64": ctypes.c_uint64,
    "fp32": ctypes.c_float,
    "fp64": ctypes.c_double,
}
_PTX_SIZES = {"8": 1, "16": 2, "32": 4, "64": 8}
_PTX_PARAM = re.compile(r"\.param\s+\.[busf](8|16|32|64)\b")
# Triton's C launcher appends these after the kernel's own arguments (global scratch, then
# profile scratch in newer versions); both are null for kernels that need no scratch.
_MAX_SCRATCH_PARAMS = 2


@dataclass(frozen=True)
class KernelLayout:
    """Where a compiled kernel's parameters come from: ``(argument index, C type)`` per
    kernel parameter that is an argument, then ``scratch`` null pointers."""

    function: int
    block: int
    shared: int
    params: tuple[tuple[int, type[ctypes._SimpleCData]], ...]
    scratch: int


def ptx_param_sizes(ptx: str, name: str) -> list[int]:
    """Byte sizes of the parameters of PTX entry ``name``, in order."""
    start = ptx.find(f".entry {name}(")
    if start < 0:
        raise ValueError(f"no .entry {name} in the PTX")
    end = ptx.find(")", start)
    return [_PTX_SIZES[bits] for bits in _PTX_PARAM.findall(ptx[start:end])]


def kernel_layout(compiled: Any) -> KernelLayout | str:
    """The parameter layout of a Triton ``CompiledKernel`` whose handles are loaded, or
    why it cannot be launched directly."""
    meta = compiled.metadata
    if getattr(meta, "num_ctas", 1) != 1:
        return "a cluster launch"
    if getattr(meta, "launch_cooperative_grid", False) or getattr(meta, "launch_pdl", False):
        return "a cooperative or programmatic launch"
    if getattr(meta, "global_scratch_size", 0) or getattr(meta, "profile_scratch_size", 0):
        return "scratch memory"
    if meta.shared > 228 * 1024:
        return "oversized shared memory"
    if getattr(meta, "tensordesc_meta", None):
        return "tensor descriptor arguments"
    ptx = compiled.asm.get("ptx")
    if ptx is None or not compiled.function:
        return "no PTX or no loaded function"
    params = []
    for index, kind in enumerate(compiled.src.signature.values()):
        if kind == "constexpr":
            continue
        if not isinstance(kind, str):
            return f"argument type {kind!r}"
        ctype = ctypes.c_uint64 if kind.startswith("*") else _SCALAR_CTYPES.get(kind)
        if ctype is None:
            return f"argument type {kind!r}"
        params.append((index, ctype))
    try:
        declared = ptx_param_sizes(ptx, compiled.name)
    except ValueError as exc:
        return str(exc)
    scratch = len(declared) - len(params)
    packed = [ctypes.sizeof(c) for _, c in params] + [8] * scratch
    if not 0 <= scratch <= _MAX_SCRATCH_PARAMS or declared != packed:
        return f"declared parameters {declared} do not match the signature's {packed}"
    return KernelLayout(int(compiled.function), 32 * meta.num_warps, meta.shared, tuple(params), scratch)


class DirectLaunch:
    """``launch(*pointers, stream=handle)``: the kernel of ``layout`` over ``grid`` with
    ``args`` (every runtime then constexpr argument, as Triton's launch takes them), the
    first ``lead`` of them (tensors) replaced at each launch by ``pointers``."""

    __slots__ = ("_function", "_grid", "_block", "_shared", "_lead", "_params", "_storage", "_launch")

    def __init__(self, layout: KernelLayout, grid: tuple[int, ...], args: tuple, lead: int, cu_launch: Any):
        grid = (*grid, 1, 1)[:3]
        storage, lead_slots = [], [None] * lead
        for index, ctype in layout.params:
            value = args[index]
            slot = ctype(value.data_ptr() if hasattr(value, "data_ptr") else value)
            storage.append(slot)
            if index < lead:
                lead_slots[index] = slot
        if any(slot is None for slot in lead_slots):
            raise ValueError("every leading argument must be a kernel parameter")
        storage += [ctypes.c_uint64(0) for _ in range(layout.scratch)]
        self._params = (ctypes.c_void_p * len(storage))(*(ctypes.addressof(s) for s in storage))
        self._storage, self._lead = storage, tuple(lead_slots)  # storage: keeps the values alive
        self._function, self._grid, self._block, self._shared = layout.function, grid, layout.block, layout.shared
        self._launch = cu_launch

    def __call__(self, *pointers: int, stream: int) -> None:
        for slot, pointer in zip(self._lead, pointers, strict=True):
            slot.value = pointer
        gx, gy, gz = self._grid
        status = self._launch(self._function, gx, gy, gz, self._block, 1, 1, self._shared, stream, self._params, None)
        if status != 0:
            raise RuntimeError(f"cuLaunchKernel failed: CUDA error {status}")


@functools.cache
def cu_launch_kernel() -> Any:
    """The CUDA driver's ``cuLaunchKernel`` through ctypes (OSError without a driver)."""
    fn = ctypes.CDLL("libcuda.so.1").cuLaunchKernel
    fn.argtypes = [ctypes.c_void_p, *[ctypes.c_uint] * 7, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
    fn.restype = ctypes.c_int
    return fn
