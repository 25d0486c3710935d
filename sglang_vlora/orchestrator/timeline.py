"""Every iteration the orchestrator timed, in order, for ``GET /vlora/timeline``.

The cost model keeps a window of samples per mode and ``/vlora/status`` shows the last few of
each; neither says when an iteration ran or what ran around it. A benchmark round that costs
ten times another of the same workload needs that order to be explained, iteration by
iteration (docs/orchestrator.md, "At three quarters"). ``at`` is when the iteration's timing
was read (the scheduler reads finished timings between forward passes, never waiting for one),
so it trails the iteration's end by at most a few iterations. ``record`` runs once an iteration
in the scheduler's loop, so it only appends; ``since`` reads back from the newest entry and
stops at ``t``, so an answer costs what it returns, not what is kept.
"""

from __future__ import annotations

import math
from collections import deque
from itertools import takewhile
from typing import Any

from sglang_vlora.orchestrator.state import Mode

# About a dozen 100-request benchmark rounds of 1024 in / 64 out (0.7-1.4k iterations a round
# on the H200, 2026-11-28).
TIMELINE_CAPACITY = 16384


class IterationTimeline:
    """The last ``capacity`` timed iterations: ``(at, mode, prefill tokens, decode requests,
    seconds)``, in the order their timings were read (``at`` from the wall clock)."""

    def __init__(self, capacity: int = TIMELINE_CAPACITY) -> None:
        if capacity <= 0:
            raise ValueError("capacity must be positive")
        self._entries: deque[tuple[float, Mode, int, int, float]] = deque(maxlen=capacity)
        self._last_dropped_at: float | None = None

    def record(self, at: float, mode: Mode, prefill_tokens: int, decode_requests: int, seconds: float) -> None:
        if len(self._entries) == self._entries.maxlen:
            self._last_dropped_at = self._entries[0][0]
        self._entries.append((at, mode, prefill_tokens, decode_requests, seconds))

    def since(self, t: float) -> dict[str, Any]:
        """The iterations timed after unix time ``t``, and whether that is all of them
        (``complete``: none of those was dropped to make room)."""
        if not math.isfinite(t):
            raise ValueError("since must be a finite unix time")
        newest_first = takewhile(lambda entry: entry[0] > t, reversed(self._entries))
        # ``at`` unrounded: an answer's last ``at``, passed back as ``since``, asks for what came after
        rows = [[at, Mode(mode).value, tokens, requests, round(seconds, 6)]
                for at, mode, tokens, requests, seconds in newest_first][::-1]
        complete = self._last_dropped_at is None or self._last_dropped_at <= t
        return {"since": t, "complete": complete, "capacity": self._entries.maxlen,
                "columns": ["at", "mode", "prefill_tokens", "decode_requests", "seconds"], "iterations": rows}
