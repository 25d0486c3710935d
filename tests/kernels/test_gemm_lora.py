"""ATMM with the base GEMM as its own (``ops.lora_apply_gemm``: the shrink, then one GEMM that adds
each token's LoRA delta in its accumulator) under Triton's interpreter, in fp32, against fp64
``x W^T + b + LoRA``: three slices, several slots in one row tile (the lowest, the highest and
one between), tokens no item covers, a rank-0 slot, ranks below the pool's, with and without
bias; and every case it refuses, with the reason. Tolerance: relative Frobenius error 1e-5."""

from __future__ import annotations

import pytest
import torch

from sglang_vlora.atmm import ops
from sglang_vlora.atmm.work_items import build_work_items
from tests.kernels.lora_reference import ref_delta, rel_err
from tests.triton_interpreter import use_triton_interpreter

D_IN = 64
OFFSETS = [0, 256, 512, 768]  # inner offsets: multiples of the GEMM's 256-column tiles
RANKS = [0, 16, 8, 16]  # slot 0: rank 0
MAX_RANK = 16


@pytest.fixture(autouse=True)
def interpret(monkeypatch) -> None:
    use_triton_interpreter(monkeypatch)


def pool(gen: torch.Generator, max_rank: int = MAX_RANK):
    a = torch.randn(len(RANKS), 3 * max_rank, D_IN, generator=gen) / D_IN**0.5
    b = torch.randn(len(RANKS), OFFSETS[-1], max_rank, generator=gen) / max_rank**0.5
    w = torch.randn(OFFSETS[-1], D_IN, generator=gen) / D_IN**0.5
    return a, b, w


# 45 tokens, one 128-row tile: slots 1, 2, 3 and 1 again, tokens 16-19 and 41-44 in no item, a
# rank-0 item over 20-24
SEGMENTS = ([0, 5, 9, 20, 25], [5, 4, 7, 5, 16], [1, 2, 3, 0, 1], [0.5, -1.0, 2.0, 1.0, 1.5])


@pytest.mark.parametrize(("with_bias", "max_rank"), [(False, MAX_RANK), (True, MAX_RANK), (False, 8)])
def test_gemm_lora_matches_fp64(with_bias: bool, max_rank: int) -> None:
    """Pools of max rank 16, and 8 (its MMA depth padded to 16 by the descriptors' bounds)."""
    gen = torch.Generator().manual_seed(3)
    a, b, w = pool(gen, max_rank)
    ranks = [min(r, max_rank) for r in RANKS]
    bias = torch.randn(OFFSETS[-1], generator=gen) if with_bias else None
    starts, lens, slots, scales = SEGMENTS
    x = torch.randn(45, D_IN, generator=gen)
    items = build_work_items(starts, lens, slots, scales, ranks)
    out = ops.lora_apply_gemm(x, w, bias, a, b, items, OFFSETS)
    ref = x.double() @ w.double().T + ref_delta(x, a, b, OFFSETS, ranks, starts, lens, slots, scales)
    if bias is not None:
        ref += bias.double()
    assert out.shape == (45, OFFSETS[-1])
    assert rel_err(out, ref) < 1e-5


def test_gemm_lora_without_items_is_the_base_gemm() -> None:
    gen = torch.Generator().manual_seed(4)
    a, b, w = pool(gen)
    x = torch.randn(10, D_IN, generator=gen)
    out = ops.lora_apply_gemm(x, w, None, a, b, build_work_items([], [], [], [], RANKS), OFFSETS)
    assert rel_err(out, x.double() @ w.double().T) < 1e-5


def test_gemm_lora_refuses_what_it_cannot_compute() -> None:
    gen = torch.Generator().manual_seed(5)
    a, b, w = pool(gen)
    x = torch.randn(20, D_IN, generator=gen)
    permuted = build_work_items([0], [20], [1], [1.0], RANKS, permutation=torch.randperm(20, generator=gen))
    with pytest.raises(ValueError, match="permuted"):
        ops.lora_apply_gemm(x, w, None, a, b, permuted, OFFSETS)
    overlapping = build_work_items([0, 0], [20, 20], [1, 2], [1.0, -1.0], RANKS)
    with pytest.raises(ValueError, match="overlap"):
        ops.lora_apply_gemm(x, w, None, a, b, overlapping, OFFSETS)
    plain = build_work_items([0], [20], [1], [1.0], RANKS)
    with pytest.raises(ValueError, match="slice offsets"):
        ops.lora_apply_gemm(x, w, None, a, b, plain, [0, 128, 512, 768])
    a12, b12, _ = pool(gen, max_rank=12)
    with pytest.raises(ValueError, match="max rank 12"):
        ops.lora_apply_gemm(x, w, None, a12, b12, build_work_items([0], [20], [1], [1.0], [0, 12, 8, 12]), OFFSETS)


def test_gemm_lora_needs_cuda_or_the_interpreter(monkeypatch) -> None:
    monkeypatch.delenv("TRITON_INTERPRET")
    gen = torch.Generator().manual_seed(6)
    a, b, w = pool(gen)
    with pytest.raises(ValueError, match="CUDA"):
        ops.lora_apply_gemm(torch.randn(4, D_IN), w, None, a, b, build_work_items([0], [4], [1], [1.0], RANKS),
                            OFFSETS)
