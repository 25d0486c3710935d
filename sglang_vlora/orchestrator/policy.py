"""Scheduling policies: which inference mode runs next and which requests it serves.

V-LoRA's policy is Algorithm 1 of the paper (§4.4.3). Every request gets a *credit*:
its waiting time plus its expected execution time in the current mode, plus the switch
latency when the current weights cannot serve it (then the cheapest way this policy has
to serve it is taken). A request whose credit exceeds ``theta`` is *starving*. Then:

* nothing starves and the most-requested adapter holds more than half of the max batch:
  **merge** that adapter and run its requests;
* starving requests are at most half of the max batch and that adapter still holds more
  than half: **mixture** with it merged; the starving requests first, then its requests;
* otherwise **unmerge**: the starving requests first, then everyone else.

Starving requests are ordered by tighter SLO first (no SLO last), then by larger credit;
the others by running before waiting (they hold KV), then arrival. Batches stop at
``max_batch`` requests and skip a request whose adapter would exceed ``adapter_slots``
(SGLang's ``max_loras_per_batch``: distinct adapters of the batch, the base model
included, and the merged adapter always counts).

Policies are stateless: a decision is a function of the :class:`SchedulerState`, the
:class:`PolicyConfig` and the cost model only. Nothing here reads a clock.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

from sglang_vlora.orchestrator.cost_model import CostModel
from sglang_vlora.orchestrator.state import Decision, Mode, Request, SchedulerState, WeightState


@dataclass(frozen=True)
class PolicyConfig:
    """Static knobs of a policy (the ``--vlora-theta`` / ``--vlora-max-batch`` flags)."""

    theta: float  # starvation threshold on credits, seconds
    max_batch: int  # requests per iteration (MaxBS of Algorithm 1)
    adapter_slots: int | None = None  # distinct adapters per batch; None: no limit

    def __post_init__(self) -> None:
        if not math.isfinite(self.theta) or self.theta < 0:
            raise ValueError(f"theta must be a finite number of seconds >= 0, got {self.theta}")
        if self.max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {self.max_batch}")
        if self.adapter_slots is not None and self.adapter_slots < 1:
            raise ValueError(f"adapter_slots must be >= 1 or None, got {self.adapter_slots}")


class SchedulingPolicy(Protocol):
    def decide(self, state: SchedulerState) -> Decision:
        """The mode, merged adapter and batch of the next iteration."""
        ...


PolicyFactory = Callable[[PolicyConfig, CostModel], SchedulingPolicy]
_F = TypeVar("_F", bound=PolicyFactory)
_REGISTRY: dict[str, PolicyFactory] = {}


def register_policy(name: str) -> Callable[[_F], _F]:
    """Class decorator: make a policy available to :func:`make_policy` as ``name``."""

    def register(factory: _F) -> _F:
        if name in _REGISTRY:
            raise ValueError(f"policy {name!r} is already registered")
        _REGISTRY[name] = factory
        return factory

    return register


def policy_names() -> tuple[str, ...]:
    return tuple(sorted(_REGISTRY))


def make_policy(name: str, config: PolicyConfig, cost: CostModel) -> SchedulingPolicy:
    try:
        factory = _REGISTRY[name]
    except KeyError:
        raise ValueError(f"unknown policy {name!r}; known: {list(policy_names())}") from None
    return factory(config, cost)


# Building blocks shared by the policies -------------------------------------------------

ServingStates = Callable[[str | None, SchedulerState], Iterable[WeightState]]


def compute_credits(state: SchedulerState, cost: CostModel, serving: ServingStates) -> dict[str, float]:
    """Credit of every request: waiting time + expected execution + switch latency.

    ``serving(adapter, state)`` lists the weight states in which the policy could run a
    request of ``adapter``. If the current one is among them the request pays no switch;
    otherwise the cheapest of them (execution there plus the switch to it) is charged.
    """
    routes: dict[str | None, list[tuple[Mode, float]]] = {}  # per adapter: (mode to run in, switch seconds)
    for adapter in dict.fromkeys(r.adapter for r in state.requests):
        options = list(serving(adapter, state))
        if state.weights in options:
            routes[adapter] = [(state.mode, 0.0)]
        else:
            routes[adapter] = [
                (mode, cost.switch_s(state.weights, (mode, to), state.ranks)) for mode, to in options
            ]
    return {
        r.rid: max(0.0, state.now - r.arrival)
        + min(cost.exec_s(r, mode) + switch for mode, switch in routes[r.adapter])
        for r in state.requests
    }


def queue_order(requests: Iterable[Request], state: SchedulerState) -> list[Request]:
    """Running before waiting (they hold KV), then arrival; ids break ties."""
    running = {r.rid for r in state.running}
    return sorted(requests, key=lambda r: (r.rid not in running, r.arrival, r.rid))


def starving_requests(state: SchedulerState, credits: Mapping[str, float], theta: float) -> list[Request]:
    """Requests with credit above ``theta``: tighter SLO first (none last), then larger credit."""
    starving = [r for r in state.requests if credits[r.rid] > theta]
    return sorted(starving, key=lambda r: (r.slo is None, r.slo or 0.0, -credits[r.rid], r.arrival, r.rid))


def most_requested(state: SchedulerState) -> tuple[str | None, list[Request]]:
    """The adapter with the most requests (ties: the merged one, then by name) and its requests.

    The base model is never a merge candidate.
    """
    groups: dict[str, list[Request]] = {}
    for request in state.requests:
        if request.adapter is not None:
            groups.setdefault(request.adapter, []).append(request)
    if not groups:
        return None, []
    top = min(groups, key=lambda a: (-len(groups[a]), a != state.merged, a))
    return top, groups[top]


def build_decision(
    state: SchedulerState,
    config: PolicyConfig,
    mode: Mode,
    adapter: str | None,
    ordered: Sequence[Request],
    credits: Mapping[str, float],
    starving: Sequence[Request],
) -> Decision:
    """Take ``ordered`` requests into the batch within ``max_batch`` and ``adapter_slots``."""
    used: set[str | None] = set() if adapter is None else {adapter}
    batch: list[Request] = []
    for request in ordered:
        if len(batch) == config.max_batch:
            break
        if config.adapter_slots is not None and len(used | {request.adapter}) > config.adapter_slots:
            continue
        batch.append(request)
        used.add(request.adapter)
    chosen = {r.rid for r in batch}
    running = {r.rid for r in state.running}
    return Decision(
        mode=mode,
        adapter=adapter,
        batch=tuple(r.rid for r in batch),
        admit=tuple(r.rid for r in batch if r.rid not in running),
        pause=tuple(r.rid for r in queue_order(state.running, state) if r.rid not in chosen),
        starving=tuple(r.rid for r in starving),
        credits=credits,
    )


def unmerge_all(
    state: SchedulerState, config: PolicyConfig, credits: Mapping[str, float], starving: Sequence[Request]
) -> Decision:
    """Unmerge; the starving requests first, then everyone else in queue order (Algorithm 1 line 15)."""
    starving_ids = {r.rid for r in starving}
    rest = queue_order((r for r in state.requests if r.rid not in starving_ids), state)
    return build_decision(state, config, Mode.UNMERGE, None, [*starving, *rest], credits, starving)


def idle_decision(mode: Mode, adapter: str | None) -> Decision:
    """No requests: an empty batch; the caller names weights it can keep (a switch now buys nothing)."""
    return Decision(mode, adapter, (), (), (), (), {})


# V-LoRA ---------------------------------------------------------------------------------


@register_policy("vlora")
class VLoRAPolicy:
    """Algorithm 1: merge when possible, mixture on mild starvation, unmerge otherwise."""

    def __init__(self, config: PolicyConfig, cost: CostModel) -> None:
        self.config = config
        self.cost = cost

    @staticmethod
    def serving_states(adapter: str | None, state: SchedulerState) -> list[WeightState]:
        """Merged with its own adapter, mixture around the merged one, or unmerged."""
        states: list[WeightState] = [(Mode.UNMERGE, None)]
        if adapter is not None:
            states.append((Mode.MERGE, adapter))
        if state.merged is not None:
            states.append((Mode.MIXTURE, state.merged))
        return states

    def decide(self, state: SchedulerState) -> Decision:
        if not state.requests:
            return idle_decision(state.mode, state.merged)
        credits = compute_credits(state, self.cost, self.serving_states)
        starving = starving_requests(state, credits, self.config.theta)
        top, top_requests = most_requested(state)
        max_batch = self.config.max_batch
        # Algorithm 1 line 5: |R_starve| / MaxBS <= 0.5 and |R_merge| / MaxBS > 0.5
        if top is not None and 2 * len(starving) <= max_batch and 2 * len(top_requests) > max_batch:
            if not starving:
                return build_decision(
                    state, self.config, Mode.MERGE, top, queue_order(top_requests, state), credits, starving
                )
            starving_ids = {r.rid for r in starving}
            rest = queue_order((r for r in top_requests if r.rid not in starving_ids), state)
            return build_decision(
                state, self.config, Mode.MIXTURE, top, [*starving, *rest], credits, starving
            )
        return unmerge_all(state, self.config, credits, starving)
