"""Timing batches and switches from marks read only once done, on a simulated GPU stream
(a fake clock): the overlap scheduler's host runs ahead of the device, idle gaps and
switches fall between batches, and the fitted costs still come out right."""

from __future__ import annotations

import pytest

from sglang_vlora.orchestrator import MeasuredCosts, Mode
from sglang_vlora.orchestrator.timing import BatchTimer, Intervals
from tests.orchestrator.test_measured_costs import BATCHES, TRUE, seconds


class FakeStream:
    """A device stream: work runs in order, each item after the previous one and not
    before the host queued it. A mark is done once the device has reached it."""

    def __init__(self) -> None:
        self.host = 0.0  # the host's clock
        self.device = 0.0  # when the device finishes what is queued so far
        self.reads = 0

    def queue(self, seconds: float) -> None:
        self.device = max(self.device, self.host) + seconds

    def mark(self) -> float:
        self.device = max(self.device, self.host)
        return self.device

    def done(self, mark: float) -> bool:
        self.reads += 1
        return mark <= self.host

    def seconds(self, start: float, end: float) -> float:
        assert end <= self.host, "an interval was read before the device reached its end"
        return end - start


def serve(stream: FakeStream, timer: BatchTimer, costs: MeasuredCosts, host_step: float) -> None:
    """An overlap scheduler: per iteration the host launches one batch and moves on
    after ``host_step`` seconds of its own work, never waiting for the device except
    through the pipeline depth of one batch (it reads the previous batch's results)."""
    mode = Mode.UNMERGE
    for i in range(120):
        for (m, tokens, requests), value in timer.collect():
            costs.record_iteration(m, tokens, requests, value)
        if i == 40:  # the server went idle for 2 s: the batch before the gap ends at the idle step
            timer.end_at_idle()
            stream.host = stream.device + 2.0
        if i == 80:  # a weight switch of 3 ms on the same stream, between two batches
            stream.queue(0.003)
            timer.interrupt()
            mode = Mode.MERGE
        tokens, requests = BATCHES[i % len(BATCHES)]
        timer.start((mode, tokens, requests))
        previous_end = stream.device
        stream.queue(seconds(mode, tokens, requests))
        stream.host = max(stream.host + host_step, previous_end)  # waits for the previous batch


@pytest.mark.parametrize("host_step", [0.0005, 0.002])
def test_batches_timed_on_the_stream_fit_the_true_costs(host_step):
    stream = FakeStream()
    timer = BatchTimer(stream)
    costs = MeasuredCosts(layers=28, refit_every=1)
    serve(stream, timer, costs, host_step)
    costs.snapshot()
    for mode, (fixed, forward, per_token, per_request) in TRUE.items():
        fit = costs.fits[mode]
        assert fit.prefill_token_s == pytest.approx(per_token, rel=1e-6)
        assert fit.fixed_s == pytest.approx(fixed, rel=1e-6)
        assert fit.prefill_forward_s == pytest.approx(forward, rel=1e-6)
        assert fit.decode_request_s == pytest.approx(per_request, rel=1e-6)
    assert stream.reads > 0


def test_a_host_bound_loop_is_charged_what_an_iteration_takes():
    """When the host is slower than the device, a batch costs the host's iteration time:
    that is what the requests in it wait for."""
    stream = FakeStream()
    timer = BatchTimer(stream)
    got = []
    for _ in range(5):
        got += timer.collect()
        timer.start("decode")
        stream.queue(0.001)
        stream.host += 0.004
    got += timer.collect()
    assert [value for _, value in got] == pytest.approx([0.004] * 4)


def test_a_batch_before_an_idle_step_is_timed_without_the_idle_time():
    """Requests one at a time: each batch is followed by idle steps until the next one
    arrives. Every batch is still timed, by its own work (the idle mark is done when the
    device finishes the batch), and later idle steps change nothing."""
    stream = FakeStream()
    timer = BatchTimer(stream)
    got = []
    for work in (0.060, 0.075, 0.058):
        got += timer.collect()
        timer.start(work)
        stream.queue(work)
        stream.host += 0.001  # the host launched it and looks for the next batch: none
        timer.end_at_idle()
        timer.end_at_idle()
        stream.host = stream.device + 1.0  # idle for a second, then the next request
    got += timer.collect()
    assert got == [(w, pytest.approx(w)) for w in (0.060, 0.075, 0.058)]


def test_nothing_is_read_before_its_end_is_done():
    stream = FakeStream()
    timer = BatchTimer(stream)
    timer.start("a")
    stream.queue(0.010)
    timer.start("b")  # a's end mark: the device gets there at 0.010
    assert timer.collect() == []
    stream.host = 0.009
    assert timer.collect() == []
    stream.host = 0.010
    assert timer.collect() == [("a", pytest.approx(0.010))]


def test_switch_intervals_are_read_once_done():
    stream = FakeStream()
    switches = Intervals(stream)
    start = stream.mark()
    stream.queue(0.0025)
    switches.add(start, stream.mark(), ("merge", 64))
    assert switches.collect() == []
    stream.host = 1.0
    assert switches.collect() == [(("merge", 64), pytest.approx(0.0025))]
    assert switches.collect() == []


def test_an_unrecorded_batch_ends_the_one_before_and_is_never_read():
    """The first request's batches pay one-off costs: started with ``record=False``, a batch
    is not read, yet it still ends the interval of the batch before it, and the next batch
    is timed from its own start."""
    stream = FakeStream()
    timer = BatchTimer(stream)
    starts = {}
    got = []
    for name, work, record in (("a", 4.9, False), ("b", 0.007, True), ("c", 0.008, True)):
        got += timer.collect()
        timer.start(name, record=record)
        starts[name] = stream.device
        stream.queue(work)
        stream.host = stream.device  # the host waits for the batch (no overlap)
    stream.host += 0.002  # the host's own work before the next batch: c's bubble
    timer.start("d", record=False)  # c's interval ends here; d's is never read
    stream.queue(0.5)
    stream.host = stream.device
    timer.end_at_idle()
    got += timer.collect()
    assert starts["b"] == pytest.approx(4.9)  # b starts where a ended, and is timed from there
    assert got == [("b", pytest.approx(0.007)), ("c", pytest.approx(0.010))]
    assert timer.collect() == []
