"""GPU check: after Triton's first launch of a specialisation, the ATMM launchers call
the compiled kernel directly, with the same results as Triton's own launch, and for
less host time (skipped without CUDA or under Triton's interpreter)."""

from __future__ import annotations

import os
import time

import pytest
import torch

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1",
    reason="needs a CUDA GPU and compiled Triton",
)


def _apply(x, a, b, items, offsets, impl):
    from sglang_vlora.atmm import ops

    out = torch.zeros(x.shape[0], offsets[-1], device="cuda", dtype=x.dtype)
    return ops.lora_apply(x, a, b, items, offsets, out, impl=impl)


def test_compiled_handle_gives_triton_launch_results() -> None:
    from sglang_vlora.atmm import triton_kernels
    from sglang_vlora.atmm.work_items import build_work_items

    torch.manual_seed(0)
    k, rank, widths = 896, 32, (896, 128, 128)
    offsets = [0, widths[0], widths[0] + widths[1], sum(widths)]
    a = torch.randn(3, 3 * rank, k, device="cuda", dtype=torch.bfloat16) / 8
    b = torch.randn(3, sum(widths), rank, device="cuda", dtype=torch.bfloat16) / 8
    x = torch.randn(70, k, device="cuda", dtype=torch.bfloat16)
    items = build_work_items([0, 30], [30, 40], [1, 2], [1.0, -0.5], [0, rank, rank], device="cuda")
    ref = _apply(x, a, b, items, offsets, "torch").float()
    first = _apply(x, a, b, items, offsets, "triton")  # Triton's launch: compiles, keeps the handle
    held = triton_kernels._SHRINK.compiled_count(), triton_kernels._EXPAND.compiled_count()
    assert held[0] >= 1 and held[1] >= 1
    again = _apply(x, a, b, items, offsets, "triton")  # the kept handle
    assert (triton_kernels._SHRINK.compiled_count(), triton_kernels._EXPAND.compiled_count()) == held
    assert torch.equal(first, again)
    assert (again.float() - ref).abs().max().item() <= 2e-2 * ref.abs().max().item()


def test_prepared_launch_is_cheaper_than_tritons_launch() -> None:
    from sglang_vlora.atmm import tiling, triton_kernels
    from sglang_vlora.atmm.work_items import build_work_items

    k, rank = 1024, 16
    a = torch.randn(2, rank, k, device="cuda", dtype=torch.bfloat16)
    x = torch.randn(64, k, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(64, rank, device="cuda", dtype=x.dtype)
    items = build_work_items([0], [64], [1], [1.0], [0, rank], device="cuda")
    cfg = tiling.ShrinkConfig(16, 16, 64, 1)
    args = (x, a, out, items.seg_starts, items.seg_lens, items.slots, items.row_starts, items.ranks, None, 1, 64, cfg)

    def host_us(launch, n: int = 300) -> float:
        launch()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            launch()
        took = (time.perf_counter() - t0) / n * 1e6
        torch.cuda.synchronize()
        return took

    prepared = triton_kernels.prepare_shrink(*args)  # what the eager path's launch plans hold
    fast = host_us(lambda: prepared(x, a, out))
    grid = (triton_kernels._row_tiles(64, 16, 1) * triton_kernels._cdiv(rank, 16), 1)

    def tritons_own() -> None:
        kernel_args = (x, a, out, out, out, items.seg_starts, items.seg_lens, items.slots, items.row_starts,
                       items.ranks, items.seg_starts, k, 1, x.stride(0), x.stride(1), a.stride(0), a.stride(1),
                       a.stride(2), out.stride(0), 0, 0, 1, 1)
        triton_kernels._shrink_kernel[grid](*kernel_args, CAP=16, HAS_PERM=False, EVEN_K=True, EVEN_N=True,
                                            BLOCK_M=16, BLOCK_N=16, BLOCK_K=64, SPLIT_K=1, num_warps=4,
                                            num_stages=2)

    slow = host_us(tritons_own)
    print(f"host us per launch: prepared compiled handle {fast:.1f}, Triton's launcher {slow:.1f}")
    assert fast < slow
