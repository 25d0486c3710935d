"""A batch is LoRA-active exactly when it has work items.

With adapter ``k`` merged, a batch of ``k``'s requests only has no work item, yet SGLang
counts it LoRA-active because its requests name an adapter; a batch of base-model requests
needs the ``-k`` items, yet SGLang counts it inactive (no request names an adapter). The
plugin's hooks set activity from the work items, so SGLang's own layer logic
(``BaseLayerWithLoRA.lora_active``) skips LoRA exactly when there is none to run, in eager
forwards, and its decode runner replays the base-only graph exactly then. Checked here with the real backend, SGLang's real
``lora_active`` property and ``_resolve_lora_variant`` method, and the hooks as registered;
that a merged server's answers stay right is checked by the mode parity tests."""

from types import SimpleNamespace

import pytest
import torch
from sglang.srt.lora.layers import BaseLayerWithLoRA
from sglang.srt.model_executor.forward_batch_info import ForwardMode
from sglang.srt.model_executor.runner.decode_cuda_graph_runner import DecodeCudaGraphRunner
from sglang.srt.model_executor.runner_utils.capture_mode import capture_lora_variant, model_capture_mode

from sglang_vlora.backend import ATMMLoRABackend
from sglang_vlora.config import VLoRAConfig
from sglang_vlora.modes.mode_hooks import lora_graph_if_work_around, no_work_no_lora_after
from sglang_vlora.runtime import VLoRARuntime

RANKS = [0, 8, 16, 4]  # slot 0: the base model
SCALINGS = [0.0, 2.0, 0.5, 1.5]
MERGED_SLOT = 2


class FakeController:
    def __init__(self, merged_slot):
        self.merged_uid = None if merged_slot is None else f"uid{merged_slot}"
        self.slot = merged_slot

    def merged_slot(self, lora_ranks, scalings):
        return self.slot


def prepared(merged_slot, slots, graph):
    """A backend after SGLang's LoRA manager prepared a batch of ``slots`` (the manager's own
    has_active_lora rule, then the plugin's hook)."""
    rt = VLoRARuntime(VLoRAConfig(), controller=FakeController(merged_slot))
    backend = ATMMLoRABackend(max_loras_per_batch=len(RANKS), device=torch.device("cpu"), impl="torch", runtime=rt)
    backend.init_decode_cuda_graph_batch_info(max_bs_in_cuda_graph=8, num_tokens_per_req=1)
    if graph:
        batch = SimpleNamespace(forward_mode=ForwardMode.DECODE, batch_size=len(slots))
    else:
        batch = SimpleNamespace(
            forward_mode=ForwardMode.EXTEND, batch_size=len(slots),
            extend_seq_lens=torch.full((len(slots),), 3, dtype=torch.int32), extend_seq_lens_cpu=[3] * len(slots),
        )
    backend.prepare_lora_batch(batch, slots, RANKS, SCALINGS, use_cuda_graph=graph)
    backend.batch_info.has_active_lora = any(RANKS[s] > 0 for s in slots)  # what SGLang's manager sets
    manager = SimpleNamespace(lora_backend=backend)
    no_work_no_lora_after(rt, None, manager, batch)
    return rt, backend, manager


def lora_active(backend) -> bool:
    """SGLang's own decision, for a LoRA-wrapped layer of this backend."""
    return BaseLayerWithLoRA.lora_active.fget(SimpleNamespace(lora_backend=backend, set_lora=True))


def replayed_variant(rt, manager, lora_ids) -> str | None:
    runner = SimpleNamespace(record_nolora_graph=True, model_runner=SimpleNamespace(lora_manager=manager))
    return lora_graph_if_work_around(
        rt, DecodeCudaGraphRunner._resolve_lora_variant, runner, SimpleNamespace(lora_ids=lora_ids)
    )


CASES = [  # (label, merged slot, request slots, LoRA work expected)
    ("merged adapter's requests only", MERGED_SLOT, [2, 2, 2], False),
    ("merged adapter and base-model requests (-k items)", MERGED_SLOT, [2, 0, 2], True),
    ("merged adapter and another adapter (mixture)", MERGED_SLOT, [2, 1], True),
    ("nothing merged, adapters", None, [1, 3], True),
    ("merged adapter, base-model requests only (-k items)", MERGED_SLOT, [0, 0], True),
    ("nothing merged, base model only", None, [0, 0], False),
]


@pytest.mark.parametrize("graph", [False, True], ids=["eager", "graph"])
@pytest.mark.parametrize(("label", "merged", "slots", "work"), CASES, ids=[c[0] for c in CASES])
def test_batches_without_work_skip_lora(label, merged, slots, work, graph):
    rt, backend, manager = prepared(merged, slots, graph)
    assert backend.has_lora_work is work
    layout = "graph" if graph else "eager"
    assert backend.batches_without_work == {"eager": 0, "graph": 0, layout: 0 if work else 1}
    assert backend.batch_info.has_active_lora is work
    assert lora_active(backend) is work
    lora_ids = [None if s == 0 else f"uid{s}" for s in slots]
    expected = "lora" if work else "nolora"
    assert replayed_variant(rt, manager, lora_ids) == expected


def test_capture_still_records_the_lora_graph():
    """SGLang captures with a base-only batch (no work): the "lora" variant must still hold
    the LoRA launches, the "nolora" one must not."""
    _, backend, _ = prepared(None, [0] * 4, graph=True)
    with model_capture_mode():
        with capture_lora_variant("lora"):
            assert lora_active(backend)
        with capture_lora_variant("nolora"):
            assert not lora_active(backend)


def test_a_runner_without_the_base_graph_keeps_its_variant():
    """SGLang captured no base-only graph (record_nolora_graph off): the variant stays None."""
    rt, _, manager = prepared(MERGED_SLOT, [2, 2], graph=True)
    runner = SimpleNamespace(record_nolora_graph=False, model_runner=SimpleNamespace(lora_manager=manager))
    got = lora_graph_if_work_around(
        rt, DecodeCudaGraphRunner._resolve_lora_variant, runner, SimpleNamespace(lora_ids=["uid2", "uid2"])
    )
    assert got is None


def _decode_batch(backend, slots):
    batch = SimpleNamespace(forward_mode=ForwardMode.DECODE, batch_size=len(slots))
    backend.prepare_lora_batch(batch, slots, RANKS, SCALINGS, use_cuda_graph=True)
    return batch


@pytest.mark.parametrize("base_graph", [True, False], ids=["base-only graph", "one graph"])
def test_a_merged_only_decode_batch_writes_no_items_only_where_the_base_only_graph_replays(base_graph, monkeypatch):
    """Once the runner has resolved a replay, the backend knows whether a base-only graph
    exists. With one, a decode batch wholly of the merged adapter's requests builds and writes
    no items (that graph reads none); with a single LoRA graph, which reads the static items
    at every replay, they are written as before. Batches with work always write theirs."""
    rt, backend, manager = prepared(MERGED_SLOT, [2, 1], graph=True)
    assert backend.base_only_decode_graph is False  # nothing replayed yet: every batch writes its items
    runner = SimpleNamespace(record_nolora_graph=base_graph, model_runner=SimpleNamespace(lora_manager=manager))
    lora_graph_if_work_around(rt, DecodeCudaGraphRunner._resolve_lora_variant, runner,
                              SimpleNamespace(lora_ids=["uid2", "uid1"]))
    assert backend.base_only_decode_graph is base_graph

    fills = []
    original_fill = backend.graph_items.fill
    monkeypatch.setattr(backend.graph_items, "fill", lambda *a, **k: (fills.append(a), original_fill(*a, **k)))
    batch = _decode_batch(backend, [2, 2, 2])
    assert backend.has_lora_work is False
    assert backend.use_graph_path and backend.static_items is backend.graph_items
    assert backend.batch_info.bs == backend.batch_info.num_segments == batch.batch_size == 3
    assert len(fills) == (0 if base_graph else 1)
    _decode_batch(backend, [2, 0])  # base-model requests with k merged: -k items, always written
    assert backend.has_lora_work is True and len(fills) == (1 if base_graph else 2)
    assert fills[-1][0].num_items > 0  # the items written were the -k ones
