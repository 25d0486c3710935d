"""GPU check of the eager batches' LoRA inside the plugin's own GEMM (``--vlora-lora-gemm``:
``ops.lora_apply_gemm`` through the backend's ``forward_with_base``), compiled Triton on
CUDA (skipped without it, under Triton's interpreter, or without SGLang).

A q/k/v layer with the appended-rows stack (``in_gemm_weights``), 1024 -> 1024 + 256 + 256,
pool max rank 64 (ranks 16, 64, 8 and the no-adapter slot): an unmerged eager batch of 1536
tokens whose requests of one adapter are apart, with bias, against fp64; SGLang's base GEMM
must not run. Relative error of the whole output: bf16 1e-2 (the bf16 rounding of the output
and of the shrink's intermediate).

Run on a GPU machine with SGLang installed: ``TRITON_INTERPRET=0 python -m pytest tests/gpu``.
"""

from __future__ import annotations

import os

import pytest
import torch

from tests.gpu.appended_layer import appended_qkv_layer, extend_batch, reference
from tests.gpu.test_graph_modes import QKV, RANKS, SCALINGS, D  # the same q/k/v layer and pool

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1",
    reason="needs a CUDA GPU and compiled Triton",
)

REQUESTS = [(512, 1), (128, 2), (256, 0), (384, 1), (64, 3), (192, 2)]  # (tokens, slot)


def test_eager_batch_runs_the_lora_in_the_plugins_gemm():
    pytest.importorskip("sglang.srt.lora.backend.base_backend")

    from sglang_vlora.backend import ATMMLoRABackend
    from sglang_vlora.config import VLoRAConfig
    from sglang_vlora.runtime import VLoRARuntime

    g = torch.Generator().manual_seed(0)
    layer, pool_a, pool_b = appended_qkv_layer(g)
    lens = [n for n, _ in REQUESTS]
    xs = torch.randn(sum(lens), D, generator=g).to("cuda", torch.bfloat16)

    rt = VLoRARuntime(VLoRAConfig(lora_gemm="on"))
    backend = ATMMLoRABackend(max_loras_per_batch=4, device=torch.device("cuda"), impl="auto", runtime=rt)
    backend.shrink_in_gemm = True
    batch = extend_batch(lens)
    backend.prepare_lora_batch(batch, [s for _, s in REQUESTS], RANKS, SCALINGS, use_cuda_graph=False)
    assert backend.gemm_items is not None
    got = backend.forward_with_base(layer, xs, lambda: pytest.fail("SGLang's base GEMM ran"), pool_a, pool_b, None,
                                    tuple(QKV))
    assert backend.batches_by_layout["eager_lora_gemm"] == 1
    ref = reference(xs, layer, pool_a, pool_b, REQUESTS)
    err = ((got.double().cpu() - ref).norm() / ref.norm()).item()
    assert err < 1e-2, err
