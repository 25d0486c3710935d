"""bench/image_prefill.py: the excess over the floor per round, and one CPU run on the tiny
model with real servers (merged and unmerged, every scenario once). No timing is asserted."""

from __future__ import annotations

import json
from unittest.mock import ANY

import pytest

from bench import image_prefill


def _result(prefill_ms: float | None) -> dict:
    return {"stages": None if prefill_ms is None else {"prefill": prefill_ms}}


def test_excess_is_taken_round_by_round_and_skips_rounds_without_timestamps():
    raw = {"image448": {"nolora": [_result(100.0), _result(80.0), _result(None)],
                        "unmerge_only": [_result(110.0), _result(95.0), _result(500.0)],
                        "merge_only": [_result(None), _result(79.0), _result(90.0)]}}
    excess = image_prefill.excess_over_floor(raw, "nolora")
    assert excess["image448"]["unmerge_only"] == {"median": 12.5, "min": 10.0, "max": 15.0, "rounds": 2}
    assert excess["image448"]["merge_only"] == {"median": -1.0, "min": -1.0, "max": -1.0, "rounds": 1}
    assert "nolora" not in excess["image448"]


def test_round_payloads_are_fresh_per_round_and_the_same_for_every_server():
    a, b = image_prefill.round_payloads("cpu", 0, 0, 12), image_prefill.round_payloads("cpu", 1, 0, 12)
    assert a["image448"]["image_data"] != b["image448"]["image_data"]
    assert a == image_prefill.round_payloads("cpu", 0, 0, 12)
    assert len(a["text448"]["input_ids"]) == 12
    assert all(p["sampling_params"]["max_new_tokens"] == 1 and p["lora_path"] is None for p in a.values())


def test_rejects_a_system_named_twice(tmp_path):
    with pytest.raises(SystemExit):
        image_prefill.main(["--out", str(tmp_path), "--scale", "cpu", "--systems", "merge_only", "merge_only"])


def test_refuses_systems_that_need_a_gpu_on_a_machine_without_one(tmp_path, capsys):
    if image_prefill.provenance.gpu_info() is not None:
        pytest.skip("this machine has a GPU: the systems would start")
    with pytest.raises(SystemExit):
        image_prefill.main(["--out", str(tmp_path), "--scale", "cpu", "--systems", "nolora", "merge_only"])
    assert "nolora: needs a CUDA GPU" in capsys.readouterr().err
    assert not (tmp_path / "logs").exists()  # refused before any server started


def test_rejects_a_mixture_system_that_is_not_a_plugin_system_under_test(tmp_path, capsys):
    for systems, mixture in ((["unmerge_only"], "vlora_keep_popular"), (["nolora", "unmerge_only"], "nolora")):
        with pytest.raises(SystemExit):
            image_prefill.main(["--out", str(tmp_path), "--scale", "cpu", "--systems", *systems,
                                "--mixture-systems", mixture])
        assert f"--mixture-systems: {mixture} must be a plugin system among --systems" in capsys.readouterr().err


def test_refuses_a_negative_beside_decode(tmp_path, capsys):
    with pytest.raises(SystemExit):
        image_prefill.main(["--out", str(tmp_path), "--scale", "cpu", "--systems", "unmerge_only",
                            "--beside-decode", "-1"])
    assert "--beside-decode must be >= 0 and --beside-output-tokens >= 1" in capsys.readouterr().err


def test_one_cpu_round(tmp_path):
    systems = ("merge_only", "unmerge_only", "vlora_keep_popular")
    result = image_prefill.main(["--out", str(tmp_path), "--scale", "cpu", "--rounds", "1",
                                 "--systems", *systems, "--mixture-systems", "vlora_keep_popular",
                                 "--beside-decode", "2", "--beside-output-tokens", "256"])
    saved = json.loads((tmp_path / "image_prefill.json").read_text())
    assert saved["scenarios"].keys() == set(image_prefill.SCENARIOS)
    assert saved["mixture_systems"] == {"vlora_keep_popular": {"merged": result["adapter"], "requests_on": ANY,
                                                               "primed_by": image_prefill.PRIME}}
    for scenario, by_system in result["scenarios"].items():
        assert by_system.keys() == set(systems)
        for name, data in by_system.items():
            (request,) = data["requests"]
            assert data["stages_ms"]["prefill"]["median"] > 0, (scenario, name)
            assert request["output_tokens"] == 1
        # each system ran the request in the mode it is there to measure, and says so
        assert set(by_system["merge_only"]["iterations_by_mode"]) == {"merge"}, scenario
        assert set(by_system["unmerge_only"]["iterations_by_mode"]) == {"unmerge"}, scenario
        # beside two decoding top-adapter requests, which keep it merged: the second adapter's in mixture
        assert "mixture" in by_system["vlora_keep_popular"]["iterations_by_mode"], scenario
        assert "unmerge" not in by_system["vlora_keep_popular"]["iterations_by_mode"], scenario
    assert saved["beside_decode"]["requests"] == 2
    text = result["scenarios"]["text448"]["unmerge_only"]["requests"][0]
    assert text["prompt_tokens"] == result["text_prompt_tokens"] and text["cached_tokens"] == 0
    assert result["prefill_over_floor_ms"] == {}  # no floor among the systems
    assert "--vlora-policy merge-only" in result["servers"]["merge_only"]["command"]
    assert (tmp_path / "logs" / "unmerge_only.log").exists()


def test_prefill_host_splits_the_language_model_from_the_vision_encoder_and_skips_failed_profiles():
    def profiled(lm_us: float, vision_us: float, busy_us: float) -> dict:
        return {"busy_us_per_step": busy_us,
                "top_host_us_per_step": {image_prefill.LM_PREFILL: lm_us, image_prefill.VISION_ENCODER: vision_us}}

    host = image_prefill.prefill_host([profiled(60_000, 40_000, 16_000), {"failed": "RuntimeError: no trace"},
                                       profiled(90_000, 45_000, 16_500), profiled(70_000, 50_000, 16_200)])
    assert host["failed"] == 1
    assert [r["ratio"] for r in host["requests"]] == [1.5, 2.0, 1.4]
    assert host["median"] == {"language_model_ms": 70.0, "vision_encoder_ms": 45.0, "ratio": 1.5, "gpu_busy_ms": 16.2}
    assert image_prefill.prefill_host([{"failed": "x"}]) == {"requests": [], "median": {}, "failed": 1}


def test_refuses_no_profiled_requests(tmp_path, capsys):
    with pytest.raises(SystemExit):
        image_prefill.main(["--out", str(tmp_path), "--scale", "cpu", "--systems", "unmerge_only",
                            "--profile", "--profile-requests", "0"])
    assert "--profile-requests must be >= 1" in capsys.readouterr().err
