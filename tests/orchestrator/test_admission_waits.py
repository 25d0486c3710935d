"""The admission-wait tally /vlora/status reports per adapter (cumulative, so a benchmark
diffs two readings); that the server fills it from real decisions is checked in
tests/server/test_orchestrator.py."""

import pytest

from sglang_vlora.orchestrator.admission_waits import OVER_S, AdmissionWaits


def test_waits_are_tallied_per_adapter():
    waits = AdmissionWaits()
    for adapter, wait in [("a8", 0.0), ("a8", 0.3), ("b16", 1.5), ("a8", 0.07)]:
        waits.record(adapter, wait)
    report = waits.report()
    assert list(report) == ["a8", "b16"]
    a8 = report["a8"]
    assert (a8["requests"], a8["max_s"]) == (3, 0.3)
    assert a8["total_s"] == pytest.approx(0.37)
    assert a8["over_s"] == {"0.05": 2, "0.1": 1, "0.25": 1, "0.5": 0, "1": 0}
    assert report["b16"]["over_s"] == {f"{limit:g}": 1 for limit in OVER_S}


def test_a_negative_wait_is_refused():
    with pytest.raises(ValueError, match="negative"):
        AdmissionWaits().record("a8", -0.1)
