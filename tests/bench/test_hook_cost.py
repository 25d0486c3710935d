"""The orchestrator's Python work a decision (bench/hook_cost.py): a call's timelines replayed
through the cost model, the policy timed on states of N requests, beside the server's figure."""

import json

import pytest

from bench import hook_cost
from tests.bench.call_files import write_call

COLUMNS = ["at", "mode", "prefill_tokens", "decode_requests", "seconds"]
STEPS = [[1.0 + i / 100, "merge", 0, 1 + i % 3, 0.008] for i in range(40)] + [[2.0, "mixture", 600, 0, 0.09]]


def _results() -> dict:
    with_hooks = {"system": "vlora", "point": "p", "repeat": 0, "timeline": {"file": "timelines/a.json"},
                  "orchestrator": {"hook_calls": 400, "hook_seconds_total": 0.12}}
    without = {"system": "vlora", "point": "p", "repeat": 1, "timeline": {"file": "timelines/b.json"},
               "orchestrator": {"iterations": {"merge": 3}}}  # a server from before the hook times
    return {"run_id": "r", "date": "2026-12-01T00:00:00+00:00", "systems": {"vlora": {}}, "setup": {},
            "device": "GPU", "platform": "Linux", "cpu_count": 16, "versions": {}, "measurements": [with_hooks, without],
            "code": {"revision": "c" * 40, "dirty": False}}


def _timeline(rows: list[list]) -> str:
    return json.dumps({"since": 0.0, "complete": True, "capacity": 16384, "columns": COLUMNS, "iterations": rows})


def test_a_replay_feeds_every_iteration_and_reads_a_snapshot_after_each():
    seconds, iterations, rebuilt, costs = hook_cost.replay(json.loads(_timeline(STEPS)))
    assert iterations == len(STEPS) and seconds > 0
    assert 1 <= rebuilt < iterations  # refitted when due, not every iteration
    assert costs.snapshot().decode_step_s[hook_cost.Mode.MERGE] == pytest.approx(0.008, rel=0.01)


def test_each_measurement_with_hook_times_gets_a_row_beside_the_servers_figure(tmp_path, capsys):
    results_path, logs_path = write_call(tmp_path, _results(), {
        "timelines/a.json": _timeline(STEPS), "timelines/b.json": _timeline(STEPS[:3])})
    doc = hook_cost.main([str(results_path), str(logs_path), "--requests", "1", "4", "--repeats", "20",
                          "--out", str(tmp_path), "--tag", "h"])
    (row,) = doc["rows"]
    assert row["repeat"] == 0 and row["decisions"] == 400 and row["server_hook_us"] == 300.0
    assert row["decode_batch"] == {"median": 2.0, "max": 3} and row["iterations"] == len(STEPS)
    assert row["cost_model_us"] > 0
    assert set(doc["decision_us_by_requests"]) == {"1", "4"} and all(v > 0 for v in doc["decision_us_by_requests"].values())
    assert json.loads((tmp_path / "h.json").read_text()) == doc
    assert "| 400 | 300.0 | 2.0 (3) |" in capsys.readouterr().out


def test_calls_without_hook_times_or_odd_arguments_are_refused(tmp_path, capsys):
    results = _results()
    results["measurements"] = results["measurements"][1:]
    results_path, logs_path = write_call(tmp_path, results, {"timelines/b.json": _timeline(STEPS[:3])})
    with pytest.raises(SystemExit, match="no measurement with hook times"):
        hook_cost.main([str(results_path), str(logs_path), "--out", str(tmp_path)])
    with pytest.raises(SystemExit) as exit_info:
        hook_cost.main([str(results_path)])
    assert exit_info.value.code == 2 and "RESULTS.json LOGS.tar.gz pairs" in capsys.readouterr().err


def test_unreadable_or_malformed_inputs_are_named_in_the_error(tmp_path):
    results_path, logs_path = write_call(tmp_path, _results(), {"timelines/a.json": "{not json"})
    with pytest.raises(SystemExit, match="r.json with .*r_logs.tar.gz"):
        hook_cost.main([str(results_path), str(logs_path), "--out", str(tmp_path)])
    with pytest.raises(SystemExit, match="missing.json"):
        hook_cost.main([str(tmp_path / "missing.json"), str(logs_path), "--out", str(tmp_path)])
    no_columns = json.dumps({"iterations": [[1.0, "merge", 0, 1, 0.008]]})  # a timeline without its columns
    results_path, logs_path = write_call(tmp_path, _results(), {"timelines/a.json": no_columns,
                                                                "timelines/b.json": _timeline(STEPS[:3])})
    with pytest.raises(SystemExit, match="columns"):
        hook_cost.main([str(results_path), str(logs_path), "--out", str(tmp_path)])
