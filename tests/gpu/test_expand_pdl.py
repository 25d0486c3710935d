"""GPU check: the in-GEMM expand launched with programmatic dependent launch (PDL) writes the
same bits as without it, in a CUDA graph and eagerly (skipped without a CUDA GPU of compute
capability 9.0 or under Triton's interpreter). Its time is measured by ``bench/expand_pdl.py``."""

from __future__ import annotations

import os

import pytest
import torch

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1"
    or torch.cuda.get_device_capability() < (9, 0),
    reason="needs a CUDA GPU with grid dependency control (sm90+) and compiled Triton",
)


def test_pdl_expand_gives_the_plain_launchs_bits(monkeypatch) -> None:
    from sglang_vlora.atmm import ops, triton_kernels
    from sglang_vlora.atmm.static_items import StaticWorkItems
    from sglang_vlora.atmm.work_items import build_work_items
    from sglang_vlora.config import PDL_ENV

    torch.manual_seed(0)
    tokens, d_in, d_out, rank, slots = 32, 1024, 2048, 64, 4
    bf = torch.bfloat16
    x = torch.randn(tokens, d_in, device="cuda", dtype=bf)
    w = torch.randn(d_out, d_in, device="cuda", dtype=bf) / 32
    a = torch.randn(slots, rank, d_in, device="cuda", dtype=bf) / 32
    b = torch.randn(slots, d_out, rank, device="cuda", dtype=bf) / 8
    w_ext = torch.cat([w, a.reshape(-1, d_in)])
    # three adapters over 28 tokens; the last 4 tokens are the base model's (copy items)
    items = build_work_items([0, 10, 20], [10, 10, 8], [0, 2, 3], [1.0, 0.5, -2.0], [rank] * slots, device="cuda")
    static = StaticWorkItems.allocate(8, tokens, slots, "cuda", covers_tokens=True)
    static.fill(items, tokens)

    ref = x.float() @ w.float().T
    for slot, start, n, scale in ((0, 0, 10, 1.0), (2, 10, 10, 0.5), (3, 20, 8, -2.0)):
        xs = x[start:start + n].float()
        ref[start:start + n] += scale * (xs @ a[slot].float().T) @ b[slot].float().T

    def op() -> torch.Tensor:
        return ops.lora_apply_static_in_gemm(x, w_ext, None, d_out, b, static, [0, d_out])

    results = {}
    for pdl in ("0", "1"):
        monkeypatch.setenv(PDL_ENV, pdl)
        eager = op()
        graph = torch.cuda.CUDAGraph()
        op()  # compiled before the capture
        torch.cuda.synchronize()
        with torch.cuda.graph(graph):
            captured = op()
        graph.replay()
        torch.cuda.synchronize()
        results[pdl] = (eager.clone(), captured.clone())
    assert any(k.metadata.launch_pdl for k in triton_kernels._EXPAND._compiled.values())
    for got in (*results["0"], *results["1"]):
        assert torch.equal(got, results["0"][0])
    err = (results["1"][1].float() - ref).abs().max().item()
    assert err <= 2e-2 * ref.abs().max().item()
