"""Triton ATMM kernels: LoRA shrink and expand over work items, tile shape as arguments.

Both kernels read only device tensors (segment starts and lengths, slots, scales,
row starts, layers, ranks, permutation) and static integers. Row tiles are
scheduled flat: program ``t`` finds its item and row tile from a prefix sum of
``cdiv(seg_len, BLOCK_M)`` over the items (one vector load per program), so the grid
needs only the static bound ``min(cdiv(row_bound, BLOCK_M) + n_items, row_bound)`` row
tiles, however the rows are spread over items. Programs past the last tile, or whose tile lies
outside their item's rank or slice, exit at once. A grid captured in a CUDA graph
therefore stays correct at replay for any items written into the same buffers, as
long as the bounds hold.

Layouts (see :mod:`sglang_vlora.atmm.work_items`): ``x[tokens, d_in]``,
``A[slot, S * max_rank, d_in]``, ``B[slot, d_out_total, max_rank]``; the
intermediate is ``[rows, S * max_rank]`` in the activation dtype, one row per
(item, token). Split-K shrink sums its fp32 partials inside the kernel (the last
split of a tile to finish does it), so expand reads one intermediate. The launchers
here take tile configs and raw tensors; choosing the config is
:mod:`sglang_vlora.atmm.tiling`'s job.
"""

from __future__ import annotations

import functools
import math
from typing import TYPE_CHECKING

import torch
import triton
import triton.language as tl
from triton.language.extra.cuda import gdc_wait

from sglang_vlora.atmm.fast_launch import FastLauncher, PreparedLaunch, launch_options
from sglang_vlora.atmm.launch_compiles import compile_and_load
from sglang_vlora.atmm.split_k import COUNTER_SLOTS, split_counters
from sglang_vlora.atmm.tiling import ExpandConfig, ShrinkConfig
from sglang_vlora.atmm.work_items import ABSORBED as _ABSORBED
from sglang_vlora.config import pdl_setting

if TYPE_CHECKING:
    from sglang_vlora.atmm.in_gemm import InGemmLayout

ABSORBED = tl.constexpr(_ABSORBED)


@triton.jit
def _find_tile(
    t,
    seg_lens_ptr,
    layers_ptr,
    layer,
    partners_ptr,
    n_items,
    CAP: tl.constexpr,
    BLOCK_M: tl.constexpr,
    CHECK_LAYER: tl.constexpr,
    PAIRED: tl.constexpr,
):
    """Map flat row tile ``t`` to ``(item, row tile in item, seg_len)``; item is
    ``n_items`` past the last tile. Items of other layers (with CHECK_LAYER), absorbed
    items (with PAIRED: their partners expand them) and empty items own no tiles."""
    idx = tl.arange(0, CAP)
    valid = idx < n_items
    lens = tl.load(seg_lens_ptr + idx, mask=valid, other=0)
    if CHECK_LAYER:
        lens = tl.where(tl.load(layers_ptr + idx, mask=valid, other=-1) == layer, lens, 0)
    if PAIRED:
        lens = tl.where(tl.load(partners_ptr + idx, mask=valid, other=ABSORBED) != ABSORBED, lens, 0)
    tiles = (lens + BLOCK_M - 1) // BLOCK_M
    ends = tl.cumsum(tiles, 0)
    item = tl.sum((ends <= t).to(tl.int32), 0)
    here = idx == item
    first = tl.sum(tl.where(here, ends - tiles, 0), 0)
    return item, t - first, tl.sum(tl.where(here, lens, 0), 0)


# Integer arguments Triton must not specialise (on == 1 and % 16): those that change with
# the batch (token and item counts, the split-K partials' stride, which grows with the rows)
# would each compile a new variant in the middle of serving, after the first call of a shape
# compiled every table config ahead (``ops._compile_table_configs``).
SHRINK_UNSPECIALISED = ("K", "n_tiles", "stride_ps", "num_slices", "n_items")
EXPAND_UNSPECIALISED = ("layer", "off0", "off1", "off2", "off3", "n_tiles", "m_tokens", "n_items")


@triton.jit(do_not_specialize=SHRINK_UNSPECIALISED)
def _shrink_kernel(
    x_ptr,
    a_ptr,
    out_ptr,
    part_ptr,
    count_ptr,
    seg_starts_ptr,
    seg_lens_ptr,
    slots_ptr,
    row_starts_ptr,
    ranks_ptr,
    perm_ptr,
    K,
    n_tiles,
    stride_xm,
    stride_xk,
    stride_as,
    stride_an,
    stride_ak,
    stride_om,
    stride_ps,
    stride_pm,
    num_slices,
    n_items,
    CAP: tl.constexpr,
    HAS_PERM: tl.constexpr,
    EVEN_K: tl.constexpr,
    EVEN_N: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    SPLIT_K: tl.constexpr,
):
    pid = tl.program_id(0)
    pid_k = tl.program_id(1)
    pid_n = pid % n_tiles
    item, pid_m, seg_len = _find_tile(
        pid // n_tiles, seg_lens_ptr, seg_lens_ptr, 0, seg_lens_ptr, n_items, CAP, BLOCK_M, False, False
    )
    if item >= n_items:
        return
    slot = tl.load(slots_ptr + item).to(tl.int64)
    width = tl.load(ranks_ptr + slot) * num_slices
    if pid_n * BLOCK_N >= width:
        return
    seg_start = tl.load(seg_starts_ptr + item)
    row_start = tl.load(row_starts_ptr + item)

    tokens, rows, m_mask = _tile_rows(pid_m, seg_start, row_start, seg_len, perm_ptr, HAS_PERM, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    n_mask = offs_n < width

    k_span = tl.cdiv(K, SPLIT_K * BLOCK_K) * BLOCK_K
    offs_k = pid_k * k_span + tl.arange(0, BLOCK_K)
    x_ptrs = x_ptr + tokens[:, None] * stride_xm + offs_k[None, :] * stride_xk
    a_ptrs = a_ptr + slot * stride_as + offs_n[None, :] * stride_an + offs_k[:, None] * stride_ak

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, k_span, BLOCK_K):
        if EVEN_K:
            xt = tl.load(x_ptrs, mask=m_mask[:, None], other=0.0)
            at = tl.load(a_ptrs, mask=n_mask[None, :], other=0.0)
        else:
            k_mask = offs_k + k < K
            xt = tl.load(x_ptrs, mask=m_mask[:, None] & k_mask[None, :], other=0.0)
            at = tl.load(a_ptrs, mask=n_mask[None, :] & k_mask[:, None], other=0.0)
        acc += tl.dot(xt, at)
        x_ptrs += BLOCK_K * stride_xk
        a_ptrs += BLOCK_K * stride_ak

    if EVEN_N:  # columns in [S*r, pool width) get the zeros of masked A rows: vector stores
        mask = m_mask[:, None]
    else:
        mask = m_mask[:, None] & n_mask[None, :]
    out_ptrs = out_ptr + rows[:, None] * stride_om + offs_n[None, :]
    if SPLIT_K == 1:
        tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=mask)
    else:
        part_ptrs = part_ptr + rows[:, None] * stride_pm + offs_n[None, :]
        _store_split(acc, out_ptrs, part_ptrs, count_ptr + pid, pid_k, stride_ps, mask, SPLIT_K)


@triton.jit
def _tile_rows(pid_m, seg_start, row_start, seg_len, perm_ptr, HAS_PERM: tl.constexpr, BLOCK_M: tl.constexpr):
    """Row tile ``pid_m`` of an item: each row's token (through the permutation), its
    intermediate row, and which rows lie inside the item."""
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    m_mask = offs_m < seg_len
    tokens = seg_start + offs_m
    if HAS_PERM:
        tokens = tl.load(perm_ptr + tokens, mask=m_mask, other=0)
    return tokens.to(tl.int64), (row_start + offs_m).to(tl.int64), m_mask


@triton.jit
def _store_split(acc, out_ptrs, part_ptrs, count_ptr, pid_k, stride_ps, mask, SPLIT_K: tl.constexpr):
    """Split-K: each split stores an fp32 partial; the last split of this tile to arrive
    (per-tile counter) sums the partials in split order, so the result is deterministic,
    stores it and re-arms the counter for the next launch."""
    tl.store(part_ptrs + pid_k * stride_ps, acc, mask=mask)
    tl.debug_barrier()
    arrived = tl.atomic_add(count_ptr, 1, sem="acq_rel")
    if arrived == SPLIT_K - 1:
        total = tl.zeros_like(acc)
        for split in tl.static_range(SPLIT_K):
            total += tl.load(part_ptrs + split * stride_ps, mask=mask, other=0.0, cache_modifier=".cg")
        tl.store(out_ptrs, total.to(out_ptrs.dtype.element_ty), mask=mask)
        tl.atomic_xchg(count_ptr, 0)


@triton.jit(do_not_specialize=EXPAND_UNSPECIALISED)
def _expand_kernel(
    inter_ptr,
    b_ptr,
    out_ptr,
    base_ptr,
    seg_starts_ptr,
    seg_lens_ptr,
    slots_ptr,
    scales_ptr,
    row_starts_ptr,
    layers_ptr,
    partners_ptr,
    ranks_ptr,
    perm_ptr,
    layer,
    off0,
    off1,
    off2,
    off3,
    n_tiles,
    stride_im,
    stride_ik,
    stride_bs,
    stride_bn,
    stride_bk,
    stride_om,
    stride_on,
    stride_basem,
    stride_islot,
    m_tokens,
    n_items,
    CAP: tl.constexpr,
    NUM_SLICES: tl.constexpr,
    HAS_PERM: tl.constexpr,
    CHECK_LAYER: tl.constexpr,
    PAIRED: tl.constexpr,
    ALIGNED: tl.constexpr,
    IN_GEMM: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    K_GROUP: tl.constexpr,
    USE_PDL: tl.constexpr,
):
    """``out[tokens] = base[tokens] + scale * inter @ B.T`` per item, slice and column tile.

    Separate shrink (IN_GEMM false): ``inter`` rows are the items' shrink rows and ``base``
    is ``out`` (updated in place). Shrink in the base GEMM (IN_GEMM): ``inter`` is the GEMM's
    extra columns, one row per token, slot ``j``'s block at column ``j * stride_islot``;
    ``base`` is the GEMM's own columns and ``out`` a separate tensor that every token reaches
    through some item (copy items, of the rank-0 copy slot, add nothing); rows at
    or past ``m_tokens`` (position padding past the graph's rows) are skipped. K_GROUP: how
    the partial K tile of a rank is loaded (:func:`_expand_tail`). USE_PDL: launched with
    programmatic dependent launch (:func:`expand_pdl`), so the programs may start before the
    previous kernel has finished; they wait for it before anything else."""
    if USE_PDL:
        gdc_wait()
    pid = tl.program_id(0)
    tiles_per_m = NUM_SLICES * n_tiles
    if NUM_SLICES == 1:
        s = 0  # static: the slice's inter columns start at the slot block (aligned, vector loads)
    else:
        s = (pid % tiles_per_m) // n_tiles
    pid_n = pid % n_tiles
    item, pid_m, seg_len = _find_tile(
        pid // tiles_per_m, seg_lens_ptr, layers_ptr, layer, partners_ptr, n_items, CAP, BLOCK_M, CHECK_LAYER,
        PAIRED,
    )
    if item >= n_items:
        return
    # Slice bounds from the static offsets: slice s covers output columns [lo, lo + width).
    lo = tl.where(s == 0, off0, tl.where(s == 1, off1, off2))
    width = tl.where(s == 0, off1, tl.where(s == 1, off2, off3)) - lo
    if pid_n * BLOCK_N >= width:
        return
    if not IN_GEMM:
        # Only the copy items of the shrink-in-GEMM layout have rank 0: nothing to add here.
        if tl.load(ranks_ptr + tl.load(slots_ptr + item)) == 0:
            return
    seg_start = tl.load(seg_starts_ptr + item)
    tokens, rows, m_mask = _tile_rows(
        pid_m, seg_start, tl.load(row_starts_ptr + item), seg_len, perm_ptr, HAS_PERM, BLOCK_M
    )
    if IN_GEMM:
        m_mask = m_mask & (tokens < m_tokens)
        rows = tokens
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_n = lo + cols
    if ALIGNED:  # every slice offset is a multiple of 16: vector access of the output. The hints go
        # on the derived values: tl.multiple_of on a kernel argument (lo = off0 with one slice) is lost.
        offs_n = tl.multiple_of(offs_n, 16)
        width = tl.multiple_of(width, 16)
    n_mask = cols < width
    acc = _expand_item(inter_ptr, b_ptr, slots_ptr, ranks_ptr, item, rows, s, offs_n, m_mask, n_mask, stride_im,
                       stride_ik, stride_islot, stride_bs, stride_bn, stride_bk, BLOCK_M, BLOCK_N, BLOCK_K, K_GROUP)
    acc = acc * tl.load(scales_ptr + item)
    if PAIRED:
        # The absorbed item over this item's tokens: its rows at the same offset into its segment
        # (in the GEMM's columns: the same tokens, the partner's slot block).
        partner = tl.load(partners_ptr + item)
        if partner >= 0:
            if IN_GEMM:
                p_rows = rows
            else:
                offset = tl.load(row_starts_ptr + partner) + seg_start - tl.load(seg_starts_ptr + partner)
                p_rows = (offset + pid_m * BLOCK_M + tl.arange(0, BLOCK_M)).to(tl.int64)
            p_acc = _expand_item(inter_ptr, b_ptr, slots_ptr, ranks_ptr, partner, p_rows, s, offs_n, m_mask,
                                 n_mask, stride_im, stride_ik, stride_islot, stride_bs, stride_bn, stride_bk, BLOCK_M,
                                 BLOCK_N, BLOCK_K, K_GROUP)
            acc += p_acc * tl.load(scales_ptr + partner)

    out_ptrs = out_ptr + tokens[:, None] * stride_om + offs_n[None, :] * stride_on
    base_ptrs = base_ptr + tokens[:, None] * stride_basem + offs_n[None, :] * stride_on
    mask = m_mask[:, None] & n_mask[None, :]
    base = tl.load(base_ptrs, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptrs, (base + acc).to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _expand_item(
    inter_ptr,
    b_ptr,
    slots_ptr,
    ranks_ptr,
    item,
    rows,
    s,
    offs_n,
    m_mask,
    n_mask,
    stride_im,
    stride_ik,
    stride_islot,
    stride_bs,
    stride_bn,
    stride_bk,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    K_GROUP: tl.constexpr,
):
    """Unscaled ``inter[rows, slot block + s*r:(s+1)*r] @ B[slot, offs_n, :r].T`` of one item,
    fp32 (the slot block is at ``slot * stride_islot``: 0 for a separate shrink's rows)."""
    slot = tl.load(slots_ptr + item).to(tl.int64)
    rank = tl.load(ranks_ptr + slot)
    offs_k = tl.arange(0, BLOCK_K)
    i_ptrs = (inter_ptr + rows[:, None] * stride_im + slot * stride_islot
              + (s * rank + offs_k)[None, :] * stride_ik)
    b_ptrs = b_ptr + slot * stride_bs + offs_n[None, :] * stride_bn + offs_k[:, None] * stride_bk
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    # Whole K tiles without a rank mask (vector loads), then the partial tile of the rank's rest.
    full = rank - rank % BLOCK_K
    for _ in range(0, full, BLOCK_K):
        it = tl.load(i_ptrs, mask=m_mask[:, None], other=0.0)
        bt = tl.load(b_ptrs, mask=n_mask[None, :], other=0.0)
        acc += tl.dot(it.to(bt.dtype), bt)
        i_ptrs += BLOCK_K * stride_ik
        b_ptrs += BLOCK_K * stride_bk
    if full < rank:
        acc = _expand_tail(acc, i_ptrs, b_ptrs, m_mask, n_mask, offs_k, rank - full, BLOCK_K, K_GROUP)
    return acc


@triton.jit
def _expand_tail(acc, i_ptrs, b_ptrs, m_mask, n_mask, offs_k, left, BLOCK_K: tl.constexpr, K_GROUP: tl.constexpr):
    """``acc += inter_tile @ B_tile`` over the first ``left`` (< BLOCK_K) columns of a K tile.

    A mask on the columns makes every load of the tile an element load, and those more than
    doubled the kernel's registers in some configs (``bench/expand_registers.py`` counts them).
    With K_GROUP > 1 the tile is loaded in whole groups of K_GROUP columns (all of it when
    K_GROUP is BLOCK_K: no column mask at all), as vectors where the tile starts aligned (B's
    always; the intermediate's with one slice: slice s starts at column s * rank), and the
    columns at and past ``left`` are zeroed in registers. Whatever memory holds there (the next
    slice's columns, an earlier adapter's weights, an intermediate never written, NaN) never
    reaches the sum, and the dot gets the operands the masked loads gave, so the result is the
    same bit for bit. The launcher picks K_GROUP dividing the pool's max rank, so the groups
    read end at or before it (:func:`_k_group`)."""
    if K_GROUP < BLOCK_K:
        k_load = offs_k < tl.cdiv(left, K_GROUP) * K_GROUP
        i_mask = m_mask[:, None] & k_load[None, :]
        b_mask = n_mask[None, :] & k_load[:, None]
    else:
        i_mask = m_mask[:, None]
        b_mask = n_mask[None, :]
    it = tl.load(i_ptrs, mask=i_mask, other=0.0)
    bt = tl.load(b_ptrs, mask=b_mask, other=0.0)
    if K_GROUP > 1:
        k_mask = offs_k < left
        it = tl.where(k_mask[None, :], it, 0.0)
        bt = tl.where(k_mask[:, None], bt, 0.0)
    return acc + tl.dot(it.to(bt.dtype), bt)


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _row_tiles(row_bound: int, block_m: int, n_items: int) -> int:
    """Static bound on the row tiles of items with at most ``row_bound`` rows in all:
    each item adds at most one partial tile, and every tile holds at least one row."""
    return min(_cdiv(row_bound, block_m) + n_items, row_bound)


def _cap(n_items: int) -> int:
    """Vector width of the tile search: a power of two >= the item count."""
    return max(16, 1 << (n_items - 1).bit_length())


def launch_shrink(
    x: torch.Tensor,
    a_buffer: torch.Tensor,
    out: torch.Tensor,
    seg_starts: torch.Tensor,
    seg_lens: torch.Tensor,
    slots: torch.Tensor,
    row_starts: torch.Tensor,
    ranks: torch.Tensor,
    permutation: torch.Tensor | None,
    num_slices: int,
    row_bound: int,
    config: ShrinkConfig,
    compile_only: bool = False,
) -> None:
    """Write ``x[tokens of item] @ A[slot, :S*r].T`` into ``out[rows of item, :S*r]``.

    ``out`` is ``[rows, S * max_rank]`` (contiguous rows); rows of no item are left
    untouched, columns at and past ``S * r_slot`` untouched or zero. ``row_bound`` is a
    static upper bound on the sum of ``seg_lens``; the item count is ``seg_lens.numel()``
    (entries with length 0 do nothing). ``compile_only``: compile the kernel these
    arguments select, launch nothing.
    """
    call = _shrink_call(x, a_buffer, out, seg_starts, seg_lens, slots, row_starts, ranks, permutation, num_slices,
                        row_bound, config)
    if call is not None:
        _launch(_SHRINK, *call, config, compile_only)


def prepare_shrink(
    x: torch.Tensor,
    a_buffer: torch.Tensor,
    out: torch.Tensor,
    seg_starts: torch.Tensor,
    seg_lens: torch.Tensor,
    slots: torch.Tensor,
    row_starts: torch.Tensor,
    ranks: torch.Tensor,
    permutation: torch.Tensor | None,
    num_slices: int,
    row_bound: int,
    config: ShrinkConfig,
) -> PreparedLaunch | None:
    """:func:`launch_shrink` with these arguments, prepared: ``prepared(x, a_buffer, out)``
    launches it for other tensors of the same shapes and strides (None: nothing to run)."""
    call = _shrink_call(x, a_buffer, out, seg_starts, seg_lens, slots, row_starts, ranks, permutation, num_slices,
                        row_bound, config)
    return None if call is None else PreparedLaunch(_SHRINK, *call, config.num_warps, config.num_stages, lead=3)


def _shrink_call(
    x, a_buffer, out, seg_starts, seg_lens, slots, row_starts, ranks, permutation, num_slices, row_bound, config,
):
    n_items = seg_lens.numel()
    if n_items == 0 or row_bound == 0:
        return None
    n_max = a_buffer.shape[1]
    if out.dim() != 2 or out.shape[1] != n_max or out.stride(1) != 1:
        raise ValueError(f"shrink output must be [rows, {n_max}] with contiguous rows")
    k_dim = x.shape[1]
    n_tiles = _cdiv(n_max, config.block_n)
    grid = (_row_tiles(row_bound, config.block_m, n_items) * n_tiles, config.split_k)
    if config.split_k > 1:
        if grid[0] > COUNTER_SLOTS:
            raise ValueError(f"{grid[0]} split-K tiles exceed {COUNTER_SLOTS} counters")
        # The real shape also when only compiling: Triton specialises integer arguments on
        # == 1 and % 16, so a stand-in of shape (split_k, 1, 1) (strides 1) compiled a variant
        # no launch uses, and the first launch compiled the real one while serving.
        partials = torch.empty((config.split_k, *out.shape), dtype=torch.float32, device=out.device)
        counters = split_counters(out.device)
    else:
        partials = counters = out
    args = (
        x,
        a_buffer,
        out,
        partials,
        counters,
        seg_starts,
        seg_lens,
        slots,
        row_starts,
        ranks,
        seg_starts if permutation is None else permutation,
        k_dim,
        n_tiles,
        x.stride(0),
        x.stride(1),
        a_buffer.stride(0),
        a_buffer.stride(1),
        a_buffer.stride(2),
        out.stride(0),
        partials.stride(0) if config.split_k > 1 else 0,
        partials.stride(1) if config.split_k > 1 else 0,
        num_slices,
        n_items,
    )
    constexprs = {
        "CAP": _cap(n_items),
        "HAS_PERM": permutation is not None,
        "EVEN_K": k_dim % (config.split_k * config.block_k) == 0,
        "EVEN_N": n_max % config.block_n == 0,
        "BLOCK_M": config.block_m,
        "BLOCK_N": config.block_n,
        "BLOCK_K": config.block_k,
        "SPLIT_K": config.split_k,
    }
    return grid, args, constexprs


def launch_expand(
    inter: torch.Tensor,
    b_buffer: torch.Tensor,
    output: torch.Tensor,
    seg_starts: torch.Tensor,
    seg_lens: torch.Tensor,
    slots: torch.Tensor,
    scales: torch.Tensor,
    row_starts: torch.Tensor,
    layers: torch.Tensor | None,
    num_layers: int,
    ranks: torch.Tensor,
    permutation: torch.Tensor | None,
    slice_offsets: list[int] | tuple[int, ...],
    row_bound: int,
    config: ExpandConfig,
    compile_only: bool = False,
    partners: torch.Tensor | None = None,
    in_gemm: InGemmLayout | None = None,
) -> None:
    """``output[tokens, slice s] += scale * inter[rows, s*r:(s+1)*r] @ B[slot, slice s, :r].T``.

    ``inter`` is ``[rows, >= S * max_rank]``.
    One launch per layer (``num_layers`` is a static bound; each launch schedules only
    its layer's items), so items that share tokens never update the same output
    concurrently. ``row_bound`` bounds the rows of one layer (at most the tokens).
    ``partners`` (:mod:`sglang_vlora.atmm.work_items`'s pairs): each item also adds the
    item it absorbs, absorbed items get no tiles of their own; ``layers`` and
    ``num_layers`` then describe the items left (one layer for mixture's pairs).
    ``compile_only``: compile the kernel these arguments select, launch nothing; for an
    in-GEMM expand both of its PDL variants where batches of this shape may take either
    (:func:`expand_pdl` decides by the rows, which a compile ahead does not know).
    ``in_gemm``: the shrink ran inside the base GEMM (:class:`InGemmLayout`): ``inter`` is
    the GEMM's extra columns (a row per token), ``output`` a separate tensor that gets
    ``in_gemm.base + LoRA`` for every token the items cover.
    """
    calls = _expand_calls(inter, b_buffer, output, seg_starts, seg_lens, slots, scales, row_starts, layers,
                          num_layers, ranks, permutation, slice_offsets, row_bound, config, partners, in_gemm)
    if compile_only:
        grid, args, constexprs = calls[0]
        some_batch_pdl = in_gemm is not None and expand_pdl(output.device, 1, len(slice_offsets) - 1)
        for use_pdl in (False, True) if some_batch_pdl else (False,):
            _launch(_EXPAND, grid, args, {**constexprs, "USE_PDL": use_pdl}, config, True)
        return
    for call in calls:
        _launch(_EXPAND, *call, config, False)


def prepare_expand(
    inter: torch.Tensor,
    b_buffer: torch.Tensor,
    output: torch.Tensor,
    seg_starts: torch.Tensor,
    seg_lens: torch.Tensor,
    slots: torch.Tensor,
    scales: torch.Tensor,
    row_starts: torch.Tensor,
    layers: torch.Tensor | None,
    num_layers: int,
    ranks: torch.Tensor,
    permutation: torch.Tensor | None,
    slice_offsets: list[int] | tuple[int, ...],
    row_bound: int,
    config: ExpandConfig,
    partners: torch.Tensor | None = None,
    in_gemm: InGemmLayout | None = None,
    m_tokens: int | None = None,
) -> list[PreparedLaunch]:
    """:func:`launch_expand` with these arguments, prepared: one launch per overlap layer,
    each called as ``prepared(inter, b_buffer, output, base)``, where ``base`` is the tensor
    the kernel reads the base from: the output itself, updated in place, or with ``in_gemm``
    the base columns of the GEMM's output (``in_gemm.base``'s shape and strides).
    ``m_tokens``: with ``in_gemm``, the tokens past which items' positions are skipped
    (default ``output.shape[0]``); a launch kept for outputs of up to ``m_tokens`` rows passes
    its bound, and items that reach no further than each call's rows."""
    calls = _expand_calls(inter, b_buffer, output, seg_starts, seg_lens, slots, scales, row_starts, layers,
                          num_layers, ranks, permutation, slice_offsets, row_bound, config, partners, in_gemm,
                          m_tokens)
    return [PreparedLaunch(_EXPAND, *call, config.num_warps, config.num_stages, lead=4) for call in calls]


def _expand_calls(
    inter, b_buffer, output, seg_starts, seg_lens, slots, scales, row_starts, layers, num_layers, ranks, permutation,
    slice_offsets, row_bound, config, partners=None, in_gemm=None, m_tokens=None,
) -> list[tuple]:
    n_items = seg_lens.numel()
    if in_gemm is not None and num_layers > 1:
        raise ValueError("the shrink-in-GEMM expand writes each token once: one layer of items (or pairs)")
    num_slices = len(slice_offsets) - 1
    if not 1 <= num_slices <= 3:
        raise ValueError(f"1 to 3 slices are supported, got {num_slices}")
    if n_items == 0 or row_bound == 0:
        return []
    offs = [int(o) for o in slice_offsets] + [int(slice_offsets[-1])] * (4 - len(slice_offsets))
    max_width = max(offs[i + 1] - offs[i] for i in range(num_slices))
    n_tiles = _cdiv(max_width, config.block_n)
    grid = (_row_tiles(row_bound, config.block_m, n_items) * num_slices * n_tiles,)
    check_layer = num_layers > 1
    constexprs = {
        "CAP": _cap(n_items),
        "NUM_SLICES": num_slices,
        "HAS_PERM": permutation is not None,
        "CHECK_LAYER": check_layer,
        "PAIRED": partners is not None,
        "ALIGNED": all(o % 16 == 0 for o in offs),
        "IN_GEMM": in_gemm is not None,
        "BLOCK_M": config.block_m,
        "BLOCK_N": config.block_n,
        "BLOCK_K": config.block_k,
        "K_GROUP": _k_group(inter, b_buffer, num_slices, config.block_k, in_gemm),
        "USE_PDL": in_gemm is not None and expand_pdl(output.device, row_bound, num_slices),
    }
    calls = []
    for layer in range(num_layers):
        args = (
            inter,
            b_buffer,
            output,
            output if in_gemm is None else in_gemm.base,
            seg_starts,
            seg_lens,
            slots,
            scales,
            row_starts,
            layers if check_layer else seg_lens,
            seg_lens if partners is None else partners,
            ranks,
            seg_starts if permutation is None else permutation,
            layer,
            *offs,
            n_tiles,
            inter.stride(0),
            inter.stride(1),
            b_buffer.stride(0),
            b_buffer.stride(1),
            b_buffer.stride(2),
            output.stride(0),
            output.stride(1),
            output.stride(0) if in_gemm is None else in_gemm.base.stride(0),
            0 if in_gemm is None else in_gemm.slot_width * inter.stride(1),
            output.shape[0] if m_tokens is None else m_tokens,
            n_items,
        )
        calls.append((grid, args, constexprs))
    return calls


# The most rows an in-GEMM expand launched with PDL has. Up to 48 tokens the base GEMM that
# precedes it lets its dependents start early in the o-projection shapes; from 64 cuBLAS runs
# another kernel, where PDL gained in one cell and cost up to 1.8 points of the GEMM in the
# others (bench/expand_pdl.py: H200, 4096- and 3584-wide projections at 1-128 tokens).
PDL_MAX_ROWS = 48
# The most slices an in-GEMM expand launched with PDL has. After Qwen2-VL-7B's q/k/v GEMM PDL
# cost 0.1-0.3 us an expand, after the 3x4096 q/k/v nothing measurable, after a 2x11008 gate/up
# 0.3-0.6 us less (bench/expand_pdl.py, H200); one slice (o, down) is where it gains on the
# model the benchmarks serve: 5-9 us less a Qwen2-VL-7B decode graph step than at every slice count.
PDL_MAX_SLICES = 1


def expand_pdl(device: torch.device, rows: int, num_slices: int) -> bool:
    """Whether an in-GEMM expand of at most ``rows`` rows and ``num_slices`` slices on
    ``device`` is launched with programmatic dependent launch (PDL): a CUDA device of compute
    capability 9.0 or later (Hopper's grid dependency control), at most :data:`PDL_MAX_ROWS`
    rows and :data:`PDL_MAX_SLICES` slices, and ``SGLANG_VLORA_PDL`` not ``0``.

    The expand follows the base GEMM that computed its inputs. With PDL its programs can be
    scheduled while that GEMM's last tiles finish, where cuBLAS's kernel allows it, instead of
    after the GEMM has completed; each program waits for the GEMM (``gdc_wait``) before it reads
    anything, so the result is the same bit for bit. In a decode graph step of Qwen2-VL-7B's
    q/k/v and o projections this took 21-34 us (7-10%) off the LoRA's cost at 8-48 requests on the
    H200 (``bench/expand_pdl.py``, ``bench/graph_step.py``). The driver's direct launch
    (:mod:`sglang_vlora.atmm.driver_launch`) cannot set the launch attribute, so prepared launches
    of this kernel go through Triton's launcher; launched without the attribute, the wait would
    be a no-op and the launch an ordinary one."""
    return (device.type == "cuda" and rows <= PDL_MAX_ROWS and num_slices <= PDL_MAX_SLICES and pdl_setting()
            and _capability(device.index) >= (9, 0))


@functools.cache
def _capability(index: int | None) -> tuple[int, int]:
    return torch.cuda.get_device_capability(index)


def _k_group(
    inter: torch.Tensor, b_buffer: torch.Tensor, num_slices: int, block_k: int, in_gemm: InGemmLayout | None
) -> int:
    """Columns the expand's partial K tile loads as one group (:func:`_expand_tail`): the
    largest power of two dividing BLOCK_K and the pool's max rank (BLOCK_K itself where the
    max rank is a multiple of it: the partial tile is then read whole); 1 (element loads)
    where the intermediate's rows (a slot's block, in the GEMM's columns) are narrower than
    every slice at the max rank.

    Only the pool's and the buffers' shapes decide it, and they are fixed for a captured
    graph; the kernel is right for every rank up to the max rank, since a group that holds
    a rank's last column ends at or before the max rank. An adapter of any rank loaded
    after capture is therefore computed right. A flag that skips the partial tile where
    every rank is a multiple of BLOCK_K would have to be derived from the ranks themselves,
    which can change after capture: there is none."""
    max_rank = b_buffer.shape[2]
    width = inter.shape[1] if in_gemm is None else in_gemm.slot_width
    if width < num_slices * max_rank:
        return 1
    return math.gcd(block_k, max_rank)


_SHRINK = FastLauncher(_shrink_kernel)
_EXPAND = FastLauncher(_expand_kernel)


def _launch(launcher: FastLauncher, grid, args: tuple, constexprs: dict, config, compile_only: bool) -> None:
    """Launch, or with ``compile_only`` compile and load without launching
    (:func:`sglang_vlora.atmm.launch_compiles.compile_and_load`)."""
    if compile_only:
        compile_and_load(launcher.fn, grid, args, constexprs, config.num_warps, config.num_stages,
                         **launch_options(constexprs))
        return
    launcher(grid, args, constexprs, config.num_warps, config.num_stages)
