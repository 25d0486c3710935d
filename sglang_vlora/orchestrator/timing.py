"""Timing batches and switches without stopping the GPU.

A :class:`Clock` makes *marks* and later says whether a mark is done and the seconds
between two done marks. On a GPU a mark is a CUDA event recorded on a stream (no host
synchronisation: an interval is read only once ``event.query()`` says its end is done);
on a CPU it is the wall clock. Tests use a fake clock.

A batch's time is the interval from its start mark to the next batch's start mark, both
on the stream the forward runs on. On the GPU that is the end of the previous batch's
work to the end of this batch's work, bubbles the host left included: what the batch
costs in steady state, also under SGLang's overlap scheduler (where ``run_batch``
returns before the GPU is done). When the scheduler goes idle after a batch, the batch's
interval ends with a mark made at the idle step: on the GPU that mark is done when the
batch's work is, so the wait for the next request is not charged to it (a server whose
requests arrive one at a time, or answer in one forward, times every batch). An interval
that a weight switch fell into is not the batch's own and is dropped. A batch started
with ``record=False`` (one that pays one-off costs) still ends the previous batch's
interval, but its own is never read.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

Mark = Any


class Clock(Protocol):
    def mark(self) -> Mark: ...

    def done(self, mark: Mark) -> bool: ...

    def seconds(self, start: Mark, end: Mark) -> float: ...


class WallClock:
    """Host wall clock: for a device whose work is done when the call returns (CPU)."""

    def mark(self) -> float:
        return time.perf_counter()

    def done(self, mark: float) -> bool:
        return True

    def seconds(self, start: float, end: float) -> float:
        return end - start


K = TypeVar("K", bound=Hashable)


@dataclass
class _Interval(Generic[K]):
    start: Mark
    payload: K
    end: Mark | None = None
    valid: bool = True


class Intervals(Generic[K]):
    """Intervals waiting for their end mark to be done; read in order, never blocking."""

    def __init__(self, clock: Clock, limit: int = 256) -> None:
        self.clock = clock
        self._pending: deque[_Interval[K]] = deque(maxlen=limit)  # a stuck device drops the oldest

    def add(self, start: Mark, end: Mark, payload: K) -> None:
        self._pending.append(_Interval(start, payload, end))

    def collect(self) -> list[tuple[K, float]]:
        """``(payload, seconds)`` of the closed intervals whose end is done, oldest first."""
        out = []
        while self._pending and self._pending[0].end is not None:
            head = self._pending[0]
            if head.valid:
                if not self.clock.done(head.end):
                    break
                out.append((head.payload, self.clock.seconds(head.start, head.end)))
            self._pending.popleft()
        return out


class BatchTimer(Intervals[K]):
    """Each batch from its start mark to the next batch's start mark."""

    def start(self, payload: K, record: bool = True) -> None:
        """A batch starts: the previous batch's interval ends here. With ``record=False``
        this batch's own interval is dropped (``collect`` never returns it)."""
        mark = self.clock.mark()
        if self._pending and self._pending[-1].end is None:
            self._pending[-1].end = mark
        self._pending.append(_Interval(mark, payload, valid=record))

    def end_at_idle(self) -> None:
        """The scheduler found no batch to run: the last batch's interval ends here."""
        if self._pending and self._pending[-1].end is None:
            self._pending[-1].end = self.clock.mark()

    def interrupt(self) -> None:
        """Something other than a batch ran since the last start: that batch's interval is not its own."""
        if self._pending and self._pending[-1].end is None:
            self._pending[-1].valid = False
            self._pending[-1].end = self._pending[-1].start
