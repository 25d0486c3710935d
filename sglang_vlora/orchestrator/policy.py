"""Scheduling policies: which inference mode runs next and which requests it serves.

V-LoRA's policy is Algorithm 1 of the paper (§4.4.3). Every request gets a *credit*:
its waiting time plus its expected execution time in the current mode, plus the switch
latency when the current weights cannot serve it (then the cheapest way this policy has
to serve it is taken). A request whose credit exceeds its threshold (``theta``, or its
SLO when that is tighter) is *starving*. Then:

* nothing starves and the most-requested adapter holds more than half of the max batch:
  **merge** that adapter and admit its requests;
* starving requests are at most half of the max batch and that adapter still holds more
  than half: **mixture** with it merged; the starving requests first, then its requests;
* otherwise **unmerge**: the starving requests first, then everyone else.

One deviation: line 5's count of starving requests leaves out the most-requested adapter's
own. Merged weights serve those at no LoRA cost, the fastest way there is to serve them;
the paper's count unmerged for them, which only slowed them down and switched the weights
twice. On the benchmark's video workload (one adapter; detection requests run longer than
the derived theta, so they starve while running) the paper's count ran up to 44% of the
iterations unmerged, with up to 61 switches a minute; this count, none and none
(docs/orchestrator.md). The other adapters' starving requests, which would run in mixture,
count as in the paper.

What happens to the other adapters' requests while an adapter is merged is the
``admission`` knob (``--vlora-admission``):

* ``algorithm1`` (:class:`PolicyConfig`'s default; the server's is ``all``, ``config.py``): the
  paper's rule: they wait until their credit exceeds theta;
* ``all``: after the starving requests and the merged adapter's, every other waiting request
  that fits is admitted too and runs in mixture, so none waits for starvation. Alone it did
  not pay on the benchmark GPU; with ``keep_merged`` "plurality" and mixture's pairs it was at
  least as fast as the paper's rules (docs/orchestrator.md).

Whether merged weights stay merged once line 5 fails is the ``keep_merged`` knob
(``--vlora-keep-merged``):

* ``majority`` (:class:`PolicyConfig`'s default; the server's is ``plurality``): the paper's
  rule: line 5 is checked every iteration, and the weights unmerge as soon as it fails;
* ``plurality``: entering a merge still needs line 5, but an adapter already merged stays
  merged while it is still the most-requested adapter and at most half of the max batch
  starve (the other adapters' requests run in mixture around it, admitted as ``admission``
  says). Under Algorithm 1's admission the requests held back while merged count in line 5
  and can take the top adapter's majority away although it still has the most requests;
* ``popular``: as ``plurality``, and the merged adapter also stays while it is *popular*
  (below: more than ``popular_share`` of the recent arrivals), even when other adapters have more requests in flight (a lone
  request of another adapter then runs in mixture instead of unmerging the weights for it).
  At a few requests in flight the top adapter of the moment changes every few iterations;
  the arrivals say whether the merged one still keeps the traffic.

Entering a merge also needs the adapter to be *popular*: more than ``popular_share``
(``--vlora-popular-share``, default one half) of the latest arrivals (:attr:`SchedulerState.recent_arrivals`; the server keeps the last
``--vlora-popular-window``, default 32). Line 5 counts the
requests in flight, and at light load they are one or two: "more than half of MaxBS on one
adapter" then holds for every lone request, whatever the popularity, and with uniform
popularity the weights followed each request's adapter (an H200 run merged 71% of its
iterations at derived MaxBS 1 with 76 switches, 18% in mixture, and its mean was above
unmerged's; docs/orchestrator.md).
Merging pays off for an adapter that keeps most of the traffic (paper §4.3), and that is
what the arrivals tell. An adapter already merged needs no such check (no switch is made).
Under ``keep_merged`` "majority" and "plurality" a popular merged adapter does not stay merged
for another adapter's lone request: that request would run in mixture (its own delta plus the
merged one's subtracted), and on the vision-skewed benchmark with prefill CUDA graphs keeping it
so doubled the mixture iterations and raised the LoRA cost (docs/orchestrator.md); the weights
unmerge for it instead. "popular" keeps it (the module's knob above). Without a history (an
empty ``recent_arrivals``) the check is skipped: Algorithm 1 as written.

Two facts of the server as built shape every policy here (named in docs/orchestrator.md):

* running requests hold KV cache and are **never paused**: every batch runs all of them,
  and a policy only chooses the weights and the waiting requests to admit. Weights with
  adapter ``k`` merged and a running request of another adapter run that batch as
  mixture, and the decision says so (:attr:`Decision.mode` is what runs);
* a weight switch stops the GPU for its duration, so V-LoRA keeps a **switch budget**:
  it changes the weights only when the time since the last change is at least the
  measured cost of the switch divided by ``switch_budget`` (so switching takes at most
  about that fraction of the time); until then the current weights serve the running
  requests and the decided admissions (mixture serves any request, so no request waits
  for the budget). With nothing running, the budget does not hold a switch back. The
  weights also stay when the adapter to merge would find no pool slot (the running
  requests' adapters and the merged one fill ``adapter_slots``).

Starving requests are ordered by tighter SLO first (no SLO last), then by larger credit;
the others by running before waiting (they hold KV), then arrival. Admissions stop at
``max_batch`` requests in the batch (running ones included) and skip a request whose
adapter would exceed ``adapter_slots`` (SGLang's ``max_loras_per_batch``: distinct
adapters of the batch, the base model included, and the merged adapter always counts).

Every decision names its *reason* (:data:`DECISION_REASONS`), which ``/vlora/status``
counts: why the weights are what they are, e.g. which half of line 5 failed when V-LoRA
did not merge, or that the switch budget kept the weights.

Policies are stateless: a decision is a function of the :class:`SchedulerState`, the
:class:`PolicyConfig` and the cost model only. Nothing here reads a clock.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

from sglang_vlora.orchestrator.cost_model import CostModel
from sglang_vlora.orchestrator.state import Decision, Mode, Request, SchedulerState, WeightState

ADMISSIONS = ("algorithm1", "all")  # see the module docstring
KEEP_MERGED = ("majority", "plurality", "popular")  # see the module docstring

# Why a decision went the way it did (Decision.reason). Every policy:
IDLE = "idle"  # no request in flight: the weights stay as the policy keeps them idle
# V-LoRA (Algorithm 1), and dLoRA where it decides alike:
MERGE = "merge"  # line 5 holds: the top adapter has more than half of max batch, at most half of it starve
NO_ADAPTER = "no_adapter"  # no request uses an adapter: nothing to merge
NO_MAJORITY = "no_majority"  # the top adapter has at most half of the requests in flight
BELOW_MAX_BATCH = "below_max_batch"  # more than half of those in flight, but at most half of max batch
STARVING = "starving"  # the top adapter has more than half of max batch, but over half starve elsewhere (dLoRA: any)
KEPT_SWITCH_BUDGET = "kept_switch_budget"  # other weights wanted; the switch budget kept the current ones
KEPT_NO_SLOT = "kept_no_slot"  # other weights wanted; the adapter to merge found no pool slot
FREE_SLOT = "free_slot"  # the adapter to merge found no pool slot and nothing runs: unmerge to free one
KEPT_PLURALITY = "kept_plurality"  # line 5 fails, but keep_merged "plurality" keeps the top adapter merged
KEPT_POPULAR = "kept_popular"  # the merged adapter is not the top one in flight; keep_merged "popular" keeps it
NOT_POPULAR = "not_popular"  # line 5 holds, but the adapter has at most popular_share of the recent arrivals
# The comparison policies (baselines.py):
SERVE_ONE_ADAPTER = "serve_one_adapter"  # merge-only: one adapter's requests on its own weights
DRAIN_MERGED = "drain_merged"  # another adapter wanted: the current weights finish their running requests
DRAIN_UNMERGED = "drain_unmerged"  # an adapter wanted, others' requests running (no mixture): clean weights
NEVER_MERGES = "never_merges"  # unmerge-only
DECISION_REASONS = (
    IDLE,
    MERGE,
    NO_ADAPTER,
    NO_MAJORITY,
    BELOW_MAX_BATCH,
    STARVING,
    KEPT_SWITCH_BUDGET,
    KEPT_NO_SLOT,
    FREE_SLOT,
    KEPT_PLURALITY,
    KEPT_POPULAR,
    NOT_POPULAR,
    SERVE_ONE_ADAPTER,
    DRAIN_MERGED,
    DRAIN_UNMERGED,
    NEVER_MERGES,
)


@dataclass(frozen=True)
class PolicyConfig:
    """Knobs of a policy: ``--vlora-theta`` / ``--vlora-max-batch`` or their derived values."""

    theta: float  # starvation threshold on credits, seconds
    max_batch: int  # requests per iteration (MaxBS of Algorithm 1)
    adapter_slots: int | None = None  # distinct adapters per batch; None: no limit
    switch_budget: float = 0.1  # largest fraction of the time V-LoRA may spend switching weights
    admission: str = "algorithm1"  # merged weights admit the starving (Algorithm 1), or "all" waiting requests
    keep_merged: str = "majority"  # merged weights stay while line 5 holds, or while they are the top adapter
    popular_share: float = 0.5  # an adapter is popular above this share of the recent arrivals

    def __post_init__(self) -> None:
        if not math.isfinite(self.theta) or self.theta < 0:
            raise ValueError(f"theta must be a finite number of seconds >= 0, got {self.theta}")
        if self.max_batch < 1:
            raise ValueError(f"max_batch must be >= 1, got {self.max_batch}")
        if self.adapter_slots is not None and self.adapter_slots < 1:
            raise ValueError(f"adapter_slots must be >= 1 or None, got {self.adapter_slots}")
        if not 0 < self.switch_budget <= 1:
            raise ValueError(f"switch_budget must be in (0, 1], got {self.switch_budget}")
        if self.admission not in ADMISSIONS:
            raise ValueError(f"admission must be one of {ADMISSIONS}, got {self.admission!r}")
        if self.keep_merged not in KEEP_MERGED:
            raise ValueError(f"keep_merged must be one of {KEEP_MERGED}, got {self.keep_merged!r}")
        if not 0 <= self.popular_share < 1:
            raise ValueError(f"popular_share must be in [0, 1), got {self.popular_share}")

    def threshold(self, request: Request) -> float:
        """Credit above which ``request`` starves: theta, or its SLO when tighter."""
        return self.theta if request.slo is None else min(self.theta, request.slo)


@dataclass(frozen=True)
class Plan:
    """What a policy chose: the weights, and the requests in priority order.

    Running requests in ``order`` only set their place in the batch (they run anyway);
    waiting ones are admitted in this order while room is left.
    """

    adapter: str | None  # merged adapter of the next iteration; None: clean weights
    order: Sequence[Request]
    reason: str  # one of DECISION_REASONS


class SchedulingPolicy(ABC):
    """The skeleton every policy shares; a policy supplies :meth:`serving_states` and
    :meth:`plan`, and :meth:`idle_weights` when it keeps other weights than the current."""

    def __init__(self, config: PolicyConfig, cost: CostModel) -> None:
        self.config = config
        self.cost = cost

    @abstractmethod
    def serving_states(self, adapter: str | None, state: SchedulerState) -> Iterable[WeightState]:
        """The weight states in which this policy could run a request of ``adapter``."""

    @abstractmethod
    def plan(self, state: SchedulerState, credits: Mapping[str, float], starving: Sequence[Request]) -> Plan:
        """Weights and admission order for a state with requests."""

    def idle_weights(self, state: SchedulerState) -> WeightState:
        """Weights to keep with no requests (a switch now buys nothing)."""
        return state.weights

    def decide(self, state: SchedulerState) -> Decision:
        """The mode, merged adapter and batch of the next iteration."""
        if not state.requests:
            mode, adapter = self.idle_weights(state)
            return Decision(mode, adapter, (), (), (), {}, IDLE)
        credits = compute_credits(state, self.cost, self.serving_states)
        starving = starving_requests(state, credits, self.config)
        plan = self.plan(state, credits, starving)
        return build_decision(state, self.config, plan, credits, starving)


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


def starving_requests(
    state: SchedulerState, credits: Mapping[str, float], config: PolicyConfig
) -> list[Request]:
    """Requests with credit above their threshold: tighter SLO first (none last), then larger credit."""
    starving = [r for r in state.requests if credits[r.rid] > config.threshold(r)]
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


def starving_first(starving: Sequence[Request], others: Iterable[Request], state: SchedulerState) -> list[Request]:
    """The starving requests in their order, then ``others`` not among them in queue order."""
    starving_ids = {r.rid for r in starving}
    return [*starving, *queue_order((r for r in others if r.rid not in starving_ids), state)]


def starving_elsewhere(starving: Sequence[Request], adapter: str | None) -> list[Request]:
    """The starving requests that weights with ``adapter`` merged would run in mixture: every
    one but ``adapter``'s own (module docstring: line 5's count)."""
    return [r for r in starving if r.adapter != adapter]


def merge_condition(config: PolicyConfig, starving: Sequence[Request], top_requests: Sequence[Request]) -> bool:
    """Algorithm 1 line 5: |R_starve| / MaxBS <= 0.5 and |R_merge| / MaxBS > 0.5."""
    return 2 * len(starving) <= config.max_batch and 2 * len(top_requests) > config.max_batch


def majority_reason(state: SchedulerState, config: PolicyConfig, top_requests: Sequence[Request]) -> str | None:
    """Why the most-requested adapter (``top_requests`` its requests) fails line 5's second
    half, |R_merge| / MaxBS > 0.5; None when it holds. When the max batch exceeds the
    requests in flight, a majority of them can still be too few."""
    if not top_requests:
        return NO_ADAPTER
    if 2 * len(top_requests) > config.max_batch:
        return None
    if 2 * len(top_requests) <= len(state.requests):
        return NO_MAJORITY
    return BELOW_MAX_BATCH


def popular(state: SchedulerState, adapter: str, popular_share: float = 0.5) -> bool:
    """Whether ``adapter`` has more than ``popular_share`` of the recent arrivals (True without
    a history)."""
    share = state.arrival_share(adapter)
    return share is None or share > popular_share


def runs_without_mixture(requests: Iterable[Request], adapter: str | None) -> bool:
    """Whether weights with ``adapter`` merged (None: clean) run ``requests`` without mixture."""
    return adapter is None or all(r.adapter == adapter for r in requests)


def build_decision(
    state: SchedulerState,
    config: PolicyConfig,
    plan: Plan,
    credits: Mapping[str, float],
    starving: Sequence[Request],
) -> Decision:
    """Every running request plus the waiting ones of ``plan.order`` that fit.

    Waiting requests are admitted while the batch holds fewer than ``max_batch`` requests
    and their adapter fits in ``adapter_slots``; running requests never leave.
    """
    running_ids = {r.rid for r in state.running}
    used: set[str | None] = {r.adapter for r in state.running}
    if plan.adapter is not None:
        used.add(plan.adapter)
    room = config.max_batch - len(state.running)
    batch: list[Request] = []
    for request in plan.order:
        if request.rid not in running_ids:
            if room <= 0 or (
                config.adapter_slots is not None and len(used | {request.adapter}) > config.adapter_slots
            ):
                continue
            room -= 1
            used.add(request.adapter)
        batch.append(request)
    chosen = {r.rid for r in batch}
    batch += queue_order((r for r in state.running if r.rid not in chosen), state)
    if plan.adapter is None:
        mode = Mode.UNMERGE
    else:
        mode = Mode.MERGE if runs_without_mixture(batch, plan.adapter) else Mode.MIXTURE
    return Decision(
        mode=mode,
        adapter=plan.adapter,
        batch=tuple(r.rid for r in batch),
        admit=tuple(r.rid for r in batch if r.rid not in running_ids),
        starving=tuple(r.rid for r in starving),
        credits=credits,
        reason=plan.reason,
    )


def fits_in_slots(state: SchedulerState, config: PolicyConfig, adapter: str | None) -> bool:
    """Whether merging ``adapter`` finds a pool slot: the running requests' adapters, the
    one merged now (it leaves the pool only after the switch) and ``adapter`` must fit in
    ``adapter_slots``; the mode controller refuses the switch otherwise."""
    if adapter is None or adapter == state.merged or config.adapter_slots is None:
        return True
    needed = {r.adapter for r in state.running} | {adapter}
    if state.merged is not None:
        needed.add(state.merged)
    return len(needed) <= config.adapter_slots


def within_switch_budget(state: SchedulerState, config: PolicyConfig, cost: CostModel, adapter: str | None) -> bool:
    """Whether moving the weights to ``adapter`` merged keeps switching within the budget:
    the time since the last switch is at least this switch's cost / ``switch_budget``.
    With nothing running there is no batch to serve in the current weights: always."""
    if adapter == state.merged or state.last_switch is None or not state.running:
        return True
    target: WeightState = (Mode.UNMERGE, None) if adapter is None else (Mode.MERGE, adapter)
    seconds = cost.switch_s(state.weights, target, state.ranks)
    return state.now - state.last_switch >= seconds / config.switch_budget


# V-LoRA ---------------------------------------------------------------------------------


@register_policy("vlora")
class VLoRAPolicy(SchedulingPolicy):
    """Algorithm 1: merge when possible, mixture on mild starvation, unmerge otherwise."""

    def serving_states(self, adapter: str | None, state: SchedulerState) -> list[WeightState]:
        """Merged with its own adapter, mixture around the merged one, or unmerged."""
        states: list[WeightState] = [(Mode.UNMERGE, None)]
        if adapter is not None:
            states.append((Mode.MERGE, adapter))
        if state.merged is not None:
            states.append((Mode.MIXTURE, state.merged))
        return states

    def plan(self, state: SchedulerState, credits: Mapping[str, float], starving: Sequence[Request]) -> Plan:
        top, top_requests = most_requested(state)
        line5 = top is not None and merge_condition(self.config, starving_elsewhere(starving, top), top_requests)
        if line5 and (top == state.merged or popular(state, top, self.config.popular_share)):
            # Lines 6-12: merge top (entering a merge needs top to be popular: module docstring).
            adapter, order, reason = top, self.merged_order(state, starving, top_requests), MERGE
        elif self.keeps_merged(state, starving, top):
            # keep_merged "plurality" / "popular": line 5 failed, but the merged adapter is still
            # the top one (or, for "popular", keeps most of the arrivals) and at most half of max
            # batch starve elsewhere; it stays, admitting as a merge does.
            adapter = state.merged
            own = [r for r in state.requests if r.adapter == adapter]
            order = self.merged_order(state, starving, own)
            reason = KEPT_PLURALITY if top == adapter else KEPT_POPULAR
        else:
            # Lines 13-15: unmerge; the starving first, then everyone. When line 5's second
            # half holds, its first failed (more than half of max batch starve), or top is
            # not popular.
            adapter, order = None, starving_first(starving, state.requests, state)
            reason = NOT_POPULAR if line5 else majority_reason(state, self.config, top_requests) or STARVING
        # Other weights wanted: the current ones stay when the adapter to merge finds no pool
        # slot, or when switching now would exceed the switch budget (they serve the same
        # admissions: mixture serves any request). With nothing running, kept weights whose
        # adapter fills the last slot would admit no request of the wanted one, ever: unmerging
        # (always possible) frees the slot, and the next decision can merge.
        if not fits_in_slots(state, self.config, adapter):
            if state.running:
                adapter, reason = state.merged, KEPT_NO_SLOT
            else:
                adapter, order, reason = None, starving_first(starving, state.requests, state), FREE_SLOT
        elif not within_switch_budget(state, self.config, self.cost, adapter):
            adapter, reason = state.merged, KEPT_SWITCH_BUDGET
        return Plan(adapter, order, reason)

    def merged_order(
        self, state: SchedulerState, starving: Sequence[Request], merged_requests: Sequence[Request]
    ) -> list[Request]:
        """Admission order with an adapter merged: the starving first (mixture), then the merged
        adapter's requests; with admission "all" every other request after them (mixture)
        instead of waiting to starve."""
        order = starving_first(starving, merged_requests, state)
        if self.config.admission == "all":
            placed = {r.rid for r in order}
            order += queue_order((r for r in state.requests if r.rid not in placed), state)
        return order

    def keeps_merged(self, state: SchedulerState, starving: Sequence[Request], top: str | None) -> bool:
        """Whether keep_merged keeps the weights merged although line 5 fails: an adapter is
        merged, at most half of max batch starve elsewhere, and it is still the most requested
        in flight (``top``; "plurality" and "popular") or, for "popular" only, it is popular
        (a history is needed: without one nothing says it keeps the traffic). It never enters a
        merge."""
        merged = state.merged
        if self.config.keep_merged == "majority" or merged is None:
            return False
        if 2 * len(starving_elsewhere(starving, merged)) > self.config.max_batch:
            return False
        if top == merged:
            return True
        return (
            self.config.keep_merged == "popular"
            and state.arrival_share(merged) is not None
            and popular(state, merged, self.config.popular_share)
        )
