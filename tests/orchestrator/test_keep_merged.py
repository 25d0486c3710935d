"""``keep_merged``: whether merged weights stay merged once Algorithm 1's line 5 fails.

Costs come from ``builders.MEASURED``: a fresh request takes 0.28 s unmerged, so with theta
0.6 s a request that arrived at ``now`` does not starve and one that waited 1 s does.
"""

import pytest

from sglang_vlora.orchestrator import Decision, Mode, PolicyConfig, SchedulerState, make_policy
from sglang_vlora.orchestrator.policy import KEPT_PLURALITY, MERGE, NO_MAJORITY, STARVING
from tests.orchestrator.builders import cost_model, req, running, state

THETA = 0.6
NOW = 1.0


def decide(
    current: SchedulerState, max_batch: int, keep_merged: str, admission: str = "algorithm1"
) -> Decision:
    config = PolicyConfig(THETA, max_batch, admission=admission, keep_merged=keep_merged)
    return make_policy("vlora", config, cost_model()).decide(current)


def a_plurality(merged: str | None, waited: float = 0.0) -> SchedulerState:
    """a holds 3 of the 7 requests in flight, b and c 2 each: the most requested adapter, but
    no majority. a1, a2 and b1 run; a3, b2, c1 and c2 wait (for ``waited`` seconds)."""
    waiting = [req("a3", "a", NOW), *(req(rid, rid[0], NOW - waited) for rid in ("b2", "c1", "c2"))]
    busy = [running("a1", "a", NOW), running("a2", "a", NOW), running("b1", "b", NOW)]
    return state(NOW, waiting, busy, Mode.UNMERGE if merged is None else Mode.MIXTURE, merged)


def test_majority_unmerges_a_merged_adapter_that_lost_its_majority():
    decision = decide(a_plurality("a"), max_batch=8, keep_merged="majority")
    assert (decision.mode, decision.adapter, decision.reason) == (Mode.UNMERGE, None, NO_MAJORITY)
    assert decision.admit == ("a3", "b2", "c1", "c2")


def test_plurality_keeps_the_most_requested_adapter_merged():
    """Algorithm 1's admission: a's waiting request joins, b's and c's wait; b1 runs, so mixture."""
    decision = decide(a_plurality("a"), max_batch=8, keep_merged="plurality")
    assert (decision.mode, decision.adapter, decision.reason) == (Mode.MIXTURE, "a", KEPT_PLURALITY)
    assert decision.starving == () and decision.admit == ("a3",)
    assert decision.batch == ("a1", "a2", "a3", "b1")


def test_plurality_with_admission_all_admits_the_other_adapters_at_once():
    decision = decide(a_plurality("a"), max_batch=8, keep_merged="plurality", admission="all")
    assert (decision.mode, decision.adapter, decision.reason) == (Mode.MIXTURE, "a", KEPT_PLURALITY)
    assert decision.admit == ("a3", "b2", "c1", "c2")
    assert decision.batch == ("a1", "a2", "a3", "b1", "b2", "c1", "c2")


def test_plurality_runs_merge_when_only_the_merged_adapters_requests_run():
    """Kept with no other adapter's request running: the batch is a's alone, so merge."""
    waiting = [req("b1", "b", NOW), req("c1", "c", NOW)]
    current = state(NOW, waiting, [running("a1", "a", NOW)], Mode.MERGE, "a")
    decision = decide(current, max_batch=4, keep_merged="plurality")
    assert (decision.mode, decision.adapter, decision.reason) == (Mode.MERGE, "a", KEPT_PLURALITY)
    assert decision.batch == ("a1",)


def test_plurality_lets_go_when_another_adapter_is_the_most_requested():
    """a merged with 2 requests, b has 3: b is the top adapter. Under a max batch of 8 line 5
    fails for b too (unmerge); under 5 it holds and b is merged."""
    waiting = [req("b2", "b", NOW), req("b3", "b", NOW), req("c1", "c", NOW), req("c2", "c", NOW)]
    busy = [running("a1", "a", NOW), running("a2", "a", NOW), running("b1", "b", NOW)]
    current = state(NOW, waiting, busy, Mode.MIXTURE, "a")
    unmerged = decide(current, max_batch=8, keep_merged="plurality")
    assert (unmerged.mode, unmerged.adapter, unmerged.reason) == (Mode.UNMERGE, None, NO_MAJORITY)
    merged_b = decide(current, max_batch=5, keep_merged="plurality")
    assert (merged_b.mode, merged_b.adapter, merged_b.reason) == (Mode.MIXTURE, "b", MERGE)


def test_plurality_lets_go_when_more_than_half_of_max_batch_starve():
    """b2, c1 and c2 waited 1 s (over theta): 3 starving of a max batch of 6 is half, kept.
    Of a max batch of 5 more than half: unmerged, and since a's 3 are more than half of 5,
    line 5 failed on its first half (starving)."""
    current = a_plurality("a", waited=1.0)
    kept = decide(current, max_batch=6, keep_merged="plurality")
    assert set(kept.starving) == {"b2", "c1", "c2"}
    assert (kept.adapter, kept.reason) == ("a", KEPT_PLURALITY)
    assert kept.admit[:3] == kept.starving  # the starving first
    released = decide(current, max_batch=5, keep_merged="plurality")
    assert (released.mode, released.adapter, released.reason) == (Mode.UNMERGE, None, STARVING)


def test_plurality_lets_go_when_too_many_starve_without_a_majority():
    """One more starving request of c (a and c tie at 3: the merged a is the top one): 4
    starving of a max batch of 6 is more than half; a holds no majority of the 8 in flight."""
    current = a_plurality("a", waited=1.0)
    current = state(NOW, (*current.waiting, req("c3", "c", 0.0)), current.running, Mode.MIXTURE, "a")
    decision = decide(current, max_batch=6, keep_merged="plurality")
    assert len(decision.starving) == 4
    assert (decision.mode, decision.adapter, decision.reason) == (Mode.UNMERGE, None, NO_MAJORITY)


@pytest.mark.parametrize("admission", ["algorithm1", "all"])
def test_plurality_never_enters_a_merge(admission):
    decision = decide(a_plurality(None), max_batch=8, keep_merged="plurality", admission=admission)
    assert (decision.mode, decision.adapter, decision.reason) == (Mode.UNMERGE, None, NO_MAJORITY)
    assert decision == decide(a_plurality(None), max_batch=8, keep_merged="majority", admission=admission)


def test_the_knob_changes_nothing_while_line_5_holds():
    waiting = [req("a3", "a", NOW), req("b2", "b", NOW)]
    current = state(NOW, waiting, [running("a1", "a", NOW), running("a2", "a", NOW)], Mode.MERGE, "a")
    majority = decide(current, max_batch=5, keep_merged="majority")
    assert (majority.mode, majority.adapter, majority.reason) == (Mode.MERGE, "a", MERGE)
    assert decide(current, max_batch=5, keep_merged="plurality") == majority


@pytest.mark.parametrize("name", ["vlora", "merge-only", "unmerge-only", "dlora"])
def test_bad_keep_merged_is_refused_by_name(name):
    message = r"keep_merged must be one of \('majority', 'plurality', 'popular'\), got 'always'"
    with pytest.raises(ValueError, match=message):
        make_policy(name, PolicyConfig(THETA, 4, keep_merged="always"), cost_model())


@pytest.mark.parametrize("name", ["merge-only", "unmerge-only", "dlora"])
def test_the_comparison_policies_ignore_the_knob(name):
    current = a_plurality("a")
    plurality = make_policy(name, PolicyConfig(THETA, 8, keep_merged="plurality"), cost_model())
    majority = make_policy(name, PolicyConfig(THETA, 8), cost_model())
    assert plurality.decide(current) == majority.decide(current)
