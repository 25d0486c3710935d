"""The atmm backend's pure-torch paths against an fp32 per-token reference: mixed
ranks in one batch, stacked qkv / gate_up slices, empty segments, the no-adapter
slot, stale memory-pool columns beyond a slot's rank, and the decode-graph layout."""

from types import SimpleNamespace

import pytest
import torch
from sglang.srt.model_executor.forward_batch_info import ForwardMode

from sglang_vlora.backend import ATMMLoRABackend, segments_from_requests

D_IN = 24
MAX_RANK = 16
SLOTS_RANKS = [0, 8, 16, 4]  # slot 0 is the no-adapter slot
SCALINGS = [0.0, 2.0, 0.5, 1.5]


def pools(slices: list[int], seed: int = 0):
    """Memory pools as SGLang lays them out, with garbage beyond each slot's rank
    (a previous, larger adapter may have left it there)."""
    g = torch.Generator().manual_seed(seed)
    n = len(slices)
    a = torch.randn(len(SLOTS_RANKS), n * MAX_RANK, D_IN, generator=g)
    b = torch.randn(len(SLOTS_RANKS), sum(slices), MAX_RANK, generator=g)
    return a, b


def reference(x, a, b, token_slots, slices):
    offsets = [0]
    for s in slices:
        offsets.append(offsets[-1] + s)
    out = torch.zeros(x.shape[0], offsets[-1], dtype=torch.float64)
    for t, slot in enumerate(token_slots):
        r = SLOTS_RANKS[slot]
        if r == 0:
            continue
        for j in range(len(slices)):
            xa = x[t].double() @ a[slot, j * r : (j + 1) * r].double().T
            out[t, offsets[j] : offsets[j + 1]] += SCALINGS[slot] * (xa @ b[slot, offsets[j] : offsets[j + 1], :r].double().T)
    return out, offsets


def extend_batch(seq_lens):
    return SimpleNamespace(
        forward_mode=ForwardMode.EXTEND,
        batch_size=len(seq_lens),
        extend_seq_lens=torch.tensor(seq_lens, dtype=torch.int32),
        extend_seq_lens_cpu=list(seq_lens),
    )


def decode_batch(n):
    return SimpleNamespace(forward_mode=ForwardMode.DECODE, batch_size=n)


REQUESTS = [  # (seq_len, slot): mixed ranks, repeats, an empty segment, base requests
    (5, 1), (3, 1), (0, 2), (7, 2), (4, 0), (6, 3), (2, 1), (1, 0),
]


@pytest.mark.parametrize("slices", [[20], [12, 6, 6], [10, 10]], ids=["single", "qkv", "gate_up"])
def test_eager_path_matches_reference(slices):
    seq_lens = [n for n, _ in REQUESTS]
    slots = [s for _, s in REQUESTS]
    token_slots = [s for n, s in REQUESTS for _ in range(n)]
    x = torch.randn(sum(seq_lens), D_IN)
    a, b = pools(slices)
    expected, offsets = reference(x, a, b, token_slots, slices)

    backend = ATMMLoRABackend(max_loras_per_batch=len(SLOTS_RANKS), device=torch.device("cpu"))
    backend.prepare_lora_batch(extend_batch(seq_lens), slots, SLOTS_RANKS, SCALINGS, use_cuda_graph=False)
    base = torch.randn(x.shape[0], offsets[-1])
    offsets_cpu = torch.tensor(offsets, dtype=torch.int32)
    if len(slices) == 1:
        inter = backend.run_lora_a_sgemm(x, a)
        got = backend.run_lora_b_sgemm(inter, b, output_offset_cpu=offsets_cpu, base_output=base.clone())
    elif len(slices) == 3:
        got = backend.run_qkv_lora(x, a, b, output_offset_cpu=offsets_cpu, base_output=base.clone())
    else:
        got = backend.run_gate_up_lora(x, a, b, output_offset_cpu=offsets_cpu, base_output=base.clone())
    torch.testing.assert_close(got.double() - base.double(), expected, rtol=1e-4, atol=1e-4)
    assert backend.batch_info.expected_tokens == x.shape[0]


@pytest.mark.parametrize("slices", [[20], [12, 6, 6]], ids=["single", "qkv"])
def test_decode_graph_path_matches_reference(slices):
    slots = [1, 0, 3, 2, 2, 1]
    x = torch.randn(len(slots), D_IN)
    a, b = pools(slices, seed=1)
    expected, offsets = reference(x, a, b, slots, slices)
    backend = ATMMLoRABackend(max_loras_per_batch=len(SLOTS_RANKS), device=torch.device("cpu"))
    backend.init_decode_cuda_graph_batch_info(max_bs_in_cuda_graph=8, num_tokens_per_req=1)
    backend.prepare_lora_batch(decode_batch(len(slots)), slots, SLOTS_RANKS, SCALINGS, use_cuda_graph=True)
    offsets_cpu = torch.tensor(offsets, dtype=torch.int32)
    got = backend.run_qkv_lora(x, a, b, output_offset_cpu=offsets_cpu, n_slices=len(slices))
    torch.testing.assert_close(got.double(), expected, rtol=1e-4, atol=1e-4)
    # A later replay with another adapter mix reuses the same static tensors.
    static = backend.graph_info.token_slots
    new_slots = [3, 3, 0]
    backend.prepare_lora_batch(decode_batch(3), new_slots, SLOTS_RANKS, SCALINGS, use_cuda_graph=True)
    assert backend.graph_info.token_slots is static
    got = backend.run_qkv_lora(x[:3], a, b, output_offset_cpu=offsets_cpu, n_slices=len(slices))
    expected, _ = reference(x[:3], a, b, new_slots, slices)
    torch.testing.assert_close(got.double(), expected, rtol=1e-4, atol=1e-4)


def test_segments_group_consecutive_requests_only():
    starts, lengths, slots = segments_from_requests([2, 3, 1, 4], [1, 1, 2, 1])
    assert (starts, lengths, slots) == ([0, 5, 6], [5, 1, 4], [1, 2, 1])


def test_embedding_and_lm_head_targets_are_refused():
    backend = ATMMLoRABackend(max_loras_per_batch=2, device=torch.device("cpu"))
    with pytest.raises(ValueError, match="lm_head"):
        backend.validate_lora_targets(torch.nn.Linear(2, 2), {"q_proj", "lm_head"})


def test_graph_batch_larger_than_captured_is_refused():
    backend = ATMMLoRABackend(max_loras_per_batch=len(SLOTS_RANKS), device=torch.device("cpu"))
    backend.init_decode_cuda_graph_batch_info(max_bs_in_cuda_graph=2, num_tokens_per_req=1)
    with pytest.raises(RuntimeError, match="exceeds"):
        backend.prepare_lora_batch(decode_batch(3), [1, 1, 1], SLOTS_RANKS, SCALINGS, use_cuda_graph=True)
