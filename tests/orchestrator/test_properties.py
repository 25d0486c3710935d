"""Property tests (hypothesis) of every policy over random states, and a simulation of
serving a stream of requests that bounds every request's wait by theta."""

from __future__ import annotations

import dataclasses
import math

from hypothesis import event, example, given, settings
from hypothesis import strategies as st

from sglang_vlora.config import VLoRAConfig
from sglang_vlora.orchestrator import (
    DECISION_REASONS,
    CostModel,
    Decision,
    Mode,
    PolicyConfig,
    Request,
    SchedulerState,
    make_policy,
    policy_names,
)
from sglang_vlora.orchestrator import policy as reasons
from sglang_vlora.orchestrator.cost_model import SCHEMA
from sglang_vlora.orchestrator.policy import ADMISSIONS, KEEP_MERGED
from tests.orchestrator.builders import RANKS, cost_model, req, running
from tests.orchestrator.builders import state as hand_built

ADAPTERS = (None, "a", "b", "c", "d")
NO_STARVATION_BOUND = ("vlora", "unmerge-only", "dlora")  # merge-only serves one adapter at a time

seconds = st.floats(min_value=1e-4, max_value=0.02)


@st.composite
def cost_models(draw) -> CostModel:
    def points():
        return [{"rank": rank, "layers": 32, "seconds": draw(seconds)} for rank in (16, 64)]

    data = {
        "schema": SCHEMA,
        "token_latency_s": {
            mode.value: {"prefill_token": draw(st.floats(1e-6, 1e-3)), "decode_step": draw(seconds)}
            for mode in Mode
        },
        "switch_s": {"merge": points(), "unmerge": points(), "fused": points()},
    }
    return CostModel.from_dict(data, layers=draw(st.integers(1, 80)))


@st.composite
def requests(draw, rid: str, now: float, adapters: list[str | None]) -> Request:
    prompt = draw(st.integers(0, 512))
    expected = draw(st.integers(0, 32))
    return Request(
        rid,
        draw(st.sampled_from(adapters)),
        now - draw(st.floats(0.0, 2.0)),
        prompt,
        expected,
        draw(st.integers(0, prompt)),
        draw(st.integers(0, expected)),
        slo=draw(st.none() | st.floats(0.05, 5.0)),
    )


@st.composite
def states(draw, switched: bool = False, history: bool = False) -> SchedulerState:
    """Few adapters per state, so that one often dominates; waits comparable to theta.
    ``switched``: the weights may have changed recently (the switch budget applies);
    ``history``: recent arrivals (popularity) may be known."""
    now = draw(st.floats(0.0, 10.0))
    adapters = draw(st.lists(st.sampled_from(ADAPTERS), min_size=1, max_size=4, unique=True))
    count = draw(st.integers(0, 20))
    reqs = [draw(requests(f"r{i}", now, adapters)) for i in range(count)]
    is_running = [draw(st.booleans()) for _ in reqs]
    merged = draw(st.sampled_from(ADAPTERS))
    mode = Mode.UNMERGE if merged is None else draw(st.sampled_from([Mode.MERGE, Mode.MIXTURE]))
    return SchedulerState(
        now,
        tuple(r for r, run in zip(reqs, is_running, strict=True) if not run),
        tuple(r for r, run in zip(reqs, is_running, strict=True) if run),
        mode,
        merged,
        RANKS,
        last_switch=draw(st.none() | st.floats(now - 0.5, now)) if switched else None,
        recent_arrivals=tuple(draw(st.lists(st.sampled_from(adapters), max_size=32))) if history else (),
    )


configs = st.builds(
    PolicyConfig,
    theta=st.floats(0.0, 2.0),
    max_batch=st.integers(1, 16),
    adapter_slots=st.none() | st.integers(1, 5),
    admission=st.sampled_from(ADMISSIONS),
    keep_merged=st.sampled_from(KEEP_MERGED),
)


def slots_used(rids, adapter: str | None, by_id: dict[str, Request]) -> int:
    adapters = {by_id[rid].adapter for rid in rids}
    if adapter is not None:
        adapters.add(adapter)
    return len(adapters)


def mode_of_batch(decision: Decision, by_id: dict[str, Request]) -> Mode:
    """The mode a batch runs in with the decision's weights."""
    if decision.adapter is None:
        return Mode.UNMERGE
    if all(by_id[rid].adapter == decision.adapter for rid in decision.batch):
        return Mode.MERGE
    return Mode.MIXTURE


@settings(max_examples=100, deadline=None)
@given(name=st.sampled_from(policy_names()), state=states(switched=True), config=configs, cost=cost_models())
def test_decisions_are_well_formed(name, state, config, cost):
    decision = make_policy(name, config, cost).decide(state)
    by_id = {r.rid: r for r in state.requests}
    running = [r.rid for r in state.running]

    assert len(set(decision.batch)) == len(decision.batch) and set(decision.batch) <= set(by_id)
    assert set(running) <= set(decision.batch), "a running request was left out (it cannot be paused)"
    assert decision.admit == tuple(rid for rid in decision.batch if rid not in running)
    assert len(decision.batch) <= max(config.max_batch, len(running))
    assert not decision.admit or len(decision.batch) <= config.max_batch
    if config.adapter_slots is not None and decision.admit:
        assert slots_used(decision.batch, decision.adapter, by_id) <= max(
            config.adapter_slots, slots_used(running, decision.adapter, by_id)
        )
    assert decision.mode is mode_of_batch(decision, by_id) if decision.batch else True
    assert (decision.mode is Mode.UNMERGE) == (decision.adapter is None)
    assert decision.reason in DECISION_REASONS
    assert (decision.reason == reasons.IDLE) == (not state.requests)
    if state.requests:
        assert decision.batch, "a policy left the GPU idle with requests waiting"
    for r in state.requests:
        assert decision.credits[r.rid] >= state.now - r.arrival
        threshold = config.theta if r.slo is None else min(config.theta, r.slo)
        assert (r.rid in decision.starving) == (decision.credits[r.rid] > threshold)


@settings(max_examples=100, deadline=None)
@given(
    name=st.sampled_from(policy_names()),
    state=states(switched=True),
    config=configs,
    cost=cost_models(),
    data=st.data(),
)
def test_same_inputs_same_decision(name, state, config, cost, data):
    """What every TP rank relies on: a fresh policy on an equal state, in any list order, agrees."""
    decision = make_policy(name, config, cost).decide(state)
    shuffled = dataclasses.replace(
        state,
        waiting=tuple(data.draw(st.permutations(state.waiting))),
        running=tuple(data.draw(st.permutations(state.running))),
        ranks=dict(reversed(list(state.ranks.items()))),
    )
    assert make_policy(name, config, cost).decide(shuffled) == decision
    assert make_policy(name, config, cost).decide(state) == decision


@settings(max_examples=100, deadline=None)
@given(name=st.sampled_from(NO_STARVATION_BOUND), state=states(), config=configs, cost=cost_models())
def test_starving_requests_come_first_in_slo_order(name, state, config, cost):
    """Starving requests lead the batch in SLO order, and a starving waiting request is
    left out only when the running requests and more urgent starving ones fill the batch."""
    decision = make_policy(name, dataclasses.replace(config, adapter_slots=None), cost).decide(state)
    by_id = {r.rid: r for r in state.requests}
    starving_in_batch = [rid for rid in decision.starving if rid in decision.batch]
    assert decision.batch[: len(starving_in_batch)] == tuple(starving_in_batch)
    left_out = [rid for rid in decision.starving if rid not in decision.batch]
    if left_out:
        assert len(decision.batch) >= config.max_batch
        first_left_out = decision.starving.index(left_out[0])
        assert all(rid in decision.batch for rid in decision.starving[:first_left_out])
    slos = [by_id[rid].slo if by_id[rid].slo is not None else math.inf for rid in starving_in_batch]
    assert slos == sorted(slos)


@settings(max_examples=100, deadline=None)
@given(state=states(), config=configs, cost=cost_models())
def test_vlora_weights_follow_algorithm_1(state, config, cost):
    """Line 5 picks the weights (no switch budget applies: the states never switched; no
    pool-slot limit: the slot check is a deviation tested on its own, and so are admission
    "all" and keep_merged "plurality"); the batch then runs merge or mixture by whether other
    adapters' requests are in it."""
    paper = dataclasses.replace(config, adapter_slots=None, admission="algorithm1", keep_merged="majority")
    decision = make_policy("vlora", paper, cost).decide(state)
    if not state.requests:
        return
    counts = {a: sum(r.adapter == a for r in state.requests) for a in ADAPTERS if a is not None}
    by_id = {r.rid: r for r in state.requests}
    # Line 5 counts the starving requests the merged weights would run in mixture: not the top adapter's.
    starving = sum(by_id[rid].adapter != top_adapter(state, counts) for rid in decision.starving)
    dominant = 2 * max(counts.values()) > config.max_batch
    expected = Mode.MERGE if dominant and starving == 0 else Mode.MIXTURE
    if not (dominant and 2 * starving <= config.max_batch):
        expected = Mode.UNMERGE
    event(f"Algorithm 1: {expected}, ran {decision.mode}")
    if expected is Mode.UNMERGE:
        assert decision.adapter is None
    else:
        assert counts[decision.adapter] == max(counts.values())
        admitted_others = [rid for rid in decision.admit if by_id[rid].adapter != decision.adapter]
        if expected is Mode.MERGE:
            assert not admitted_others, "merge admits only the merged adapter's requests"
        else:
            assert set(admitted_others) <= set(decision.starving)


# a merged with two of the four requests in flight, b and c one each: the plurality, no majority
A_PLURALITY = hand_built(
    1.0, [req("a2", "a", 1.0), req("c1", "c", 1.0)], [running("a1", "a", 0.9), running("b1", "b", 0.9)],
    Mode.MIXTURE, "a",
)


def top_adapter(state: SchedulerState, counts: dict[str, int]) -> str | None:
    """The most requested adapter as Algorithm 1 picks it (ties: the merged one, then by name)."""
    most = max(counts.values())
    if most == 0:
        return None
    if state.merged is not None and counts.get(state.merged) == most:
        return state.merged
    return min(a for a, n in counts.items() if n == most)


# a merged, nothing running, one request of b waiting and one pool slot: line 5 wants b merged
B_WANTS_THE_ONLY_SLOT = hand_built(0.0, [req("r0", "b", 0.0)], [], Mode.MERGE, "a")


@settings(max_examples=200, deadline=None)
@given(state=states(switched=True, history=True), config=configs, cost=cost_models())
@example(state=A_PLURALITY, config=PolicyConfig(0.6, 5, keep_merged="plurality"), cost=cost_model())
@example(state=A_PLURALITY, config=PolicyConfig(0.6, 5, keep_merged="majority"), cost=cost_model())
@example(state=B_WANTS_THE_ONLY_SLOT, config=PolicyConfig(0.0, 1, adapter_slots=1), cost=cost_model())
def test_vlora_reasons_name_what_decided(state, config, cost):
    """The reason is the condition that decided: which half of line 5 failed, that the top
    adapter is not popular (at most half of the recent arrivals, entering a merge), that
    keep_merged "plurality" kept the merged adapter (still the most requested, at most half
    of max batch starving), that "popular" kept it (more than half of the recorded arrivals,
    at most half of max batch starving elsewhere), or that the slots or the switch budget kept the current weights
    (then they are kept), or that the adapter to merge found no slot with nothing running (then
    the weights unmerge to free one)."""
    decision = make_policy("vlora", config, cost).decide(state)
    if not state.requests:
        return
    counts = {a: sum(r.adapter == a for r in state.requests) for a in ADAPTERS if a is not None}
    top = top_adapter(state, counts)
    by_id = {r.rid: r for r in state.requests}
    twice_top = 2 * max(counts.values())
    twice_starving = 2 * sum(by_id[rid].adapter != top for rid in decision.starving)  # elsewhere: line 5's count
    in_flight, max_batch = len(state.requests), config.max_batch
    arrivals = state.recent_arrivals

    def popular(adapter: str) -> bool:
        return not arrivals or 2 * sum(a == adapter for a in arrivals) > len(arrivals)

    line_5 = twice_top > max_batch and twice_starving <= max_batch
    merged_is_top = state.merged is not None and 0 < counts[state.merged] == max(counts.values())
    enters = line_5 and (top == state.merged or popular(top))
    keeps = config.keep_merged != "majority" and merged_is_top and twice_starving <= max_batch
    merged_backed = (  # "popular": the merged adapter has more than half of the recorded arrivals
        state.merged is not None and bool(arrivals) and 2 * sum(a == state.merged for a in arrivals) > len(arrivals)
    )
    twice_starving_around_merged = 2 * sum(by_id[rid].adapter != state.merged for rid in decision.starving)
    keeps_popular = (
        config.keep_merged == "popular" and not merged_is_top and merged_backed
        and twice_starving_around_merged <= max_batch
    )
    event(f"{config.keep_merged}: reason {decision.reason}")
    assert (decision.reason == reasons.KEPT_PLURALITY) == (keeps and not enters)
    assert (decision.reason == reasons.KEPT_POPULAR) == (keeps_popular and not enters)
    if decision.reason in (reasons.KEPT_PLURALITY, reasons.KEPT_POPULAR):
        assert decision.adapter == state.merged
        return
    if decision.reason in (reasons.KEPT_NO_SLOT, reasons.KEPT_SWITCH_BUDGET):
        assert decision.adapter == state.merged
        return
    if decision.reason == reasons.FREE_SLOT:  # line 5 wanted another adapter merged: no slot, nothing runs
        assert enters and top != state.merged and decision.adapter is None and not state.running
        return
    assert (decision.reason == reasons.MERGE) == (decision.adapter is not None)
    assert (decision.reason == reasons.MERGE) == enters
    assert (decision.reason == reasons.NOT_POPULAR) == (line_5 and not enters)
    assert (decision.reason == reasons.NO_ADAPTER) == (twice_top == 0)
    if decision.reason == reasons.NO_MAJORITY:
        assert 0 < twice_top <= min(in_flight, max_batch)
    if decision.reason == reasons.BELOW_MAX_BATCH:
        assert in_flight < twice_top <= max_batch
    if decision.reason == reasons.STARVING:
        assert twice_top > max_batch and twice_starving > max_batch
    assert decision.reason in (
        reasons.MERGE, reasons.NOT_POPULAR, reasons.NO_ADAPTER, reasons.NO_MAJORITY, reasons.BELOW_MAX_BATCH,
        reasons.STARVING,
    )


@settings(max_examples=60, deadline=None)
@given(
    name=st.sampled_from(tuple(n for n in policy_names() if n != "vlora")),
    state=states(),
    config=configs,
    cost=cost_models(),
)
def test_only_vlora_uses_mixture(name, state, config, cost):
    decision = make_policy(name, config, cost).decide(state)
    assert decision.mode is not Mode.MIXTURE
    if name == "unmerge-only":
        assert decision.mode is Mode.UNMERGE


# A serving simulation: one decision per iteration of ``dt`` seconds; a request in the
# batch gains a token (its prefill gives the first). With at most ``max_batch`` requests
# and enough adapter slots, nothing but the policy can keep a request waiting.


@st.composite
def workloads(draw):
    """Arrivals within a few iterations of each other and theta a few iterations long, so
    that requests of one adapter are still running when another's turn comes."""
    dt = draw(st.floats(0.005, 0.2))
    max_batch = draw(st.integers(1, 8))
    choices = draw(st.lists(st.sampled_from(ADAPTERS), min_size=1, max_size=3, unique=True))
    arrivals = [
        (
            draw(st.integers(0, 15)),
            draw(st.sampled_from(choices)),
            draw(st.integers(1, 64)),
            draw(st.integers(1, 12)),
            draw(st.none() | st.floats(0.05, 2.0)),
        )
        for _ in range(draw(st.integers(1, max_batch)))
    ]
    adapters = {adapter for _, adapter, *_ in arrivals}
    config = PolicyConfig(
        theta=dt * draw(st.floats(0.0, 10.0)),
        max_batch=max_batch,
        adapter_slots=draw(st.none() | st.integers(len(adapters), 6)),
        switch_budget=draw(st.floats(0.01, 1.0)),
        admission=draw(st.sampled_from(ADMISSIONS)),
        keep_merged=draw(st.sampled_from(KEEP_MERGED)),
    )
    return config, dt, arrivals


# b runs alone, then two requests of a take the merge; b must not be left behind for long.
B_THEN_TWO_A = (
    PolicyConfig(theta=0.3, max_batch=3),
    0.1,
    [(0, "b", 8, 12, None), (2, "a", 8, 12, None), (2, "a", 8, 12, None)],
)


@settings(max_examples=150, deadline=None)
@given(name=st.sampled_from(policy_names()), workload=workloads(), cost=cost_models())
@example(name="vlora", workload=B_THEN_TWO_A, cost=cost_model())
def test_no_request_waits_beyond_theta(name, workload, cost):
    """Running requests are never paused. A waiting request is admitted at the first
    decision after its credit exceeds its threshold (theta, or a tighter SLO) when the
    batch has room for it (``max_batch`` minus the running requests and more urgent
    starving ones) and an adapter slot; here every request fits, so once
    ``now - arrival > theta`` a request runs in every iteration until it finishes: it
    first runs by ``arrival + theta + dt`` and ends by ``arrival + theta + out * dt``.

    merge-only serves one adapter at a time and has no such bound; like every policy it
    keeps the GPU busy, so all requests end within the total work after the last arrival.
    V-LoRA's weight changes while requests run keep to the switch budget.
    """
    config, dt, arrivals = workload
    bounded = name in NO_STARVATION_BOUND
    policy = make_policy(name, config, cost)
    pending = {
        f"r{i}": (step, adapter, prompt, out, slo)
        for i, (step, adapter, prompt, out, slo) in enumerate(arrivals)
    }
    live: dict[str, Request] = {}
    started: set[str] = set()
    finished: dict[str, int] = {}
    mode, merged, last_switch = Mode.UNMERGE, None, None
    recent: list[str | None] = []  # the adapters of the arrivals so far, as the server keeps them
    last_arrival = max(step for step, *_ in arrivals)
    total_work = sum(out for _, _, _, out, _ in arrivals)
    for k in range(last_arrival + math.ceil(config.theta / dt) + total_work + 1):
        now = k * dt
        for rid, (step, adapter, prompt, out, slo) in list(pending.items()):
            if step == k:
                live[rid] = Request(rid, adapter, step * dt, prompt, out, slo=slo)
                recent.append(adapter)
                del pending[rid]
        state = SchedulerState(
            now,
            tuple(r for r in live.values() if r.rid not in started),
            tuple(r for r in live.values() if r.rid in started),
            mode,
            merged,
            RANKS,
            last_switch=last_switch,
            recent_arrivals=tuple(recent[-VLoRAConfig().popular_window:]),
        )
        decision = policy.decide(state)
        overdue = {r.rid for r in live.values() if now - r.arrival > config.theta}
        if bounded:
            assert overdue <= set(decision.batch), (
                f"step {k}: overdue {overdue - set(decision.batch)} left out"
            )
        if decision.adapter != merged:
            if name == "vlora" and state.running and last_switch is not None:
                target = (Mode.UNMERGE, None) if decision.adapter is None else (Mode.MERGE, decision.adapter)
                dwell = cost.switch_s(state.weights, target, RANKS) / config.switch_budget
                assert now - last_switch >= dwell - 1e-12, f"step {k}: switched {now - last_switch:.4f} s after the last"
            last_switch = now
        mode, merged = decision.mode, decision.adapter
        for rid in decision.batch:
            r = live[rid]
            live[rid] = dataclasses.replace(
                r, prefilled_tokens=r.prompt_tokens, output_tokens=r.output_tokens + 1
            )
            started.add(rid)
            if live[rid].output_tokens == r.expected_output_tokens:
                finished[rid] = k
                del live[rid]
    assert not live and not pending
    for i, (step, _, _, out, _) in enumerate(arrivals):
        assert finished[f"r{i}"] < last_arrival + total_work
        if bounded:
            assert finished[f"r{i}"] * dt - step * dt <= config.theta + out * dt + 1e-9
