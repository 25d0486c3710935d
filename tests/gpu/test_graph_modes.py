"""GPU check of the atmm backend's decode-CUDA-graph path in every inference mode
(skipped without CUDA, under Triton's interpreter, or without SGLang).

As SGLang's decode graph runner drives it: the backend is prepared with a padded,
base-only batch (no work items), a CUDA graph of LoRA layers is captured (the qkv
layer through ``forward_with_base``: the base GEMM with the shrink beside it on the
side stream; the o layer through ``run_lora_a_sgemm`` / ``run_lora_b_sgemm``), then
each later batch is prepared (the static items filled in place) and the graph
replayed: unmerge, merge and mixture batches with more, fewer and no items than at
capture, mixed ranks. Every replay is compared with the eager path on the same batch
and with an fp64 computation (relative error of the LoRA delta: bf16 1e-2, fp32 5e-3,
as Triton's fp32 dot runs in TF32).

Run on a GPU machine with SGLang installed: ``TRITON_INTERPRET=0 python -m pytest tests/gpu``.
"""

from __future__ import annotations

import os
from types import SimpleNamespace

import pytest
import torch

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1",
    reason="needs a CUDA GPU and compiled Triton",
)

D = 1024
QKV = [0, 1024, 1280, 1536]
RANKS = [0, 16, 64, 8]  # slot 0: the no-adapter slot
SCALINGS = [0.0, 2.0, 0.5, 1.5]
MERGED = 2
GRAPH_BS = 16
TOL = {torch.bfloat16: 1e-2, torch.float32: 5e-3}
REPLAYS = [  # (label, merged slot, request slots)
    ("unmerge, more items than captured", None, [1, 3, 3, 2, 0, 1, 2, 1, 3, 3, 0, 1]),
    ("mixture, the most items", MERGED, [1, 2, 3, 2, 1, 2, 3, 1, 2, 3, 2, 1, 2, 3, 0, 1]),
    ("mixture, fewer items", MERGED, [3, 0, 2]),
    ("merge, only the merged adapter", MERGED, [MERGED] * 9),
    ("mixture, base-only requests", MERGED, [0, 0, MERGED, 0]),
    ("unmerge, one request", None, [3]),
    ("unmerge, no adapter", None, [0] * GRAPH_BS),
    ("unmerge again, full batch", None, [2] * GRAPH_BS),
]


class FakeController:
    def __init__(self, merged):
        self.merged_uid = None if merged is None else "merged"
        self.slot = merged

    def merged_slot(self, lora_ranks, scalings):
        lora_ranks[self.slot], scalings[self.slot] = RANKS[self.slot], SCALINGS[self.slot]
        return self.slot


def delta_fp64(x, a, b, offsets, token_slots, merged):
    """+own delta for other adapters' tokens, -merged delta for every non-merged token."""
    x, a, b = x.double().cpu(), a.double().cpu(), b.double().cpu()
    out = torch.zeros(x.shape[0], offsets[-1], dtype=torch.float64)
    for t, slot in enumerate(token_slots):
        if slot == merged:
            continue
        for use, sign in ((slot, 1.0), (merged, -1.0)):
            if use is None or RANKS[use] == 0:
                continue
            r = RANKS[use]
            for s in range(len(offsets) - 1):
                lo, hi = offsets[s], offsets[s + 1]
                xa = x[t] @ a[use, s * r : (s + 1) * r].T
                out[t, lo:hi] += sign * SCALINGS[use] * (xa @ b[use, lo:hi, :r].T)
    return out


def rel(got, ref) -> float:
    assert torch.isfinite(got).all()
    return ((got.double().cpu() - ref).norm() / ref.norm().clamp_min(1e-30)).item()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32], ids=["bf16", "fp32"])
def test_graph_replays_every_mode_like_eager(dtype):
    pytest.importorskip("sglang.srt.lora.backend.base_backend")
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    from sglang_vlora.backend import ATMMLoRABackend
    from sglang_vlora.config import VLoRAConfig
    from sglang_vlora.runtime import VLoRARuntime

    g = torch.Generator().manual_seed(0)
    max_rank = max(RANKS)

    def randn(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g) * scale).to("cuda", dtype)

    a_qkv, b_qkv = randn(4, 3 * max_rank, D, scale=D**-0.5), randn(4, QKV[-1], max_rank, scale=max_rank**-0.5)
    a_o, b_o = randn(4, max_rank, D, scale=D**-0.5), randn(4, D, max_rank, scale=max_rank**-0.5)
    w_qkv = randn(QKV[-1], D, scale=D**-0.5)
    x = torch.zeros(GRAPH_BS, D, device="cuda", dtype=dtype)
    o_base = torch.zeros(GRAPH_BS, D, device="cuda", dtype=dtype)

    rt = VLoRARuntime(VLoRAConfig())
    backend = ATMMLoRABackend(max_loras_per_batch=4, device=torch.device("cuda"), impl="auto", runtime=rt)
    backend.init_decode_cuda_graph_batch_info(max_bs_in_cuda_graph=GRAPH_BS, num_tokens_per_req=1)

    def prepare(slots, merged, graph: bool):
        rt.controller = FakeController(merged)
        ranks = [r if s in slots else 0 for s, r in enumerate(RANKS)]
        batch = SimpleNamespace(forward_mode=ForwardMode.DECODE, batch_size=len(slots))
        backend.prepare_lora_batch(batch, slots, ranks, SCALINGS, use_cuda_graph=graph)

    qkv_offsets = torch.tensor(QKV, dtype=torch.int32)
    # What SGLang's QKV LoRA layer does in eager batches (forward_with_base calls it).
    qkv_layer = SimpleNamespace(
        apply_lora=lambda base, xs: backend.run_qkv_lora(xs, a_qkv, b_qkv, output_offset_cpu=qkv_offsets, base_output=base)
    )

    def layers(rows: int):
        xs = x[:rows]
        qkv = backend.forward_with_base(qkv_layer, xs, lambda: xs @ w_qkv.T, a_qkv, b_qkv, None, tuple(QKV))
        inter = backend.run_lora_a_sgemm(xs, a_o)
        o = backend.run_lora_b_sgemm(inter, b_o, output_offset_cpu=torch.tensor([0, D]), base_output=o_base[:rows].clone())
        return qkv, o

    # Capture as SGLang does: a padded base-only batch, warm-up runs, then the graph.
    prepare([0] * GRAPH_BS, None, graph=True)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            layers(GRAPH_BS)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        graph_qkv, graph_o = layers(GRAPH_BS)
    buffers = backend.graph_items.packed.data_ptr()

    for label, merged, slots in REPLAYS:
        n = len(slots)
        x.copy_(torch.randn(GRAPH_BS, D, generator=g).to(dtype))
        o_base.copy_(torch.randn(GRAPH_BS, D, generator=g).to(dtype))
        prepare(slots, merged, graph=True)
        graph.replay()
        torch.cuda.synchronize()
        got_qkv, got_o = graph_qkv[:n].clone(), graph_o[:n].clone()
        prepare(slots, merged, graph=False)
        eager_qkv, eager_o = layers(n)
        torch.cuda.synchronize()
        base_qkv = (x[:n].double() @ w_qkv.double().T).cpu()
        for got, eager, base, a, b, offsets in (
            (got_qkv, eager_qkv, base_qkv, a_qkv, b_qkv, QKV),
            (got_o, eager_o, o_base[:n].double().cpu(), a_o, b_o, [0, D]),
        ):
            ref = delta_fp64(x[:n], a, b, offsets, slots, merged)
            if ref.norm() == 0:  # no items: the base only
                assert torch.allclose(got.double().cpu(), base, rtol=TOL[dtype], atol=TOL[dtype]), label
                continue
            assert rel(got.double().cpu() - base, ref) < TOL[dtype] * 4, f"graph vs fp64: {label}"
            gap = (got.double().cpu() - eager.double().cpu()).norm() / ref.norm()
            assert gap < TOL[dtype], f"graph vs eager: {label}"
        assert backend.graph_items.packed.data_ptr() == buffers
