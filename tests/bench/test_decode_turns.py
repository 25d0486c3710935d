"""bench/decode_turns.py: the TPOT of a request, the excess over the floor round by round, bad
arguments refused, and one CPU round on the tiny model with real plugin servers. No timing is
asserted."""

from __future__ import annotations

import json

import pytest

from bench import decode_turns


def test_tpot_is_the_decode_stage_over_the_tokens_after_the_first():
    assert decode_turns.tpot_ms({"stages": {"decode": 63.0}, "output_tokens": 64}) == 1.0
    assert decode_turns.tpot_ms({"stages": None, "output_tokens": 64}) is None
    assert decode_turns.tpot_ms({"stages": {"decode": 5.0}, "output_tokens": 1}) is None


def test_the_mix_scenario_puts_one_request_on_the_second_adapter():
    assert decode_turns.adapters_for("top", 3, "a", "b") == ["a", "a", "a"]
    assert decode_turns.adapters_for("mix", 3, "a", "b") == ["b", "a", "a"]
    with pytest.raises(ValueError, match="unknown scenario"):
        decode_turns.adapters_for("all", 3, "a", "b")


def test_excess_is_taken_round_by_round_and_skips_rounds_without_a_tpot():
    raw = {"top": {"nolora": [{"tpot_ms": 8.0}, {"tpot_ms": 9.0}, {"tpot_ms": None}],
                   "vlora": [{"tpot_ms": 8.5}, {"tpot_ms": 10.0}, {"tpot_ms": 12.0}]}}
    excess = decode_turns.excess_over_floor(raw, "nolora")
    assert excess == {"top": {"vlora": {"median": 0.75, "min": 0.5, "max": 1.0, "rounds": 2}}}


def test_round_payloads_are_fresh_per_round_and_the_same_for_every_server():
    a, b = decode_turns.round_payloads(0, 0, 3, 12, 8), decode_turns.round_payloads(1, 0, 3, 12, 8)
    assert a != b and a == decode_turns.round_payloads(0, 0, 3, 12, 8)
    assert len(a) == 3 and all(len(p["input_ids"]) == 12 and p["lora_path"] is None for p in a)
    assert all(p["sampling_params"]["max_new_tokens"] == 8 and p["sampling_params"]["ignore_eos"] for p in a)


@pytest.mark.parametrize(("flags", "message"), [
    (["--batch", "1"], "--batch must be >= 2"),
    (["--output-tokens", "1"], "--output-tokens must be >= 2"),
    (["--rounds", "0"], "--rounds must be >= 1"),
    (["--cpus-per-server", "-1"], "--cpus-per-server must be >= 0"),
    (["--systems", "vlora", "vlora"], "--systems names a system twice"),
    (["--cpus-per-server", "4096"], "need"),
])
def test_refuses_bad_arguments_before_any_server_starts(tmp_path, capsys, flags, message):
    with pytest.raises(SystemExit):
        decode_turns.main(["--out", str(tmp_path / "out"), "--scale", "cpu", "--systems", "vlora", *flags])
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_one_cpu_round(tmp_path):
    systems = ("vlora", "unmerge_only", "merge_only")
    result = decode_turns.main(["--out", str(tmp_path), "--scale", "cpu", "--rounds", "1", "--batch", "2",
                                "--output-tokens", "6", "--prompt-tokens", "16", "--systems", *systems])
    saved = json.loads((tmp_path / "decode_turns.json").read_text())
    assert saved["summary"].keys() == set(decode_turns.SCENARIOS)
    for scenario, by_system in result["scenarios"].items():
        assert by_system.keys() == set(systems)
        for name, (measured,) in by_system.items():
            assert [r["output_tokens"] for r in measured["requests"]] == [6, 6], (scenario, name)
            assert measured["tpot_ms"] > 0
            assert measured["decisions"] > 0 and measured["hook_us_per_decision"] > 0
    # each system ran the iterations it is there to measure, and says so
    assert set(result["scenarios"]["top"]["vlora"][0]["ran_in"]) == {"merge"}
    assert set(result["scenarios"]["top"]["unmerge_only"][0]["ran_in"]) == {"unmerge"}
    assert set(result["scenarios"]["mix"]["merge_only"][0]["ran_in"]) == {"merge"}


def test_replot_prints_and_plots_a_results_file_and_refuses_another(tmp_path, capsys):
    results = {"batch": 4, "rounds": 2, "device": "a GPU", "servers": {"nolora": {}, "vlora": {}},
               "summary": {"top": {"nolora": {"tpot_ms": {"median": 7.0}},
                                   "vlora": {"tpot_ms": {"median": 7.5}, "iterations_by_mode": {"merge": 9},
                                             "hook_us_per_decision": {"median": 300.0}}}},
               "tpot_over_floor_ms": {"top": {"vlora": {"median": 0.5, "min": 0.25, "max": 0.75, "rounds": 2}}}}
    path = tmp_path / "decode_turns.json"
    path.write_text(json.dumps(results))
    decode_turns.main(["--replot", str(path)])
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("top      vlora"))
    assert "+0.500" in row and "300.0" in row and "{'merge': 9}" in row
    if decode_turns.pyplot() is not None:
        assert path.with_suffix(".png").stat().st_size > 0
    bad = tmp_path / "e2e.json"
    bad.write_text(json.dumps({"measurements": []}))
    with pytest.raises(SystemExit, match="not a decode_turns results file"):
        decode_turns.main(["--replot", str(bad)])
    bad.write_text("{")
    with pytest.raises(SystemExit, match="not a decode_turns results file"):
        decode_turns.main(["--replot", str(bad)])


def test_running_needs_an_out_folder(capsys):
    with pytest.raises(SystemExit):
        decode_turns.main(["--scale", "cpu", "--systems", "vlora"])
    assert "--out is required to run" in capsys.readouterr().err
