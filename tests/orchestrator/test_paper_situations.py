"""Algorithm 1 (paper §4.4.3) on the situations the paper describes, with hand-checked numbers.

Costs come from ``builders.MEASURED``: a fresh request (256 prompt tokens, 16 output
tokens) takes 0.1856 s merged, 0.2227 s in mixture and 0.2784 s unmerged.
"""

import pytest

from sglang_vlora.orchestrator import Mode, PolicyConfig, make_policy
from tests.orchestrator.builders import cost_model, measured, req, running, state

THETA = 0.6


def vlora(max_batch: int, adapter_slots: int | None = None):
    return make_policy("vlora", PolicyConfig(THETA, max_batch, adapter_slots), cost_model())


def test_fig7_three_of_one_adapter_then_four_of_others():
    """Fig. 7: requests 1-3 share an adapter and run merged; 4-7 (four other adapters)
    wait while they are within theta, then force unmerge once they starve."""
    policy = vlora(max_batch=4)
    firsts = [req(f"r{i}", "a", 0.0) for i in (1, 2, 3)]
    first = policy.decide(state(0.0, waiting=firsts))
    assert (first.mode, first.adapter) == (Mode.MERGE, "a")
    assert first.batch == first.admit == ("r1", "r2", "r3")

    others = [req(f"r{i}", adapter, 0.05) for i, adapter in zip((4, 5, 6, 7), "bcde", strict=True)]
    merged = [running(f"r{i}", "a", 0.0, done=1) for i in (1, 2, 3)]
    second = policy.decide(state(0.05, waiting=others, running=merged, mode=Mode.MERGE, merged="a"))
    assert (second.mode, second.adapter) == (Mode.MERGE, "a")
    assert second.batch == ("r1", "r2", "r3") and second.admit == () and second.starving == ()

    merged = [running(f"r{i}", "a", 0.0, done=8) for i in (1, 2, 3)]
    third = policy.decide(state(0.5, waiting=others, running=merged, mode=Mode.MERGE, merged="a"))
    assert set(third.starving) == {"r4", "r5", "r6", "r7"}  # 4 > max_batch / 2
    assert (third.mode, third.adapter) == (Mode.UNMERGE, None)
    assert sorted(third.batch) == ["r4", "r5", "r6", "r7"] and third.admit == third.batch
    assert third.pause == ("r1", "r2", "r3")


def merged_workload(now: float, a_arrival: float, other_arrival: float, others: str):
    running_a = [running(f"a{i}", "a", a_arrival) for i in range(1, 7)]
    waiting = [req(f"{x}1", x, other_arrival) for x in others]
    return state(now, waiting=waiting, running=running_a, mode=Mode.MERGE, merged="a")


def test_starvation_turns_merge_into_mixture():
    policy = vlora(max_batch=8)
    calm = policy.decide(merged_workload(0.25, 0.2, 0.0, "b"))
    assert (calm.mode, calm.adapter) == (Mode.MERGE, "a")
    assert "b1" not in calm.batch and calm.starving == ()

    starving = policy.decide(merged_workload(0.45, 0.2, 0.0, "b"))
    assert starving.starving == ("b1",)
    assert (starving.mode, starving.adapter) == (Mode.MIXTURE, "a")
    assert starving.batch == ("b1", "a1", "a2", "a3", "a4", "a5", "a6")
    assert starving.admit == ("b1",) and starving.pause == ()


def test_half_of_max_batch_starving_is_still_mixture():
    decision = vlora(max_batch=8).decide(merged_workload(1.0, 1.0, 0.0, "bcde"))
    assert len(decision.starving) == 4
    assert (decision.mode, decision.adapter) == (Mode.MIXTURE, "a")
    assert decision.batch[:4] == decision.starving
    assert decision.batch[4:] == ("a1", "a2", "a3", "a4") and decision.pause == ("a5", "a6")


def test_more_than_half_starving_turns_into_unmerge():
    decision = vlora(max_batch=8).decide(merged_workload(1.0, 1.0, 0.0, "bcdef"))
    assert len(decision.starving) == 5
    assert (decision.mode, decision.adapter) == (Mode.UNMERGE, None)
    assert decision.batch[:5] == decision.starving
    assert decision.batch[5:] == ("a1", "a2", "a3") and decision.pause == ("a4", "a5", "a6")


@pytest.mark.parametrize(("count", "mode"), [(4, Mode.UNMERGE), (5, Mode.MERGE)])
def test_merge_needs_more_than_half_of_max_batch(count, mode):
    waiting = [req(f"a{i}", "a") for i in range(count)] + [req("b0", "b")]
    assert vlora(max_batch=8).decide(state(0.0, waiting=waiting)).mode is mode


def test_merge_prefers_the_adapter_already_merged_on_ties():
    waiting = [req(f"{x}{i}", x) for x in "bc" for i in range(3)]
    decision = vlora(max_batch=4).decide(state(0.0, waiting=waiting, mode=Mode.MIXTURE, merged="c"))
    assert (decision.mode, decision.adapter) == (Mode.MERGE, "c")


def test_starving_requests_with_tighter_slo_go_first():
    waiting = [
        req("x", "b", 0.0),  # no SLO, the largest credit
        req("y", "c", 0.3, slo=2.0),
        req("z", "d", 0.5, slo=0.5),
        req("w", "e", 2.0, slo=0.1),  # not starving
    ]
    decision = vlora(max_batch=2).decide(state(2.0, waiting=waiting))
    assert decision.starving == ("z", "y", "x")
    assert decision.mode is Mode.UNMERGE and decision.batch == ("z", "y")


def test_equal_slos_order_by_credit():
    waiting = [req("late", "b", 1.0, slo=1.0), req("early", "c", 0.0, slo=1.0)]
    assert vlora(max_batch=2).decide(state(2.0, waiting=waiting)).batch == ("early", "late")


def test_slo_order_in_mixture():
    running_a = [running(f"a{i}", "a", 1.0) for i in range(5)]
    waiting = [req("b1", "b", 0.0, slo=3.0), req("c1", "c", 0.0, slo=1.0)]
    decision = vlora(max_batch=8).decide(state(1.0, waiting, running_a, Mode.MERGE, "a"))
    assert decision.mode is Mode.MIXTURE
    assert decision.batch[:2] == ("c1", "b1")


def test_adapter_slots_skip_requests_of_one_adapter_too_many():
    waiting = [req("a1", "a", 0.0), req("b1", "b", 0.1), req("c1", "c", 0.2), req("a2", "a", 0.3)]
    decision = vlora(max_batch=8, adapter_slots=2).decide(state(0.3, waiting=waiting))
    assert decision.mode is Mode.UNMERGE and decision.batch == ("a1", "b1", "a2")


def test_mixture_counts_the_merged_adapter_as_a_slot():
    running_a = [running(f"a{i}", "a", 1.0) for i in range(5)]
    waiting = [req("b1", "b", 0.0), req("c1", "c", 0.1)]
    decision = vlora(max_batch=8, adapter_slots=2).decide(state(1.0, waiting, running_a, Mode.MERGE, "a"))
    assert decision.mode is Mode.MIXTURE
    assert decision.batch == ("b1", "a0", "a1", "a2", "a3", "a4")


def test_no_requests_keeps_the_weights():
    decision = vlora(max_batch=4).decide(state(5.0, mode=Mode.MERGE, merged="a"))
    assert (decision.mode, decision.adapter, decision.batch) == (Mode.MERGE, "a", ())


def test_credit_is_wait_plus_execution_plus_switch():
    """In merge(a) a request of b cannot run as is: V-LoRA charges its cheapest way in
    (merge b after a fused switch, here), dLoRA the cheaper of merge-b and unmerge."""
    cost = cost_model()
    b1 = req("b1", "b", 0.1)
    current = state(0.3, waiting=[b1], running=[running("a1", "a", 0.3)], mode=Mode.MERGE, merged="a")
    fused = cost.switch_s((Mode.MERGE, "a"), (Mode.MERGE, "b"), current.ranks)
    unmerge = cost.switch_s((Mode.MERGE, "a"), (Mode.UNMERGE, None), current.ranks)
    assert fused > 0 and unmerge > 0
    expected_b = 0.2 + min(
        cost.exec_s(b1, Mode.MERGE) + fused,
        cost.exec_s(b1, Mode.MIXTURE),
        cost.exec_s(b1, Mode.UNMERGE) + unmerge,
    )
    expected_a = 0.0 + cost.exec_s(current.running[0], Mode.MERGE)
    credits = make_policy("vlora", PolicyConfig(THETA, 4), cost).decide(current).credits
    assert credits == pytest.approx({"b1": expected_b, "a1": expected_a})

    dlora_b = 0.2 + min(cost.exec_s(b1, Mode.MERGE) + fused, cost.exec_s(b1, Mode.UNMERGE) + unmerge)
    assert make_policy("dlora", PolicyConfig(THETA, 4), cost).decide(current).credits["b1"] == pytest.approx(
        dlora_b
    )


def test_slower_switch_makes_requests_starve_sooner():
    """The same wait starves under a 53 ms switch (dLoRA, Fig. 7) but not under a 4 ms one."""
    slow = measured()
    for kind in ("merge", "unmerge", "fused"):
        slow["switch_s"][kind] = [{"rank": 32, "layers": 32, "seconds": 0.053}]
    current = state(
        0.40, waiting=[req("b1", "b", 0.0)], running=[running("a1", "a", 0.38)], mode=Mode.MERGE, merged="a"
    )
    fast_policy = make_policy("dlora", PolicyConfig(THETA, 4), cost_model())
    slow_policy = make_policy("dlora", PolicyConfig(THETA, 4), cost_model(slow))
    assert fast_policy.decide(current).starving == ()
    assert slow_policy.decide(current).starving == ("b1",)
