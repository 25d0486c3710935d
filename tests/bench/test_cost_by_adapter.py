"""bench/cost_by_adapter.py: per-request differences from the floor, split by the round's top
adapter, on requests rebuilt from the trace seed and checked against what the round sent."""

from __future__ import annotations

import collections
import dataclasses
import json

import pytest

from bench import cost_by_adapter
from bench.e2e import measure, plan

NAMES = ["a0", "a1", "a2"]
POINT = "vision-skewed"


def _run(seed: int, extra_ms: dict[str, float], per_adapter_override: dict | None = None) -> dict:
    """One round: the floor at 100 ms E2E / 50 ms TTFT per request, vlora at that plus
    ``extra_ms`` by adapter (E2E) and half of it (TTFT)."""
    spec = plan.points_of("cpu")[POINT]
    adapters = [r.adapter for r in measure.own_requests(spec, NAMES, seed, lora=True)]
    index = list(range(len(adapters)))

    def measurement(system: str, add: dict[str, float], tpot: float) -> dict:
        return {"system": system, "point": POINT, "repeat": 0, "trace_seed": seed,
                "per_request": {"index": index, "e2e_ms": [100.0 + add.get(a, 0.0) for a in adapters],
                                "ttft_ms": [50.0 + add.get(a, 0.0) / 2 for a in adapters]},
                "per_adapter": per_adapter_override or {a: {"requests": n} for a, n in collections.Counter(adapters).items()},
                "metrics": {"tpot_ms": {"mean": tpot, "p50": tpot - 1}}}

    return {"points": {POINT: dataclasses.asdict(spec)}, "setup": {"adapter_names": NAMES},
            "measurements": [measurement("nolora", {}, 10.0), measurement("vlora", extra_ms, 11.5)]}, adapters


def test_the_top_adapter_and_the_others_are_split_request_by_request(tmp_path):
    run, adapters = _run(1, {"a0": 10.0, "a1": 40.0, "a2": 40.0})
    top = collections.Counter(adapters).most_common(1)[0][0]
    assert top == "a0"  # the skewed point's top adapter is the first name
    path = tmp_path / "r.json"
    path.write_text(json.dumps(run))
    report = cost_by_adapter.main([str(path), "--point", POINT, "--out", str(tmp_path), "--tag", "t"])
    vlora = report["systems"]["vlora"]
    assert vlora["rounds"] == 1
    assert vlora["top"]["requests"] == adapters.count("a0")
    assert vlora["others"]["requests"] == len(adapters) - adapters.count("a0") > 0
    assert vlora["top"]["e2e_ms_over_floor"] == {"mean": 10.0, "median": 10.0}
    assert vlora["others"]["ttft_ms_over_floor"] == {"mean": 20.0, "median": 20.0}
    assert vlora["tpot_ms_over_floor"] == {"mean": 1.5, "p50": 1.5}
    assert json.loads((tmp_path / "t.json").read_text())["systems"] == report["systems"]


def test_a_trace_that_does_not_rebuild_as_sent_is_refused(tmp_path, capsys):
    run, _ = _run(5, {}, per_adapter_override={"a0": {"requests": 1}})
    path = tmp_path / "r.json"
    path.write_text(json.dumps(run))
    with pytest.raises(SystemExit):
        cost_by_adapter.main([str(path), "--point", POINT, "--out", str(tmp_path)])
    assert "trace 5 rebuilt as" in capsys.readouterr().err


def test_files_without_the_point_or_not_results_are_refused(tmp_path, capsys):
    bad = tmp_path / "bad.json"
    bad.write_text("{}")
    with pytest.raises(SystemExit):
        cost_by_adapter.main([str(bad)])
    assert "not an end-to-end results file" in capsys.readouterr().err
    run, _ = _run(5, {})
    ok = tmp_path / "r.json"
    ok.write_text(json.dumps(run))
    with pytest.raises(SystemExit):
        cost_by_adapter.main([str(ok), "--point", "video-lm"])
    assert "no results file has point 'video-lm'" in capsys.readouterr().err


def test_a_measurement_missing_what_is_read_is_refused(tmp_path, capsys):
    run, _ = _run(1, {})
    del run["measurements"][1]["metrics"]
    path = tmp_path / "r.json"
    path.write_text(json.dumps(run))
    with pytest.raises(SystemExit):
        cost_by_adapter.main([str(path), "--point", POINT, "--out", str(tmp_path)])
    assert "lacks what this reads" in capsys.readouterr().err
