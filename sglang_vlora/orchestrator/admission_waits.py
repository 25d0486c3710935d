"""How long requests wait before the policy admits them, per adapter.

A request's wait runs from the scheduler iteration that first sees it waiting to the one
whose decision admits it: the queueing SGLang would have anyway plus whatever the policy
holds it back (Algorithm 1 keeps other adapters' requests waiting while one adapter is
merged, until they starve). Latency tails are made of these waits or of slow iterations;
this tells the two apart. Counts are cumulative since start-up, so a benchmark reading
``/vlora/status`` before and after a run takes the difference.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

OVER_S = (0.05, 0.1, 0.25, 0.5, 1.0)  # report how many waits exceeded each of these


@dataclass
class _Waits:
    requests: int = 0
    total_s: float = 0.0
    max_s: float = 0.0
    over: list[int] = field(default_factory=lambda: [0] * len(OVER_S))


class AdmissionWaits:
    """Per adapter name: admitted requests, their summed and longest wait, and how many
    waited longer than each of :data:`OVER_S`."""

    def __init__(self) -> None:
        self._by_adapter: dict[str, _Waits] = {}

    def record(self, adapter: str, wait_s: float) -> None:
        if wait_s < 0:
            raise ValueError(f"a wait cannot be negative, got {wait_s}")
        waits = self._by_adapter.setdefault(adapter, _Waits())
        waits.requests += 1
        waits.total_s += wait_s
        waits.max_s = max(waits.max_s, wait_s)
        for i, limit in enumerate(OVER_S):
            if wait_s > limit:
                waits.over[i] += 1

    def report(self) -> dict[str, Any]:
        return {
            adapter: {
                "requests": w.requests,
                "total_s": w.total_s,
                "max_s": w.max_s,
                "over_s": {f"{limit:g}": n for limit, n in zip(OVER_S, w.over, strict=True)},
            }
            for adapter, w in sorted(self._by_adapter.items())
        }
