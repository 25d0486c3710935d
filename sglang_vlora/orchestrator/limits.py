"""Algorithm 1's MaxBS and theta for a server started without ``--vlora-max-batch`` /
``--vlora-theta``: derived from what the server runs, with where each came from.

* **max batch**: the requests in flight (running + waiting) at this scheduling step, at
  most the capacity (SGLang's max running requests, and the largest captured decode CUDA
  graph when graphs are on: beyond it decode runs eagerly). That is the batch the server
  would run if it admitted everyone, so Algorithm 1's merge condition "one adapter holds
  more than half of MaxBS" reads "one adapter holds most of the requests in flight", the
  situation merging pays off in. SGLang's max running requests alone (4096 by default)
  would make it unreachable. As a batch cap it admits everyone who is waiting, as SGLang
  would. The switch budget (:mod:`~sglang_vlora.orchestrator.policy`), not a smoothed
  MaxBS, keeps the weights from following every arrival.
* **theta**: ``theta_factor`` (2) times the mean execution time (first run to finish)
  of the last ``finished_window`` finished requests: a request starves once it has
  waited about as long as a request takes to run. Execution rather than end-to-end time,
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
        theta_factor: float = 2.0,
    ) -> None:
        if capacity < 1:
            raise ValueError(f"capacity must be >= 1, got {capacity}")
        self._max_batch_flag = max_batch
        self._theta_flag = theta
        self.capacity = capacity
        self.capacity_source = capacity_source
        self.theta_factor = theta_factor
        self._in_flight = 0
        self._executions: deque[float] = deque(maxlen=finished_window)

    def observe(self, in_flight: int) -> None:
        """Requests in flight (running + waiting) at this scheduling step."""
        self._in_flight = in_flight

    def finished(self, execution_s: float) -> None:
        """A request finished ``execution_s`` seconds after it first ran."""
        if math.isfinite(execution_s) and execution_s >= 0:
            self._executions.append(execution_s)

    def max_batch(self) -> tuple[int, str]:
        if self._max_batch_flag is not None:
            return self._max_batch_flag, "--vlora-max-batch"
        return (
            max(1, min(self.capacity, self._in_flight)),
            f"requests in flight (running + waiting), at most {self.capacity} ({self.capacity_source})",
        )

    def theta(self) -> tuple[float, str]:
        if self._theta_flag is not None:
            return self._theta_flag, "--vlora-theta"
        if not self._executions:
            return 0.0, "no request finished yet: every request counts as starving"
        mean = sum(self._executions) / len(self._executions)
        return (
            self.theta_factor * mean,
            f"{self.theta_factor:g} x mean execution time of the last {len(self._executions)} finished requests",
        )
