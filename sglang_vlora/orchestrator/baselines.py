"""Comparison policies for the benchmarks (paper §6.3.3), same credits and threshold as V-LoRA.

* ``merge-only``: one adapter at a time, merged; base-model requests run on clean weights.
* ``unmerge-only``: the S-LoRA / Punica way, every adapter unmerged in one batch.
* ``dlora``: merge or unmerge by workload, no mixture: a starving request forces unmerge.
  (dLoRA's slower per-layer switching is a property of the switcher and of the cost
  model measured for it, not of this policy.)
"""

from __future__ import annotations

from sglang_vlora.orchestrator.cost_model import CostModel
from sglang_vlora.orchestrator.policy import (
    PolicyConfig,
    build_decision,
    compute_credits,
    idle_decision,
    most_requested,
    queue_order,
    register_policy,
    starving_requests,
    unmerge_all,
)
from sglang_vlora.orchestrator.state import Decision, Mode, SchedulerState, WeightState


def _own_weights(adapter: str | None) -> WeightState:
    """The weights that serve one adapter's requests alone: it merged, or clean for the base model."""
    return (Mode.UNMERGE, None) if adapter is None else (Mode.MERGE, adapter)


@register_policy("merge-only")
class MergeOnlyPolicy:
    """Serve one adapter's requests at a time with that adapter merged.

    Stays with the current adapter while nobody starves; otherwise moves to the adapter
    of the most urgent starving request (or, when the current one has no requests left,
    of the first request in queue order).
    """

    def __init__(self, config: PolicyConfig, cost: CostModel) -> None:
        self.config = config
        self.cost = cost

    @staticmethod
    def serving_states(adapter: str | None, state: SchedulerState) -> list[WeightState]:
        return [_own_weights(adapter)]

    def decide(self, state: SchedulerState) -> Decision:
        if not state.requests:
            return idle_decision(*_own_weights(state.merged))
        credits = compute_credits(state, self.cost, self.serving_states)
        starving = starving_requests(state, credits, self.config.theta)
        if starving:
            target = starving[0].adapter
        elif any(r.adapter == state.merged for r in state.requests):
            target = state.merged
        else:
            target = queue_order(state.requests, state)[0].adapter
        group_starving = [r for r in starving if r.adapter == target]
        starving_ids = {r.rid for r in group_starving}
        rest = queue_order(
            (r for r in state.requests if r.adapter == target and r.rid not in starving_ids), state
        )
        mode, adapter = _own_weights(target)
        return build_decision(state, self.config, mode, adapter, [*group_starving, *rest], credits, starving)


@register_policy("unmerge-only")
class UnmergeOnlyPolicy:
    """Every request unmerged: starving ones first, then queue order."""

    def __init__(self, config: PolicyConfig, cost: CostModel) -> None:
        self.config = config
        self.cost = cost

    @staticmethod
    def serving_states(adapter: str | None, state: SchedulerState) -> list[WeightState]:
        return [(Mode.UNMERGE, None)]

    def decide(self, state: SchedulerState) -> Decision:
        if not state.requests:
            return idle_decision(Mode.UNMERGE, None)
        credits = compute_credits(state, self.cost, self.serving_states)
        starving = starving_requests(state, credits, self.config.theta)
        return unmerge_all(state, self.config, credits, starving)


@register_policy("dlora")
class DLoRAPolicy:
    """Merge the dominant adapter while nobody starves, else unmerge everything (no mixture)."""

    def __init__(self, config: PolicyConfig, cost: CostModel) -> None:
        self.config = config
        self.cost = cost

    @staticmethod
    def serving_states(adapter: str | None, state: SchedulerState) -> list[WeightState]:
        states: list[WeightState] = [(Mode.UNMERGE, None)]
        if adapter is not None:
            states.append((Mode.MERGE, adapter))
        return states

    def decide(self, state: SchedulerState) -> Decision:
        if not state.requests:
            return idle_decision(*_own_weights(state.merged))
        credits = compute_credits(state, self.cost, self.serving_states)
        starving = starving_requests(state, credits, self.config.theta)
        top, top_requests = most_requested(state)
        if top is not None and not starving and 2 * len(top_requests) > self.config.max_batch:
            return build_decision(
                state, self.config, Mode.MERGE, top, queue_order(top_requests, state), credits, starving
            )
        return unmerge_all(state, self.config, credits, starving)
