"""Plain data the orchestrator decides on: requests, the scheduler's state, the decision.

Everything here is a frozen dataclass of numbers and strings, so that a decision is a
pure function of its inputs: every TP rank that builds the same :class:`SchedulerState`
gets the same :class:`Decision`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum


class Mode(StrEnum):
    """Inference modes of paper §4.4."""

    MERGE = "merge"  # one adapter folded into the base weights; only its requests run
    MIXTURE = "mixture"  # one adapter folded in; the others run unmerged with its delta subtracted
    UNMERGE = "unmerge"  # clean base weights; every adapter runs unmerged


# Where the weights are: the mode and the adapter folded into them (None in unmerge).
WeightState = tuple[Mode, str | None]


@dataclass(frozen=True)
class Request:
    """One request as the policy sees it.

    ``adapter`` is the key SGLang batches on (its ``lora_id``; ``None`` for the base
    model). Times are in seconds on the caller's clock (the same clock as
    :attr:`SchedulerState.now`). ``expected_output_tokens`` is the caller's estimate of
    the output length (``max_new_tokens`` or a per-application estimate).
    """

    rid: str
    adapter: str | None
    arrival: float
    prompt_tokens: int
    expected_output_tokens: int
    prefilled_tokens: int = 0
    output_tokens: int = 0
    application: str | None = None
    slo: float | None = None  # latency SLO of its application, seconds; None: no SLO

    def __post_init__(self) -> None:
        if (
            min(self.prompt_tokens, self.expected_output_tokens, self.prefilled_tokens, self.output_tokens)
            < 0
        ):
            raise ValueError(f"request {self.rid}: token counts must be non-negative")
        if self.slo is not None and self.slo <= 0:
            raise ValueError(f"request {self.rid}: slo must be positive, got {self.slo}")

    @property
    def remaining_prefill_tokens(self) -> int:
        return max(0, self.prompt_tokens - self.prefilled_tokens)

    @property
    def remaining_decode_steps(self) -> int:
        return max(0, self.expected_output_tokens - self.output_tokens)


@dataclass(frozen=True)
class SchedulerState:
    """What the scheduler knows at one iteration.

    ``now`` is supplied by the caller and must be identical on every TP rank (derive it
    from the iteration count, or broadcast it); the policy never reads a clock.
    ``ranks`` maps every adapter that may be merged to its LoRA rank (switch costs).
    ``last_switch`` is when the weights last changed (same clock as ``now``; None: never),
    for the switch budget. ``recent_arrivals`` holds the adapters of the latest arriving
    requests, oldest first (``None`` for the base model; empty: no history known), from
    which a policy reads an adapter's popularity beyond the requests in flight.

    ``running`` requests hold KV cache and are never paused: every decision runs them.
    """

    now: float
    waiting: Sequence[Request]
    running: Sequence[Request]
    mode: Mode
    merged: str | None
    ranks: Mapping[str, int] = field(default_factory=dict)
    last_switch: float | None = None
    recent_arrivals: Sequence[str | None] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "mode", Mode(self.mode))  # accept "merge" etc. from the glue
        if (self.mode is Mode.UNMERGE) != (self.merged is None):
            raise ValueError(
                f"mode {self.mode} with merged adapter {self.merged!r}: "
                "merge and mixture need one, unmerge has none"
            )
        rids = [r.rid for r in (*self.waiting, *self.running)]
        if len(rids) != len(set(rids)):
            raise ValueError("request ids must be unique across waiting and running")

    @property
    def weights(self) -> WeightState:
        return (self.mode, self.merged)

    @property
    def requests(self) -> tuple[Request, ...]:
        return (*self.running, *self.waiting)

    def arrival_share(self, adapter: str) -> float | None:
        """``adapter``'s share of :attr:`recent_arrivals`; None when there are none."""
        if not self.recent_arrivals:
            return None
        return sum(a == adapter for a in self.recent_arrivals) / len(self.recent_arrivals)


@dataclass(frozen=True)
class Decision:
    """What to run in the next iteration.

    ``mode`` is the mode the batch runs in with the weights ``adapter`` names: merge only
    when every request of the batch uses ``adapter``, mixture when some do not (running
    requests of other adapters are never paused), unmerge when nothing is merged.
    ``batch`` holds the request ids to run, most urgent first: every running request and
    the admitted waiting ones; ``admit`` the waiting ones among them (in that order: the
    order to offer them to SGLang's admission, which may still stop early for memory).
    ``credits``, ``starving`` and ``reason`` (one of
    :data:`~sglang_vlora.orchestrator.policy.DECISION_REASONS`) explain the decision
    (metrics, /vlora/status).
    """

    mode: Mode
    adapter: str | None
    batch: tuple[str, ...]
    admit: tuple[str, ...]
    starving: tuple[str, ...]
    credits: Mapping[str, float]
    reason: str
