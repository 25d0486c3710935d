"""The base GEMM with the LoRA expand in its epilogue: ``x W^T + b + scale * inter B^T``.

A Triton GEMM over the base weight whose output tile, before it is stored, gets each token's
LoRA delta: the tile's rows' own slot columns of ``inter`` (the slots' shrink, laid out as
:mod:`sglang_vlora.atmm.in_gemm` lays out the appended columns: a row per token, slot ``j``'s
``S * max_rank`` columns at ``j * slot_width``) times the slot's ``B`` rows of the tile's
columns. The output is written once, by the GEMM; no separate expand reads or writes it.

Why: the expand of every other entry point (separate, in place, or after the shrink inside the
GEMM) costs 1.6-2x a copy of the output, and halving its bytes did not make it faster
(docs/atmm.md): its time is the latency of a kernel that does little work per byte. Here the
delta is one more small MMA per output tile (rank / d_in of the base work).

Every tile's columns lie in one slice (the slice offsets are multiples of ``BLOCK_N``). Rows
may belong to different slots: the epilogue runs one masked MMA per slot between the tile's
lowest and highest (one in a prefill tile inside one request). ``token_slots[t]`` is token
``t``'s slot (-1: no LoRA), ``token_scales[t]`` its scale.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl


@dataclass(frozen=True)
class GemmConfig:
    block_m: int = 128
    block_n: int = 128
    block_k: int = 64
    group_m: int = 8
    num_warps: int = 8
    num_stages: int = 3


@triton.jit
def _gemm_lora_kernel(
    x_ptr,
    w_ptr,
    out_ptr,
    bias_ptr,
    inter_ptr,
    b_ptr,
    tok_slots_ptr,
    tok_scales_ptr,
    ranks_ptr,
    M,
    N,
    K,
    off1,
    off2,
    stride_xm,
    stride_wn,
    stride_om,
    stride_im,
    slot_width,
    stride_bs,
    stride_bn,
    HAS_BIAS: tl.constexpr,
    HAS_LORA: tl.constexpr,
    R_BLOCK: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_K: tl.constexpr,
    GROUP_M: tl.constexpr,
):
    pid = tl.program_id(0)
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * num_n
    first_m = (pid // per_group) * GROUP_M
    size_m = min(num_m - first_m, GROUP_M)
    pid_m = first_m + (pid % per_group) % size_m
    pid_n = (pid % per_group) // size_m
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rm = (offs_m % M).to(tl.int64)  # rows past M read row (m mod M); their results are not stored
    rn = offs_n % N
    offs_k = tl.arange(0, BLOCK_K)
    x_ptrs = x_ptr + rm[:, None] * stride_xm + offs_k[None, :]
    w_ptrs = w_ptr + rn[None, :].to(tl.int64) * stride_wn + offs_k[:, None]
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        left = K - k * BLOCK_K
        a = tl.load(x_ptrs, mask=offs_k[None, :] < left, other=0.0)
        b = tl.load(w_ptrs, mask=offs_k[:, None] < left, other=0.0)
        acc = tl.dot(a, b, acc)
        x_ptrs += BLOCK_K
        w_ptrs += BLOCK_K
    if HAS_LORA:
        slots = tl.load(tok_slots_ptr + rm)
        scales = tl.load(tok_scales_ptr + rm)
        col0 = pid_n * BLOCK_N
        s = (col0 >= off1).to(tl.int32) + (col0 >= off2).to(tl.int32)  # the tile's slice
        lo = tl.min(tl.where(slots >= 0, slots, 1 << 30))
        hi = tl.max(slots)
        offs_r = tl.arange(0, R_BLOCK)
        for slot in range(lo, hi + 1):
            rank = tl.load(ranks_ptr + slot)
            chosen = slots == slot
            i_ptrs = inter_ptr + rm[:, None] * stride_im + slot * slot_width + s * rank + offs_r[None, :]
            part_i = tl.load(i_ptrs, mask=chosen[:, None] & (offs_r[None, :] < rank), other=0.0)
            b_ptrs = b_ptr + slot * stride_bs + rn[None, :].to(tl.int64) * stride_bn + offs_r[:, None]
            part_b = tl.load(b_ptrs, mask=offs_r[:, None] < rank, other=0.0)
            acc += tl.dot(part_i, part_b) * scales[:, None]
    if HAS_BIAS:
        acc += tl.load(bias_ptr + rn).to(tl.float32)[None, :]
    out_ptrs = out_ptr + offs_m[:, None].to(tl.int64) * stride_om + offs_n[None, :]
    tl.store(out_ptrs, acc.to(out_ptr.dtype.element_ty), mask=(offs_m[:, None] < M) & (offs_n[None, :] < N))


def token_maps(
    seg_starts: list[int], seg_lens: list[int], slots: list[int], scales: list[float], m: int, device
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(token_slots, token_scales)`` for items that do not overlap, without permutation:
    ``[m]`` int32 slots (-1 where no item covers the token) and float32 scales."""
    token_slots = torch.full((m,), -1, dtype=torch.int32)
    token_scales = torch.zeros(m, dtype=torch.float32)
    for start, length, slot, scale in zip(seg_starts, seg_lens, slots, scales, strict=True):
        if (token_slots[start : start + length] >= 0).any():
            raise ValueError("items overlap: the GEMM epilogue adds one slot per token")
        token_slots[start : start + length] = slot
        token_scales[start : start + length] = scale
    return token_slots.to(device), token_scales.to(device)


def gemm_lora(
    x: torch.Tensor,
    weight: torch.Tensor,
    bias: torch.Tensor | None,
    inter: torch.Tensor | None,
    b_buffer: torch.Tensor | None,
    token_slots: torch.Tensor | None,
    token_scales: torch.Tensor | None,
    ranks: torch.Tensor | None,
    slice_offsets: list[int],
    config: GemmConfig,
) -> torch.Tensor:
    """``x @ weight.T (+ bias) + LoRA`` into a new ``[m, N]`` output; ``inter`` None: the
    plain GEMM. ``inter``: ``[m, slots * slot_width]`` (:mod:`sglang_vlora.atmm.in_gemm`'s
    layout of the shrink), ``b_buffer``: ``[slots, N, max_rank]``."""
    m, k = x.shape
    n = weight.shape[0]
    if x.stride(1) != 1 or weight.stride(1) != 1 or weight.shape[1] != k or slice_offsets[-1] != n:
        raise ValueError(f"x {tuple(x.shape)} and weight {tuple(weight.shape)} must be row-major over {k} inputs")
    offs = [int(o) for o in slice_offsets] + [n] * (4 - len(slice_offsets))
    if any(o % config.block_n for o in offs[1:3] if o < n):
        raise ValueError(f"slice offsets {slice_offsets} must be multiples of BLOCK_N={config.block_n}")
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    has_lora = inter is not None
    dummy = out
    slots = b_buffer.shape[0] if has_lora else 1
    slot_width = inter.shape[1] // slots if has_lora else 0
    max_rank = b_buffer.shape[2] if has_lora else 16
    grid = (triton.cdiv(m, config.block_m) * triton.cdiv(n, config.block_n),)
    _gemm_lora_kernel[grid](
        x, weight, out, bias if bias is not None else dummy,
        inter if has_lora else dummy, b_buffer if has_lora else dummy,
        token_slots if has_lora else dummy, token_scales if has_lora else dummy, ranks if has_lora else dummy,
        m, n, k, offs[1], offs[2],
        x.stride(0), weight.stride(0), out.stride(0),
        inter.stride(0) if has_lora else 0, slot_width,
        b_buffer.stride(0) if has_lora else 0, b_buffer.stride(1) if has_lora else 0,
        HAS_BIAS=bias is not None, HAS_LORA=has_lora, R_BLOCK=max(16, triton.next_power_of_2(max_rank)),
        BLOCK_M=config.block_m, BLOCK_N=config.block_n, BLOCK_K=config.block_k, GROUP_M=config.group_m,
        num_warps=config.num_warps, num_stages=config.num_stages,
    )
    return out
