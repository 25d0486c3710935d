"""The end-to-end harness (bench/run_e2e.py) at its smallest CPU setting: one real server for
the plugin's ``vlora`` system, the S-LoRA-like peer skipped (no GPU), every sweep point run,
JSON / markdown / PNG written. No timing is asserted. A second test checks that a server
that does not start is reported as failed, with its log tail, and the run goes on."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from PIL import Image

from bench import run_e2e

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def check_files(report: dict, out, tag: str) -> None:
    for suffix in ("", "_rate", "_skew", "_adapters", "_workloads"):
        if suffix:
            png = out / f"{tag}{suffix}.png"
            assert png.read_bytes()[:8] == PNG_MAGIC, png
            assert min(Image.open(png).size) > 100
    assert json.loads((out / f"{tag}.json").read_text())["schema"] == run_e2e.SCHEMA
    assert sorted(map(str, report["files"])) == sorted(
        str(out / f"{tag}{s}") for s in (".json", ".md", "_rate.png", "_skew.png", "_adapters.png", "_workloads.png")
    )


def test_smoke_run_on_cpu(tmp_path):
    out = tmp_path / "results"
    report = run_e2e.main(["--smoke", "--systems", "vlora", "slora_like", "--out", str(out), "--tag", "smoke",
                           "--log-dir", str(tmp_path / "logs")])
    vlora, slora = report["systems"]["vlora"], report["systems"]["slora_like"]
    assert vlora["status"] == "ok", (vlora.get("reason"), vlora.get("log_tail"))
    assert slora["status"] == "skipped" and "CUDA" in slora["reason"] and not slora["points"]

    # Provenance.
    for key in ("date", "command", "device", "versions", "setup", "caveats", "points", "sweeps"):
        assert report[key], key
    assert {"torch", "sglang", "sglang_vlora"} <= set(report["versions"])
    assert "run_e2e.py" in report["command"] and "--smoke" in report["command"]
    assert "--vlora-policy vlora" in vlora["server_command"]

    # Every sweep point was measured on the system that runs, with completed requests.
    apps = {"retrieval": "visual_retrieval", "video": "video_analytics", "trace": "trace"}
    assert set(vlora["points"]) == set(report["points"])
    for pid, point in report["points"].items():
        res = vlora["points"][pid]
        m = res["metrics"]
        assert m["ok"] > 0 and m["output_tokens"] > 0, (pid, res["error_samples"])
        assert m["avg_token_latency_s"] > 0
        assert {"p50", "p95", "p99", "mean"} <= set(m["latency_s"])
        assert m["throughput"]["tokens_per_s"] > 0
        assert list(m["slo"]) == [apps[point["workload"]]]
        assert 0 <= m["slo"][apps[point["workload"]]]["attainment"] <= 1
        assert res["orchestrator"]["iterations"]  # /vlora/status answered
    for name, sweep in report["sweeps"].items():
        assert len(sweep["x"]) == len(sweep["points"]) >= 2, name
        assert set(sweep["points"]) <= set(report["points"])

    # Video analytics: task heads answer video understanding in one token.
    heads = report["video_heads"]
    assert heads["system"] == "vlora"
    vu = heads["task_heads"]["video_understanding"]
    assert vu["ok"] == vu["requests"] == vu["output_tokens"] > 0
    lm = heads["lm_head"]["video_understanding"]
    assert lm["ok"] > 0 and lm["output_tokens"] > lm["ok"]

    md = (out / "smoke.md").read_text()
    for text in ("## Rate sweep", "## Skew sweep", "## Adapters sweep", "## Workload sweep", "task heads",
                 "| vlora |", "slora_like", "What differs from a production install"):
        assert text in md, text
    check_files(report, out, "smoke")


@pytest.mark.parametrize("overlap", ["--no-overlap", "--overlap"])
def test_a_server_that_does_not_start_is_reported(tmp_path, monkeypatch, overlap):
    def failing_launch(system, scale, model, adapters, log_dir, extra_args):
        log_dir.mkdir(parents=True, exist_ok=True)
        log = log_dir / f"{system.name}.log"
        cmd = [sys.executable, "-c", f"print('launch_server: cannot start {system.name}'); raise SystemExit(3)"]
        with open(log, "w") as f:
            proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, start_new_session=True)
        return run_e2e.Server(system.name, "http://127.0.0.1:9", log, proc, cmd)

    monkeypatch.setattr(run_e2e, "launch", failing_launch)
    out = tmp_path / "results"
    systems = ["vlora", "dlora_like", "merge_only"]
    report = run_e2e.main(["--smoke", "--systems", *systems, "--out", str(out), "--tag", "failed",
                           "--log-dir", str(tmp_path / "logs"), overlap])
    for name in systems:  # a failure does not stop the run
        entry = report["systems"][name]
        assert entry["status"] == "failed" and "code 3" in entry["reason"]
        assert f"cannot start {name}" in entry["log_tail"]
        assert not entry["points"]
    assert report["video_heads"] is None
    md = (out / "failed.md").read_text()
    assert "dlora_like: server log tail" in md and "failed (server exited with code 3" in md
    check_files(report, out, "failed")


@pytest.mark.parametrize("scale", [run_e2e.CPU, run_e2e.SMOKE, run_e2e.GPU])
def test_plans_share_the_base_point(scale):
    points, sweeps = run_e2e.plan(scale, ["vlora"])
    ids = [p.id for p in points]
    assert len(ids) == len(set(ids))
    base = ids[0]
    for name in ("rate", "skew", "adapters", "workload"):
        assert base in sweeps[name]["points"], name
    assert max(scale.adapter_counts) <= scale.n_adapters
    heads = [p for p in points if p.heads]
    assert len(heads) == 1 and heads[0].only == ("vlora",)
