"""GPU check of the GEMM that computes its own shrink (``gemm_lora.launch_fused``, what
``ops.lora_apply_gemm`` runs), compiled Triton on CUDA in bf16 (skipped without it or under
Triton's interpreter).

A q/k/v module 1024 -> 1024 + 256 + 256, pool max rank 64 (ranks 0, 16, 64, 8), 1500 tokens in
requests of several adapters that share row tiles, some tokens in no request: the output with
the shrink programs as chosen, with none (every tile its own shrink) and with one for every
unit, against fp64 (relative error 1e-2: the bf16 roundings of the output and of the shrink);
the launch state after each launch; and the launch captured in a CUDA graph, replayed on new
inputs, against eager launches of the same inputs (each replay must publish its own epoch: a
replay that trusted the previous one's flags would read a shrink not yet written).
"""

from __future__ import annotations

import os

import pytest
import torch

from tests.kernels.lora_reference import ref_delta, rel_err

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1",
    reason="needs a CUDA GPU and compiled Triton",
)

K, OFFSETS, RANKS, MAX_RANK = 1024, [0, 1024, 1280, 1536], [0, 16, 64, 8], 64
# (start, length, slot, scale): slots 1-3 inside the first row tiles, tokens 300-399 in none
REQUESTS = [(0, 40, 1, 0.5), (40, 100, 2, 1.0), (140, 60, 3, 2.0), (200, 100, 1, -1.0), (400, 1100, 2, 0.25)]
M = 1500


def _operands(seed: int):
    g = torch.Generator().manual_seed(seed)
    a = torch.randn(len(RANKS), 3 * MAX_RANK, K, generator=g) / K**0.5
    b = torch.randn(len(RANKS), OFFSETS[-1], MAX_RANK, generator=g) / MAX_RANK**0.5
    w = torch.randn(OFFSETS[-1], K, generator=g) / K**0.5
    bias = torch.randn(OFFSETS[-1], generator=g)
    return [t.to("cuda", torch.bfloat16) for t in (a, b, w, bias)]


def _reference(x, a, b, w, bias):
    starts, lens, slots, scales = (list(c) for c in zip(*REQUESTS, strict=True))
    base = x.double().cpu() @ w.double().cpu().T + bias.double().cpu()
    return base + ref_delta(x, a, b, OFFSETS, RANKS, starts, lens, slots, scales)


def _maps():
    from sglang_vlora.atmm import gemm_lora
    from sglang_vlora.atmm.work_items import build_work_items

    starts, lens, slots, scales = (list(c) for c in zip(*REQUESTS, strict=True))
    items = build_work_items(starts, lens, slots, scales, RANKS, device="cuda")
    return (*gemm_lora.token_maps(items, M, torch.device("cuda")), items.ranks)


@pytest.mark.parametrize("programs", [None, 0, 36])
def test_fused_shrink_matches_fp64(programs: int | None) -> None:
    from sglang_vlora.atmm import gemm_lora

    a, b, w, bias = _operands(0)
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    state = gemm_lora.launch_state(x.device)
    for _ in range(3):
        counter = int(state[0])
        out = torch.empty(M, OFFSETS[-1], device="cuda", dtype=torch.bfloat16)
        gemm_lora.launch_fused(x, w, bias, a, b, *_maps(), OFFSETS, out, programs=programs)
        torch.cuda.synchronize()
        assert rel_err(out, _reference(x, a, b, w, bias)) < 1e-2
        assert int(state[0]) == counter + 1 and int(state[1]) == 0


def test_fused_shrink_replays_in_a_cuda_graph() -> None:
    from sglang_vlora.atmm import gemm_lora

    a, b, w, bias = _operands(1)
    maps = _maps()
    x = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    out = torch.empty(M, OFFSETS[-1], device="cuda", dtype=torch.bfloat16)
    gemm_lora.launch_fused(x, w, bias, a, b, *maps, OFFSETS, out)  # compiles and arms the state
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        gemm_lora.launch_fused(x, w, bias, a, b, *maps, OFFSETS, out)
    for seed in range(3):
        x.copy_(torch.randn(M, K, generator=torch.Generator().manual_seed(seed)).to("cuda", torch.bfloat16))
        graph.replay()
        eager = torch.empty_like(out)
        gemm_lora.launch_fused(x, w, bias, a, b, *maps, OFFSETS, eager)
        torch.cuda.synchronize()
        ref = _reference(x, a, b, w, bias)
        assert rel_err(out, ref) < 1e-2
        assert rel_err(out, eager.double().cpu()) < 1e-3
