"""The comparison policies, the registry, and the purity rules every policy keeps."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from sglang_vlora.orchestrator import (
    Mode,
    PolicyConfig,
    SchedulerState,
    make_policy,
    policy_names,
    register_policy,
)
from tests.orchestrator.builders import RANKS, cost_model, req, running, state

THETA = 0.6
REPO = Path(__file__).resolve().parents[2]


def policy(name: str, max_batch: int = 8):
    return make_policy(name, PolicyConfig(THETA, max_batch), cost_model())


def mixed_state(now: float) -> SchedulerState:
    """Six requests of a merged, one of b that starves from now = 0.45 on."""
    running_a = [running(f"a{i}", "a", 0.2) for i in range(1, 7)]
    return state(now, waiting=[req("b1", "b", 0.0)], running=running_a, mode=Mode.MERGE, merged="a")


def test_registry_lists_the_four_policies():
    assert policy_names() == ("dlora", "merge-only", "unmerge-only", "vlora")


def test_unknown_policy_names_the_known_ones():
    with pytest.raises(ValueError, match="known: .*vlora"):
        make_policy("fifo", PolicyConfig(THETA, 4), cost_model())


def test_a_name_registers_once():
    with pytest.raises(ValueError, match="already registered"):
        register_policy("vlora")(object)


def test_merge_only_drains_the_merged_adapter_then_moves_to_the_starving_one():
    merge_only = policy("merge-only")
    calm = merge_only.decide(mixed_state(0.25))
    assert (calm.mode, calm.adapter) == (Mode.MERGE, "a") and "b1" not in calm.batch
    # b1 starves, but a's requests are running and are never paused: merging b now would
    # run them as mixture, which merge-only does not have. It admits nothing until they end.
    starving = merge_only.decide(mixed_state(0.5))
    assert (starving.mode, starving.adapter) == (Mode.MERGE, "a")
    assert starving.batch == ("a1", "a2", "a3", "a4", "a5", "a6") and starving.admit == ()
    drained = merge_only.decide(state(0.6, waiting=[req("b1", "b", 0.0)], mode=Mode.MERGE, merged="a"))
    assert (drained.mode, drained.adapter, drained.batch) == (Mode.MERGE, "b", ("b1",))


def test_dlora_drains_other_adapters_before_it_merges():
    """Four a's and two b's running unmerged, a dominant: dLoRA admits only a's and
    stays unmerged until the b's are done, so it never runs a mixture batch."""
    dlora = policy("dlora", max_batch=7)
    busy = [running("a1", "a"), running("a2", "a"), running("b1", "b"), running("b2", "b")]
    waiting = [req("a3", "a", 0.1), req("a4", "a", 0.1), req("c1", "c", 0.1)]
    draining = dlora.decide(state(0.2, waiting=waiting, running=busy))
    assert (draining.mode, draining.adapter) == (Mode.UNMERGE, None)
    assert draining.admit == ("a3", "a4")
    only_a = [running(f"a{i}", "a") for i in range(1, 5)]
    merged = dlora.decide(state(0.3, waiting=[req("c1", "c", 0.1)], running=only_a))
    assert (merged.mode, merged.adapter, merged.admit) == (Mode.MERGE, "a", ())


def test_merge_only_serves_the_base_model_on_clean_weights():
    decision = policy("merge-only").decide(state(0.0, waiting=[req("base", None), req("b1", "b", 0.1)]))
    assert (decision.mode, decision.adapter, decision.batch) == (Mode.UNMERGE, None, ("base",))


def test_merge_only_leaves_an_adapter_without_requests():
    decision = policy("merge-only").decide(state(0.0, waiting=[req("c1", "c")], mode=Mode.MERGE, merged="a"))
    assert (decision.mode, decision.adapter) == (Mode.MERGE, "c")


def test_unmerge_only_never_merges():
    waiting = [req(f"a{i}", "a") for i in range(8)]
    decision = policy("unmerge-only").decide(state(0.0, waiting=waiting, mode=Mode.MERGE, merged="a"))
    assert (decision.mode, decision.adapter) == (Mode.UNMERGE, None) and len(decision.batch) == 8


def test_dlora_merges_like_vlora_but_unmerges_where_vlora_mixes():
    dlora, vlora = policy("dlora"), policy("vlora")
    assert dlora.decide(mixed_state(0.25)).mode is Mode.MERGE
    starving = mixed_state(0.5)
    assert vlora.decide(starving).mode is Mode.MIXTURE
    decision = dlora.decide(starving)
    assert (decision.mode, decision.adapter) == (Mode.UNMERGE, None)
    assert decision.batch == ("b1", "a1", "a2", "a3", "a4", "a5", "a6")


@pytest.mark.parametrize("name", ["vlora", "merge-only", "unmerge-only", "dlora"])
def test_decisions_never_read_a_clock(name, monkeypatch):
    def no_clock() -> float:
        raise AssertionError("a policy read the clock")

    for clock in ("time", "monotonic", "perf_counter", "time_ns", "monotonic_ns"):
        monkeypatch.setattr(time, clock, no_clock)
    assert policy(name).decide(mixed_state(0.5)).batch


RANK_PROBE = """
from sglang_vlora.orchestrator import Mode, PolicyConfig, make_policy, policy_names
from tests.orchestrator.builders import cost_model, req, running, state
waiting = [req(f"w{i}", "aabac"[i % 5] if i % 7 else None, 0.2 * (i // 4), slo=(i % 3 or None)) for i in range(40)]
busy = [running(f"r{i}", "abc"[i % 3], 0.02 * i) for i in range(12)]
for name in policy_names():
    for now, weights in ((0.3, (Mode.UNMERGE, None)), (0.9, (Mode.MERGE, "a")), (9.0, (Mode.MIXTURE, "b"))):
        for running_now in (busy, busy[::3]):  # busy[::3]: only a's
            config = PolicyConfig(1.0, 24, 4)
            print(make_policy(name, config, cost_model()).decide(state(now, waiting, running_now, *weights)))
"""


def test_ranks_with_different_hash_seeds_decide_alike():
    """TP ranks are separate processes, each with its own string-hash seed."""
    outputs = {
        subprocess.run(
            [sys.executable, "-c", RANK_PROBE],
            cwd=REPO,
            capture_output=True,
            text=True,
            check=True,
            env={**os.environ, "PYTHONHASHSEED": seed},
        ).stdout
        for seed in ("1", "2", "3")
    }
    assert len(outputs) == 1
    decisions = outputs.pop()
    assert all(f"mode=<Mode.{mode.name}" in decisions for mode in Mode)


def test_orchestrator_imports_neither_torch_nor_sglang():
    probe = (
        "import sys, sglang_vlora.orchestrator; "
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'sglang')))"
    )
    out = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


@pytest.mark.parametrize(("mode", "merged"), [(Mode.MERGE, None), (Mode.MIXTURE, None), (Mode.UNMERGE, "a")])
def test_state_rejects_weights_that_cannot_be(mode, merged):
    with pytest.raises(ValueError, match="merged adapter"):
        SchedulerState(0.0, (), (), mode, merged, RANKS)


def test_state_takes_mode_names():
    assert SchedulerState(0.0, (), (), "mixture", "a", RANKS).mode is Mode.MIXTURE
    with pytest.raises(ValueError):
        SchedulerState(0.0, (), (), "fused", "a", RANKS)


def test_state_rejects_duplicate_request_ids():
    with pytest.raises(ValueError, match="unique"):
        state(0.0, waiting=[req("x", "a")], running=[running("x", "b")])


@pytest.mark.parametrize(
    "kwargs",
    [
        {"theta": -1.0, "max_batch": 4},
        {"theta": float("nan"), "max_batch": 4},
        {"theta": 1.0, "max_batch": 0},
        {"theta": 1.0, "max_batch": 4, "adapter_slots": 0},
        {"theta": 1.0, "max_batch": 4, "admission": "fifo"},
        {"theta": 1.0, "max_batch": 4, "keep_merged": "always"},
    ],
)
def test_config_rejects_nonsense(kwargs):
    with pytest.raises(ValueError):
        PolicyConfig(**kwargs)


@pytest.mark.parametrize(
    ("name", "weights"),
    [
        ("vlora", (Mode.MIXTURE, "a")),
        ("merge-only", (Mode.MERGE, "a")),
        ("dlora", (Mode.MERGE, "a")),
        ("unmerge-only", (Mode.UNMERGE, None)),
    ],
)
def test_idle_keeps_weights_the_policy_can_use(name, weights):
    decision = policy(name).decide(state(1.0, mode=Mode.MIXTURE, merged="a"))
    assert (decision.mode, decision.adapter) == weights and decision.batch == ()
