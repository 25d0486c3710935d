"""The iteration timeline behind ``GET /vlora/timeline`` and its ``since`` parameter."""

import math

import pytest

from sglang_vlora.http_api import timeline_since
from sglang_vlora.orchestrator.state import Mode
from sglang_vlora.orchestrator.timeline import IterationTimeline


def test_iterations_come_back_in_order_after_the_time_asked():
    timeline = IterationTimeline(capacity=8)
    timeline.record(100.0, Mode.UNMERGE, 1024, 0, 0.0612345678)
    timeline.record(100.5, Mode.MIXTURE, 0, 9, 0.008)
    timeline.record(101.0, Mode.MERGE, 0, 7, 0.0075)
    answer = timeline.since(100.0)  # strictly after
    assert answer["iterations"] == [[100.5, "mixture", 0, 9, 0.008], [101.0, "merge", 0, 7, 0.0075]]
    assert answer["columns"] == ["at", "mode", "prefill_tokens", "decode_requests", "seconds"]
    assert answer["complete"] and answer["capacity"] == 8 and answer["since"] == 100.0
    assert timeline.since(0)["iterations"][0] == [100.0, "unmerge", 1024, 0, 0.061235]
    assert timeline.since(101.0)["iterations"] == []
    # the last ``at`` of an answer, passed back, asks for what came after it (no rounding between)
    timeline.record(101.00004, Mode.MERGE, 0, 7, 0.0075)
    last = timeline.since(100.5)["iterations"][-1][0]
    assert last == 101.00004 and timeline.since(last)["iterations"] == []


def test_a_full_timeline_says_whether_it_dropped_what_was_asked_for():
    timeline = IterationTimeline(capacity=3)
    for i in range(5):  # 0 and 1 are dropped
        timeline.record(float(i), "unmerge", 0, 1, 0.01)
    assert [row[0] for row in timeline.since(-1)["iterations"]] == [2.0, 3.0, 4.0]
    assert not timeline.since(0.5)["complete"]  # 1.0 was after 0.5 and is gone
    assert timeline.since(1.0)["complete"]  # everything after 1.0 is kept
    with pytest.raises(ValueError):
        IterationTimeline(capacity=0)
    with pytest.raises(ValueError):
        timeline.since(math.nan)


@pytest.mark.parametrize("text, since", [("0", 0.0), ("1795885455.687", 1795885455.687), ("12", 12.0)])
def test_since_reads_a_unix_time(text, since):
    assert timeline_since(text) == (since, None)


@pytest.mark.parametrize("text", ["", "soon", "-1", "inf", "nan", "1e400"])
def test_a_bad_since_is_refused_with_the_reason(text):
    since, error = timeline_since(text)
    assert since is None and "since must be" in error and repr(text) in error


def test_the_newest_iterations_come_back_oldest_first():
    """Of 10,000 kept, the two after ``t`` (``since`` reads back from the newest and stops at
    the first not after ``t``), oldest first, with the mode as its name."""
    timeline = IterationTimeline()
    for i in range(10_000):
        timeline.record(float(i), Mode.MERGE, 0, 8, 0.008)
    rows = timeline.since(9_997.0)["iterations"]
    assert [row[0] for row in rows] == [9_998.0, 9_999.0] and rows[0][1] == "merge"
