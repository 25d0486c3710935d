"""GPU check of eager batches run by launch plans kept across batches (``ops.lora_apply_kept``
through the backend's ``forward_with_base``, the default for eager batches above
``--vlora-eager-in-gemm-max-tokens``), compiled Triton on CUDA (skipped without it, under
Triton's interpreter, or without SGLang).

The q/k/v layer and pool of ``test_graph_modes`` (ranks 16, 64 and 8 and the no-adapter slot):
eager batches of token counts that share a bound and of others, in unmerge and mixture (slot 2
merged), each against fp64 from the same bf16 operands and against plans built for every batch
(``kept_plans`` off) on the same batch: relative error of the whole output within bf16's 1e-2.
Then the plans: one per bound, none built for a bound seen before, no device items built.

Run on a GPU machine with SGLang installed: ``TRITON_INTERPRET=0 python -m pytest tests/gpu``.
"""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest
import torch

from tests.gpu.appended_layer import appended_qkv_layer, extend_batch, reference
from tests.gpu.test_graph_modes import QKV, RANKS, SCALINGS, D

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1",
    reason="needs a CUDA GPU and compiled Triton",
)

BATCHES = [  # (merged slot, (tokens, slot) per request)
    (None, [(512, 1), (128, 2), (256, 0), (384, 1), (64, 3), (192, 2)]),  # 1536 tokens, permuted
    (None, [(700, 3), (600, 2)]),  # 1300: the same bound
    (2, [(400, 1), (300, 2), (200, 0), (500, 3)]),  # 1400, mixture: the same bound
    (None, [(3000, 2), (100, 1)]),  # 3100: past the buffers' first 2048 tokens
    (None, [(1024, 1)]),  # bound 1024
]


class Merged:
    """The mode controller as the backend sees it: the merged adapter's pool slot."""

    def __init__(self, slot):
        self.merged_uid, self.slot = (None, None) if slot is None else (f"uid{slot}", slot)

    def merged_slot(self, lora_ranks, scalings):
        lora_ranks[self.slot], scalings[self.slot] = RANKS[self.slot], SCALINGS[self.slot]
        return self.slot


def test_eager_batches_run_launch_plans_kept_across_batches():
    pytest.importorskip("sglang.srt.lora.backend.base_backend")

    from sglang_vlora.backend import ATMMLoRABackend
    from sglang_vlora.config import VLoRAConfig
    from sglang_vlora.in_gemm_weights import ATTR
    from sglang_vlora.runtime import VLoRARuntime

    g = torch.Generator().manual_seed(1)
    layer, pool_a, pool_b = appended_qkv_layer(g)
    fused = getattr(layer, ATTR)
    runtime = VLoRARuntime(VLoRAConfig(eager_in_gemm_max_tokens=0))
    kept, per_batch = (ATMMLoRABackend(max_loras_per_batch=4, device=torch.device("cuda"), impl="auto",
                                       runtime=runtime) for _ in range(2))
    per_batch.kept_plans = False
    assert kept.kept_plans
    for merged, requests in BATCHES:
        runtime.controller = Merged(merged)
        lens = [n for n, _ in requests]
        x = torch.randn(sum(lens), D, generator=g).to("cuda", torch.bfloat16)
        batch = extend_batch(lens)
        outputs = []
        for backend in (kept, per_batch):
            backend.prepare_lora_batch(batch, [s for _, s in requests], list(RANKS), list(SCALINGS),
                                       use_cuda_graph=False)
            outputs.append(backend.forward_with_base(
                SimpleNamespace(), x, lambda x=x: torch.nn.functional.linear(x, fused.weight[: QKV[-1]],
                                                                             fused.bias[: QKV[-1]]),
                pool_a, pool_b, None, tuple(QKV)))
        assert kept.eager_kept and not per_batch.eager_kept
        assert kept._work_items is None  # the static buffers only
        # Slot 2 merged: the base weights would hold it (here they do not), so its tokens get
        # nothing and every other token its own adapter less slot 2's delta.
        ref = reference(x, layer, pool_a, pool_b, [(n, 0 if s == merged else s) for n, s in requests])
        if merged is not None:
            ref -= reference(x, layer, pool_a, pool_b, [(n, merged if s != merged else 0) for n, s in requests])
            ref += reference(x, layer, pool_a, pool_b, [(sum(lens), 0)])
        for name, got in zip(("kept", "per_batch"), outputs, strict=True):
            err = ((got.double().cpu() - ref).norm() / ref.norm()).item()
            assert err < 1e-2, (merged, requests, name, err)
    bounds = sorted(key[1] for key in kept._eager_plans if key[0] == "apply")
    assert bounds == [1024, 3328], bounds  # the 1536 plan went with the first buffers
    assert kept.eager_static.max_tokens == 4096
    assert kept.batches_by_layout["eager_kept"] == len(BATCHES)
