"""Algorithm 1 (paper §4.4.3) on the situations the paper describes, with hand-checked numbers.

Costs come from ``builders.MEASURED``: a fresh request (256 prompt tokens, 16 output
tokens) takes 0.1856 s merged, 0.2227 s in mixture and 0.2784 s unmerged.
"""

import dataclasses

import pytest

from sglang_vlora.orchestrator import Mode, PolicyConfig, make_policy
from tests.orchestrator.builders import cost_model, measured, req, running, state

THETA = 0.6


def vlora(max_batch: int, adapter_slots: int | None = None, admission: str = "algorithm1"):
    return make_policy("vlora", PolicyConfig(THETA, max_batch, adapter_slots, admission=admission), cost_model())


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
    # The paper pauses r1-r3 here; SGLang's running requests hold KV and are never paused,
    # so they go on (unmerged) and the one place left goes to the most starving: r6, whose
    # adapter (rank 64) would cost the longest switch to serve any other way.
    assert third.admit == ("r6",) and third.batch == ("r6", "r1", "r2", "r3")


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
    assert starving.admit == ("b1",)


def test_admission_all_serves_other_adapters_in_mixture_without_waiting():
    """Admission "all": while a is merged, b's request is admitted at once (mixture)
    instead of waiting until it starves; the starving first, then a's, then the others."""
    policy = vlora(max_batch=8, admission="all")
    calm = policy.decide(merged_workload(0.25, 0.2, 0.0, "b"))
    assert (calm.mode, calm.adapter) == (Mode.MIXTURE, "a") and calm.starving == ()
    assert calm.admit == ("b1",) and calm.batch == ("a1", "a2", "a3", "a4", "a5", "a6", "b1")

    waiting = [req("c1", "c", 0.0), req("a7", "a", 0.25), req("d1", "d", 0.45), req("b1", "b", 0.3)]
    running_a = [running(f"a{i}", "a", 0.4) for i in range(1, 5)]
    decision = policy.decide(state(0.5, waiting=waiting, running=running_a, mode=Mode.MERGE, merged="a"))
    assert decision.starving == ("c1",)
    assert (decision.mode, decision.adapter) == (Mode.MIXTURE, "a")
    assert decision.admit == ("c1", "a7", "b1", "d1")
    assert decision.batch == ("c1", "a1", "a2", "a3", "a4", "a7", "b1", "d1")


def test_admission_all_keeps_merge_for_a_batch_of_the_merged_adapter_only():
    policy = vlora(max_batch=8, admission="all")
    waiting = [req(f"a{i}", "a") for i in range(5)]
    decision = policy.decide(state(0.0, waiting=waiting))
    assert (decision.mode, decision.adapter) == (Mode.MERGE, "a") and len(decision.admit) == 5


def test_admission_all_still_unmerges_when_no_adapter_holds_the_majority():
    waiting = [req(f"a{i}", "a") for i in range(4)] + [req(f"b{i}", "b") for i in range(4)]
    decision = vlora(max_batch=8, admission="all").decide(state(0.0, waiting=waiting))
    assert (decision.mode, decision.adapter) == (Mode.UNMERGE, None) and len(decision.admit) == 8


def test_half_of_max_batch_starving_is_still_mixture():
    decision = vlora(max_batch=8).decide(merged_workload(1.0, 1.0, 0.0, "bcde"))
    assert len(decision.starving) == 4
    assert (decision.mode, decision.adapter) == (Mode.MIXTURE, "a")
    # six a's keep running: two places left, for the two most starving
    assert decision.admit == decision.starving[:2]
    assert decision.batch == (*decision.starving[:2], "a1", "a2", "a3", "a4", "a5", "a6")


def test_more_than_half_starving_turns_into_unmerge():
    decision = vlora(max_batch=8).decide(merged_workload(1.0, 1.0, 0.0, "bcdef"))
    assert len(decision.starving) == 5
    assert (decision.mode, decision.adapter) == (Mode.UNMERGE, None)
    assert decision.admit == decision.starving[:2]
    assert decision.batch == (*decision.starving[:2], "a1", "a2", "a3", "a4", "a5", "a6")


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
        req("w", "e", 2.0, slo=0.1),  # just arrived, but 0.28 s of work against a 0.1 s SLO
        req("v", "f", 2.0, slo=1.0),  # just arrived, within its SLO and theta
    ]
    decision = vlora(max_batch=2).decide(state(2.0, waiting=waiting))
    assert decision.starving == ("w", "z", "y", "x")
    assert decision.mode is Mode.UNMERGE and decision.batch == ("w", "z")


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


def test_the_switch_budget_holds_a_switch_back_until_it_has_paid_for_itself():
    """a merged with one request of a running; three of b arrive, so Algorithm 1 wants b
    merged (a fused switch, 4.3 ms here). With a 10% budget the weights move only 43 ms
    after the last switch; until then b's requests are admitted and run around a (mixture)."""
    cost = cost_model()
    b_requests = [req(f"b{i}", "b", 1.0) for i in (1, 2, 3)]

    def decide(last_switch: float | None, busy: bool = True):
        current = state(1.0, b_requests, [running("a1", "a", 0.9)] if busy else [], Mode.MERGE, "a")
        current = dataclasses.replace(current, last_switch=last_switch)
        return make_policy("vlora", PolicyConfig(THETA, 4, switch_budget=0.1), cost).decide(current)

    fused = cost.switch_s((Mode.MERGE, "a"), (Mode.MERGE, "b"), {"a": 16, "b": 16})
    assert fused == pytest.approx(0.0043)
    held = decide(last_switch=1.0 - 0.9 * fused / 0.1)
    assert (held.mode, held.adapter) == (Mode.MIXTURE, "a")
    assert held.admit == ("b1", "b2", "b3")
    moved = decide(last_switch=1.0 - 1.1 * fused / 0.1)
    assert (moved.mode, moved.adapter, moved.admit) == (Mode.MIXTURE, "b", ("b1", "b2", "b3"))
    idle_gpu = decide(last_switch=1.0, busy=False)  # nothing running: nothing to serve meanwhile
    assert (idle_gpu.mode, idle_gpu.adapter) == (Mode.MERGE, "b")


def test_no_switch_to_an_adapter_without_a_free_pool_slot():
    """a is merged and c's request runs; b is the majority. With three pool slots b
    merges (c runs around it); with two, merging b would need a third slot while c runs:
    the weights stay (the controller would refuse the switch) and b waits for a slot."""
    busy = [running("c1", "c", 0.9)]
    waiting = [req(f"b{i}", "b", 1.0) for i in (1, 2, 3)]
    current = state(1.0, waiting, busy, Mode.MIXTURE, "a")
    decision = make_policy("vlora", PolicyConfig(THETA, 4, adapter_slots=3), cost_model()).decide(current)
    assert (decision.mode, decision.adapter) == (Mode.MIXTURE, "b")
    decision = make_policy("vlora", PolicyConfig(THETA, 4, adapter_slots=2), cost_model()).decide(current)
    assert (decision.mode, decision.adapter, decision.batch) == (Mode.MIXTURE, "a", ("c1",))
