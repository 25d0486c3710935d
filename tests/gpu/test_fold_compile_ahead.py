"""GPU check: after ``fold_kernel.compile_ahead`` (what the mode controller runs at start-up for
the loaded adapters' ranks), the switcher's merges, switches and unmerges compile nothing
(skipped without CUDA or under Triton's interpreter). The CPU test of the same by launch keys
is tests/modes/test_fold_compile_ahead.py."""

from __future__ import annotations

import os

import pytest
import torch

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1",
    reason="needs a CUDA GPU and compiled Triton",
)


def _compiled(kernel) -> int:
    return sum(len(cache[0]) for cache in kernel.device_caches.values())


def test_switches_compile_nothing_after_the_compile_ahead() -> None:
    from sglang_vlora.modes import fold_kernel
    from sglang_vlora.modes.switcher import LoRADelta, SwiftSwitcher, slice_kinds

    hidden, kv, layers = 3584, 512, 2
    qkv = torch.randn(layers, hidden + 2 * kv, hidden, device="cuda", dtype=torch.bfloat16) * 0.02
    kinds = {**slice_kinds(qkv, ["q", "k", "v"], [0, hidden, hidden + kv, hidden + 2 * kv]),
             "o": torch.randn(layers, hidden, hidden, device="cuda", dtype=torch.bfloat16) * 0.02}
    ranks = (8, 64)
    for weights in kinds.values():
        fold_kernel.compile_ahead(weights, ranks)
    before = _compiled(fold_kernel._fold_kernel)
    switcher = SwiftSwitcher(kinds, exact=True)
    for rank in ranks:
        switcher.add_adapter(f"r{rank}", {name: LoRADelta(
            a=torch.randn(layers, rank, w.shape[2], device="cuda", dtype=w.dtype) * 0.02,
            b=torch.randn(layers, w.shape[1], rank, device="cuda", dtype=w.dtype) * 0.02, scaling=0.5)
            for name, w in kinds.items()})
    for target in ("r8", "r64", None, "r64", None):
        switcher.switch(target)
    torch.cuda.synchronize()
    assert _compiled(fold_kernel._fold_kernel) == before
