"""Comparison policies for the benchmarks (paper §6.3.3), same credits and threshold as V-LoRA.

* ``merge-only``: one adapter at a time, merged; base-model requests run on clean weights.
* ``unmerge-only``: the S-LoRA / Punica way, every adapter unmerged in one batch.
* ``dlora``: merge or unmerge by workload, no mixture: a starving request forces unmerge.
  (dLoRA's slower per-layer switching is a property of the switcher and of the cost
  model measured for it, not of this policy.)

Running requests are never paused, and neither ``merge-only`` nor ``dlora`` has mixture:
so they merge an adapter only once every running request is that adapter's, and until
then *drain*: the current weights finish the running requests while admitting only what
those weights serve. Without that, the batches run mixture (what an earlier version of
``dlora`` did while never choosing it).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from sglang_vlora.orchestrator.policy import (
    DRAIN_MERGED,
    DRAIN_UNMERGED,
    MERGE,
    NEVER_MERGES,
    SERVE_ONE_ADAPTER,
    STARVING,
    Plan,
    SchedulingPolicy,
    majority_reason,
    merge_condition,
    most_requested,
    queue_order,
    register_policy,
    runs_without_mixture,
    starving_first,
)
from sglang_vlora.orchestrator.state import Mode, Request, SchedulerState, WeightState


def _own_weights(adapter: str | None) -> WeightState:
    """The weights that serve one adapter's requests alone: it merged, or clean for the base model."""
    return (Mode.UNMERGE, None) if adapter is None else (Mode.MERGE, adapter)


@register_policy("merge-only")
class MergeOnlyPolicy(SchedulingPolicy):
    """Serve one adapter's requests at a time with that adapter merged.

    Stays with the current adapter while nobody starves; otherwise moves to the adapter
    of the most urgent starving request (or, when the current one has no requests left,
    of the first request in queue order), once the running requests are that adapter's.
    """

    def serving_states(self, adapter: str | None, state: SchedulerState) -> list[WeightState]:
        return [_own_weights(adapter)]

    def idle_weights(self, state: SchedulerState) -> WeightState:
        return _own_weights(state.merged)

    def plan(self, state: SchedulerState, credits: Mapping[str, float], starving: Sequence[Request]) -> Plan:
        if starving:
            target = starving[0].adapter
        elif any(r.adapter == state.merged for r in state.requests):
            target = state.merged
        else:
            target = queue_order(state.requests, state)[0].adapter
        if runs_only(state.running, target):
            ordered = starving_first([r for r in starving if r.adapter == target], state.requests, state)
            return Plan(target, [r for r in ordered if r.adapter == target], SERVE_ONE_ADAPTER)
        if runs_only(state.running, state.merged):
            return Plan(state.merged, [], DRAIN_MERGED)  # drain the current adapter's requests first
        return Plan(None, [], DRAIN_UNMERGED)  # running requests of several adapters: finish them unmerged


def runs_only(requests: Sequence[Request], adapter: str | None) -> bool:
    """Whether every request uses ``adapter`` (None: the base model)."""
    return all(r.adapter == adapter for r in requests)


@register_policy("unmerge-only")
class UnmergeOnlyPolicy(SchedulingPolicy):
    """Every request unmerged: starving ones first, then queue order."""

    def serving_states(self, adapter: str | None, state: SchedulerState) -> list[WeightState]:
        return [(Mode.UNMERGE, None)]

    def idle_weights(self, state: SchedulerState) -> WeightState:
        return (Mode.UNMERGE, None)

    def plan(self, state: SchedulerState, credits: Mapping[str, float], starving: Sequence[Request]) -> Plan:
        return Plan(None, starving_first(starving, state.requests, state), NEVER_MERGES)


@register_policy("dlora")
class DLoRAPolicy(SchedulingPolicy):
    """Merge the dominant adapter while nobody starves, else unmerge everything (no mixture)."""

    def serving_states(self, adapter: str | None, state: SchedulerState) -> list[WeightState]:
        states: list[WeightState] = [(Mode.UNMERGE, None)]
        if adapter is not None:
            states.append((Mode.MERGE, adapter))
        return states

    def idle_weights(self, state: SchedulerState) -> WeightState:
        return _own_weights(state.merged)

    def plan(self, state: SchedulerState, credits: Mapping[str, float], starving: Sequence[Request]) -> Plan:
        top, top_requests = most_requested(state)
        if top is None or starving or not merge_condition(self.config, starving, top_requests):
            # as V-LoRA says it, except that a single starving request forces unmerge
            reason = majority_reason(state, self.config, top_requests) or STARVING
            return Plan(None, starving_first(starving, state.requests, state), reason)
        if runs_only(state.running, top):
            return Plan(top, queue_order(top_requests, state), MERGE)
        if state.merged is None:
            return Plan(None, queue_order(top_requests, state), DRAIN_UNMERGED)  # drain the others unmerged
        if runs_without_mixture(state.running, state.merged):
            return Plan(state.merged, [], DRAIN_MERGED)  # drain the merged adapter's requests first
        return Plan(None, starving_first(starving, state.requests, state), DRAIN_UNMERGED)
