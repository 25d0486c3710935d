"""The end-to-end harness on the tiny CPU model, with real servers and both clients: two
plugin systems side by side (ours and unmerge-only), the no-LoRA floor and csgmv skipped
(they need a GPU), every measurement repeated twice; then the report merges the results
into markdown, plots and a README block. No timing is asserted. A second test: a server
that does not start is reported with its log tail and the call goes on."""

from __future__ import annotations

import json

from PIL import Image

from bench import run_e2e
from bench.e2e import report, runner, timeline_figures

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
SYSTEMS = ["nolora", "vlora", "unmerge_only"]
POINTS = ["sgl-mixed", "vision-skewed", "video-heads"]


def test_smoke_call_on_cpu_and_its_report(tmp_path):
    out = tmp_path / "results"
    result = run_e2e.main(["run", "--call", "cpu-smoke", "--systems", *SYSTEMS, "--points", *POINTS,
                           "--repeats", "2", "--out", str(out), "--tag", "smoke", "--log-dir", str(tmp_path / "logs")])
    saved = json.loads((out / "smoke.json").read_text())
    assert saved["schema"] == runner.SCHEMA and saved["measurements"] == result["measurements"]
    systems = result["systems"]
    assert systems["nolora"]["status"] == "skipped" and "CUDA GPU" in systems["nolora"]["reason"]
    for name in ("vlora", "unmerge_only"):
        assert systems[name]["status"] == "ok", (systems[name].get("reason"), systems[name].get("log_tail"))
        assert systems[name]["warmup"]["completed"] == systems[name]["warmup"]["requests"] > 0
    assert "--plugin vlora" in systems["vlora"]["server_command"]
    assert "--vlora-policy" not in systems["vlora"]["server_command"]  # ours runs the defaults

    # Provenance: real versions and the revision of the code.
    assert result["versions"]["sglang"] == "0.5.23" and result["versions"]["torch"]
    assert len(result["code"]["revision"]) == 40 and result["code"]["dirty"] in (True, False)

    done = [m for m in result["measurements"] if m["status"] == "ok"]
    assert [(m["system"], m["point"], m["repeat"]) for m in result["measurements"]] == [
        ("vlora", "sgl-mixed", 0), ("unmerge_only", "sgl-mixed", 0), ("vlora", "vision-skewed", 0),
        ("unmerge_only", "vision-skewed", 0), ("vlora", "video-heads", 0),
        ("unmerge_only", "sgl-mixed", 1), ("vlora", "sgl-mixed", 1), ("unmerge_only", "vision-skewed", 1),
        ("vlora", "vision-skewed", 1), ("vlora", "video-heads", 1)]
    assert len(done) == 10, [m.get("reason") for m in result["measurements"] if m["status"] != "ok"]
    for m in done:
        met = m["metrics"]
        assert met["completed"] == met["requests"] > 0 and met["errors"] == 0, m
        assert 0 < met["ttft_ms"]["mean"] <= met["e2e_ms"]["mean"] <= met["e2e_ms"]["p99"]
        assert m["orchestrator"]["iterations"], m  # /vlora/status answered and moved
        # the server's processes (HTTP, scheduler, detokenizer) worked on the host; no GPU here
        assert m["host"]["processes"] >= 3 and m["host"]["cpu_s"] > 0 and m["host"]["cpus"] == "all", m["host"]
        assert m["gpu_clocks"] is None
        probe = m["host_probe"]  # the fixed loop timed beside it; a sample in which it was preempted is not kept
        assert probe["samples"] >= 1 and ("loop_ms" in probe) == (probe["kept"] > 0) and probe["counters"], probe
        # every iteration ours timed during the measurement, in a file beside the server logs
        timeline = json.loads((tmp_path / "logs" / m["timeline"]["file"]).read_text())
        assert m["timeline"]["iterations"] == len(timeline["iterations"]) > 0 and m["timeline"]["complete"]
        figures = m["timeline"]["figures"]  # the saved file's figures, kept in the results
        assert figures == timeline_figures.figures(timeline)
        assert sum(figures["iterations"].values()) == len(timeline["iterations"])
        prefilled = timeline["columns"].index("prefill_tokens")
        assert sum(b["prefills"] for b in figures["prefill_ms_by_band"].values()) == sum(
            1 for row in timeline["iterations"] if row[prefilled]) > 0
        assert all(row[0] >= m["started_at_unix"] - 1 for row in timeline["iterations"])
        reasons, decisions = m["orchestrator"]["decision_reasons"], m["orchestrator"]["decisions"]
        assert sum(reasons.values()) == sum(decisions.values()) > 0, (reasons, decisions)
    sgl = [m for m in done if m["point"] == "sgl-mixed"]
    assert all("sglang.benchmark.serving" in m["client_command"] for m in sgl)
    assert all("--lora-name" in m["client_command"] and m["metrics"]["output_tokens"] == 16 * 4 for m in sgl)
    for m in (m for m in done if m["point"] == "vision-skewed"):
        groups = m["per_adapter"]  # the 80% adapter first, every request in one group
        assert sum(g["requests"] for g in groups.values()) == m["metrics"]["requests"], groups
        top, *others = groups.values()
        assert others and all(top["requests"] > g["requests"] for g in others), groups
        rows = m["per_request"]  # every request by its index, for the report's pairing with the floor
        assert rows["index"] == list(range(m["metrics"]["requests"]))
        assert sum(e is not None for e in rows["e2e_ms"]) == m["metrics"]["completed"]
    heads = [m for m in done if m["point"] == "video-heads"]
    vu = heads[0]["per_task"]["video_understanding"]
    assert vu["completed"] == vu["output_tokens"] > 0  # one token per head answer

    readme = tmp_path / "README.md"
    readme.write_text("# x\n<!-- e2e-headline:begin -->\nold\n<!-- e2e-headline:end -->\n")
    run_e2e.main(["report", str(out / "smoke.json"), "--out", str(tmp_path / "merged"), "--readme", str(readme)])
    merged_text = (tmp_path / "merged.json").read_text()
    assert "\n" not in merged_text  # compact: the tree travels to the GPU machine within a size limit
    assert "\n" not in (out / "smoke.json").read_text()  # a call's own file too
    merged = json.loads(merged_text)
    assert merged["runs"][0]["run_id"] == result["run_id"] and merged["provenance"]["git"]["commit"]
    # every float to 4 decimals, for the same size limit
    assert report.load([tmp_path / "merged.json"])[0]["measurements"][0]["metrics"] == report.rounded(done[0]["metrics"])
    md = (tmp_path / "merged.md").read_text()
    for text in ("## Every point", "retrieval, 56/112 px", "n=2",
                 "What the orchestrator did", "server nolora skipped", "tiny random-weight",
                 "| cpu-smoke | vision-skewed | 0 | vlora |"):
        assert text in md, text
    for suffix in ("e2e", "lora_cost"):
        png = tmp_path / f"merged_{suffix}.png"
        assert png.read_bytes()[:8] == PNG_MAGIC and min(Image.open(png).size) > 100
    table = readme.read_text()
    assert "old" not in table and "| point | vlora | unmerge_only |" in table
    assert "| random-ids 64 in / 4 out, Zipf 2 |" in table


def test_a_server_that_does_not_start_is_reported(tmp_path):
    out = tmp_path / "results"
    result = run_e2e.main(["run", "--call", "cpu-smoke", "--systems", "vlora", "--points", "vision-skewed",
                           "--repeats", "1", "--out", str(out), "--tag", "failed", "--log-dir", str(tmp_path / "logs"),
                           "--server-args", "--no-such-sglang-flag"])
    entry = result["systems"]["vlora"]
    assert entry["status"] == "failed" and "exited with code" in entry["reason"]
    assert "--no-such-sglang-flag" in entry["log_tail"]
    assert result["measurements"] == []
    md = report.markdown(report.load([out / "failed.json"]))
    assert "server vlora failed" in md
