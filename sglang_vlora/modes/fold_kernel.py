"""One-pass fold on the GPU: ``out[l] = src[l] + scale * b[l] @ a[l]`` for all layers.

The exact scheme merges from the pristine copy: ``W <- W0 + s B A``. With torch ops
that is two passes over the weights (``copy_`` then ``baddbmm_``: read W0, write W,
read W, write W). This Triton kernel reads each ``W0`` tile once, adds the rank-``r``
product accumulated in fp32, rounds once and writes ``W``: the HBM floor of a
switch (read and write every weight once). ``src`` may be ``out`` itself, which makes
it an in-place batched GEMM as well.

Any strides are accepted, so per-slice views of a fused qkv / gate_up stack work
without a copy. Tile sizes are arguments (:class:`FoldConfig`); the benchmark
(``bench/switch.py``) times the candidates on the device.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from sglang_vlora.atmm.launch_compiles import compile_and_load, launch_counting_compiles


@dataclass(frozen=True)
class FoldConfig:
    block_m: int = 64
    block_n: int = 128
    num_warps: int = 4
    num_stages: int = 3  # Triton's default on CUDA, named so that a compile is described


@triton.jit
def _fold_kernel(
    out_ptr,
    src_ptr,
    b_ptr,
    a_ptr,
    scale,
    M,
    N,
    R,
    s_out_l,
    s_out_m,
    s_out_n,
    s_src_l,
    s_src_m,
    s_src_n,
    s_b_l,
    s_b_m,
    s_b_r,
    s_a_l,
    s_a_r,
    s_a_n,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCK_R: tl.constexpr,
    ADD_LORA: tl.constexpr,
    PRECISION: tl.constexpr,
):
    layer = tl.program_id(2).to(tl.int64)
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask_m, mask_n = rm < M, rn < N
    tile = mask_m[:, None] & mask_n[None, :]
    src = tl.load(src_ptr + layer * s_src_l + rm[:, None] * s_src_m + rn[None, :] * s_src_n, mask=tile)
    if ADD_LORA:
        rr = tl.arange(0, BLOCK_R)
        mask_r = rr < R
        b = tl.load(
            b_ptr + layer * s_b_l + rm[:, None] * s_b_m + rr[None, :] * s_b_r,
            mask=mask_m[:, None] & mask_r[None, :],
            other=0.0,
        )
        a = tl.load(
            a_ptr + layer * s_a_l + rr[:, None] * s_a_r + rn[None, :] * s_a_n,
            mask=mask_r[:, None] & mask_n[None, :],
            other=0.0,
        )
        value = (src.to(tl.float32) + scale * tl.dot(b, a, input_precision=PRECISION)).to(out_ptr.dtype.element_ty)
    else:
        value = src
    tl.store(out_ptr + layer * s_out_l + rm[:, None] * s_out_m + rn[None, :] * s_out_n, value, mask=tile)


def fold(
    out: torch.Tensor,
    src: torch.Tensor,
    b: torch.Tensor,
    a: torch.Tensor,
    scale: float,
    config: FoldConfig | None = None,
) -> torch.Tensor:
    """``out[l] = src[l] + scale * b[l] @ a[l]`` with ``out``/``src`` ``[L, M, N]``,
    ``b`` ``[L, M, R]``, ``a`` ``[L, R, N]``; one rounding per element. Returns
    ``out``."""
    layers, m, n = out.shape
    r = a.shape[1]
    if src.shape != out.shape or tuple(b.shape) != (layers, m, r) or tuple(a.shape) != (layers, r, n):
        raise ValueError(
            f"fold shapes: out {tuple(out.shape)}, src {tuple(src.shape)}, b {tuple(b.shape)}, a {tuple(a.shape)}"
        )
    _launch(out, src, b, a, scale, r, b.stride(), a.stride(), config or FoldConfig())
    return out


def copy_stack(out: torch.Tensor, src: torch.Tensor, config: FoldConfig | None = None) -> torch.Tensor:
    """``out[l] = src[l]`` bit for bit, with the fold's tiling: one pass at HBM speed also
    for per-slice views of a fused stack, where torch's strided ``copy_`` measured about
    1.6x slower on an H100 (unmerge of q,k,v,o over 32 layers: 4.5 ms vs 2.9 ms)."""
    if src.shape != out.shape or src.dtype != out.dtype or out.dim() != 3:
        raise ValueError(f"copy_stack: out {tuple(out.shape)} {out.dtype}, src {tuple(src.shape)} {src.dtype}")
    _launch(out, src, out, out, 0.0, 0, (0, 0, 0), (0, 0, 0), config or FoldConfig())
    return out


def compile_ahead(out: torch.Tensor, ranks: Iterable[int], config: FoldConfig | None = None) -> None:
    """Compile, launching nothing, the kernels a switch of the weights ``out`` (``[L, M, N]``,
    a stack or a slice view of one) runs: :func:`fold` for adapters of each of ``ranks``
    (factors as the switcher holds them: contiguous ``[L, M, r]`` and ``[L, r, N]``) and
    :func:`copy_stack`. A switch's first fold would otherwise compile while serving, holding
    the scheduler for as long. The pristine copy a switch also reads (contiguous ``[L, M, N]``)
    is stood in for by ``out``: the same specialisation wherever ``N`` is a multiple of 16."""
    cfg = config or FoldConfig()
    layers, m, n = out.shape
    for r in sorted(set(ranks)):
        if r < 1:
            raise ValueError(f"ranks must be positive, got {r}")
        _launch(out, out, out, out, 1.0, r, (m * r, r, 1), (r * n, n, 1), cfg, compile_only=True)
    _launch(out, out, out, out, 0.0, 0, (0, 0, 0), (0, 0, 0), cfg, compile_only=True)


def _launch(out, src, b, a, scale: float, r: int, b_strides: tuple, a_strides: tuple, cfg: FoldConfig,
            compile_only: bool = False) -> None:
    """The fold kernel over ``out``'s ``[L, M, N]``: with ``r`` > 0 the fold of ``b``/``a`` (their
    strides given, so a compile ahead needs only stand-in pointers), with ``r`` = 0 the copy."""
    layers, m, n = out.shape
    grid = (triton.cdiv(m, cfg.block_m), triton.cdiv(n, cfg.block_n), layers)
    args = (out, src, b, a, float(scale), m, n, r, *out.stride(), *src.stride(), *b_strides, *a_strides)
    constexprs = {
        "BLOCK_M": cfg.block_m,
        "BLOCK_N": cfg.block_n,
        "BLOCK_R": max(16, triton.next_power_of_2(r)) if r else 16,
        "ADD_LORA": r > 0,
        # fp32 weights: full fp32 products (TF32 would put ~1e-3 relative error in the
        # delta: merged and unmerged fp32 servers then differ measurably).
        "PRECISION": "ieee" if r and out.dtype == torch.float32 else "tf32",
    }
    warps, stages = cfg.num_warps, cfg.num_stages
    if compile_only:
        compile_and_load(_fold_kernel, grid, args, constexprs, warps, stages)
    else:  # a variant compiled here, while serving, shows in /vlora/status kernel_compiles
        launch_counting_compiles(
            _fold_kernel, lambda: _fold_kernel[grid](*args, **constexprs, num_warps=warps, num_stages=stages),
            constexprs, warps, stages)
