"""GPU check: after Triton's first launch of a specialisation, the ATMM launchers call
the compiled kernel directly, with the same results as Triton's own launch (skipped
without CUDA or under Triton's interpreter). Its host time is measured by
``bench/layer_cost.py``'s ``host_cost``, not here."""

from __future__ import annotations

import os

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
    # the kept handles take every tensor as its address: new activations, weights and outputs
    # of the same shapes (the next layer's) are read and written where they are, not where the
    # first call's were
    x2, a2, b2 = torch.randn_like(x), torch.randn_like(a) / 8, torch.randn_like(b) / 8
    ref2 = _apply(x2, a2, b2, items, offsets, "torch").float()
    other = _apply(x2, a2, b2, items, offsets, "triton")
    assert (other.float() - ref2).abs().max().item() <= 2e-2 * ref2.abs().max().item()
    assert torch.equal(_apply(x, a, b, items, offsets, "triton"), first)


def test_descriptor_kernel_launches_through_its_compiled_handle() -> None:
    """The LoRA-in-GEMM kernel takes tensor descriptors: its kept handle encodes each launch's
    own (new activations, weights and outputs are read and written where they are)."""
    from sglang_vlora.atmm import gemm_lora, ops
    from sglang_vlora.atmm.work_items import build_work_items

    torch.manual_seed(0)
    k, rank, n = 512, 32, 512
    items = build_work_items([0, 700], [700, 324], [1, 2], [1.0, -0.5], [0, rank, rank], device="cuda")

    def operands():
        return (torch.randn(1024, k, device="cuda", dtype=torch.bfloat16),
                torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / 16,
                torch.randn(3, rank, k, device="cuda", dtype=torch.bfloat16) / 16,
                torch.randn(3, n, rank, device="cuda", dtype=torch.bfloat16) / 8)

    def reference(x, w, a, b):
        out = (x.float() @ w.float().T)
        out[:700] += 1.0 * (x[:700].float() @ a[1].float().T) @ b[1].float().T
        out[700:] += -0.5 * (x[700:].float() @ a[2].float().T) @ b[2].float().T
        return out

    first = operands()
    got = ops.lora_apply_gemm(*first[:2], None, *first[2:], items, [0, n])
    held = gemm_lora._LAUNCHER.compiled_count()
    assert held >= 1
    for x, w, a, b in (operands(), first):
        again = ops.lora_apply_gemm(x, w, None, a, b, items, [0, n])
        ref = reference(x, w, a, b)
        assert (again.float() - ref).abs().max().item() <= 2e-2 * ref.abs().max().item()
    assert gemm_lora._LAUNCHER.compiled_count() == held
    assert torch.equal(again, got)


def test_direct_driver_launches_give_the_triton_handles_results() -> None:
    """The ATMM kernels' prepared launches go straight to the driver (driver_launch); with
    that turned off they go through Triton's compiled handle. Both ways write the same
    bits, for the first layer's tensors and for another layer's."""
    from sglang_vlora.atmm import triton_kernels
    from sglang_vlora.atmm.work_items import build_work_items

    torch.manual_seed(1)
    k, rank, widths = 896, 32, (896, 128, 128)
    offsets = [0, widths[0], widths[0] + widths[1], sum(widths)]
    launchers = (triton_kernels._SHRINK, triton_kernels._EXPAND)

    def operands():
        return (torch.randn(300, k, device="cuda", dtype=torch.bfloat16),
                torch.randn(3, 3 * rank, k, device="cuda", dtype=torch.bfloat16) / 8,
                torch.randn(3, sum(widths), rank, device="cuda", dtype=torch.bfloat16) / 8)

    layers = [operands(), operands()]
    results = {}
    try:
        for direct in (True, False):
            for launcher in launchers:
                launcher.use_direct(direct)
            # new items: a new batch, whose launch plans take the way just set
            items = build_work_items([0, 100], [100, 200], [1, 2], [1.0, -0.5], [0, rank, rank], device="cuda")
            results[direct] = [_apply(*layer, items, offsets, "triton") for layer in (*layers, layers[0])]
            if direct:
                assert all(launcher.direct_count() >= 1 for launcher in launchers)
            else:
                assert all(launcher.direct_count() == 0 for launcher in launchers)
    finally:
        for launcher in launchers:
            launcher.use_direct(True)
    torch.cuda.synchronize()
    for got, expected in zip(results[True], results[False], strict=True):
        assert torch.equal(got, expected)
    assert torch.equal(results[True][0], results[True][2])
    ref = _apply(*layers[1], items, offsets, "torch").float()
    assert (results[True][1].float() - ref).abs().max().item() <= 2e-2 * ref.abs().max().item()
