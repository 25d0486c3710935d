"""GPU check of the GEMM whose tiles compute the shrink among themselves
(``gemm_shared_shrink.launch``, what ``ops.lora_apply_gemm`` runs), compiled Triton on CUDA in
bf16 (skipped without it or under Triton's interpreter).

Two modules: q/k/v 1024 -> 1024 + 256 + 256 (slices of 4, 1 and 1 column tiles), and a 4096 ->
4096 projection (16 column tiles, all producers). Pool max rank 64 (ranks 0, 16, 64, 8); requests
of several adapters that share row tiles, some tokens in no request. Against fp64 with relative
error 1e-2 (the bf16 roundings of the output and of the shrink): the output with the producers
as chosen, with one producer per slice, and with no polls (every tile computes its own shrink);
the scratch and the counts are zero after every launch; and the launch captured in a CUDA graph
and replayed on new inputs matches eager launches of the same inputs.
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

RANKS, MAX_RANK = [0, 16, 64, 8], 64
MODULES = {"qkv": (1024, [0, 1024, 1280, 1536]), "proj": (4096, [0, 4096])}
# (start, length, slot, scale): slots 1-3 inside the first row tiles, tokens 300-399 in none
REQUESTS = [(0, 40, 1, 0.5), (40, 100, 2, 1.0), (140, 60, 3, 2.0), (200, 100, 1, -1.0), (400, 1100, 2, 0.25)]
M = 1500


def _operands(seed: int, module: str):
    k, offsets = MODULES[module]
    g = torch.Generator().manual_seed(seed)
    slices = len(offsets) - 1
    a = torch.randn(len(RANKS), slices * MAX_RANK, k, generator=g) / k**0.5
    b = torch.randn(len(RANKS), offsets[-1], MAX_RANK, generator=g) / MAX_RANK**0.5
    w = torch.randn(offsets[-1], k, generator=g) / k**0.5
    bias = torch.randn(offsets[-1], generator=g)
    x = torch.randn(M, k, generator=g)
    return [t.to("cuda", torch.bfloat16) for t in (x, a, b, w, bias)]


def _reference(module, x, a, b, w, bias):
    offsets = MODULES[module][1]
    starts, lens, slots, scales = (list(c) for c in zip(*REQUESTS, strict=True))
    base = x.double().cpu() @ w.double().cpu().T + bias.double().cpu()
    return base + ref_delta(x, a, b, offsets, RANKS, starts, lens, slots, scales)


def _maps():
    from sglang_vlora.atmm import gemm_lora
    from sglang_vlora.atmm.work_items import build_work_items

    starts, lens, slots, scales = (list(c) for c in zip(*REQUESTS, strict=True))
    items = build_work_items(starts, lens, slots, scales, RANKS, device="cuda")
    return (*gemm_lora.token_maps(items, M, torch.device("cuda")), items.ranks)


@pytest.mark.parametrize("module", sorted(MODULES))
@pytest.mark.parametrize(("producers", "max_polls"), [(16, None), (1, None), (16, 0)])
def test_shared_shrink_matches_fp64(module: str, producers: int, max_polls: int | None) -> None:
    from sglang_vlora.atmm import gemm_shared_shrink

    x, a, b, w, bias = _operands(0, module)
    offsets = MODULES[module][1]
    polls = {} if max_polls is None else {"max_polls": max_polls}
    ref = _reference(module, x, a, b, w, bias)
    for _ in range(3):
        out = torch.empty(M, offsets[-1], device="cuda", dtype=torch.bfloat16)
        gemm_shared_shrink.launch(x, w, bias, a, b, *_maps(), offsets, out, producers=producers, **polls)
        torch.cuda.synchronize()
        assert rel_err(out, ref) < 1e-2
        scratch, counts = gemm_shared_shrink.shared_state(x.device, M, MAX_RANK)
        assert int(counts.abs().max()) == 0 and float(scratch.abs().max()) == 0.0


def test_shared_shrink_replays_in_a_cuda_graph() -> None:
    from sglang_vlora.atmm import gemm_shared_shrink

    x, a, b, w, bias = _operands(1, "qkv")
    offsets = MODULES["qkv"][1]
    maps = _maps()
    out = torch.empty(M, offsets[-1], device="cuda", dtype=torch.bfloat16)
    gemm_shared_shrink.launch(x, w, bias, a, b, *maps, offsets, out)  # compiles, allocates the state
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        gemm_shared_shrink.launch(x, w, bias, a, b, *maps, offsets, out)
    for seed in range(3):
        x.copy_(torch.randn(M, x.shape[1], generator=torch.Generator().manual_seed(seed)).to("cuda", torch.bfloat16))
        graph.replay()
        eager = torch.empty_like(out)
        gemm_shared_shrink.launch(x, w, bias, a, b, *maps, offsets, eager)
        torch.cuda.synchronize()
        assert rel_err(out, _reference("qkv", x, a, b, w, bias)) < 1e-2
        assert rel_err(out, eager.double().cpu()) < 1e-3
