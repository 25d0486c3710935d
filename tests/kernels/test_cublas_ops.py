"""ATMM's cuBLAS implementation (``impl="cublas"``: one torch GEMM per item and slice)
against the fp64 computation of the Triton tests, on CPU; relative Frobenius error of the
LoRA delta within 1e-5 in fp32. Its intermediate layout is ATMM's: a cuBLAS shrink feeds a
torch-path expand and the reverse."""

from __future__ import annotations

import pytest
import torch

from sglang_vlora.atmm import ops
from sglang_vlora.atmm.work_items import build_work_items
from tests.kernels.test_triton_ops import CASES, RANKS, fp64_delta, make_pool, rel_err


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("num_slices", [1, 3])
def test_cublas_apply_matches_fp64(case: str, num_slices: int) -> None:
    n_tokens, starts, lens, slots, scales, permute = CASES[case]
    gen = torch.Generator().manual_seed(7)
    a, b, offsets = make_pool(num_slices, torch.float32, gen)
    x = torch.randn(n_tokens, a.shape[2], generator=gen)
    perm = torch.randperm(n_tokens, generator=gen) if permute else None
    items = build_work_items(starts, lens, slots, scales, RANKS, permutation=perm)
    base = torch.randn(n_tokens, offsets[-1], generator=gen)
    out = ops.lora_apply(x, a, b, items, offsets, base.clone(), impl="cublas")
    ref = fp64_delta(x, a, b, offsets, starts, lens, slots, scales, perm)
    assert rel_err(out - base, ref) < 1e-5


def test_cublas_and_torch_paths_share_the_intermediate_layout() -> None:
    n_tokens, starts, lens, slots, scales, _ = CASES["ragged_mixed_ranks"]
    gen = torch.Generator().manual_seed(8)
    a, b, offsets = make_pool(2, torch.float32, gen)
    x = torch.randn(n_tokens, a.shape[2], generator=gen)
    items = build_work_items(starts, lens, slots, scales, RANKS)
    inter_cublas = ops.lora_shrink(x, a, items, 2, impl="cublas")
    inter_torch = ops.lora_shrink(x, a, items, 2, impl="torch")
    torch.testing.assert_close(inter_cublas, inter_torch, rtol=1e-5, atol=1e-5)
    base = torch.randn(n_tokens, offsets[-1], generator=gen)
    mixed = ops.lora_expand(inter_torch, b, items, offsets, base.clone(), impl="cublas")
    plain = ops.lora_expand(inter_torch, b, items, offsets, base.clone(), impl="torch")
    torch.testing.assert_close(mixed, plain, rtol=1e-5, atol=1e-5)
