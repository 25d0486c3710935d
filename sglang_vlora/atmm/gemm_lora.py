"""The base GEMM that adds the LoRA delta in its own accumulator (eager prefill batches).

Every other entry point ends in an expand that reads or writes the whole output beside the
base GEMM, and that expand is bound by its per-tile work, not its bytes (docs/atmm.md). Here
one Triton GEMM over the base weight, loading and storing through tensor descriptors (the
copy engine), computes ``x W^T (+ b)`` and, before its tile is stored, adds each token's
``scale * inter @ B^T``: one MMA of depth ``max_rank`` per slot among the tile's rows, so the
output is written once. ``inter`` is ATMM's shrink with its rows at the tokens' positions
(:func:`sglang_vlora.atmm.ops.lora_apply_gemm` runs it); rows of tokens no item covers are
never read unmasked.

What it needs (:func:`unsupported` says which is missing): CUDA tensors in bf16/fp16, items
without a permutation (the shrink's rows are then the tokens) that do not overlap (one
contribution per token: no mixture pairs, no second layer), slice offsets that are multiples
of the tile's columns, and row strides that are multiples of 16 bytes (tensor descriptors).

``bench/gemm_epilogue.py`` measured the design before it was built; ``bench/kernels.py``
times this entry point as ``atmm_gemm``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from sglang_vlora.atmm.fast_launch import FastLauncher
from sglang_vlora.atmm.launch_compiles import compile_and_load
from sglang_vlora.atmm.work_items import WorkItems

DTYPES = (torch.bfloat16, torch.float16)


@dataclass(frozen=True)
class GemmConfig:
    """One tile shape of the GEMM (the probe's best on the H200: 128x256x64, 8 warps, 3 stages;
    ``bench/gemm_epilogue.py``)."""

    block_m: int = 128
    block_n: int = 256
    block_k: int = 64
    group_m: int = 8
    num_warps: int = 8
    num_stages: int = 3


DEFAULT_CONFIG = GemmConfig()


def config_for(max_rank: int) -> GemmConfig:
    """The tile config for a pool of ``max_rank``: above 64 the LoRA tiles need the shared
    memory of a pipeline stage of 128x256 tiles (3 stages ran out of it at rank 128 on the
    H200, 2 stages cost 79-100% of the base GEMM), so the tiles are 128 columns wide."""
    return DEFAULT_CONFIG if max_rank <= 64 else GemmConfig(block_n=128)


@triton.jit
def tile_origin(tile, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """``(row0, col0)`` of output tile ``tile``: tiles run GROUP_M row tiles at a time down each
    column of tiles, so the weight tile they share is still in L2."""
    num_m = tl.cdiv(M, BLOCK_M)
    per_group = GROUP_M * tl.cdiv(N, BLOCK_N)
    first_m = (tile // per_group) * GROUP_M
    size_m = min(num_m - first_m, GROUP_M)
    return (first_m + (tile % per_group) % size_m) * BLOCK_M, ((tile % per_group) // size_m) * BLOCK_N


@triton.jit
def lora_tile(acc, i_desc, bb_desc, slot, slots, scales, ranks_ptr, row0, col0, s, N, slot_width,
              R_BLOCK: tl.constexpr, DTYPE: tl.constexpr):
    """``acc + scale * inter @ B^T`` over the tile's rows of ``slot``: the other rows, and the
    columns past the slot's rank (the next slice's, or stale pool columns), masked to zero.
    ``slot_width``: the intermediate's columns per slot (0: each row holds its own slot's only)."""
    offs_r = tl.arange(0, R_BLOCK)
    rank = tl.load(ranks_ptr + slot)
    part_i = i_desc.load([row0, slot * slot_width + s * rank]).to(tl.float32)
    keep = (slots == slot)[:, None] & (offs_r[None, :] < rank)
    part_i = tl.where(keep, part_i * scales[:, None], 0.0).to(DTYPE)
    part_b = bb_desc.load([slot * N + col0, 0])
    part_b = tl.where(offs_r[None, :] < rank, part_b, 0.0).to(DTYPE)
    return tl.dot(part_i, part_b.T, acc)


# The token count changes with every batch: not specialised (on == 1 and % 16), so one compiled
# variant per module shape serves every batch (compile_ahead compiles it before serving).
@triton.jit(do_not_specialize=("M",))
def _gemm_lora_kernel(x_desc, w_desc, out_desc, i_desc, bb_desc, bias_ptr, tok_slots_ptr, tok_scales_ptr, ranks_ptr,
                      M, N, K, off1, off2, HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                      BLOCK_K: tl.constexpr, R_BLOCK: tl.constexpr, GROUP_M: tl.constexpr):
    """One output tile: the K loop over ``x`` and ``W``, then one LoRA MMA for the lowest and
    one for the highest slot among the tile's rows, and a loop over any slots between them (a
    run-time loop over all of them cost 34-50 points in the probe: docs/atmm.md)."""
    row0, col0 = tile_origin(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    dtype = out_desc.dtype
    # The rows' slots before the K loop: their loads' latency hides under it.
    rows = row0 + tl.arange(0, BLOCK_M)
    valid = rows < M
    slots = tl.load(tok_slots_ptr + rows, mask=valid, other=-1)
    scales = tl.load(tok_scales_ptr + rows, mask=valid, other=0.0)
    s = (col0 >= off1).to(tl.int32) + (col0 >= off2).to(tl.int32)  # the tile's slice
    lo = tl.min(tl.where(slots >= 0, slots, 1 << 30))
    hi = tl.max(slots)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        acc = tl.dot(x_desc.load([row0, k * BLOCK_K]), w_desc.load([col0, k * BLOCK_K]).T, acc)
    if hi >= 0:
        acc = lora_tile(acc, i_desc, bb_desc, lo, slots, scales, ranks_ptr, row0, col0, s, N, 0, R_BLOCK, dtype)
    if hi > lo:
        acc = lora_tile(acc, i_desc, bb_desc, hi, slots, scales, ranks_ptr, row0, col0, s, N, 0, R_BLOCK, dtype)
        for slot in range(lo + 1, hi):
            acc = lora_tile(acc, i_desc, bb_desc, slot, slots, scales, ranks_ptr, row0, col0, s, N, 0, R_BLOCK,
                                dtype)
    if HAS_BIAS:
        cols = col0 + tl.arange(0, BLOCK_N)
        acc += tl.load(bias_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)[None, :]
    out_desc.store([row0, col0], acc.to(dtype))


def unsupported(x: torch.Tensor, weight: torch.Tensor, b_buffer: torch.Tensor, slice_offsets: list[int],
                items: WorkItems | None = None, config: GemmConfig | None = None) -> str | None:
    """Why this GEMM cannot run these operands (and ``items``, where given), or None."""
    if not x.is_cuda and os.environ.get("TRITON_INTERPRET") != "1":
        return "not a CUDA tensor (or Triton's interpreter)"
    if x.is_cuda and x.dtype not in DTYPES:
        return f"dtype {x.dtype} (bf16 or fp16 only)"
    if items is not None and items.permutation is not None:
        return "a permuted batch (the shrink's rows would not be the tokens)"
    if items is not None and (items.num_layers != 1 or items.partners_host is not None):
        return "items that overlap (one LoRA contribution per token only)"
    max_rank = b_buffer.shape[2]
    if max_rank % 8 or max_rank > 128:
        return f"pool max rank {max_rank} (a multiple of 8 up to 128: 16-byte rows for the tensor descriptors)"
    config = config or config_for(max_rank)
    inner = [int(o) for o in slice_offsets[1:-1]]
    if any(o % config.block_n for o in inner) or len(inner) > 2:
        return f"slice offsets {list(slice_offsets)} (inner ones multiples of {config.block_n}, at most 3 slices)"
    row_bytes = [t.stride(0) * t.element_size() for t in (x, weight)] + [b_buffer.shape[2] * b_buffer.element_size()]
    if x.stride(1) != 1 or weight.stride(1) != 1 or any(b % 16 for b in row_bytes) or not b_buffer.is_contiguous():
        return "rows that are not contiguous and 16-byte aligned"
    return None


def token_maps(items: WorkItems, m: int, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """``(token_slots, token_scales)``: per token its item's slot (int32, -1 where no item of a
    nonzero rank covers it) and scale (float32), for items that do not overlap and a batch of
    ``m`` tokens in position order."""
    slots = torch.full((m,), -1, dtype=torch.int32)
    scales = torch.zeros(m, dtype=torch.float32)
    for start, length, slot, scale in zip(items.seg_starts_host, items.seg_lens_host, items.slots_host,
                                          items.scales_host, strict=True):
        if length and items.ranks_host[slot]:
            slots[start : start + length] = slot
            scales[start : start + length] = scale
    return slots.to(device), scales.to(device)


def launch(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, inter: torch.Tensor,
           b_buffer: torch.Tensor, token_slots: torch.Tensor, token_scales: torch.Tensor, ranks: torch.Tensor,
           slice_offsets: list[int], out: torch.Tensor, config: GemmConfig | None = None,
           compile_only: bool = False) -> torch.Tensor:
    """``out = x @ weight.T (+ bias) + LoRA``; ``inter`` ``[m, S * max_rank]`` has each covered
    token's shrink in its row; ``b_buffer`` ``[slots, N, max_rank]``. Returns ``out``.
    ``compile_only``: compile the kernel these arguments select, launch nothing."""
    m, k = x.shape
    n = weight.shape[0]
    config = config or config_for(b_buffer.shape[2])
    rank_block = max(16, triton.next_power_of_2(b_buffer.shape[2]))  # MMA depth; columns past the
    # pool's come in as zeros (the descriptors' bounds), past a slot's rank are masked
    offs = [int(o) for o in slice_offsets] + [n] * (4 - len(slice_offsets))
    grid = (triton.cdiv(m, config.block_m) * triton.cdiv(n, config.block_n),)
    args = (
        TensorDescriptor.from_tensor(x, [config.block_m, config.block_k]),
        TensorDescriptor.from_tensor(weight, [config.block_n, config.block_k]),
        TensorDescriptor.from_tensor(out, [config.block_m, config.block_n]),
        TensorDescriptor.from_tensor(inter, [config.block_m, rank_block]),
        TensorDescriptor.from_tensor(b_buffer.view(-1, b_buffer.shape[2]), [config.block_n, rank_block]),
        bias if bias is not None else out, token_slots, token_scales, ranks, m, n, k, offs[1], offs[2],
    )
    constexprs = {"HAS_BIAS": bias is not None, "BLOCK_M": config.block_m, "BLOCK_N": config.block_n,
                  "BLOCK_K": config.block_k, "R_BLOCK": rank_block, "GROUP_M": config.group_m}
    if compile_only:
        compile_and_load(_gemm_lora_kernel, grid, args, constexprs, config.num_warps, config.num_stages)
    else:
        _LAUNCHER(grid, args, constexprs, config.num_warps, config.num_stages)
    return out


# Past its first launch of a specialisation, the compiled kernel directly: Triton's binder costs
# more host time than the rest of the call (bench/layer_cost.py --host-only).
_LAUNCHER = FastLauncher(_gemm_lora_kernel)


def compile_ahead(x: torch.Tensor, a_buffer: torch.Tensor, b_buffer: torch.Tensor, slice_offsets: list[int],
                  has_bias: bool) -> bool:
    """Compile, launching nothing, the kernel :func:`launch` runs for a module of this shape
    (``x``: any rows of its input's width and dtype; the pools as served): a server whose
    prefills replay CUDA graphs would otherwise compile it at its first large eager batch, in
    a user's request. False where the op cannot run these operands (nothing to compile)."""
    n, m = slice_offsets[-1], 16
    weight = torch.empty((n, x.shape[1]), dtype=x.dtype, device=x.device)
    if unsupported(x, weight, b_buffer, slice_offsets) is not None:
        return False
    inter = torch.empty((m, a_buffer.shape[1]), dtype=x.dtype, device=x.device)
    maps = torch.empty(m, dtype=torch.int32, device=x.device), torch.empty(m, dtype=torch.float32, device=x.device)
    ranks = torch.empty(b_buffer.shape[0], dtype=torch.int32, device=x.device)
    bias = torch.empty(n, dtype=x.dtype, device=x.device) if has_bias else None
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    launch(x[:m], weight, bias, inter, b_buffer, *maps, ranks, slice_offsets, out, compile_only=True)
    return True
