"""The one-pass Triton fold (interpreter on CPU) against fp64, on strided slice
views and in place, and the switcher's ``fold`` path against its torch path.

Triton 3.8's interpreter computes bf16 ``tl.dot`` wrongly, so the kernel is checked
in fp32 (tolerance 1e-6) and fp16 (1e-3) here and in bf16 on the GPU by
``bench/switch.py``. Relative Frobenius error against fp64.
"""

from __future__ import annotations

import random

import pytest
import torch

from sglang_vlora.modes.fold_kernel import FoldConfig, copy_stack, fold
from sglang_vlora.modes.switcher import LoRADelta, SwiftSwitcher, slice_kinds

TOL = {torch.float32: 1e-6, torch.float16: 1e-3}


def rel(x: torch.Tensor, ref: torch.Tensor) -> float:
    return ((x.double() - ref.double()).norm() / ref.double().norm()).item()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
@pytest.mark.parametrize("rank", [3, 16, 40])
def test_fold_on_slice_views(dtype, rank):
    g = torch.Generator().manual_seed(rank)
    fused = torch.randn(2, 40, 70, generator=g).to(dtype)
    before = fused.clone()
    view = fused[:, 8:33]  # rows 8..32 of each layer: a strided, non-contiguous view
    b = torch.randn(2, 25, rank, generator=g).to(dtype)
    a = torch.randn(2, rank, 70, generator=g).to(dtype)
    ref = view.double() + 0.5 * b.double() @ a.double()
    out = torch.empty_like(view)
    fold(out, view, b, a, 0.5, FoldConfig(16, 32, 4))
    assert rel(out, ref) <= TOL[dtype]
    assert torch.equal(fused, before)  # src untouched
    fold(view, view, b, a, 0.5, FoldConfig(16, 32, 4))  # in place
    assert rel(view, ref) <= TOL[dtype]
    assert torch.equal(fused[:, :8], before[:, :8]) and torch.equal(fused[:, 33:], before[:, 33:])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_copy_stack_restores_slice_views_bit_for_bit(dtype):
    g = torch.Generator().manual_seed(7)
    fused = torch.randn(3, 40, 70, generator=g).to(dtype)
    before = fused.clone()
    pristine = torch.randn(3, 25, 70, generator=g).to(dtype)
    view = fused[:, 8:33]
    copy_stack(view, pristine, FoldConfig(16, 32, 4))
    assert torch.equal(view, pristine)
    assert torch.equal(fused[:, :8], before[:, :8]) and torch.equal(fused[:, 33:], before[:, 33:])
    with pytest.raises(ValueError, match="copy_stack"):
        copy_stack(view, pristine[:, :5])


def test_fold_rejects_bad_shapes():
    x = torch.zeros(2, 4, 6)
    with pytest.raises(ValueError, match="fold shapes"):
        fold(x, x, torch.zeros(2, 4, 3), torch.zeros(2, 2, 6), 1.0)


def test_switcher_fold_path_matches_torch_path_and_is_exact():
    g = torch.Generator().manual_seed(1)
    fused = torch.randn(2, 24, 20, generator=g).half()
    original = fused.clone()
    twin = fused.clone()
    offsets = [0, 16, 20, 24]
    fast = SwiftSwitcher(slice_kinds(fused, ["q", "k", "v"], offsets), kernel="triton")
    slow = SwiftSwitcher(slice_kinds(twin, ["q", "k", "v"], offsets), kernel="torch")
    assert set(fast.paths.values()) == {"fold"} and set(slow.paths.values()) == {"batched"}
    for name, rank in [("a", 4), ("b", 8), ("c", 2)]:
        deltas = {}
        for kind, (lo, hi) in zip("qkv", zip(offsets, offsets[1:], strict=False), strict=True):
            a = torch.randn(2, rank, 20, generator=g).half()
            b = torch.randn(2, hi - lo, rank, generator=g).half()
            deltas[kind] = LoRADelta(a=a, b=b, scaling=0.25 * rank)
        fast.add_adapter(name, deltas)
        slow.add_adapter(name, deltas)
    rng = random.Random(0)
    for _ in range(12):
        name = rng.choice([n for n in ["a", "b", "c", None] if n != fast.merged])
        fast.switch(name)
        slow.switch(name)
        if name is not None:
            assert rel(fused, twin) <= TOL[torch.float16]
    fast.unmerge()
    assert torch.equal(fused.view(torch.int16), original.view(torch.int16))
