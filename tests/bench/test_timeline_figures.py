"""The figures of one measurement's timeline that the results keep: iterations per mode, seconds
busy, the decode steps' median and the prefills by prompt-token band, against hand counts."""

import pytest

from bench.e2e import timeline_figures


def _timeline(rows: list[list], columns=("at", "mode", "prefill_tokens", "decode_requests", "seconds")) -> dict:
    return {"since": 0.0, "complete": True, "capacity": 16384, "columns": list(columns), "iterations": rows}


def test_figures_count_and_time_each_kind_of_iteration():
    timeline = _timeline([
        [1.0, "unmerge", 1391, 0, 0.050], [1.1, "unmerge", 1500, 0, 0.070], [1.2, "merge", 1600, 2, 0.060],
        [1.3, "unmerge", 0, 4, 0.008], [1.4, "mixture", 0, 4, 0.010], [1.5, "unmerge", 0, 8, 0.012],
        [1.6, "unmerge", 1, 0, 0.040], [1.7, "unmerge", 2100, 0, 0.090]])
    figures = timeline_figures.figures(timeline)
    assert figures["iterations"] == {"merge": 1, "mixture": 1, "unmerge": 6}
    assert figures["busy_s"] == pytest.approx(0.340)
    assert figures["decode_step_median_ms"] == pytest.approx(10.0)  # of 8, 10 and 12 ms
    assert list(figures["prefill_ms_by_band"]) == ["1-255", "1024-2047", "2048-4095"]
    assert figures["prefill_ms_by_band"]["1-255"] == {"prefills": 1, "p25": 40.0, "median": 40.0, "p75": 40.0}
    assert figures["prefill_ms_by_band"]["1024-2047"] == {"prefills": 3, "p25": 55.0, "median": 60.0, "p75": 65.0}
    assert figures["prefill_ms_by_band"]["2048-4095"]["prefills"] == 1


def test_columns_are_read_by_name_not_position():
    rows = [[0.020, 1300, "unmerge", 1.0, 0]]
    figures = timeline_figures.figures(_timeline(rows, ("seconds", "prefill_tokens", "mode", "at", "decode_requests")))
    assert figures["prefill_ms_by_band"] == {"1024-2047": {"prefills": 1, "p25": 20.0, "median": 20.0, "p75": 20.0}}
    assert figures["decode_step_median_ms"] is None


def test_an_empty_timeline_has_no_figures_to_lie_with():
    figures = timeline_figures.figures(_timeline([]))
    assert figures == {"iterations": {}, "busy_s": 0.0, "decode_step_median_ms": None, "prefill_ms_by_band": {}}


def test_a_timeline_without_a_needed_column_is_refused():
    with pytest.raises(ValueError):
        timeline_figures.figures(_timeline([[1.0, "unmerge", 0, 0.01]], ("at", "mode", "prefill_tokens", "seconds")))


def test_the_runner_keeps_a_timeline_it_cannot_summarise_and_says_why(tmp_path, monkeypatch):
    from bench.e2e import runner, servers

    good = _timeline([[1.0, "unmerge", 1300, 0, 0.05]])
    monkeypatch.setattr(servers, "vlora_timeline", lambda server, since: good)
    kept = runner.save_timeline(None, "unmerge_only", "sgl-prefill", 1000.0, tmp_path)
    assert kept["figures"] == timeline_figures.figures(good) and (tmp_path / kept["file"]).is_file()

    odd = {"since": 0.0, "complete": True, "iterations": [[1.0, "unmerge", 1300, 0, 0.05]]}  # no columns
    monkeypatch.setattr(servers, "vlora_timeline", lambda server, since: odd)
    kept = runner.save_timeline(None, "unmerge_only", "sgl-prefill", 1001.0, tmp_path)
    assert kept["figures"] == {"error": "KeyError: 'columns'"} and kept["iterations"] == 1
    assert (tmp_path / kept["file"]).is_file()  # the file is written all the same
