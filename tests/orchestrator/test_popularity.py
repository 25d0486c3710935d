"""Entering a merge needs a popular adapter: more than half of the recent arrivals.

At light load line 5 counts one or two requests in flight, so "more than half of MaxBS on
one adapter" holds for every lone request; the recent arrivals say whether the adapter keeps
the traffic. Costs come from ``builders.MEASURED``; theta 0.6 s, nothing starves here.
"""

from dataclasses import replace

import pytest

from sglang_vlora.orchestrator import Decision, Mode, PolicyConfig, SchedulerState, make_policy
from sglang_vlora.orchestrator.policy import (
    KEPT_PLURALITY,
    KEPT_POPULAR,
    MERGE,
    NO_MAJORITY,
    NOT_POPULAR,
    popular,
)
from tests.orchestrator.builders import cost_model, req, running, state

THETA = 0.6
NOW = 1.0
UNIFORM = ("a", "b", "c", "d") * 8  # 32 arrivals, a quarter each
SKEWED = ("a",) * 22 + ("b", "c", "d") * 3 + ("a",)  # a: 23 of 32


def decide(current: SchedulerState, max_batch: int = 1, keep_merged: str = "plurality") -> Decision:
    config = PolicyConfig(THETA, max_batch, admission="all", keep_merged=keep_merged)
    return make_policy("vlora", config, cost_model()).decide(current)


def lone(adapter: str, arrivals: tuple[str | None, ...], merged: str | None = None) -> SchedulerState:
    """One request of ``adapter`` waiting, nothing running, the weights as ``merged`` says."""
    current = state(NOW, [req("r1", adapter, NOW)], (), Mode.UNMERGE if merged is None else Mode.MERGE, merged)
    return replace(current, recent_arrivals=arrivals)


def test_share_is_over_all_recent_arrivals_base_model_included():
    current = lone("a", ("a", "a", None, "b"))
    assert current.arrival_share("a") == 0.5 and current.arrival_share("b") == 0.25
    assert not popular(current, "a")
    assert popular(replace(current, recent_arrivals=("a", "a", None)), "a")
    assert lone("a", ()).arrival_share("a") is None and popular(lone("a", ()), "a")


def test_lone_request_of_an_unpopular_adapter_runs_unmerged():
    """Uniform popularity at MaxBS 1: line 5 holds for b's lone request, b is not popular."""
    decision = decide(lone("b", UNIFORM))
    assert (decision.mode, decision.adapter, decision.reason) == (Mode.UNMERGE, None, NOT_POPULAR)
    assert decision.admit == ("r1",)


def test_lone_request_of_a_popular_adapter_is_merged():
    decision = decide(lone("a", SKEWED))
    assert (decision.mode, decision.adapter, decision.reason) == (Mode.MERGE, "a", MERGE)


def test_without_a_history_algorithm_1_merges_the_lone_request():
    decision = decide(lone("b", ()))
    assert (decision.mode, decision.adapter, decision.reason) == (Mode.MERGE, "b", MERGE)


@pytest.mark.parametrize("keep_merged", ["majority", "plurality"])
def test_an_unpopular_adapter_already_merged_stays_while_line_5_holds(keep_merged):
    """No switch to justify: line 5 holds for the merged adapter, so it stays merged."""
    decision = decide(lone("b", UNIFORM, merged="b"), keep_merged=keep_merged)
    assert (decision.mode, decision.adapter, decision.reason) == (Mode.MERGE, "b", MERGE)


def test_unpopular_merged_adapter_lets_go_of_another_adapters_lone_request():
    """Uniform: c merged, b's lone request: neither popular, the weights unmerge."""
    decision = decide(lone("b", UNIFORM, merged="c"))
    assert (decision.mode, decision.adapter, decision.reason) == (Mode.UNMERGE, None, NOT_POPULAR)


@pytest.mark.parametrize("keep_merged", ["majority", "plurality"])
def test_popular_merged_adapter_unmerges_for_another_adapters_lone_request(keep_merged):
    """Skewed: a merged and popular, b's lone request: b does not take the weights (not
    popular) and a does not stay for it (that would run it in mixture): clean weights."""
    decision = decide(lone("b", SKEWED, merged="a"), keep_merged=keep_merged)
    assert (decision.mode, decision.adapter, decision.reason) == (Mode.UNMERGE, None, NOT_POPULAR)
    assert decision.admit == ("r1",)


def test_a_popular_adapter_takes_the_weights_from_an_unpopular_merged_one():
    decision = decide(lone("a", SKEWED, merged="c"))
    assert (decision.mode, decision.adapter, decision.reason) == (Mode.MERGE, "a", MERGE)


def test_popularity_does_not_change_a_kept_plurality():
    """The merged adapter is still the top one in flight: kept as before, popular or not."""
    busy = [running("a1", "a", NOW), running("a2", "a", NOW), running("b1", "b", NOW)]
    waiting = [req("c1", "c", NOW), req("d1", "d", NOW)]
    current = replace(state(NOW, waiting, busy, Mode.MIXTURE, "a"), recent_arrivals=UNIFORM)
    decision = decide(current, max_batch=8)
    assert (decision.mode, decision.adapter, decision.reason) == (Mode.MIXTURE, "a", KEPT_PLURALITY)
    unmerged = decide(replace(current, merged=None, mode=Mode.UNMERGE), max_batch=8)
    assert (unmerged.adapter, unmerged.reason) == (None, NO_MAJORITY)


# keep_merged "popular": the merged adapter stays while the arrivals say it keeps the traffic.


def test_popular_keeps_a_popular_merged_adapter_for_another_adapters_lone_request():
    """Skewed: a merged and popular, b's lone request: b runs in mixture beside a, no switch."""
    decision = decide(lone("b", SKEWED, merged="a"), keep_merged="popular")
    assert (decision.mode, decision.adapter, decision.reason) == (Mode.MIXTURE, "a", KEPT_POPULAR)
    assert decision.admit == ("r1",)


def test_popular_keeps_the_merged_adapter_when_others_outnumber_it_in_flight():
    """a merged and popular with one request running, b and c two each: plurality lets go, popular keeps."""
    busy = [running("a1", "a", NOW), running("b1", "b", NOW), running("c1", "c", NOW)]
    waiting = [req("b2", "b", NOW), req("c2", "c", NOW)]
    current = replace(state(NOW, waiting, busy, Mode.MIXTURE, "a"), recent_arrivals=SKEWED)
    assert decide(current, max_batch=8).adapter is None
    kept = decide(current, max_batch=8, keep_merged="popular")
    assert (kept.mode, kept.adapter, kept.reason) == (Mode.MIXTURE, "a", KEPT_POPULAR)
    assert kept.admit == ("b2", "c2")


def test_popular_still_keeps_the_top_adapter_as_plurality_does():
    busy = [running("a1", "a", NOW), running("a2", "a", NOW), running("b1", "b", NOW)]
    current = replace(state(NOW, [req("c1", "c", NOW)], busy, Mode.MIXTURE, "a"), recent_arrivals=UNIFORM)
    decision = decide(current, max_batch=8, keep_merged="popular")
    assert (decision.mode, decision.adapter, decision.reason) == (Mode.MIXTURE, "a", KEPT_PLURALITY)


@pytest.mark.parametrize("arrivals", [UNIFORM, ()], ids=["not popular", "no history"])
def test_popular_lets_go_of_a_merged_adapter_the_arrivals_do_not_back(arrivals):
    """Uniform arrivals, or none recorded yet: nothing says a keeps the traffic; b's lone
    request is not a's, so the weights go clean (uniform) or follow b (no history: line 5)."""
    decision = decide(lone("b", arrivals, merged="a"), keep_merged="popular")
    assert decision.adapter == ("b" if not arrivals else None)
    assert decision.reason in (MERGE, NOT_POPULAR)


def test_popular_lets_go_when_more_than_half_of_max_batch_starve_elsewhere():
    """b's two requests waited 1 s (credit over theta 0.6): 2 starving of a max batch of 3."""
    busy = [running("a1", "a", NOW)]
    waiting = [req("b1", "b", NOW - 1.0), req("b2", "b", NOW - 1.0)]
    current = replace(state(NOW, waiting, busy, Mode.MIXTURE, "a"), recent_arrivals=SKEWED)
    decision = decide(current, max_batch=3, keep_merged="popular")
    assert set(decision.starving) == {"b1", "b2"}
    assert decision.adapter is None and decision.mode is Mode.UNMERGE


def test_a_lower_popular_share_lets_a_zipf_2_top_adapter_in():
    """SGLang's Zipf 2 over 4 adapters: the top one has about 8/15 of the arrivals; a window
    where it has 15 of 32 fails the default gate (more than half) and passes one of 0.4."""
    arrivals = ("a",) * 15 + ("b",) * 9 + ("c",) * 5 + ("d",) * 3
    current = lone("a", arrivals)
    assert decide(current).reason == NOT_POPULAR
    config = PolicyConfig(THETA, 1, admission="all", keep_merged="popular", popular_share=0.4)
    decision = make_policy("vlora", config, cost_model()).decide(current)
    assert (decision.mode, decision.adapter, decision.reason) == (Mode.MERGE, "a", MERGE)
    kept = make_policy("vlora", config, cost_model()).decide(lone("b", arrivals, merged="a"))
    assert (kept.mode, kept.adapter, kept.reason) == (Mode.MIXTURE, "a", KEPT_POPULAR)


@pytest.mark.parametrize("share", [-0.1, 1.0, 1.5])
def test_popular_share_outside_0_to_1_is_refused(share):
    with pytest.raises(ValueError, match="popular_share must be in"):
        PolicyConfig(THETA, 1, popular_share=share)
