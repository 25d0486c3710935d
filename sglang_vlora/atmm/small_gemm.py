"""Base GEMM, shrink and expand in one launch, for eager batches of a few tokens.

An eager forward of a few tokens (a new request's prefill while others decode) is bound by
the host: every kernel launch's host time adds to the latency, and the GPU waits between
them (docs/perf.md). The in-GEMM path still launches two kernels a module (the base GEMM over
the weight with the pool's A rows appended, then the expand), the first through
``torch.nn.functional.linear``, whose host time (about 24 us a call on the benchmark H200's
host) is more than a direct launch's. Here one Triton kernel computes, per row tile of one
item and column tile of one slice,

    out[tokens, cols] = x[tokens] W[cols]^T + b[cols] + scale * bf16(x[tokens] A_slot,s^T) B_slot[cols]^T

with the shrink accumulated in the same K loop as the base (each program recomputes its
item's ``x A^T``: a few tokens make that a few MB read from L2), and launched through the
kept plans' direct launch. Which rows of ``x`` belong to which adapter comes from the eager
static items (:class:`~sglang_vlora.atmm.static_items.StaticWorkItems` with copy items, rank 0,
over the tokens without an adapter), so every token is written once.

Only single-layer items (no mixture pairs: nothing merged) are run; the caller keeps the
in-GEMM path for the rest. The intermediate is rounded to the activations' dtype before the
expand, as the GEMM's extra columns are in the in-GEMM path; the base is not rounded before
the LoRA is added (one rounding of the sum).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from sglang_vlora.atmm.fast_launch import FastLauncher, PreparedLaunch
from sglang_vlora.atmm.static_items import StaticWorkItems
from sglang_vlora.atmm.triton_kernels import _cap, _find_tile, _launch, _row_tiles, _tile_rows

BLOCK_M = 16  # a tile of rows of one item; the batches this serves have a few tokens per request
MAX_SLICES = 3
# The largest pool max rank it runs. Each pipeline stage holds an A tile of the max rank's rows and
# every program reads its item's A slice whole, so shared memory and GPU time grow with the rank
# (54 KB at 64, 78 KB at 128 for sm_80-90: bench/small_gemm_resources.py); only up to 64 was timed
# on a GPU. The in-GEMM call runs larger ranks.
MAX_RANK = 64


@dataclass(frozen=True)
class SmallGemmConfig:
    block_n: int = 64
    block_k: int = 64
    num_warps: int = 4
    num_stages: int = 4


# One config for every module shape: the batches it runs are bound by the host, not the GPU.
CONFIG = SmallGemmConfig()

# Integer arguments that change with the module shape or the kept plan's token bound: not
# specialised, so a new shape or bound compiles nothing while serving.
UNSPECIALISED = ("off0", "off1", "off2", "off3", "tiles1", "tiles2", "n_tiles", "K", "m_tokens", "n_items")


@triton.jit(do_not_specialize=UNSPECIALISED)
def _small_gemm_lora_kernel(
    x_ptr,
    w_ptr,
    bias_ptr,
    a_ptr,
    b_ptr,
    out_ptr,
    seg_starts_ptr,
    seg_lens_ptr,
    slots_ptr,
    scales_ptr,
    ranks_ptr,
    perm_ptr,
    off0,
    off1,
    off2,
    off3,
    tiles1,
    tiles2,
    n_tiles,
    K,
    stride_xm,
    stride_wn,
    stride_as,
    stride_an,
    stride_bs,
    stride_bn,
    stride_om,
    m_tokens,
    n_items,
    CAP: tl.constexpr,
    NUM_SLICES: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    EVEN_K: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    BLOCK_R: tl.constexpr,
):
    """Program ``pid``: column tile ``pid % n_tiles`` over the slices' tiles (slice 0's first,
    ``tiles1`` and ``tiles2`` where slices 1 and 2 start), row tile ``pid // n_tiles`` of the
    items' flat row tiles. The K dimension of ``x``, ``W``, ``A`` and the rank dimension of ``B``
    are contiguous. Rows of ``A`` and columns of ``B`` past the slot's rank are never read."""
    pid = tl.program_id(0)
    pid_n = pid % n_tiles
    if NUM_SLICES == 1:
        s = 0
        lo = off0
        width = off1 - off0
    else:
        s = (pid_n >= tiles1).to(tl.int32) + (pid_n >= tiles2).to(tl.int32)
        pid_n -= tl.where(s == 0, 0, tl.where(s == 1, tiles1, tiles2))
        lo = tl.where(s == 0, off0, tl.where(s == 1, off1, off2))
        width = tl.where(s == 0, off1, tl.where(s == 1, off2, off3)) - lo
    item, pid_m, seg_len = _find_tile(
        pid // n_tiles, seg_lens_ptr, seg_lens_ptr, 0, seg_lens_ptr, n_items, CAP, BLOCK_M, False, False
    )
    if item >= n_items:
        return
    slot = tl.load(slots_ptr + item).to(tl.int64)
    rank = tl.load(ranks_ptr + slot)
    tokens, _, m_mask = _tile_rows(pid_m, tl.load(seg_starts_ptr + item), 0, seg_len, perm_ptr, True, BLOCK_M)
    m_mask = m_mask & (tokens < m_tokens)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_n = (lo + cols).to(tl.int64)
    n_mask = cols < width
    offs_k = tl.arange(0, BLOCK_K)
    offs_r = tl.arange(0, BLOCK_R)
    r_mask = offs_r < rank
    x_ptrs = x_ptr + tokens[:, None] * stride_xm + offs_k[None, :]
    w_ptrs = w_ptr + offs_n[None, :] * stride_wn + offs_k[:, None]
    a_ptrs = a_ptr + slot * stride_as + (s * rank + offs_r)[None, :].to(tl.int64) * stride_an + offs_k[:, None]

    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    inter = tl.zeros((BLOCK_M, BLOCK_R), dtype=tl.float32)
    for k in range(0, K, BLOCK_K):
        if EVEN_K:
            xt = tl.load(x_ptrs, mask=m_mask[:, None], other=0.0)
            wt = tl.load(w_ptrs, mask=n_mask[None, :], other=0.0)
        else:
            k_mask = offs_k + k < K
            xt = tl.load(x_ptrs, mask=m_mask[:, None] & k_mask[None, :], other=0.0)
            wt = tl.load(w_ptrs, mask=n_mask[None, :] & k_mask[:, None], other=0.0)
        # No branch on the rank in the loop (a rank-0 item's A loads are all masked): a branch
        # keeps Triton from pipelining the loads, and the loop then waits on every tile.
        if EVEN_K:
            at = tl.load(a_ptrs, mask=r_mask[None, :], other=0.0)
        else:
            at = tl.load(a_ptrs, mask=r_mask[None, :] & k_mask[:, None], other=0.0)
        acc += tl.dot(xt, wt)
        inter += tl.dot(xt, at)
        x_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
        a_ptrs += BLOCK_K

    if rank > 0:
        b_ptrs = b_ptr + slot * stride_bs + offs_n[None, :] * stride_bn + offs_r[:, None]
        bt = tl.load(b_ptrs, mask=r_mask[:, None] & n_mask[None, :], other=0.0)
        acc += tl.dot(inter.to(bt.dtype), bt) * tl.load(scales_ptr + item)
    if HAS_BIAS:
        acc += tl.load(bias_ptr + offs_n, mask=n_mask, other=0.0).to(tl.float32)
    out_ptrs = out_ptr + tokens[:, None] * stride_om + offs_n[None, :]
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=m_mask[:, None] & n_mask[None, :])


_LAUNCHER = FastLauncher(_small_gemm_lora_kernel)
LEAD = 6  # x, weight, bias, A, B, output: what differs from one layer or call to the next


def unsupported(weight: torch.Tensor, out_features: int, a_buffer: torch.Tensor, b_buffer: torch.Tensor,
                items: StaticWorkItems, slice_offsets: list[int] | tuple[int, ...]) -> str | None:
    """Why one launch cannot run this module over ``items``, or None where it can."""
    num_slices = len(slice_offsets) - 1
    if weight.is_cuda and weight.dtype not in (torch.bfloat16, torch.float16):
        return f"{weight.dtype} weights (Triton's dot would run the base GEMM in TF32)"
    if not 1 <= num_slices <= MAX_SLICES:
        return f"{num_slices} slices (1 to {MAX_SLICES} are supported)"
    if not items.covers_tokens:
        return "items that do not cover every token (covers_tokens)"
    if items.paired or items.max_layers != 1:
        return "items in more than one layer (an adapter merged)"
    if slice_offsets[-1] != out_features or weight.shape[0] < out_features:
        return f"slices ending at {slice_offsets[-1]} over {out_features} output features of {weight.shape[0]} rows"
    if a_buffer.dim() != 3 or b_buffer.dim() != 3 or a_buffer.shape[2] != weight.shape[1]:
        return f"A {tuple(a_buffer.shape)} and B {tuple(b_buffer.shape)} over a weight of {weight.shape[1]} inputs"
    if b_buffer.shape[1] < out_features or a_buffer.shape[1] < num_slices * b_buffer.shape[2]:
        return f"A {tuple(a_buffer.shape)} and B {tuple(b_buffer.shape)} for {num_slices} slices"
    if b_buffer.shape[2] > MAX_RANK:
        return f"pool max rank {b_buffer.shape[2]} above {MAX_RANK}"
    if weight.stride(1) != 1 or a_buffer.stride(2) != 1 or b_buffer.stride(2) != 1:
        return "a weight, A or B whose last dimension is not contiguous"
    return None


def _call(x, weight, bias, a_buffer, b_buffer, out, items: StaticWorkItems, slice_offsets, bound: int,
          config: SmallGemmConfig) -> tuple:
    why = unsupported(weight, out.shape[1], a_buffer, b_buffer, items, slice_offsets)
    if why is not None:
        raise ValueError(f"one launch cannot run this module: {why}")
    return launch_args(x, weight, bias, a_buffer, b_buffer, out, items, slice_offsets, bound, config)


def launch_args(x, weight, bias, a_buffer, b_buffer, out, items: StaticWorkItems, slice_offsets, bound: int,
                config: SmallGemmConfig) -> tuple:
    """``(grid, args, constexprs)`` of the launch, for operands :func:`unsupported` accepts (it is
    not asked here: ``bench/small_gemm_resources.py`` also builds launches past ``MAX_RANK``)."""
    if x.dim() != 2 or x.stride(1) != 1 or out.stride(1) != 1 or x.shape[1] != weight.shape[1]:
        raise ValueError(f"x {tuple(x.shape)} and output {tuple(out.shape)} need contiguous rows over "
                         f"{weight.shape[1]} inputs")
    offs = [int(o) for o in slice_offsets] + [int(slice_offsets[-1])] * (MAX_SLICES + 1 - len(slice_offsets))
    tiles = [-(-(offs[i + 1] - offs[i]) // config.block_n) for i in range(MAX_SLICES)]
    n_tiles = sum(tiles)
    n_items = items.capacity
    grid = (_row_tiles(bound, BLOCK_M, n_items) * n_tiles,)
    max_rank = b_buffer.shape[2]
    args = (
        x, weight, weight if bias is None else bias, a_buffer, b_buffer, out,
        items.seg_starts, items.seg_lens, items.slots, items.scales, items.ranks, items.permutation,
        *offs, tiles[0], tiles[0] + tiles[1], n_tiles, x.shape[1],
        x.stride(0), weight.stride(0), a_buffer.stride(0), a_buffer.stride(1), b_buffer.stride(0),
        b_buffer.stride(1), out.stride(0), bound, n_items,
    )  # fmt: skip
    constexprs = {
        "CAP": _cap(n_items),
        "NUM_SLICES": len(slice_offsets) - 1,
        "HAS_BIAS": bias is not None,
        "EVEN_K": x.shape[1] % config.block_k == 0,
        "BLOCK_M": BLOCK_M,
        "BLOCK_N": config.block_n,
        "BLOCK_K": config.block_k,
        "BLOCK_R": max(16, 1 << (max_rank - 1).bit_length()),
    }
    return grid, args, constexprs


def launch(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, a_buffer: torch.Tensor,
           b_buffer: torch.Tensor, out: torch.Tensor, items: StaticWorkItems, slice_offsets: list[int],
           bound: int | None = None, config: SmallGemmConfig = CONFIG, compile_only: bool = False) -> None:
    """Write ``x W^T + b + LoRA`` of every token the ``items`` reach into ``out``: ``W`` is the
    first ``out.shape[1]`` rows of ``weight`` (a weight with the pool's A rows appended serves as
    it is), ``A [slots, S * max_rank, d_in]`` and ``B [slots, out_features, max_rank]`` the pool.
    ``bound``: the most tokens the grid is sized for (default: ``x``'s rows); the items must not
    reach past it. ``compile_only``: compile the kernel, launch nothing."""
    grid, args, constexprs = _call(x, weight, bias, a_buffer, b_buffer, out, items, slice_offsets,
                                   x.shape[0] if bound is None else bound, config)
    _launch(_LAUNCHER, grid, args, constexprs, config, compile_only)


def prepare(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, a_buffer: torch.Tensor,
            b_buffer: torch.Tensor, out: torch.Tensor, items: StaticWorkItems, slice_offsets: list[int], bound: int,
            config: SmallGemmConfig = CONFIG) -> PreparedLaunch:
    """:func:`launch` prepared for batches of up to ``bound`` tokens over ``items``' buffers:
    ``prepared(x, weight, bias_or_weight, a_buffer, b_buffer, out)`` (the weight in place of a
    missing bias) for tensors of the same shapes and strides but ``x``'s and ``out``'s rows."""
    grid, args, constexprs = _call(x, weight, bias, a_buffer, b_buffer, out, items, slice_offsets, bound, config)
    return PreparedLaunch(_LAUNCHER, grid, args, constexprs, config.num_warps, config.num_stages, lead=LEAD)
