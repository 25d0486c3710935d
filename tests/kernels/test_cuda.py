"""GPU checks of the compiled Triton kernels (skipped without CUDA or under the
interpreter): bf16 against fp64 at model sizes, and CUDA-graph replay with other
work items than at capture (the stale-segment-count bug class of SGLang PR #28371).

Run on a GPU machine: ``TRITON_INTERPRET=0 python -m pytest tests/kernels/test_cuda.py``.
Tolerance: bf16 relative error of the LoRA delta <= 1e-2.
"""

from __future__ import annotations

import os

import pytest
import torch

from sglang_vlora.atmm import ops
from sglang_vlora.atmm.static_items import StaticWorkItems
from sglang_vlora.atmm.work_items import build_work_items

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1",
    reason="needs a CUDA GPU and compiled Triton",
)

RANKS = [0, 8, 16, 64, 128]  # mixed ranks in one pool; slot 0 is the no-adapter slot
BF16_TOL = 1e-2


def pool(d_in: int, offsets: list[int], gen: torch.Generator):
    s, max_rank = len(offsets) - 1, max(RANKS)
    a = torch.randn(len(RANKS), s * max_rank, d_in, generator=gen) / d_in**0.5
    b = torch.randn(len(RANKS), offsets[-1], max_rank, generator=gen) / max_rank**0.5
    return a.cuda().bfloat16(), b.cuda().bfloat16()


def delta_fp64(x, a, b, offsets, starts, lens, slots, scales, perm=None):
    x, a, b = x.double().cpu(), a.double().cpu(), b.double().cpu()
    out = torch.zeros(x.shape[0], offsets[-1], dtype=torch.float64)
    for start, n, slot, scale in zip(starts, lens, slots, scales, strict=True):
        r = RANKS[slot]
        if n == 0 or r == 0:
            continue
        pos = torch.arange(start, start + n)
        rows = pos if perm is None else perm.cpu()[pos]
        for s in range(len(offsets) - 1):
            lo, hi = offsets[s], offsets[s + 1]
            t = x[rows] @ a[slot, s * r : (s + 1) * r].T
            out[rows, lo:hi] += scale * t @ b[slot, lo:hi, :r].T
    return out


def rel(got: torch.Tensor, ref: torch.Tensor) -> float:
    assert torch.isfinite(got).all()
    return ((got.double().cpu() - ref).norm() / ref.norm()).item()


@pytest.mark.parametrize(
    "offsets", [[0, 4096], [0, 4096, 4608, 5120], [0, 11008, 22016]], ids=["o", "qkv", "gate_up"]
)
@pytest.mark.parametrize("n_tokens", [1, 7, 64, 300, 2048])
def test_bf16_mixed_ranks(offsets: list[int], n_tokens: int) -> None:
    gen = torch.Generator().manual_seed(n_tokens + len(offsets))
    d_in = 4096
    a, b = pool(d_in, offsets, gen)
    x = torch.randn(n_tokens, d_in, generator=gen).cuda().bfloat16()
    cut = [0, n_tokens // 3, n_tokens // 2, n_tokens]
    starts = [cut[0], cut[1], cut[2], 0]
    lens = [cut[1] - cut[0], cut[2] - cut[1], cut[3] - cut[2], n_tokens]
    slots, scales = [1, 4, 3, 2], [0.5, 2.0, -1.0, -0.25]  # last item overlaps all
    perm = torch.randperm(n_tokens, generator=gen).cuda()
    items = build_work_items(starts, lens, slots, scales, RANKS, device="cuda", permutation=perm)
    base = torch.randn(n_tokens, offsets[-1], generator=gen).cuda().bfloat16()
    out = ops.lora_apply(x, a, b, items, offsets, base.clone())
    ref = delta_fp64(x, a, b, offsets, starts, lens, slots, scales, perm)
    assert rel(out.float() - base.float(), ref) < BF16_TOL
    inter = ops.lora_shrink(x, a, items, len(offsets) - 1)
    out2 = ops.lora_expand(inter, b, items, offsets, base.clone())
    assert rel(out2.float() - base.float(), ref) < BF16_TOL


def test_graph_replay_with_other_items() -> None:
    """Capture once, refill with 1..5 adapters, overlap and an empty batch, replay."""
    gen = torch.Generator().manual_seed(7)
    offsets = [0, 4096, 4608, 5120]
    n_tokens, d_in = 32, 4096
    a, b = pool(d_in, offsets, gen)
    static = StaticWorkItems.allocate(8, n_tokens, len(RANKS), "cuda", max_layers=2)
    x = torch.zeros(n_tokens, d_in, device="cuda", dtype=torch.bfloat16)
    out = torch.zeros(n_tokens, offsets[-1], device="cuda", dtype=torch.bfloat16)
    first = build_work_items([0], [n_tokens], [1], [1.0], RANKS, device="cuda")
    static.fill(first, n_tokens)
    ops.lora_apply_static(x, a, b, static, offsets, out)  # compile outside capture
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        ops.lora_apply_static(x, a, b, static, offsets, out)
    # the overlapped entry point: shrink on a side stream next to a "base GEMM"
    side = torch.cuda.Stream()
    out2 = torch.zeros_like(out)
    base2 = torch.zeros_like(out)

    def base_fn() -> torch.Tensor:
        return out2.copy_(base2)

    ops.lora_apply_static_with_base(x, a, b, static, offsets, base_fn, side)
    graph2 = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream), torch.cuda.graph(graph2, stream=stream):
        ops.lora_apply_static_with_base(x, a, b, static, offsets, base_fn, side)
    torch.cuda.synchronize()
    batches = [
        ([0, 8, 16, 24, 28], [8, 8, 8, 4, 4], [1, 2, 3, 4, 1], [1.0, 0.5, 2.0, 1.0, -1.0]),
        ([0], [n_tokens], [4], [1.0]),
        ([], [], [], []),
        ([0, 0, 20], [20, 20, 12], [2, 3, 4], [1.0, -1.0, 0.5]),  # mixture: overlap
        ([3], [5], [3], [1.0]),
    ]
    for starts, lens, slots, scales in batches:
        perm = torch.randperm(n_tokens, generator=gen).cuda()
        items = build_work_items(starts, lens, slots, scales, RANKS, device="cuda", permutation=perm)
        static.fill(items, n_tokens)
        x.copy_(torch.randn(n_tokens, d_in, generator=gen).bfloat16())
        base = torch.randn(n_tokens, offsets[-1], generator=gen).bfloat16()
        out.copy_(base)
        base2.copy_(base)
        graph.replay()
        graph2.replay()
        torch.cuda.synchronize()
        ref = delta_fp64(x, a, b, offsets, starts, lens, slots, scales, perm)
        for result in (out, out2):
            if not starts:
                assert torch.equal(result.cpu(), base)
            else:
                assert rel(result.float().cpu() - base.float(), ref) < BF16_TOL, (starts, lens)
