"""The timeline summary of an end-to-end call: ours' iterations read back from the saved
timelines, decode steps by mode and batch size, prefills by mode and prompt-token band."""

import json

import pytest

from bench import timeline_summary
from tests.bench.call_files import write_call

COLUMNS = ["at", "mode", "prefill_tokens", "decode_requests", "seconds"]


def _results(files: list[str]) -> dict:
    measurements = [{"system": "vlora", "point": "p", "repeat": i, "trace_seed": 7 + i,
                     "timeline": {"file": f, "iterations": 3, "complete": True}} for i, f in enumerate(files)]
    measurements.append({"system": "nolora", "point": "p", "repeat": 0, "timeline": None})
    return {"run_id": "r", "date": "2026-11-28T20:00:00+00:00", "systems": {"vlora": {}, "nolora": {}},
            "setup": {"extra_server_args": []}, "device": "GPU", "platform": "Linux", "cpu_count": 16,
            "versions": {"sglang": "0.5.23"}, "code": {"revision": "b" * 40, "dirty": False},
            "measurements": measurements}


def _timeline(rows: list[list]) -> str:
    return json.dumps({"since": 0.0, "complete": True, "capacity": 16384, "columns": COLUMNS, "iterations": rows})


def test_bands_hold_the_benchmark_prompts_in_one():
    assert timeline_summary.band(1) == "1-255"
    assert timeline_summary.band(1300) == timeline_summary.band(1568) == "1024-2047"
    assert timeline_summary.band(2048) == "2048-4095"
    assert timeline_summary.band(9000) == "8192+"


def test_modes_are_compared_at_the_same_batch_size(tmp_path):
    first = [[1.0, "merge", 0, 4, 0.0077], [1.1, "mixture", 0, 4, 0.0080], [1.2, "mixture", 0, 4, 0.0082],
             [1.3, "unmerge", 1391, 0, 0.047], [1.4, "merge", 1500, 0, 0.045], [1.5, "merge", 0, 8, 0.0081]]
    second = [[2.0, "mixture", 0, 4, 0.0090], [2.1, "unmerge", 1563, 0, 0.075], [2.2, "unmerge", 1400, 0, 0.051]]
    files = ["timelines/vlora_p_1.json", "timelines/vlora_p_2.json"]
    results_path, logs_path = write_call(tmp_path, _results(files), {
        files[0]: _timeline(first), files[1]: _timeline(second), "vlora.log": "a server log\n"})
    doc = timeline_summary.main([str(results_path), str(logs_path), "--out", str(tmp_path / "s.json")])
    call = doc["calls"][0]
    steps = {(r["mode"], r["decode_requests"]): r for r in call["decode_steps"]}
    assert steps["mixture", 4] == {"mode": "mixture", "decode_requests": 4, "steps": 3, "median_ms": 8.2}
    assert steps["merge", 4]["median_ms"] == 7.7 and steps["merge", 8]["steps"] == 1
    prefills = {(r["mode"], r["tokens"]): r for r in call["prefills"]}
    assert prefills["unmerge", "1024-2047"] == {"mode": "unmerge", "tokens": "1024-2047", "prefills": 3,
                                                "p25": 49.0, "median": 51.0, "p75": 63.0}
    assert [m["iterations"] for m in call["measurements"]] == [{"merge": 3, "mixture": 2, "unmerge": 1},
                                                               {"mixture": 1, "unmerge": 2}]
    assert call["measurements"][1]["trace_seed"] == 8 and call["measurements"][0]["busy_s"] == pytest.approx(0.124)
    first, second = call["measurements"]
    assert first["decode_step_median_ms"] == pytest.approx(8.05) and first["prefills_by_mode"] == {"merge": 1, "unmerge": 1}
    assert second["prefill_ms_by_band"] == {"1024-2047": {"prefills": 2, "p25": 57.0, "median": 63.0, "p75": 69.0}}
    # 75 and 51 ms: the 5-ms spans from 75 and from 50
    assert second["prefill_histogram_ms"] == {"1024-2047": {"50": 1, "75": 1}}
    assert first["prefill_histogram_ms"] == {"1024-2047": {"45": 2}}
    assert doc["pooled"]["decode_steps"] == call["decode_steps"]  # one call: pooled is the call
    assert json.loads((tmp_path / "s.json").read_text()) == doc


def test_merged_and_mixture_iterations_are_weighed_against_unmerged_ones_of_their_shape(tmp_path, capsys):
    rows = [[1.0, "unmerge", 0, 4, 0.0080], [1.1, "unmerge", 0, 4, 0.0082], [1.2, "mixture", 0, 4, 0.0085],
            [1.3, "mixture", 0, 4, 0.0086], [1.4, "merge", 0, 4, 0.0077], [1.5, "mixture", 0, 4, 0.0090],
            [1.6, "unmerge", 1400, 0, 0.050], [1.7, "mixture", 0, 6, 0.0088], [1.8, "mixture", 1450, 0, 0.052]]
    files = ["timelines/vlora_p_1.json"]
    results_path, logs_path = write_call(tmp_path, _results(files), {files[0]: _timeline(rows)})
    doc = timeline_summary.main([str(results_path), str(logs_path), "--out", str(tmp_path / "s.json")])
    measurement = doc["calls"][0]["measurements"][0]
    # medians at 4 decode requests: unmerge 8.1, mixture 8.6, merge 7.7; 1024-2047-token prefills: 50 and 52;
    # the mixture step at 6 requests has no unmerged step to stand against and is left out
    assert measurement["over_unmerged_ms"] == {"merge": {"iterations": 1, "ms": -0.4},
                                               "mixture": {"iterations": 4, "ms": 3.5}}
    assert measurement["mixture_runs"] == 3
    assert "| 0 | 1, -0.4 | 4, +3.5 | 3 |" in capsys.readouterr().out


def test_a_timeline_the_results_name_must_be_in_the_logs(tmp_path):
    results_path, logs_path = write_call(tmp_path, _results(["timelines/vlora_p_1.json"]), {"vlora.log": "x\n"})
    with pytest.raises(SystemExit, match="timelines/vlora_p_1.json"):
        timeline_summary.main([str(results_path), str(logs_path), "--out", str(tmp_path / "s.json")])


def test_a_results_file_without_measurements_is_refused(tmp_path):
    results = {k: v for k, v in _results([]).items() if k != "measurements"}
    results_path, logs_path = write_call(tmp_path, results, {"vlora.log": "x\n"})
    with pytest.raises(SystemExit, match="no measurements"):
        timeline_summary.main([str(results_path), str(logs_path), "--out", str(tmp_path / "s.json")])


def test_unreadable_inputs_are_named_in_the_error(tmp_path):
    results_path, logs_path = write_call(tmp_path, _results([]), {"vlora.log": "x\n"})
    out = ["--out", str(tmp_path / "s.json")]
    logs_path.write_bytes(b"not a tarball")
    with pytest.raises(SystemExit, match="could not be opened"):
        timeline_summary.main([str(results_path), str(logs_path), *out])
    results_path.write_text("{not json")
    with pytest.raises(SystemExit, match=f"{results_path.name}.*Expecting"):
        timeline_summary.main([str(results_path), str(logs_path), *out])
    with pytest.raises(SystemExit, match="missing.json"):
        timeline_summary.main([str(tmp_path / "missing.json"), str(logs_path), *out])
