"""Public ATMM operators: LoRA over tokens grouped by work item.

``lora_shrink`` computes ``x A^T`` per work item (rank ``r`` per slice, all slices
stacked), ``lora_expand`` multiplies by ``B^T``, scales by the item's signed scale
and accumulates into the base output, slice by slice. ``lora_apply`` does both.

Implementations (``impl``): ``"torch"`` is the pure-torch path below, the reference
every kernel is checked against; ``"triton"`` the Triton kernels
(:mod:`sglang_vlora.atmm.triton_kernels`); ``"cuda"`` the CUDA C++ kernels
(:mod:`sglang_vlora.atmm.cuda_ext`, bf16/fp16 only, built on first use); ``"cublas"``
one cuBLAS GEMM per item and slice (:mod:`sglang_vlora.atmm.cublas_ops`). ``"auto"``
(the default) runs the reference on CPU tensors and, on CUDA tensors, per op and shape
what the adaptive-tiling table says (:mod:`sglang_vlora.atmm.tiling`): cuBLAS or the
CUDA kernel where the table entry records that it won (``"impl": "cublas"`` /
``"cuda"``; the CUDA kernel only where the extension is available for the dtype), else
the Triton kernel. Tile configs come from the same table.
The ``*_static`` (CUDA-graph) entry points run the Triton kernels for every ``impl``
but ``"torch"``; with ``"torch"``, and on CPU tensors outside Triton's interpreter, they
run their graph-safe torch form (:mod:`sglang_vlora.atmm.static_items`).

Graph safety. ``lora_shrink`` / ``lora_expand`` / ``lora_apply`` size their launch
grids from the host copies in :class:`WorkItems` (item count, longest segment, total
rows): right in eager mode, wrong if captured in a CUDA graph and replayed with
other items. Under CUDA graphs use ``lora_apply_static`` / ``lora_apply_static_with_base`` /
``lora_shrink_static`` / ``lora_expand_static`` with a :class:`StaticWorkItems`: they read only its device
buffers and size grids from static bounds (buffer capacity, ``x.shape[0]``,
pool max rank), so any items written by ``StaticWorkItems.fill`` before a replay
are computed correctly.
"""

from __future__ import annotations

import os
from collections.abc import Callable

import torch

from sglang_vlora.atmm import cublas_ops, gemm_lora, in_gemm, launch_compiles, small_gemm, static_items
from sglang_vlora.atmm.static_items import StaticWorkItems
from sglang_vlora.atmm.work_items import WorkItems

IMPLS = ("auto", "torch", "triton", "cuda", "cublas")
CUDA_DTYPES = (torch.bfloat16, torch.float16)


def _kernel_impl(t: torch.Tensor, impl: str) -> str | None:
    """The kernel family for ``impl`` on tensors like ``t``; None for the reference."""
    if impl not in IMPLS:
        raise ValueError(f"impl must be one of {IMPLS}, got {impl!r}")
    if impl == "torch" or (impl == "auto" and not t.is_cuda):
        return None
    if impl == "cublas":
        return impl
    if impl == "cuda" and (not t.is_cuda or t.dtype not in CUDA_DTYPES):
        raise ValueError(f"impl='cuda' needs bfloat16/float16 CUDA tensors, got {t.dtype} on {t.device}")
    return impl


def lora_shrink(
    x: torch.Tensor, a_buffer: torch.Tensor, items: WorkItems, num_slices: int, impl: str = "auto"
) -> torch.Tensor:
    """Return ``[items.total_rows, num_slices * max_rank]``: row block ``i`` holds
    ``x[tokens of item i] @ A[slot_i, :num_slices * r_i].T`` in its first
    ``num_slices * r_i`` columns and zeros after them.

    ``impl``: see the module docstring (same for every entry point)."""
    _check_shrink_shapes(x, a_buffer)
    kernels = _kernel_impl(x, impl)
    if kernels is not None:
        return _shrink_kernel(x, a_buffer, items, num_slices, impl=kernels)
    static = static_items.from_work_items(items, x.shape[0])
    return static_items.shrink_torch(x, a_buffer, static, num_slices)[: items.total_rows]


def lora_expand(
    intermediate: torch.Tensor,
    b_buffer: torch.Tensor,
    items: WorkItems,
    slice_offsets: list[int],
    output: torch.Tensor,
    impl: str = "auto",
) -> torch.Tensor:
    """Accumulate ``scale_i * intermediate_i[:, slice s] @ B[slot_i, slice s, :r_i].T``
    into ``output[tokens of item i, slice s]`` for every item and slice; returns
    ``output`` (updated in place)."""
    kernels = _kernel_impl(output, impl)
    if kernels is not None:
        return _expand_kernel(intermediate, b_buffer, items, slice_offsets, output, impl=kernels)
    static = static_items.from_work_items(items, output.shape[0])
    return static_items.expand_torch(intermediate, b_buffer, static, slice_offsets, output)


def lora_apply(
    x: torch.Tensor,
    a_buffer: torch.Tensor,
    b_buffer: torch.Tensor,
    items: WorkItems,
    slice_offsets: list[int],
    output: torch.Tensor,
    impl: str = "auto",
) -> torch.Tensor:
    """Shrink then expand: ``output += sum_i scale_i * x_i A_i^T B_i^T`` per slice."""
    kernels = _kernel_impl(x, impl)
    if items.num_items == 0:
        return output
    if kernels is not None:
        # One plan key per module call: this runs for every LoRA module of every layer of an
        # eager forward, where the host time is the latency (docs/perf.md).
        offsets = tuple(slice_offsets)
        key = ("apply", kernels, x.dtype, x.shape, x.stride(), a_buffer.shape, a_buffer.stride(), b_buffer.shape,
               b_buffer.stride(), output.dtype, output.shape, output.stride(), offsets)
        _plan(items, key, lambda: _apply_plan(x, a_buffer, b_buffer, items, offsets, output, kernels))(
            x, a_buffer, b_buffer, output)
        return output
    num_slices = len(slice_offsets) - 1
    intermediate = lora_shrink(x, a_buffer, items, num_slices, impl)
    return lora_expand(intermediate, b_buffer, items, slice_offsets, output, impl)


def lora_apply_gemm(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    a_buffer: torch.Tensor,
    b_buffer: torch.Tensor,
    items: WorkItems,
    slice_offsets: list[int],
) -> torch.Tensor:
    """``x @ weight.T (+ bias) + LoRA`` into a new output, the base GEMM ATMM's own: the shrink
    (rows at the tokens' positions), then one GEMM that adds each token's delta in its
    accumulator (:mod:`sglang_vlora.atmm.gemm_lora`). Eager batches only (the token maps are
    built from the items' host lists, once per batch); raises ``ValueError`` where
    :func:`gemm_lora.unsupported` names a reason."""
    # One plan key per module call, as lora_apply's: the layers of one module shape share it,
    # and every operand property unsupported() reads is in it, so the plan is checked once.
    key = ("gemm", x.device, x.dtype, x.shape, x.stride(), a_buffer.shape, a_buffer.stride(), b_buffer.shape,
           b_buffer.stride(), b_buffer.dtype, weight.shape, weight.stride(), bias is None, tuple(slice_offsets))
    return _plan(items, key, lambda: _gemm_plan(x, weight, a_buffer, b_buffer, items, slice_offsets))(
        x, weight, bias, a_buffer, b_buffer)


def _gemm_plan(x, weight, a_buffer, b_buffer, items: WorkItems, slice_offsets: list[int]) -> Callable:
    """``plan(x, weight, bias, a_buffer, b_buffer) -> output`` of :func:`lora_apply_gemm` for this
    shape and batch: the token maps (once per batch), the shrink's rows at the tokens' positions
    (its launch prepared), then the GEMM. Raises where the op cannot run these operands."""
    reason = gemm_lora.unsupported(x, weight, b_buffer, slice_offsets, items)
    if reason is not None:
        raise ValueError(f"lora_apply_gemm: {reason}")
    _check_shrink_shapes(x, a_buffer)
    if items.num_items == 0:
        return lambda x, weight, bias, a, b: torch.nn.functional.linear(x, weight, bias)
    m = x.shape[0]
    maps = _plan(items, ("gemm_maps", m), lambda: gemm_lora.token_maps(items, m, x.device))
    shrink = _shrink_plan(x, a_buffer, items, len(slice_offsets) - 1, False, "triton", at_positions=True)

    def run(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, a: torch.Tensor,
            b: torch.Tensor) -> torch.Tensor:
        out = torch.empty((m, weight.shape[0]), dtype=x.dtype, device=x.device)
        return gemm_lora.launch(x, weight, bias, shrink(x, a), b, *maps, items.ranks, slice_offsets, out)

    return run


def compile_eager(
    x: torch.Tensor,
    a_buffer: torch.Tensor,
    b_buffer: torch.Tensor,
    items: WorkItems,
    slice_offsets: list[int],
    output: torch.Tensor,
    impl: str = "auto",
) -> None:
    """Compile, launching nothing, the kernels ``lora_apply`` may run for this module shape
    at any token count (what its first call compiles). A server whose forwards replay CUDA
    graphs would otherwise compile them at its first eager batch, while serving."""
    kernels = _kernel_impl(x, impl)
    if kernels is not None and items.num_items > 0:
        _apply_plan(x, a_buffer, b_buffer, items, tuple(slice_offsets), output, kernels)


# ---- graph-safe entry points ----------------------------------------------------------


def lora_apply_static(
    x: torch.Tensor,
    a_buffer: torch.Tensor,
    b_buffer: torch.Tensor,
    items: StaticWorkItems,
    slice_offsets: list[int],
    output: torch.Tensor,
    impl: str = "auto",
) -> torch.Tensor:
    """``lora_apply`` for CUDA-graph capture: reads only ``items``' device buffers.

    The grid depends on ``x.shape[0]``, ``items.capacity``, ``items.max_layers`` and
    the pool's shape, all fixed for one captured graph. ``impl="auto"`` runs the
    Triton kernels on CUDA tensors, and on CPU tensors under ``TRITON_INTERPRET=1``;
    elsewhere, or with ``impl="torch"``, the graph-safe torch path
    (:func:`static_items.shrink_torch` / :func:`static_items.expand_torch`).
    """
    num_slices = len(slice_offsets) - 1
    inter = lora_shrink_static(x, a_buffer, items, num_slices, zero_fill=False, impl=impl)
    return lora_expand_static(inter, b_buffer, items, slice_offsets, output, impl=impl)


def lora_apply_static_with_base(
    x: torch.Tensor,
    a_buffer: torch.Tensor,
    b_buffer: torch.Tensor,
    items: StaticWorkItems,
    slice_offsets: list[int],
    base_fn: Callable[[], torch.Tensor],
    side_stream: torch.cuda.Stream | None = None,
    impl: str = "auto",
) -> torch.Tensor:
    """``base_fn() + LoRA``, graph-safe, with the shrink overlapped with the base GEMM.

    The shrink needs only ``x``, so on CUDA it runs on ``side_stream`` while
    ``base_fn`` (the base layer's GEMM, returning its output) runs on the current
    stream; the expand then adds into that output. Fork and join are stream waits,
    which CUDA-graph capture records. Use one side stream for all layers (split-K
    counters are shared per device). Without CUDA or a side stream: in sequence.
    """
    num_slices = len(slice_offsets) - 1
    if side_stream is None or not x.is_cuda:
        inter = lora_shrink_static(x, a_buffer, items, num_slices, zero_fill=False, impl=impl)
        return lora_expand_static(inter, b_buffer, items, slice_offsets, base_fn(), impl=impl)
    main = torch.cuda.current_stream(x.device)
    side_stream.wait_stream(main)
    with torch.cuda.stream(side_stream):
        inter = lora_shrink_static(x, a_buffer, items, num_slices, zero_fill=False, impl=impl)
    output = base_fn()
    main.wait_stream(side_stream)
    inter.record_stream(main)
    return lora_expand_static(inter, b_buffer, items, slice_offsets, output, impl=impl)


def lora_apply_static_in_gemm(
    x: torch.Tensor,
    weight_ext: torch.Tensor,
    bias_ext: torch.Tensor | None,
    out_features: int,
    b_buffer: torch.Tensor,
    items: StaticWorkItems,
    slice_offsets: list[int],
    impl: str = "auto",
    plans: dict | None = None,
) -> torch.Tensor:
    """``base + LoRA`` with the shrink inside the base GEMM (:mod:`sglang_vlora.atmm.in_gemm`),
    graph-safe: one GEMM over ``weight_ext`` (the base weight's ``out_features`` rows, then
    every pool slot's A rows; ``bias_ext`` zero-padded alike, or None), then one expand into
    a new contiguous ``[m, out_features]`` output. ``items`` must cover every token
    (``StaticWorkItems.allocate(covers_tokens=True)``).

    ``plans``: for an eager batch, the expand goes through a launch prepared once per module
    shape and token bound (:func:`kept_plan_tokens`) and kept in this dict across batches (the
    caller owns and bounds it). That is right because ``items`` are static buffers, filled per
    batch and never moved, whose copy items reach no further than the batch's tokens
    (``fill(cover_to=...)``, checked: a launch kept for a larger bound would write the rows past
    the batch's output); the separate shrink would take a second launch. An eager batch picks its
    implementation as the eager ops do (``impl="auto"`` on CPU tensors: the torch form, even
    under Triton's interpreter). None (graph capture, where a launch's host cost does not
    matter): the plain launch."""
    if not items.covers_tokens:
        raise ValueError("the shrink-in-GEMM expand needs items that cover every token (covers_tokens)")
    if plans is not None and items.covered_to != x.shape[0]:
        raise ValueError(f"an eager batch of {x.shape[0]} tokens over items whose copy items reach position "
                         f"{items.covered_to}: fill them with cover_to={x.shape[0]}")
    if plans is not None and _kernel_impl(x, impl) is None:
        impl = "torch"  # an eager batch follows the eager ops' rule: "auto" on CPU tensors is the reference
    if plans is not None and not _static_torch(x, impl):
        return KeptInGemmCall(weight_ext, bias_ext, out_features, b_buffer, items, slice_offsets,
                              kept_plan_tokens(x.shape[0]), plans)(x)
    y = torch.nn.functional.linear(x, weight_ext, bias_ext)
    output = torch.empty((x.shape[0], out_features), dtype=y.dtype, device=y.device)
    inter, layout = in_gemm.split_output(y, out_features, b_buffer.shape[0])
    if _static_torch(output, impl):
        output.copy_(layout.base)
        rows = in_gemm.shrink_rows_torch(inter, layout, items)
        return static_items.expand_torch(rows, b_buffer, items, slice_offsets, output)
    return lora_expand_static(inter, b_buffer, items, slice_offsets, output, impl=impl, gemm_layout=layout)


class KeptInGemmCall:
    """One module's eager in-GEMM call with kept plans (the GEMM over ``weight_ext``, then the
    expand by the plan kept in ``plans`` for ``bound`` tokens), with what does not change
    between the batches of that bound looked up at its first call only. An eager forward of a
    few tokens is bound by the host, and building the plan's key and checking the
    implementation cost a module call about as much host time as the expand's launch
    (docs/perf.md, "The eager in-GEMM call kept per layer"). The backend keeps one per layer
    and asks :meth:`serves` (identity checks) before each batch's call;
    :func:`lora_apply_static_in_gemm` makes one per call."""

    def __init__(self, weight_ext: torch.Tensor, bias_ext: torch.Tensor | None, out_features: int,
                 b_buffer: torch.Tensor, items: StaticWorkItems, slice_offsets: list[int], bound: int,
                 plans: dict) -> None:
        if not items.covers_tokens:
            raise ValueError("the shrink-in-GEMM expand needs items that cover every token (covers_tokens)")
        self.weight, self.bias, self.out_features = weight_ext, bias_ext, out_features
        self.b_buffer, self.items, self.slice_offsets = b_buffer, items, list(slice_offsets)
        self.bound, self.plans = bound, plans
        self.plan: Callable | None = None
        self.dtype: torch.dtype | None = None

    def serves(self, weight_ext: torch.Tensor, b_buffer: torch.Tensor, items: StaticWorkItems, bound: int) -> bool:
        """Whether this call runs a batch of ``bound`` over these buffers."""
        return weight_ext is self.weight and b_buffer is self.b_buffer and items is self.items and bound == self.bound

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.items.covered_to != x.shape[0] or x.shape[0] > self.bound:
            raise ValueError(f"an eager batch of {x.shape[0]} tokens over items whose copy items reach position "
                             f"{self.items.covered_to}, a call kept for {self.bound} tokens")
        y = torch.nn.functional.linear(x, self.weight, self.bias)
        output = torch.empty((x.shape[0], self.out_features), dtype=y.dtype, device=y.device)
        if y.dtype is not self.dtype:
            self.plan = self._plan(y, output)
            self.dtype = y.dtype
        self.plan(y, self.b_buffer, output)
        return output

    def _plan(self, y: torch.Tensor, output: torch.Tensor) -> Callable:
        """The expand plan for ``y``'s and ``output``'s dtype and strides, from ``plans`` or built
        into it (every call of one module shape and bound shares it)."""
        b, offsets = self.b_buffer, tuple(self.slice_offsets)
        key = ("in_gemm", self.bound, self.items.paired, y.dtype, y.stride(), self.out_features, tuple(b.shape),
               b.stride(), offsets)
        plan = self.plans.get(key)
        if plan is None:
            inter, layout = in_gemm.split_output(y, self.out_features, b.shape[0])
            plan = self.plans[key] = _in_gemm_expand_plan(inter, b, self.items, offsets, output, layout, self.bound)
        return plan


class KeptSmallGemmCall:
    """One module's eager call for batches of a few tokens: base GEMM, shrink and expand in one
    launch (:mod:`sglang_vlora.atmm.small_gemm`), by a plan prepared once per module shape and
    token ``bound`` and kept in ``plans`` (every layer of the shape shares it). ``weight``: the
    base weight, or one with rows appended after its ``out_features`` (the in-GEMM stack);
    ``a_buffer`` and ``b_buffer`` the pool's. The backend keeps one per layer, as it does
    :class:`KeptInGemmCall`, and asks :meth:`serves` before each batch's call."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None, out_features: int, a_buffer: torch.Tensor,
                 b_buffer: torch.Tensor, items: StaticWorkItems, slice_offsets: list[int], bound: int,
                 plans: dict) -> None:
        why = small_gemm.unsupported(weight, out_features, a_buffer, b_buffer, items, slice_offsets)
        if why is not None:
            raise ValueError(f"one launch cannot run this module: {why}")
        self.weight, self.bias, self.out_features = weight, bias, out_features
        self.a_buffer, self.b_buffer, self.items = a_buffer, b_buffer, items
        self.slice_offsets, self.bound, self.plans = list(slice_offsets), bound, plans
        self.plan: small_gemm.PreparedLaunch | None = None
        self._key: tuple | None = None  # x's dtype and strides the plan was taken for
        self._dtypes: tuple[torch.dtype, ...] = ()  # the leading tensors' dtypes under that key

    def serves(self, weight: torch.Tensor, a_buffer: torch.Tensor, b_buffer: torch.Tensor, items: StaticWorkItems,
               bound: int) -> bool:
        """Whether this call runs a batch of ``bound`` over these buffers."""
        return (weight is self.weight and a_buffer is self.a_buffer and b_buffer is self.b_buffer
                and items is self.items and bound == self.bound)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.items.covered_to != x.shape[0] or x.shape[0] > self.bound:
            raise ValueError(f"an eager batch of {x.shape[0]} tokens over items whose copy items reach position "
                             f"{self.items.covered_to}, a call kept for {self.bound} tokens")
        if x.stride(1) != 1:
            x = x.contiguous()
        output = torch.empty((x.shape[0], self.out_features), dtype=x.dtype, device=x.device)
        lead = (x, self.weight, self.weight if self.bias is None else self.bias, self.a_buffer, self.b_buffer, output)
        key = (x.dtype, x.stride())
        if key != self._key:
            self.plan, self._key = self._plan(x, output), key
            self._dtypes = tuple(t.dtype for t in lead)
        if not self.plan.at(tuple(t.data_ptr() for t in lead), self._dtypes):
            self.plan(*lead)
        return output

    def _plan(self, x: torch.Tensor, output: torch.Tensor) -> small_gemm.PreparedLaunch:
        a, b, w = self.a_buffer, self.b_buffer, self.weight
        key = ("small_gemm", self.bound, self.items.packed.data_ptr(), x.dtype, x.stride(), tuple(w.shape),
               w.stride(), self.bias is None, tuple(a.shape), a.stride(), tuple(b.shape), b.stride(),
               tuple(self.slice_offsets))
        plan = self.plans.get(key)
        if plan is None:
            plan = self.plans[key] = small_gemm.prepare(x, w, self.bias, a, b, output, self.items,
                                                        self.slice_offsets, self.bound)
        return plan


def compile_in_gemm(x: torch.Tensor, gemm_rows: int, out_features: int, b_buffer: torch.Tensor,
                    items: StaticWorkItems, slice_offsets: list[int]) -> None:
    """Compile the in-GEMM expand of this module shape (``gemm_rows``: the extended weight's
    rows) for every config the table may pick at any token count
    (:func:`lora_apply_static_in_gemm` does at an eager batch's first plan), launching nothing."""
    if _static_torch(x, "auto"):
        return
    y = torch.empty((x.shape[0], gemm_rows), dtype=x.dtype, device=x.device)
    inter, layout = in_gemm.split_output(y, out_features, b_buffer.shape[0])
    output = torch.empty((x.shape[0], out_features), dtype=x.dtype, device=x.device)
    _in_gemm_expand_plan(inter, b_buffer, items, tuple(slice_offsets), output, layout, x.shape[0])


def compile_small_gemm(x: torch.Tensor, gemm_rows: int, has_bias: bool, a_buffer: torch.Tensor,
                       b_buffer: torch.Tensor, items: StaticWorkItems, slice_offsets: list[int]) -> None:
    """Compile the one-launch kernel of this module shape (:class:`KeptSmallGemmCall`; ``gemm_rows``:
    the weight's rows, the base's and any appended), launching nothing."""
    if _static_torch(x, "auto") or not _compiles_ahead_for(x):
        return
    weight = torch.empty((gemm_rows, x.shape[1]), dtype=x.dtype, device=x.device)
    if small_gemm.unsupported(weight, slice_offsets[-1], a_buffer, b_buffer, items, slice_offsets) is not None:
        return  # the in-GEMM call runs this shape (KeptSmallGemmCall is never built for it)
    bias = torch.empty(gemm_rows, dtype=x.dtype, device=x.device) if has_bias else None
    output = torch.empty((x.shape[0], slice_offsets[-1]), dtype=x.dtype, device=x.device)
    small_gemm.launch(x, weight, bias, a_buffer, b_buffer, output, items, slice_offsets, compile_only=True)


def _in_gemm_expand_plan(inter, b_buffer, items: StaticWorkItems, slice_offsets: tuple[int, ...], output,
                         layout: in_gemm.InGemmLayout, bound: int) -> Callable:
    """``plan(y, b_buffer, output)``: the in-GEMM expand of this module shape for batches of up to
    ``bound`` tokens over ``items``' buffers (whatever they are filled with), every table config
    compiled; ``y`` is the GEMM's output, of the strides of the one ``inter`` and ``layout`` are
    views of."""
    from sglang_vlora.atmm import triton_kernels

    num_slices = len(slice_offsets) - 1
    rank = b_buffer.shape[2]
    cfg = _pick("expand_in_gemm", output, (slice_offsets[-1], num_slices, rank, bound), "triton")[1]
    layers, num_layers, partners = static_expand_layout(items)
    args = (inter, b_buffer, output, items.seg_starts, items.seg_lens, items.slots, items.scales, items.row_starts,
            layers, num_layers, items.ranks, items.permutation, slice_offsets, bound)
    key = {"n": slice_offsets[-1], "s": num_slices, "r": rank}
    _compile_table_configs("expand_in_gemm", key, output, lambda c: triton_kernels.launch_expand(
        *args, c, compile_only=True, partners=partners, in_gemm=layout), static_variant(items))
    prepared = triton_kernels.prepare_expand(*args, cfg, partners=partners, in_gemm=layout, m_tokens=bound)
    out_features, num_slots = layout.base.shape[1], b_buffer.shape[0]
    inter_offset = out_features * inter.element_size()  # the slots' columns start after the base's

    def run(y: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> None:
        """The expand over ``y``, the GEMM's output, read through addresses: making the two views
        of it (the slots' columns and the base's) cost more host time than the launch."""
        base = y.data_ptr()
        addresses = (base + inter_offset, b.data_ptr(), out.data_ptr(), base)
        dtypes = (y.dtype, b.dtype, out.dtype, y.dtype)
        for launch in prepared:
            if not launch.at(addresses, dtypes):  # its first call: Triton's launch, given the views
                inter, layout = in_gemm.split_output(y, out_features, num_slots)
                launch(inter, b, out, layout.base)

    return run


# ---- eager batches over static items, their launches kept across batches -------------------

# Kept launch plans are built for a token bound: the next power of two up to this many tokens,
# then the next multiple of it (a batch of 1300 tokens runs the plan of 1536). Larger steps mean
# fewer plans to build while serving, more row tiles that exit at once.
KEPT_PLAN_STEP = 256
_UNBUILT = object()


def kept_plan_tokens(num_tokens: int) -> int:
    """The token bound of the kept plans that run a batch of ``num_tokens`` tokens."""
    if num_tokens <= KEPT_PLAN_STEP:
        return max(16, 1 << (num_tokens - 1).bit_length())
    return -(-num_tokens // KEPT_PLAN_STEP) * KEPT_PLAN_STEP


def lora_apply_kept(
    x: torch.Tensor,
    a_buffer: torch.Tensor,
    b_buffer: torch.Tensor,
    items: StaticWorkItems,
    slice_offsets: list[int],
    output: torch.Tensor,
    plans: dict,
    impl: str = "auto",
) -> bool:
    """``output += LoRA`` for an eager batch whose items were written into ``items`` (static
    buffers, filled per batch, never moved), as :func:`lora_apply` computes it, through Triton
    launches prepared once per module shape and token bound (:func:`kept_plan_tokens`) and kept
    in ``plans`` across batches (the caller owns and bounds it; one ``items`` per value of
    ``items.paired``, which the plans' key holds). :func:`lora_apply` prepares its
    launches anew for every batch, from that batch's items: on a host-bound eager forward that
    cost as much host time as the batch's steady LoRA calls (docs/perf.md). The grids are sized
    for the bound (row tiles past the batch's items exit at once, as a graph's padding rows
    do); the configs are the table's for the bound and the pool's max rank, not the batch's.

    Returns False, launching nothing, where ``impl`` is ``"auto"`` and the table picks another
    implementation than Triton for the shrink or the expand of this shape (cuBLAS in some large
    prefill cells): the caller then runs :func:`lora_apply` over the batch's ``WorkItems``.
    ``impl``: ``"auto"`` or ``"triton"``, on CUDA tensors or under Triton's interpreter."""
    bound = kept_plan_tokens(x.shape[0])
    key = ("apply", bound, items.paired, x.dtype, x.shape[1], x.stride(), a_buffer.shape, a_buffer.stride(),
           b_buffer.shape, b_buffer.stride(), output.dtype, output.stride(), tuple(slice_offsets))
    plan = plans.get(key, _UNBUILT)
    if plan is _UNBUILT:
        plan = plans[key] = _kept_apply_plan(x, a_buffer, b_buffer, items, tuple(slice_offsets), output, bound,
                                             impl, plans)
    if plan is None:
        return False
    plan(x, a_buffer, b_buffer, output)
    return True


def compile_kept(x: torch.Tensor, a_buffer: torch.Tensor, b_buffer: torch.Tensor, items: StaticWorkItems,
                 slice_offsets: list[int], output: torch.Tensor) -> None:
    """Compile, launching nothing, the kernels :func:`lora_apply_kept` may run for this module
    shape over these buffers at any token count (what its first plan compiles). The Triton
    configs are compiled whatever the table picks at this stand-in's token count: a cuBLAS pick
    there says nothing of the bounds a served batch has."""
    if not _static_torch(x, "auto"):
        _kept_apply_plan(x, a_buffer, b_buffer, items, tuple(slice_offsets), output, x.shape[0], "triton", {})


class _Intermediate:
    """The shrink rows of every kept plan of one width and dtype: one tensor, grown to the
    largest plan's rows. Each layer's expand reads it before the next layer's shrink writes it,
    in the order of the one stream an eager forward runs on."""

    def __init__(self) -> None:
        self.tensor: torch.Tensor | None = None

    def reserve(self, rows: int, width: int, like: torch.Tensor) -> torch.Tensor:
        if self.tensor is None or self.tensor.shape[0] < rows:
            self.tensor = torch.empty((rows, width), dtype=like.dtype, device=like.device)
        return self.tensor


def _kept_apply_plan(x, a_buffer, b_buffer, items: StaticWorkItems, slice_offsets: tuple[int, ...], output,
                     bound: int, impl: str, plans: dict) -> Callable | None:
    """``plan(x, a_buffer, b_buffer, output)`` of :func:`lora_apply_kept`, every table config of the
    static variant compiled; None where the table picks another implementation than Triton."""
    from sglang_vlora.atmm import triton_kernels

    _check_shrink_shapes(x, a_buffer)
    if impl not in ("auto", "triton"):
        raise ValueError(f"kept plans run the Triton kernels: impl 'auto' or 'triton', got {impl!r}")
    num_slices, width, rank = len(slice_offsets) - 1, a_buffer.shape[1], b_buffer.shape[2]
    shrink_impl, shrink_cfg = _pick("shrink", x, (x.shape[1], width, bound), impl)
    expand_impl, expand_cfg = _pick("expand", output, (slice_offsets[-1], num_slices, rank, bound), impl)
    if shrink_impl != "triton" or expand_impl != "triton":
        return None
    rows = items.max_rows(bound)
    intermediate = plans.setdefault(("intermediate", x.device, x.dtype, width), _Intermediate())
    inter = intermediate.reserve(rows, width, x)
    segments = (items.seg_starts, items.seg_lens, items.slots)
    shrink_args = (x, a_buffer, inter, *segments, items.row_starts, items.ranks, items.permutation, num_slices, rows)
    layers, num_layers, partners = static_expand_layout(items)
    expand_args = (inter, b_buffer, output, *segments, items.scales, items.row_starts, layers, num_layers, items.ranks,
                   items.permutation, slice_offsets, bound)
    variant = static_variant(items)
    _compile_table_configs("shrink", {"k": x.shape[1], "n": width}, x, lambda c: triton_kernels.launch_shrink(
        *shrink_args, c, compile_only=True), variant)
    _compile_table_configs("expand", {"n": slice_offsets[-1], "s": num_slices, "r": rank}, output,
                           lambda c: triton_kernels.launch_expand(*expand_args, c, compile_only=True,
                                                                  partners=partners), variant)
    shrink = triton_kernels.prepare_shrink(*shrink_args, shrink_cfg)
    expand = triton_kernels.prepare_expand(*expand_args, expand_cfg, partners=partners)

    def run(x: torch.Tensor, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> None:
        inter = intermediate.tensor
        shrink(x, a, inter)
        for launch in expand:
            launch(inter, b, out, out)

    return run


def lora_shrink_static(
    x: torch.Tensor,
    a_buffer: torch.Tensor,
    items: StaticWorkItems,
    num_slices: int,
    zero_fill: bool = True,
    impl: str = "auto",
) -> torch.Tensor:
    """Graph-safe shrink. Returns ``[items.max_rows(x.shape[0]), S * max_rank]`` in
    ``x.dtype``; rows past the items' rows and columns past ``S * r`` are zero (or
    unset with ``zero_fill=False``: expand never reads them)."""
    _check_shrink_shapes(x, a_buffer)
    if _static_torch(x, impl):
        return static_items.shrink_torch(x, a_buffer, items, num_slices)
    m = x.shape[0]
    cfg = _pick("shrink", x, (a_buffer.shape[2], a_buffer.shape[1], m), "triton")[1]
    return _launch_shrink(x, a_buffer, items, num_slices, items.max_rows(m), cfg, zero_fill)


def lora_expand_static(
    intermediate: torch.Tensor,
    b_buffer: torch.Tensor,
    items: StaticWorkItems,
    slice_offsets: list[int],
    output: torch.Tensor,
    impl: str = "auto",
    gemm_layout: in_gemm.InGemmLayout | None = None,
) -> torch.Tensor:
    """Graph-safe expand of a ``lora_shrink_static`` result into ``output``; with
    ``gemm_layout``, of the GEMM's slot columns: ``output = gemm_layout.base + LoRA``
    (Triton only: ``lora_apply_static_in_gemm`` holds the torch form)."""
    from sglang_vlora.atmm import triton_kernels

    if _static_torch(output, impl):
        if gemm_layout is not None:
            raise ValueError("the shrink-in-GEMM expand's torch form is lora_apply_static_in_gemm's")
        return static_items.expand_torch(intermediate, b_buffer, items, slice_offsets, output)
    num_slices = len(slice_offsets) - 1
    m = output.shape[0]
    rank = b_buffer.shape[2]
    op = "expand" if gemm_layout is None else "expand_in_gemm"
    cfg = _pick(op, output, (slice_offsets[-1], num_slices, rank, m), "triton")[1]
    layers, num_layers, partners = static_expand_layout(items)
    triton_kernels.launch_expand(
        intermediate,
        b_buffer,
        output,
        items.seg_starts,
        items.seg_lens,
        items.slots,
        items.scales,
        items.row_starts,
        layers,
        num_layers,
        items.ranks,
        items.permutation,
        slice_offsets,
        m,
        cfg,
        partners=partners,
        in_gemm=gemm_layout,
    )
    return output


def static_expand_layout(items: StaticWorkItems) -> tuple[torch.Tensor | None, int, torch.Tensor | None]:
    """``(layers, num_layers, partners)`` for the Triton expand over static items: with pairs one
    launch reading the partners, else one launch per overlap layer the buffers allow."""
    if items.paired:
        return None, 1, items.partners
    return items.layers, items.max_layers, None


def static_variant(items: StaticWorkItems) -> tuple[int, int, bool]:
    """What of static buffers selects the kernels' constexprs (the expand's ``CAP``,
    ``CHECK_LAYER`` and ``PAIRED``): a compile-ahead over one set of buffers serves another
    only where this is the same. The eager one-layer and paired buffers differ in it."""
    return items.capacity, items.max_layers, items.paired


def _static_torch(t: torch.Tensor, impl: str) -> bool:
    """The static ops' torch path: ``impl="torch"``, or a CPU tensor without Triton's
    interpreter. Every other impl runs Triton (the CUDA C++ kernels size their grids
    from host lists: not graph-safe)."""
    return impl == "torch" or (not t.is_cuda and os.environ.get("TRITON_INTERPRET") != "1")


# ---- kernel dispatch helpers ------------------------------------------------------------


def _check_shrink_shapes(x: torch.Tensor, a_buffer: torch.Tensor) -> None:
    if x.dim() != 2 or a_buffer.dim() != 3 or a_buffer.shape[2] != x.shape[1]:
        raise ValueError(f"shape mismatch: x {tuple(x.shape)}, A {tuple(a_buffer.shape)}")


def _device_name(t: torch.Tensor) -> str:
    from sglang_vlora.atmm import tiling

    if not t.is_cuda:
        return "cpu"
    index = t.device.index if t.device.index is not None else torch.cuda.current_device()
    return tiling.device_name(index)


def _items_max_rank(items: WorkItems) -> int:
    return max(items.ranks_host[slot] for slot in items.slots_host)


def _pick(op: str, t: torch.Tensor, dims: tuple[int, ...], impl: str):
    """``(implementation, tile config)`` of one ``op`` shape for ``impl`` (a kernel
    family or "auto", :func:`tiling.choose`); "auto" runs Triton where the table's pick
    is the CUDA extension and it cannot run here."""
    from sglang_vlora.atmm import tiling

    dev = _device_name(t)
    which, cfg = tiling.choose(dev, op, impl, dims)
    if which == "cuda" and impl == "auto" and not (t.dtype in CUDA_DTYPES and _cuda_available()):
        return tiling.choose(dev, op, "triton", dims)
    return which, cfg


def _cuda_available() -> bool:
    from sglang_vlora.atmm import cuda_ext

    return cuda_ext.available()


_COMPILED: set[tuple] = set()


def _compile_table_configs(op: str, key: dict[str, int], t: torch.Tensor, compile_one: Callable,
                           variant: tuple = ()) -> None:
    """Compile, the first time a shape is seen, the Triton kernel of every config the
    table may pick for it at any token count: a token count first seen while serving
    would otherwise compile its kernel then (about a second), in a user's request.
    ``variant``: what else selects the kernel's constexprs (the static buffers' capacity and
    layers), so that each variant is compiled once."""
    from sglang_vlora.atmm import tiling

    dev = _device_name(t)
    seen = (op, dev, t.dtype, *sorted(key.items()), variant)
    if seen in _COMPILED or not _compiles_ahead_for(t):
        return
    _COMPILED.add(seen)
    configs = tiling.triton_configs(dev, op, key)
    with launch_compiles.compiles_in_parallel():
        for cfg in configs:
            compile_one(cfg)


def _compiles_ahead_for(t: torch.Tensor) -> bool:
    """Whether kernels for tensors like ``t`` are compiled ahead: CUDA ones only (Triton's
    interpreter compiles nothing)."""
    return t.is_cuda


_IDENTITY: dict[torch.device, torch.Tensor] = {}


def _kernel_permutation(items: WorkItems, num_tokens: int) -> torch.Tensor:
    """The items' token permutation, or the identity: the Triton kernels always read one
    (as the graph-safe path does), so every batch runs the one compiled variant that the
    first call of a shape compiles ahead (``_compile_table_configs``), never a second one
    in the middle of serving."""
    if items.permutation is not None:
        return items.permutation
    device = items.seg_lens.device
    identity = _IDENTITY.get(device)
    if identity is None or identity.numel() < num_tokens:
        size = max(1024, 1 << (num_tokens - 1).bit_length())
        identity = _IDENTITY[device] = torch.arange(size, dtype=torch.int32, device=device)
    return identity[:num_tokens]


def _plan(items: WorkItems, key: tuple, build: Callable[[], Callable]) -> Callable:
    """The batch's plan for ``key`` (an op and its operands' shapes), built at its first
    call: the layers of one module shape all run the same implementation, configs and
    launch arguments, so only the first layer chooses them."""
    plan = items.plans.get(key)
    if plan is None:
        plan = items.plans[key] = build()
    return plan


def _apply_plan(x, a_buffer, b_buffer, items: WorkItems, slice_offsets: tuple[int, ...], output, impl: str) -> Callable:
    """``plan(x, a_buffer, b_buffer, output)``: shrink then expand for this shape and batch."""
    _check_shrink_shapes(x, a_buffer)
    # One intermediate for every layer of the batch: each layer's expand reads it before the
    # next layer's shrink writes it, in the order of the one stream an eager forward runs on.
    inter = torch.empty((items.total_rows, a_buffer.shape[1]), dtype=x.dtype, device=x.device)
    shrink = _shrink_plan(x, a_buffer, items, len(slice_offsets) - 1, False, impl, output=inter)
    expand = _expand_plan(inter, b_buffer, items, slice_offsets, output, impl)

    def run(x: torch.Tensor, a: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> None:
        expand(shrink(x, a), b, out)

    return run


def _shrink_kernel(
    x: torch.Tensor,
    a_buffer: torch.Tensor,
    items: WorkItems,
    num_slices: int,
    zero_fill: bool = True,
    impl: str = "auto",
) -> torch.Tensor:
    if items.num_items == 0:
        return torch.zeros((items.total_rows, a_buffer.shape[1]), dtype=x.dtype, device=x.device)
    key = ("shrink", impl, num_slices, zero_fill, x.dtype, x.shape, x.stride(), a_buffer.shape, a_buffer.stride())
    return _plan(items, key, lambda: _shrink_plan(x, a_buffer, items, num_slices, zero_fill, impl))(x, a_buffer)


def _shrink_plan(x, a_buffer, items: WorkItems, num_slices: int, zero_fill: bool, impl: str,
                 at_positions: bool = False, output: torch.Tensor | None = None) -> Callable:
    """``plan(x, a_buffer) -> intermediate`` for this shape and batch. ``at_positions``: each
    item's rows start at its segment's first position (``[x.shape[0], width]``, items that do not
    overlap; rows no item covers are left unset), Triton only; else at its ``row_starts``.
    ``output``: the Triton kernel writes every call's intermediate into this ``[rows, width]``
    tensor (the caller reads it before the next call writes it); else each call gets a new one."""
    from sglang_vlora.atmm import triton_kernels

    dims = (x.shape[1], num_slices * _items_max_rank(items), x.shape[0])
    which, cfg = _pick("shrink", x, dims, "triton" if at_positions else impl)
    rows, width = (x.shape[0] if at_positions else items.total_rows), a_buffer.shape[1]
    if which != "triton":
        return lambda x, a: _launch_shrink(x, a, items, num_slices, rows, cfg, zero_fill, which)
    alloc = torch.zeros if zero_fill else torch.empty
    inter = output if output is not None else alloc((rows, width), dtype=x.dtype, device=x.device)
    args = (x, a_buffer, inter, items.seg_starts, items.seg_lens, items.slots,
            items.seg_starts if at_positions else items.row_starts, items.ranks,
            _kernel_permutation(items, x.shape[0]), num_slices, rows)
    key = {"k": x.shape[1], "n": num_slices * _items_max_rank(items)}
    _compile_table_configs("shrink", key, x, lambda c: triton_kernels.launch_shrink(*args, c, compile_only=True))
    prepared = triton_kernels.prepare_shrink(*args, cfg)

    def run(x: torch.Tensor, a: torch.Tensor) -> torch.Tensor:
        out = output if output is not None else alloc((rows, width), dtype=x.dtype, device=x.device)
        prepared(x, a, out)
        return out

    return run


def _launch_shrink(
    x: torch.Tensor,
    a_buffer: torch.Tensor,
    items: WorkItems | StaticWorkItems,
    num_slices: int,
    rows: int,
    cfg,
    zero_fill: bool,
    which: str = "triton",
) -> torch.Tensor:
    """Allocate the ``[rows, S * max_rank]`` intermediate and run the shrink kernel of
    ``which`` implementation (eager and graph-safe items carry the same device tensors;
    the CUDA kernel needs the eager items' host lengths for its grid)."""
    alloc = torch.zeros if zero_fill else torch.empty
    inter = alloc((rows, a_buffer.shape[1]), dtype=x.dtype, device=x.device)
    if which == "cublas":
        cublas_ops.shrink(x, a_buffer, inter, items, num_slices)
        return inter
    args = (x, a_buffer, inter, items.seg_starts, items.seg_lens, items.slots, items.row_starts, items.ranks,
            items.permutation, num_slices)
    if which == "cuda":
        from sglang_vlora.atmm import cuda_ext

        cuda_ext.launch_shrink(*args, cuda_ext.exact_row_tiles(items.seg_lens_host, cfg.block_m), cfg)
    else:
        from sglang_vlora.atmm import triton_kernels

        triton_kernels.launch_shrink(*args, rows, cfg)
    return inter


def _expand_kernel(
    inter: torch.Tensor,
    b_buffer: torch.Tensor,
    items: WorkItems,
    slice_offsets: list[int],
    output: torch.Tensor,
    impl: str = "auto",
) -> torch.Tensor:
    if items.num_items == 0:
        return output
    offsets = tuple(slice_offsets)
    key = ("expand", impl, offsets, inter.shape, inter.stride(), b_buffer.shape, b_buffer.stride(), output.dtype,
           output.shape, output.stride())
    _plan(items, key, lambda: _expand_plan(inter, b_buffer, items, offsets, output, impl))(inter, b_buffer, output)
    return output


def _compile_expand_variants(inter, b_buffer, output, items: WorkItems, permutation, slice_offsets, rows, config):
    """Compile the expand kernel for plain items and for mixture's pairs (the kernel then
    reads each item's partner, a constexpr): a batch of the other kind first seen while
    serving would otherwise compile its variant then, stalling every request in flight
    for about a second."""
    from sglang_vlora.atmm import triton_kernels

    common = (items.seg_starts, items.seg_lens, items.slots, items.scales, items.row_starts, None, 1, items.ranks,
              permutation, slice_offsets, rows, config)
    # partners only selects the variant (PAIRED = partners is not None); any int32 [n_items] stands in
    for partners in (None, items.seg_lens):
        triton_kernels.launch_expand(inter, b_buffer, output, *common, compile_only=True, partners=partners)


def expand_layout(items: WorkItems) -> tuple[torch.Tensor | None, int, torch.Tensor | None]:
    """``(layers, num_layers, partners)`` for the Triton expand of ``items``: with pairs one
    launch over the items not absorbed, else one launch per overlap layer."""
    if items.partners is not None:
        return None, 1, items.partners
    return items.layers, items.num_layers, None


def _expand_plan(inter, b_buffer, items: WorkItems, slice_offsets: tuple[int, ...], output, impl: str) -> Callable:
    """``plan(inter, b_buffer, output)`` for this shape and batch."""
    from sglang_vlora.atmm import cuda_ext, triton_kernels

    num_slices = len(slice_offsets) - 1
    dims = (slice_offsets[-1], num_slices, _items_max_rank(items), output.shape[0])
    which, cfg = _pick("expand", output, dims, impl)
    if which == "cublas":
        return lambda inter, b, out: cublas_ops.expand(inter, b, out, items, list(slice_offsets))
    segments = (items.seg_starts, items.seg_lens, items.slots, items.scales, items.row_starts)
    if which == "cuda":  # pairs as ordinary overlap layers
        row_tiles = cuda_ext.exact_row_tiles(items.seg_lens_host, cfg.block_m)
        return lambda inter, b, out: cuda_ext.launch_expand(
            inter, b, out, *segments, items.layers, items.num_layers, items.ranks, items.permutation,
            slice_offsets, row_tiles, cfg,
        )
    rows = min(items.total_rows, output.shape[0])
    perm = _kernel_permutation(items, output.shape[0])
    layers, num_layers, partners = expand_layout(items)
    args = (inter, b_buffer, output, *segments, layers, num_layers, items.ranks, perm, slice_offsets)
    key = {"n": slice_offsets[-1], "s": num_slices, "r": _items_max_rank(items)}
    _compile_table_configs("expand", key, output, lambda c: _compile_expand_variants(inter, b_buffer, output, items,
                                                                                     perm, slice_offsets, rows, c))
    prepared = triton_kernels.prepare_expand(*args, rows, cfg, partners=partners)

    def run(inter: torch.Tensor, b: torch.Tensor, out: torch.Tensor) -> None:
        for launch in prepared:
            launch(inter, b, out, out)

    return run
