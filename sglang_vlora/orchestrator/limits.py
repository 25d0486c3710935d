"""Algorithm 1's MaxBS and theta for a server started without ``--vlora-max-batch`` /
``--vlora-theta``: derived from what the server runs, with where each came from.

* **max batch**: the larger of the requests in flight (running + waiting) now and their
  time average over about one request's execution time (the mean of finished requests;
  before one has finished, over the busy period so far), at most the capacity (SGLang's
  max running requests, and the largest captured decode CUDA graph when graphs are on:
  beyond it decode runs eagerly). That is the batch the server runs, so Algorithm 1's
  merge condition "one adapter holds more than half of MaxBS" reads "one adapter holds
  most of the requests in flight", the situation merging pays off in; SGLang's max
  running requests alone (4096 by default) would make it unreachable. The average keeps
  the tail of a burst (a few requests left, often of one adapter) from counting as a
  majority; taking the larger of it and the present count admits everyone waiting, as
  SGLang would.
* **theta**: ``theta_factor`` (1.5) times the mean execution time (first run to finish)
  of the last ``finished_window`` finished requests: since a credit already holds the
  request's own expected execution, a typical request starves once it has waited about
  half an execution time, and one that runs longer than the mean starves sooner. (The
  factor trades the pure-merge batches that holding other adapters' requests back buys
  against those requests' wait; 1.5 is not tuned on a GPU yet.) Execution rather than end-to-end time,
  so that waits the policy causes do not raise the threshold that bounds them. Until a
  request has finished there is nothing to derive it from and theta is 0: every request
  counts as starving, and Algorithm 1 runs unmerged. A request with an SLO starves at
  its SLO when that is tighter (:meth:`PolicyConfig.threshold`).
"""

from __future__ import annotations

import math
from collections import deque


class DerivedLimits:
    """The max batch and theta the policy uses: the flags when given, else derived."""

    def __init__(
        self,
        max_batch: int | None,
        theta: float | None,
        capacity: int,
        capacity_source: str,
        finished_window: int = 64,
        theta_factor: float = 1.5,
    ) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self._max_batch_flag = max_batch
        self._theta_flag = theta
        self.capacity = capacity
        self.capacity_source = capacity_source
        self.theta_factor = theta_factor
        self._in_flight = 0
        self._average = 0.0  # time average of requests in flight
        self._last: float | None = None  # time of the last observation of this busy period
        self._busy_since = 0.0
        self._executions: deque[float] = deque(maxlen=finished_window)

    def observe(self, now: float, in_flight: int) -> None:
        """Requests in flight (running + waiting) at a scheduling step at ``now`` (seconds)."""
        if self._last is None:
            self._average, self._busy_since = float(in_flight), now
        else:
            horizon = self._mean_execution() or (now - self._busy_since)
            if horizon > 0:
                # exponential average over ``horizon``; over the busy period it is the running mean
                weight = 1.0 - math.exp(-max(0.0, now - self._last) / horizon)
                self._average += weight * (self._in_flight - self._average)
        self._in_flight, self._last = in_flight, now

    def idle(self) -> None:
        """Nothing in flight: the next request starts a new busy period."""
        self._in_flight, self._last = 0, None

    def finished(self, execution_s: float) -> None:
        """A request finished ``execution_s`` seconds after it first ran."""
        if math.isfinite(execution_s) and execution_s >= 0:
            self._executions.append(execution_s)

    def max_batch_value(self) -> int:
        """:meth:`max_batch` without its source (every decision reads it; the text is for the status)."""
        if self._max_batch_flag is not None:
            return self._max_batch_flag
        return max(1, min(self.capacity, max(self._in_flight, round(self._average))))

    def max_batch(self) -> tuple[int, str]:
        if self._max_batch_flag is not None:
            return self._max_batch_flag, "--vlora-max-batch"
        horizon = "mean execution time" if self._executions else "busy period"
        return (
            self.max_batch_value(),
            f"requests in flight (running + waiting), now or averaged over the {horizon}, "
            f"at most {self.capacity} ({self.capacity_source})",
        )

    def theta_value(self) -> float:
        """:meth:`theta` without its source."""
        if self._theta_flag is not None:
            return self._theta_flag
        mean = self._mean_execution()
        return 0.0 if mean is None else self.theta_factor * mean

    def theta(self) -> tuple[float, str]:
        if self._theta_flag is not None:
            return self._theta_flag, "--vlora-theta"
        if not self._executions:
            return 0.0, "no request finished yet: every request counts as starving"
        return (
            self.theta_value(),
            f"{self.theta_factor:g} x mean execution time of the last {len(self._executions)} finished requests",
        )

    def _mean_execution(self) -> float | None:
        return sum(self._executions) / len(self._executions) if self._executions else None
