"""Every decision says why it went that way: each reason on a hand-built state.

Costs come from ``builders.MEASURED``: a fresh request (256 prompt tokens, 16 output
tokens) takes 0.28 s unmerged, so with theta 0.6 s a request that arrived at ``now``
does not starve and one that waited 1 s does.
"""

import dataclasses

import pytest

from sglang_vlora.orchestrator import (
    DECISION_REASONS,
    Decision,
    Mode,
    PolicyConfig,
    SchedulerState,
    make_policy,
)
from sglang_vlora.orchestrator.policy import (
    BELOW_MAX_BATCH,
    DRAIN_MERGED,
    DRAIN_UNMERGED,
    FREE_SLOT,
    IDLE,
    KEPT_NO_SLOT,
    KEPT_PLURALITY,
    KEPT_SWITCH_BUDGET,
    MERGE,
    NEVER_MERGES,
    NO_ADAPTER,
    NO_MAJORITY,
    SERVE_ONE_ADAPTER,
    STARVING,
)
from tests.orchestrator.builders import cost_model, req, running, state

THETA = 0.6


def decide(name: str, current: SchedulerState, max_batch: int, **config) -> Decision:
    return make_policy(name, PolicyConfig(THETA, max_batch, **config), cost_model()).decide(current)


def test_reasons_are_distinct():
    assert len(set(DECISION_REASONS)) == len(DECISION_REASONS)


def test_merge_when_line_5_holds():
    decision = decide("vlora", state(1.0, [req(f"a{i}", "a", 1.0) for i in range(3)]), max_batch=4)
    assert (decision.mode, decision.adapter, decision.reason) == (Mode.MERGE, "a", MERGE)


def test_no_adapter_when_every_request_is_the_base_models():
    decision = decide("vlora", state(1.0, [req("x1", None, 1.0), req("x2", None, 1.0)]), max_batch=2)
    assert (decision.mode, decision.reason) == (Mode.UNMERGE, NO_ADAPTER)


def test_no_majority_when_the_top_adapter_has_half_of_the_requests_in_flight():
    waiting = [req("a1", "a", 1.0), req("a2", "a", 1.0), req("b1", "b", 1.0), req("b2", "b", 1.0)]
    decision = decide("vlora", state(1.0, waiting), max_batch=4)
    assert (decision.mode, decision.reason) == (Mode.UNMERGE, NO_MAJORITY)


def test_below_max_batch_when_a_majority_in_flight_is_at_most_half_of_max_batch():
    """Two of the three requests in flight are a's: a majority of them, but no more than
    half of a max batch of 8 (a max batch above the load keeps the weights clean)."""
    waiting = [req("a1", "a", 1.0), req("a2", "a", 1.0), req("b1", "b", 1.0)]
    decision = decide("vlora", state(1.0, waiting), max_batch=8)
    assert (decision.mode, decision.reason) == (Mode.UNMERGE, BELOW_MAX_BATCH)
    assert decide("vlora", state(1.0, waiting), max_batch=3).reason == MERGE


def test_starving_when_more_than_half_of_max_batch_starve_elsewhere():
    """Three a's running (the majority of a max batch of 4) and b, c, d waiting for 1 s
    (over theta): merged weights would run all three in mixture, so the weights unmerge."""
    waiting = [req(f"{x}1", x, 0.0) for x in "bcd"]
    busy = [running(f"a{i}", "a", 1.0) for i in range(3)]
    decision = decide("vlora", state(1.0, waiting, busy), max_batch=4)
    assert set(decision.starving) == {"b1", "c1", "d1"}
    assert (decision.mode, decision.reason) == (Mode.UNMERGE, STARVING)


def test_the_top_adapters_own_starving_requests_do_not_unmerge_it():
    """Three a's of a max batch of 4 waited 1 s (over theta): they starve, but merged weights
    serve them fastest, so line 5 does not count them (the paper's count unmerged here)."""
    decision = decide("vlora", state(1.0, [req(f"a{i}", "a", 0.0) for i in range(3)]), max_batch=4)
    assert len(decision.starving) == 3
    assert (decision.mode, decision.adapter, decision.reason) == (Mode.MERGE, "a", MERGE)
    assert decide("dlora", state(1.0, [req(f"a{i}", "a", 0.0) for i in range(3)]), max_batch=4).reason == STARVING


def test_kept_switch_budget_when_the_budget_holds_the_weights():
    """a merged with a's request running; three of b make b the one to merge, but the last
    switch was just now: the weights stay and b's requests run around a (mixture)."""
    current = state(
        1.0, [req(f"b{i}", "b", 1.0) for i in (1, 2, 3)], [running("a1", "a", 0.9)], Mode.MERGE, "a"
    )
    held = decide("vlora", dataclasses.replace(current, last_switch=1.0), max_batch=4)
    assert (held.mode, held.adapter, held.reason) == (Mode.MIXTURE, "a", KEPT_SWITCH_BUDGET)
    moved = decide("vlora", dataclasses.replace(current, last_switch=0.0), max_batch=4)
    assert (moved.adapter, moved.reason) == ("b", MERGE)


def test_kept_switch_budget_also_holds_an_unmerge():
    """No adapter holds the majority, so Algorithm 1 wants clean weights; a switch just now keeps a."""
    current = state(1.0, [req("c1", "c", 1.0)], [running("b1", "b", 0.9)], Mode.MIXTURE, "a")
    held = decide("vlora", dataclasses.replace(current, last_switch=1.0), max_batch=4)
    assert (held.adapter, held.reason) == ("a", KEPT_SWITCH_BUDGET)
    assert decide("vlora", current, max_batch=4).reason == NO_MAJORITY


def test_kept_no_slot_when_the_adapter_to_merge_finds_no_pool_slot():
    """a merged, c's request running, b the majority: with two pool slots b cannot merge.
    The slots are checked first: a switch just now (over budget too) still says no slot."""
    current = state(
        1.0, [req(f"b{i}", "b", 1.0) for i in (1, 2, 3)], [running("c1", "c", 0.9)], Mode.MIXTURE, "a"
    )
    kept = decide("vlora", current, max_batch=4, adapter_slots=2)
    assert (kept.adapter, kept.reason) == ("a", KEPT_NO_SLOT)
    over_budget = dataclasses.replace(current, last_switch=1.0)
    assert decide("vlora", over_budget, max_batch=4, adapter_slots=2).reason == KEPT_NO_SLOT
    assert decide("vlora", current, max_batch=4, adapter_slots=3).reason == MERGE


def test_free_slot_when_nothing_runs_and_the_merged_adapter_holds_the_last_slot():
    """a merged in the only pool slot, one request of b waiting, nothing running: keeping a
    would admit nothing, ever (the GPU idle with a request waiting). The weights unmerge,
    which frees the slot, and b's request is admitted."""
    current = state(1.0, [req("b1", "b", 1.0)], [], Mode.MERGE, "a")
    freed = decide("vlora", current, max_batch=1, adapter_slots=1)
    assert (freed.mode, freed.adapter, freed.reason, freed.admit) == (Mode.UNMERGE, None, FREE_SLOT, ("b1",))
    assert decide("vlora", current, max_batch=1, adapter_slots=2).reason == MERGE


def test_kept_plurality_when_the_merged_adapter_is_still_the_most_requested():
    """a merged with two of the four requests in flight, b and c one each (b1 running):
    no majority. keep_merged "plurality" keeps a (b's running request makes it mixture)."""
    current = state(
        1.0, [req("a2", "a", 1.0), req("c1", "c", 1.0)], [running("a1", "a", 0.9), running("b1", "b", 0.9)],
        Mode.MIXTURE, "a",
    )
    kept = decide("vlora", current, max_batch=5, keep_merged="plurality")
    assert (kept.mode, kept.adapter, kept.reason) == (Mode.MIXTURE, "a", KEPT_PLURALITY)
    assert decide("vlora", current, max_batch=5).reason == NO_MAJORITY


@pytest.mark.parametrize("name", ["vlora", "merge-only", "unmerge-only", "dlora"])
def test_idle_without_requests(name):
    assert decide(name, state(1.0, mode=Mode.MERGE, merged="a"), max_batch=4).reason == IDLE


def test_merge_only_serves_one_adapter_and_drains():
    six_a = [running(f"a{i}", "a", 0.2) for i in range(1, 7)]
    b_starves = state(0.5, [req("b1", "b", 0.0)], six_a, Mode.MERGE, "a")
    assert (
        decide("merge-only", dataclasses.replace(b_starves, now=0.25), max_batch=8).reason
        == SERVE_ONE_ADAPTER
    )
    assert decide("merge-only", b_starves, max_batch=8).reason == DRAIN_MERGED
    mixed = state(0.5, [req("c1", "c", 0.0)], [running("a1", "a"), running("b1", "b")], Mode.MIXTURE, "a")
    assert decide("merge-only", mixed, max_batch=8).reason == DRAIN_UNMERGED


def test_unmerge_only_never_merges():
    decision = decide("unmerge-only", state(1.0, [req(f"a{i}", "a", 1.0) for i in range(4)]), max_batch=4)
    assert decision.reason == NEVER_MERGES


def test_dlora_reasons():
    busy = [running("a1", "a"), running("a2", "a"), running("b1", "b"), running("b2", "b")]
    waiting = [req("a3", "a", 0.1), req("a4", "a", 0.1), req("c1", "c", 0.1)]
    assert decide("dlora", state(0.2, waiting, busy), max_batch=7).reason == DRAIN_UNMERGED
    only_a = [running(f"a{i}", "a") for i in range(1, 5)]
    assert decide("dlora", state(0.3, [req("c1", "c", 0.1)], only_a), max_batch=7).reason == MERGE
    merged_b = state(
        0.3, [req(f"a{i}", "a", 0.3) for i in range(4)], [running("b1", "b", 0.2)], Mode.MERGE, "b"
    )
    assert decide("dlora", merged_b, max_batch=7).reason == DRAIN_MERGED
    around_b = dataclasses.replace(
        merged_b, running=(running("b1", "b", 0.2), running("c1", "c", 0.2)), mode=Mode.MIXTURE
    )
    assert decide("dlora", around_b, max_batch=7).reason == DRAIN_UNMERGED
    # one starving request of six: V-LoRA would merge (mixture), dLoRA unmerges
    starving = state(
        0.5, [req("b1", "b", 0.0)], [running(f"a{i}", "a", 0.2) for i in range(1, 7)], Mode.MERGE, "a"
    )
    assert decide("dlora", starving, max_batch=8).reason == STARVING
    assert decide("vlora", starving, max_batch=8).reason == MERGE
    assert (
        decide("dlora", state(0.3, [req("a1", "a", 0.3), req("b1", "b", 0.3)]), max_batch=4).reason
        == NO_MAJORITY
    )
