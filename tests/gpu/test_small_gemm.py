"""GPU check of the one-launch module of small eager batches (``ops.KeptSmallGemmCall``: base GEMM,
shrink and expand in one Triton kernel, the default up to ``--vlora-eager-small-gemm-max-tokens``)
through the backend's ``forward_with_base``, compiled Triton on CUDA (skipped without it, under
Triton's interpreter, or without SGLang).

The q/k/v layer and pool of ``test_graph_modes`` (1024 -> 1024 + 256 + 256, with bias, ranks 16,
64 and 8 and the no-adapter slot), the pool's A rows appended to the base weight: batches of 16,
16 (three adapters and a request without one) and 64 tokens in turn, then the first again, each
against fp64 from the same bf16 operands and against the in-GEMM call (limit 0) on the same batch;
SGLang's base GEMM must not run, and the kept launch goes straight through the driver. Then the
kernel compiled ahead for a module shape: a kept call of it compiles nothing more. Relative error
of the whole output: bf16 1e-2.

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
    [(16, 2)],
    [(5, 2), (4, 0), (3, 1), (4, 3)],
    [(16, 1), (16, 2), (16, 3), (16, 2)],
]


def _compiled(kernel) -> int:
    return sum(len(cache[0]) for cache in kernel.device_caches.values())


def test_small_eager_batches_run_one_kernel_a_module():
    pytest.importorskip("sglang.srt.lora.backend.base_backend")

    from sglang_vlora.atmm import small_gemm
    from sglang_vlora.in_gemm_weights import ATTR

    g = torch.Generator().manual_seed(0)
    layer, pool_a, pool_b = appended_qkv_layer(g)
    fused = getattr(layer, ATTR)
    small, in_gemm = cuda_backend(eager_small_gemm_max_tokens=64), cuda_backend(eager_small_gemm_max_tokens=0)
    for round_, requests in enumerate([*BATCHES, BATCHES[0]]):
        lens = [n for n, _ in requests]
        x = torch.randn(sum(lens), D, generator=g).to("cuda", torch.bfloat16)
        outputs = []
        for backend in (small, in_gemm):
            backend.prepare_lora_batch(extend_batch(lens), [s for _, s in requests], RANKS, SCALINGS,
                                       use_cuda_graph=False)
            outputs.append(backend.forward_with_base(layer, x, lambda: pytest.fail("SGLang's base GEMM ran"),
                                                     pool_a, pool_b, None, tuple(QKV)))
        assert small.eager_small_gemm and in_gemm.eager_in_gemm_kept and not in_gemm.eager_small_gemm
        ref = reference(x, layer, pool_a, pool_b, requests)
        for name, got in zip(("small", "in_gemm"), outputs, strict=True):
            err = ((got.double().cpu() - ref).norm() / ref.norm()).item()
            assert err < 1e-2, (round_, name, err)
        gap = ((outputs[0].double() - outputs[1].double()).norm().cpu() / ref.norm()).item()
        assert gap < 1e-2, (round_, gap)
    assert small.batches_by_layout["eager_small_gemm"] == 4
    assert small._small_gemm_calls and fused.weight is small._small_gemm_calls[id(layer)].weight
    assert small_gemm._LAUNCHER.direct_count() >= 1  # straight through the driver

    # Compiled ahead for a shape no other call has run: its kept call compiles nothing more.
    from sglang_vlora.atmm import ops
    from sglang_vlora.atmm.static_items import StaticWorkItems
    from sglang_vlora.atmm.work_items import build_work_items

    k, rank, out = 1152, 32, (1152, 128, 128)
    offsets = [0, out[0], out[0] + out[1], sum(out)]
    a = torch.randn(3, 3 * rank, k, device="cuda", dtype=torch.bfloat16) * k**-0.5
    b = torch.randn(3, sum(out), rank, device="cuda", dtype=torch.bfloat16)
    static = StaticWorkItems.allocate(capacity=7, max_tokens=1024, num_slots=3, device="cuda", covers_tokens=True)
    ops.compile_small_gemm(torch.empty(16, k, device="cuda", dtype=torch.bfloat16), sum(out) + 3 * 3 * rank, False,
                           a, b, static, offsets)
    before = _compiled(small_gemm._small_gemm_lora_kernel)
    weight = torch.randn(sum(out) + 3 * 3 * rank, k, device="cuda", dtype=torch.bfloat16) * k**-0.5
    for tokens in (7, 16, 33):
        static.fill(build_work_items([0], [tokens], [1], [1.0], [0, rank, rank], device="cuda"), tokens,
                    cover_to=tokens)
        call = ops.KeptSmallGemmCall(weight, None, sum(out), a, b, static, offsets, ops.kept_plan_tokens(tokens), {})
        call(torch.randn(tokens, k, device="cuda", dtype=torch.bfloat16))
    torch.cuda.synchronize()
    assert _compiled(small_gemm._small_gemm_lora_kernel) == before
