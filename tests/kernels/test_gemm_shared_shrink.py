"""The GEMM whose tiles compute the shrink among themselves (``gemm_shared_shrink.launch``) under
Triton's interpreter, in fp32, against fp64 ``x W^T + b + LoRA``, with small tiles so that one
launch has several row tiles, slices of one and of several column tiles, and row tiles of
several slots (a rank-0 slot, tokens no item covers).

The interpreter runs the programs one after another, so a tile whose producers come later in
the launch finds its count incomplete after its polls and computes its rows' shrink itself,
while the tiles after their producers read it from the scratch: with one producer per slice
every tile reads the scratch, with a producer per column tile the early ones compute their
own. Both must give the same result, and leave the scratch and the counts at zero. Tolerance:
relative Frobenius error 1e-5."""

from __future__ import annotations

import pytest
import torch

from sglang_vlora.atmm import gemm_lora, gemm_shared_shrink, ops
from sglang_vlora.atmm.gemm_lora import GemmConfig
from sglang_vlora.atmm.work_items import build_work_items
from tests.kernels.lora_reference import ref_delta, rel_err

D_IN = 128
OFFSETS = [0, 128, 320, 384]  # slices of 2, 3 and 1 column tiles of 64
RANKS = [0, 16, 8, 16]  # slot 0: rank 0
MAX_RANK = 16
CONFIG = GemmConfig(block_m=32, block_n=64, block_k=16, group_m=2)
# 75 tokens, three row tiles of 32: slots 1, 2, 3 and 1 again in the first, tokens 20-24 in a
# rank-0 item, 55-59 in none
SEGMENTS = ([0, 5, 9, 20, 25, 60], [5, 4, 11, 5, 30, 15], [1, 2, 3, 0, 1, 3], [0.5, -1.0, 2.0, 1.0, 1.5, 0.7])
M = 75


@pytest.fixture(autouse=True)
def interpret(monkeypatch) -> None:
    monkeypatch.setenv("TRITON_INTERPRET", "1")


def operands(seed: int):
    gen = torch.Generator().manual_seed(seed)
    a = torch.randn(len(RANKS), 3 * MAX_RANK, D_IN, generator=gen) / D_IN**0.5
    b = torch.randn(len(RANKS), OFFSETS[-1], MAX_RANK, generator=gen) / MAX_RANK**0.5
    w = torch.randn(OFFSETS[-1], D_IN, generator=gen) / D_IN**0.5
    bias = torch.randn(OFFSETS[-1], generator=gen)
    x = torch.randn(M, D_IN, generator=gen)
    return x, a, b, w, bias


@pytest.mark.parametrize(("producers", "max_polls"), [(1, 2), (2, 2), (16, 2), (16, 0)])
def test_shared_shrink_matches_fp64_and_leaves_its_state_at_zero(producers: int, max_polls: int) -> None:
    x, a, b, w, bias = operands(3)
    starts, lens, slots, scales = SEGMENTS
    items = build_work_items(starts, lens, slots, scales, RANKS)
    maps = gemm_lora.token_maps(items, M, x.device)
    ref = x.double() @ w.double().T + bias.double() + ref_delta(x, a, b, OFFSETS, RANKS, starts, lens, slots, scales)
    out = torch.empty(M, OFFSETS[-1])
    gemm_shared_shrink.launch(x, w, bias, a, b, *maps, items.ranks, OFFSETS, out, config=CONFIG,
                              producers=producers, max_polls=max_polls)
    assert rel_err(out, ref) < 1e-5
    scratch, counts = gemm_shared_shrink.shared_state(x.device, M, MAX_RANK)
    assert int(counts.abs().max()) == 0 and float(scratch.abs().max()) == 0.0


def test_a_grown_state_starts_at_zero() -> None:
    small = gemm_shared_shrink.shared_state(torch.device("cpu"), 8, MAX_RANK)[0]
    scratch, counts = gemm_shared_shrink.shared_state(torch.device("cpu"), 4 * small.shape[0] + 3, MAX_RANK)
    assert scratch.shape == (4 * small.shape[0] + 3, 3 * MAX_RANK)
    assert counts.numel() >= 2 * 3 * (scratch.shape[0] // 16)
    assert not scratch.any() and not counts.any()


def test_an_a_pool_that_is_not_contiguous_is_refused() -> None:
    x, a, b, w, _ = operands(4)  # one slice: the default tiles' 256 columns take any width
    items = build_work_items([0], [M], [1], [1.0], RANKS)
    with pytest.raises(ValueError, match="A pool that is not contiguous"):
        ops.lora_apply_gemm(x[:, :96], w[:, :96], None, a[:, :, :96], b, items, [0, OFFSETS[-1]])
