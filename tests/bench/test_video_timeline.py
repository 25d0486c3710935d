"""bench/video_timeline.py: the stages read from SGLang's timestamps, and one CPU run on the
tiny model with a real server (each scenario once). No timing is asserted."""

from __future__ import annotations

import argparse
import json

import pytest

from bench import video_timeline


def test_stages_split_the_server_span_and_leave_the_rest_to_the_client():
    meta = {"request_received_ts": 100.0, "api_server_dispatch_finish_ts": 100.030,
            "forward_entry_time": 100.040, "prefill_finished_time": 100.140, "request_finished_ts": 100.200}
    st = video_timeline.stages(meta, client_s=0.205)
    assert st == pytest.approx({"preprocess": 30.0, "to_forward": 10.0, "prefill": 100.0, "decode": 60.0,
                                "client": 5.0, "total": 205.0})
    assert sum(st[k] for k in ("preprocess", "to_forward", "prefill", "decode", "client")) == pytest.approx(st["total"])
    assert video_timeline.stages({"request_received_ts": 1.0}, 0.1) is None  # server without --enable-metrics


def test_variants_need_a_name_and_flags():
    assert video_timeline.parse_variant("vit=--mm-attention-backend triton_attn") == (
        "vit", ["--mm-attention-backend", "triton_attn"])
    for bad in ("--mm-attention-backend", "=--x"):
        with pytest.raises(argparse.ArgumentTypeError, match="NAME='FLAGS'"):
            video_timeline.parse_variant(bad)


def test_one_cpu_round(tmp_path):
    result = video_timeline.main(["--out", str(tmp_path), "--scale", "cpu", "--rounds", "1"])
    entry = result["servers"]["vlora"]
    assert entry["status"] == "ran", entry.get("reason")
    assert "--enable-metrics" in entry["command"] and "--plugin vlora" in entry["command"]
    saved = json.loads((tmp_path / "video_timeline.json").read_text())
    assert saved["servers"]["vlora"]["scenarios"].keys() == set(video_timeline.SCENARIOS)
    scenarios = entry["scenarios"]
    for name, data in scenarios.items():
        (request,) = data["requests"]
        assert data["stages_ms"] is not None, name
        assert data["stages_ms"]["total"]["median"] > 0
        expects_head = name in ("understand_head", "chunk_head")
        assert request["head"] == expects_head, name
    prompt = entry["understanding_prompt_tokens"]
    text = scenarios["text_prefill"]["requests"][0]
    assert text["prompt_tokens"] == prompt and text["cached_tokens"] == 0  # random ids: nothing cached
    lm = scenarios["understand_lm"]["requests"][0]
    # fresh frames: only the shared system prompt can be cached
    assert lm["prompt_tokens"] == prompt and lm["cached_tokens"] < prompt // 2
    assert lm["output_tokens"] > scenarios["understand_prefill"]["requests"][0]["output_tokens"] == 1
    assert (tmp_path / "logs" / "vlora.log").exists()
