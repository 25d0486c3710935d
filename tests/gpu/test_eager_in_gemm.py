"""GPU check of eager batches with the shrink inside the base GEMM (``ops.lora_apply_static_in_gemm``
through the backend's ``forward_with_base``, the default up to ``--vlora-eager-in-gemm-max-tokens``),
compiled Triton on CUDA (skipped without it, under Triton's interpreter, or without SGLang).

The q/k/v layer and pool of ``test_graph_modes`` (1024 -> 1024 + 256 + 256, with bias, ranks 16,
64 and 8 and the no-adapter slot), the pool's A rows appended to the base weight: two eager
batches in turn (1536 tokens whose requests of one adapter are apart, then 1000 tokens of other
adapters, then the first again, which reuses its prepared launch, now given the GEMM output's
addresses instead of views of it), each against fp64 from the same bf16 operands and against the
separate shrink and expand (limit 0: launch plans kept across batches) on the same batch. SGLang's base GEMM must not run. Relative
error of the whole output: bf16 1e-2.

Run on a GPU machine with SGLang installed: ``TRITON_INTERPRET=0 python -m pytest tests/gpu``.
"""

from __future__ import annotations

import os

import pytest
import torch

from tests.gpu.appended_layer import appended_qkv_layer, cuda_backend, extend_batch, reference
from tests.gpu.test_graph_modes import QKV, RANKS, SCALINGS, D  # the same q/k/v layer and pool

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1",
    reason="needs a CUDA GPU and compiled Triton",
)

BATCHES = [  # (tokens, slot) per request
    [(512, 1), (128, 2), (256, 0), (384, 1), (64, 3), (192, 2)],
    [(600, 3), (400, 2)],
]


def test_eager_batches_compute_the_shrink_in_the_base_gemm(monkeypatch):
    pytest.importorskip("sglang.srt.lora.backend.base_backend")

    from sglang_vlora.atmm.fast_launch import PreparedLaunch
    from sglang_vlora.in_gemm_weights import ATTR

    g = torch.Generator().manual_seed(0)
    layer, pool_a, pool_b = appended_qkv_layer(g)
    fused = getattr(layer, ATTR)
    # Both batches under the in-GEMM limit, and above the one-kernel limit (64 tokens).
    in_gemm, separate = cuda_backend(eager_in_gemm_max_tokens=2048), cuda_backend(eager_in_gemm_max_tokens=0)
    by_address = []
    at = PreparedLaunch.at
    monkeypatch.setattr(PreparedLaunch, "at", lambda self, *args: by_address.append(at(self, *args)) or by_address[-1])
    for round_, requests in enumerate([*BATCHES, BATCHES[0]]):
        lens = [n for n, _ in requests]
        x = torch.randn(sum(lens), D, generator=g).to("cuda", torch.bfloat16)
        batch = extend_batch(lens)
        outputs = []
        for backend in (in_gemm, separate):
            backend.prepare_lora_batch(batch, [s for _, s in requests], RANKS, SCALINGS, use_cuda_graph=False)
            base_fn = (lambda: pytest.fail("SGLang's base GEMM ran")) if backend is in_gemm else (
                lambda x=x: torch.nn.functional.linear(x, fused.weight[: QKV[-1]], fused.bias[: QKV[-1]]))
            outputs.append(backend.forward_with_base(layer, x, base_fn, pool_a, pool_b, None, tuple(QKV)))
        assert in_gemm.eager_in_gemm and not separate.eager_in_gemm
        ref = reference(x, layer, pool_a, pool_b, requests)
        for name, got in zip(("in_gemm", "separate"), outputs, strict=True):
            err = ((got.double().cpu() - ref).norm() / ref.norm()).item()
            assert err < 1e-2, (round_, name, err)
        gap = ((outputs[0].double() - outputs[1].double()).norm().cpu() / ref.norm()).item()
        assert gap < 1e-2, (round_, gap)
    assert in_gemm.batches_by_layout["eager_in_gemm"] == 3
    # The third batch reused the first's launch (bounds 1536 and 1024: ops.kept_plan_tokens).
    assert sorted(key[1] for key in in_gemm._eager_plans if key[0] == "in_gemm") == [1024, 1536]
    assert by_address == [False, False, True], by_address  # each plan's first launch takes the views
