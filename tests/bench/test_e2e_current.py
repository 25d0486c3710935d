"""The report's view of the plugin as it is now: the calls that served the same package code
(`run_e2e.py report --package-as REV`), and the bootstrap interval of the LoRA cost ratios."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from bench import provenance, run_e2e
from bench.e2e import report

needs_git = pytest.mark.skipif(provenance.full_revision("HEAD") is None, reason="needs this repository's git")


def _git(*args: str) -> str:
    return subprocess.run(["git", *args], cwd=provenance.REPO, capture_output=True, text=True, check=True).stdout.strip()


def _run(run_id: str, revision: str | None, dirty: bool | None = False, lora_ms: float = 900.0) -> dict:
    def m(system: str, repeat: int, ms: float) -> dict:
        return {"system": system, "point": "sgl-mixed", "repeat": repeat, "status": "ok",
                "metrics": {"e2e_ms": {"mean": ms, "p99": 2 * ms}, "ttft_ms": {"mean": ms / 10},
                            "tpot_ms": {"mean": 1.0}, "requests": 400, "completed": 400, "errors": 0}}

    return {"schema": report.SCHEMAS[0], "run_id": run_id, "call": {"name": "mixed-skewed", "scale": "gpu"},
            "date": "2026-11-28T01:00:00+00:00", "device": "NVIDIA H200", "platform": "Linux", "cpu_count": 16,
            "versions": {"sglang": "0.5.23", "torch": "2.11", "triton": "3.6"},
            "code": {"revision": revision, "dirty": dirty}, "points": {"sgl-mixed": {"label": "1024 in / 64 out"}},
            "systems": {}, "caveats": [], "_file": f"{run_id}.json",
            "measurements": [m("nolora", 0, 800.0), m("vlora", 0, lora_ms), m("csgmv", 0, 1200.0)]}


@needs_git
def test_same_package_keeps_the_calls_whose_plugin_code_equals_the_revisions():
    head = _git("rev-parse", "HEAD")
    root = _git("rev-list", "--max-parents=0", "HEAD").splitlines()[0]  # no plugin code like today's
    assert provenance.package_tree(head) != provenance.package_tree(root)
    runs = [_run("now", head), _run("first", root), _run("dirty", head, dirty=True),
            _run("unknown-dirtiness", head, dirty=None), _run("no-revision", None),
            _run("foreign", "f" * 40)]
    kept, selection = report.same_package(runs, ["HEAD"])
    assert [r["run_id"] for r in kept] == ["now"]
    assert selection == {"package_as": [head], "package_tree": [provenance.package_tree(head)], "calls": 1, "of": 6}
    assert [r["run_id"] for r in report.same_package(runs, [root])[0]] == ["first"]
    both, selection = report.same_package(runs, ["HEAD", root])
    assert [r["run_id"] for r in both] == ["now", "first"] and selection["package_as"] == [head, root]
    with pytest.raises(ValueError, match="not a revision"):
        report.same_package(runs, ["HEAD", "no-such-revision"])


@needs_git
def test_report_package_as_writes_only_those_calls_and_says_which(tmp_path: Path, capsys):
    head = _git("rev-parse", "HEAD")
    root = _git("rev-list", "--max-parents=0", "HEAD").splitlines()[0]
    paths = []
    for run in (_run("now", head, lora_ms=900.0), _run("old", root, lora_ms=1100.0)):
        paths.append(tmp_path / f"{run['run_id']}.json")
        paths[-1].write_text(json.dumps({k: v for k, v in run.items() if k != "_file"}))
    out = tmp_path / "current"
    run_e2e.main(["report", *map(str, paths), "--package-as", "HEAD", "--out", str(out)])
    merged = json.loads(out.with_suffix(".json").read_text())
    assert [r["run_id"] for r in merged["runs"]] == ["now"] and merged["selection"]["of"] == 2
    assert merged["sources"] == [paths[0].name]
    assert "1 of 2 calls ran the plugin" in capsys.readouterr().out
    run_e2e.main(["report", *map(str, paths), "--package-as", "HEAD", root, "--out", str(out)])
    merged = json.loads(out.with_suffix(".json").read_text())
    assert [r["run_id"] for r in merged["runs"]] == ["now", "old"] and merged["selection"]["package_as"] == [head, root]
    assert f"as at {head[:10]} or {root[:10]}" in capsys.readouterr().out
    with pytest.raises(SystemExit, match="none of the 1 calls"):
        run_e2e.main(["report", str(paths[1]), "--package-as", "HEAD", "--out", str(out)])
    with pytest.raises(SystemExit, match="not a revision"):
        run_e2e.main(["report", str(paths[0]), "--package-as", "nope", "--out", str(out)])
    with pytest.raises(SystemExit, match="bench/report.py"):
        run_e2e.main(["report", str(paths[0]), "--package-as", "HEAD", "--out", str(out),
                      "--readme", str(tmp_path / "README.md")])


def test_package_tree_needs_a_revision_git_knows():
    if shutil.which("git") is None:
        assert provenance.package_tree("HEAD") is None
    assert provenance.package_tree("f" * 40) is None


def _rounds(*figures: tuple[float, float]) -> list[report.PairedRound]:
    """Rounds of distinct (unknown) traces."""
    return [report.PairedRound(ours, peer) for ours, peer in figures]


def test_the_ratio_interval_resamples_whole_rounds_and_needs_three():
    assert report.ratio_interval(_rounds((10.0, 40.0), (20.0, 40.0))) is None
    same = _rounds(*[(10.0, 40.0)] * 5)
    assert report.ratio_interval(same) == (0.25, 0.25)
    spread = _rounds((0.0, 40.0), (10.0, 40.0), (20.0, 40.0), (30.0, 40.0), (40.0, 40.0))
    lo, hi = report.ratio_interval(spread)
    assert 0.0 < lo < 0.5 < hi < 1.0
    assert report.ratio_interval(spread) == (lo, hi)  # seeded
    # a peer that cost nothing over the floor in some resample: no interval
    assert report.ratio_interval(_rounds((5.0, 0.0), (5.0, -1.0), (5.0, 0.5))) is None


def _call(seed: int | None, costs: list[tuple[float, float]]) -> dict:
    """A call of ``len(costs)`` rounds: the floor at 800 ms, ours and csgmv at 800 + their costs."""
    run = _run(f"seed{seed}", "a" * 40)
    run["setup"] = {"seed": seed}
    run["measurements"] = [
        {**m, "repeat": repeat, "metrics": {**m["metrics"], "e2e_ms": {"mean": 800.0 + cost, "p99": 2000.0}}}
        for repeat, (ours, csgmv) in enumerate(costs)
        for m, cost in zip(run["measurements"], (0.0, ours, csgmv), strict=True)]
    return run


def test_rounds_of_one_request_trace_are_drawn_together():
    """Calls with seeds 80 and 81 share the trace of seed 81 (a round's client seed is the
    call's seed plus its index): four rounds of three traces, and the two rounds of trace 81
    are one unit of the bootstrap, summed."""
    runs = [_call(80, [(10.0, 100.0), (300.0, 400.0)]), _call(81, [(200.0, 400.0), (20.0, 100.0)])]
    rounds = report.paired_lora_costs(runs, "sgl-mixed", "vlora", "csgmv")
    assert rounds == [(10.0, 100.0, 80), (300.0, 400.0, 81), (200.0, 400.0, 81), (20.0, 100.0, 82)]
    assert report.trace_groups(rounds) == [(10.0, 100.0), (500.0, 800.0), (20.0, 100.0)]
    assert report.paired_ratio(rounds) == 0.53
    lo, hi = report.ratio_interval(rounds)
    assert 0.1 <= lo < 0.53 < hi <= 0.625  # 500 / 800 with trace 81 in every draw
    # drawn round by round instead, trace 81's two rounds could be drawn apart: a wider interval
    apart = report.ratio_interval(_rounds(*[(r.ours, r.peer) for r in rounds]))
    assert apart[1] > hi
    # two traces only: no interval, and the cell says how many rounds
    two = report.paired_lora_costs([_call(80, [(10.0, 100.0), (300.0, 400.0)]), _call(80, [(20.0, 100.0)])],
                                   "sgl-mixed", "vlora", "csgmv")
    assert report.ratio_interval(two) is None and report.ratio_cell(two) == "0.55 (3 rounds)"
    # a trace seed the runner recorded wins over the rule; a call without a seed has no traces
    recorded = _call(80, [(10.0, 100.0)])
    recorded["measurements"] = [{**m, "trace_seed": 7} for m in recorded["measurements"]]
    assert report.round_trace(recorded, recorded["measurements"][0]) == 7
    assert report.paired_lora_costs([_call(None, [(10.0, 100.0)])], "sgl-mixed", "vlora", "csgmv")[0].trace is None


def test_the_headline_shows_each_target_ratio_with_its_interval_over_paired_rounds():
    runs = [_run(f"r{i}", "a" * 40, lora_ms=ms) for i, ms in enumerate((880.0, 900.0, 920.0))]
    for run in runs:  # triton in every round, unmerge-only in none with the floor
        run["measurements"].append({**run["measurements"][2], "system": "triton",
                                    "metrics": {**run["measurements"][2]["metrics"],
                                                "e2e_ms": {"mean": 1000.0, "p99": 2000.0}}})
    pairs = report.paired_lora_costs(runs, "sgl-mixed", "vlora", "csgmv")
    assert pairs == [(80.0, 400.0, None), (100.0, 400.0, None), (120.0, 400.0, None)]  # traces unknown
    table = report.headline(runs, "test")
    header = next(line for line in table.splitlines() if line.startswith("| point"))
    assert header.endswith("| ours' LoRA cost / csgmv's | ours' LoRA cost / triton's | ours' mean E2E / csgmv's |")
    row = next(line for line in table.splitlines() if line.startswith("| 1024 in / 64 out"))
    lo, hi = report.ratio_interval(pairs)
    assert f"| 0.25 ({lo:.2f} to {hi:.2f}) | 0.50 (" in row and 0.2 <= lo < 0.25 < hi <= 0.3
    means = report.paired_means(runs, "sgl-mixed", "vlora", "csgmv")
    assert [(r.ours, r.peer) for r in means] == [(880.0, 1200.0), (900.0, 1200.0), (920.0, 1200.0)]
    lo, hi = report.ratio_interval(means)
    assert row.endswith(f"| 0.75 ({lo:.2f} to {hi:.2f}) |") and lo < 0.75 < hi


def test_a_headline_ratio_is_of_the_rounds_its_interval_resamples():
    """Ours in five rounds, triton in three of them: the ratio is over those three, not ours'
    mean over five against triton's over three (here 0.16 against 0.25)."""
    runs = [_run(f"r{i}", "a" * 40, lora_ms=ms) for i, ms in enumerate((810.0, 810.0, 900.0, 900.0, 900.0))]
    for run in runs[2:]:
        run["measurements"].append({**run["measurements"][2], "system": "triton",
                                    "metrics": {**run["measurements"][2]["metrics"],
                                                "e2e_ms": {"mean": 1200.0, "p99": 2400.0}}})
    pairs = report.paired_lora_costs(runs, "sgl-mixed", "vlora", "triton")
    assert [(r.ours, r.peer) for r in pairs] == [(100.0, 400.0)] * 3
    assert report.paired_ratio(pairs) == 0.25
    assert report.paired_ratio([]) is None and report.paired_ratio([report.PairedRound(5.0, -1.0)]) is None
    row = next(line for line in report.headline(runs, "test").splitlines() if line.startswith("| 1024 in / 64 out"))
    assert "| 0.25 (0.25 to 0.25) |" in row
    agg = report.aggregate(runs)  # the ratio of means the table showed before
    assert agg["sgl-mixed"]["vlora"]["lora_cost"]["values"] == [10.0, 10.0, 100.0, 100.0, 100.0]


def test_a_ratio_cell_says_how_many_rounds_it_rests_on_without_an_interval():
    assert report.ratio_cell([]) == "-"
    assert report.ratio_cell(_rounds((5.0, -1.0))) == "-"
    assert report.ratio_cell(_rounds((5.0, 50.0))) == "0.10 (1 round)"
    assert report.ratio_cell(_rounds((-65.0, 160.0), (73.0, 258.0))) == "0.02 (2 rounds)"
    assert report.ratio_cell(_rounds(*[(10.0, 40.0)] * 3)) == "0.25 (0.25 to 0.25)"
    # three rounds, but in some resample the peer cost nothing over the floor: no interval
    assert report.ratio_cell(_rounds((5.0, 10.0), (5.0, -1.0), (5.0, 1.0))) == "1.50 (3 rounds)"


def test_atmm_alone_against_csgmv_in_the_perf_table_is_over_paired_rounds():
    """The README's perf-e2e-lora-cost block: unmerge-only in two rounds, csgmv in four, dearer
    in the two without unmerge-only (by means the ratio would read 30 / 600 = 0.05)."""
    from bench import figures_perf

    runs = [_run(f"r{i}", "a" * 40) for i in range(4)]
    for run in runs[2:]:
        run["measurements"][2]["metrics"] = {**run["measurements"][2]["metrics"],
                                             "e2e_ms": {"mean": 1600.0, "p99": 3200.0}}
    for run, ms in zip(runs[:2], (820.0, 840.0), strict=True):
        run["measurements"].append({**run["measurements"][1], "system": "unmerge_only",
                                    "metrics": {**run["measurements"][1]["metrics"],
                                                "e2e_ms": {"mean": ms, "p99": 2 * ms}}})
    block = figures_perf.perf_e2e_lora_cost({"runs": runs})
    row = next(line for line in block.splitlines() if line.startswith("| 1024 in / 64 out"))
    assert row.endswith("| 0.07 (2 rounds) | - |")  # (20 + 40) / (400 + 400); no triton
    for run, ms in zip(runs, (900.0, 1000.0, 1400.0, 1400.0), strict=True):  # triton in every round
        run["measurements"].append({**run["measurements"][2], "system": "triton",
                                    "metrics": {**run["measurements"][2]["metrics"],
                                                "e2e_ms": {"mean": ms, "p99": 2 * ms}}})
    row = next(line for line in figures_perf.perf_e2e_lora_cost({"runs": runs}).splitlines()
               if line.startswith("| 1024 in / 64 out"))
    assert row.endswith("| 0.07 (2 rounds) | 0.20 (2 rounds) |")  # (20 + 40) / (100 + 200)


def test_the_headline_holds_atmm_alone_against_both_backends():
    """The in-server speed issue's targets: unmerge-only's LoRA cost under half of csgmv's and
    its mean E2E never above csgmv's or triton's, each over the rounds that ran both."""
    runs = [_run(f"r{i}", "a" * 40) for i in range(3)]
    for run, (alone, triton) in zip(runs, ((850.0, 1000.0), (860.0, 1100.0), (870.0, 840.0)), strict=True):
        for system, ms in (("unmerge_only", alone), ("triton", triton)):
            run["measurements"].append({**run["measurements"][2], "system": system,
                                        "metrics": {**run["measurements"][2]["metrics"],
                                                    "e2e_ms": {"mean": ms, "p99": 2 * ms}}})
    table = report.headline(runs, "test").splitlines()
    header = next(line for line in table if line.startswith("| point"))
    assert ("| unmerge-only's LoRA cost / csgmv's | unmerge-only's LoRA cost / triton's | ours' mean E2E / csgmv's "
            "| unmerge-only's mean E2E / csgmv's | unmerge-only's mean E2E / triton's |") in header
    cells = [c.strip() for c in next(line for line in table if line.startswith("| 1024 in / 64 out")).split("|")[1:-1]]
    ratios = dict(zip([c.strip() for c in header.split("|")[1:-1]], cells, strict=True))
    assert ratios["unmerge-only's LoRA cost / csgmv's"].startswith("0.15 (")  # 180 / 1200
    assert ratios["unmerge-only's LoRA cost / triton's"].startswith("0.33 (")  # 180 / 540
    assert ratios["unmerge-only's mean E2E / triton's"].startswith("0.88 (")  # 2580 / 2940, above in one round


def test_the_floors_twin_reads_the_harness_resolution_beside_the_targets():
    runs = [_run(f"r{i}", "a" * 40) for i in range(4)]
    for run, twin_ms in zip(runs, (780.0, 820.0, 800.0, 840.0), strict=True):  # the floor reads 800 in every round
        run["measurements"].append({**run["measurements"][0], "system": "nolora_twin",
                                    "metrics": {**run["measurements"][0]["metrics"],
                                                "e2e_ms": {"mean": twin_ms, "p99": 1600.0}}})
    assert [(r.ours, r.peer) for r in report.paired_means(runs, "sgl-mixed", "nolora_twin", "nolora")] == [
        (780.0, 800.0), (820.0, 800.0), (800.0, 800.0), (840.0, 800.0)]
    table = report.headline(runs, "test")
    header = next(line for line in table.splitlines() if line.startswith("| point"))
    assert "| nolora | nolora_twin | vlora | csgmv |" in header
    assert header.endswith("| ours' mean E2E / csgmv's | the floor's twin's mean E2E / the floor's |")
    row = next(line for line in table.splitlines() if line.startswith("| 1024 in / 64 out"))
    lo, hi = report.ratio_interval(report.paired_means(runs, "sgl-mixed", "nolora_twin", "nolora"))
    assert row.endswith(f"| 1.01 ({lo:.2f} to {hi:.2f}) |") and 0.97 <= lo <= 1.0 < 1.01 < hi <= 1.05
    # the twin is a system of its own, with a "LoRA cost" over the floor of its round: the A/A gap
    agg = report.aggregate(runs)
    assert agg["sgl-mixed"]["nolora_twin"]["lora_cost"]["values"] == [-20.0, 20.0, 0.0, 40.0]


def test_the_report_refuses_to_pool_two_devices(tmp_path: Path):
    paths = []
    for run_id, device in (("h200", "NVIDIA H200"), ("h100", "NVIDIA H100 80GB HBM3")):
        run = {k: v for k, v in _run(run_id, "a" * 40).items() if k != "_file"} | {"device": device}
        paths.append(tmp_path / f"{run_id}.json")
        paths[-1].write_text(json.dumps(run))
    with pytest.raises(ValueError, match="different devices"):
        report.load(paths)
    assert len(report.load(paths[:1])) == 1
    with pytest.raises(SystemExit, match="error: results of different devices"):
        run_e2e.main(["report", *map(str, paths), "--out", str(tmp_path / "out")])
    (tmp_path / "bad.json").write_text("{not json")
    with pytest.raises(SystemExit, match="error: "):
        run_e2e.main(["report", str(tmp_path / "bad.json"), "--out", str(tmp_path / "out")])


def test_the_trace_table_shows_each_trace_once_densest_first():
    """Three calls over four traces (seeds 80 and 81 share trace 81): one row a trace, its
    rounds' mean LoRA costs, and the trace the floor's client ran fastest first."""
    runs = [_call(80, [(10.0, 100.0), (300.0, 400.0)]), _call(81, [(200.0, 500.0), (20.0, 100.0)]),
            _call(90, [(5.0, 50.0)])]
    for run in runs:
        for m in run["measurements"]:
            m["metrics"]["duration_s"] = {80: 14.0, 81: 11.0, 82: 13.0, 90: 12.0}[run["setup"]["seed"] + m["repeat"]]
    lines = report.trace_table(runs)
    assert lines[:4] == ["sgl-mixed:", "",
                         "| client seed | rounds | floor's client run s | vlora LoRA cost ms (n) | csgmv LoRA cost ms (n) |",
                         "|---|---|---|---|---|"]
    assert lines[4:] == ["| 81 | 2 | 11.0 | +250 (2) | +450 (2) |", "| 90 | 1 | 12.0 | +5 (1) | +50 (1) |",
                         "| 82 | 1 | 13.0 | +20 (1) | +100 (1) |", "| 80 | 1 | 14.0 | +10 (1) | +100 (1) |"]
    assert report.trace_table(runs, min_traces=5) == []
    assert "## LoRA cost request trace by request trace" in report.markdown(runs)


def _with_popularity(run: dict, rounds: list[tuple[dict[str, int], dict[str, int]]]) -> dict:
    """Ours' measurements given /vlora/status admission counts per adapter and iterations per mode."""
    for m in run["measurements"]:
        if m["system"] == "vlora":
            requests, iterations = rounds[m["repeat"]]
            m["orchestrator"] = {"admission_waits": {"base": {"requests": 50},
                                                      **{a: {"requests": n} for a, n in requests.items()}},
                                 "iterations": iterations}
    return run


def test_the_popularity_table_groups_rounds_by_the_top_adapters_share():
    """Four rounds: top shares 0.45, 0.52, 0.53 and 0.70 of the adapter requests (base-model
    requests left out), each row with its rounds' mean costs, the ratio of their sums and the
    share of ours' iterations that ran merged or in mixture."""
    runs = [_with_popularity(_call(80, [(200.0, 400.0), (50.0, 400.0)]),
                             [({"a": 45, "b": 30, "c": 25}, {"unmerge": 90, "mixture": 10, "merge": 0}),
                              ({"a": 52, "b": 48}, {"unmerge": 60, "mixture": 30, "merge": 10})]),
            _with_popularity(_call(90, [(30.0, 200.0), (-10.0, 300.0)]),
                             [({"a": 47, "b": 53}, {"unmerge": 40, "mixture": 40, "merge": 20}),
                              ({"a": 70, "b": 30}, {"unmerge": 20, "mixture": 50, "merge": 30})])]
    lines = report.popularity_table(runs)
    assert lines[:4] == ["sgl-mixed:", "",
                         "| top adapter's share of the round's requests | rounds | vlora LoRA cost ms a round | csgmv "
                         "LoRA cost ms a round | vlora / csgmv (sums) | vlora's iterations merged or in mixture |",
                         "|---|---|---|---|---|---|"]
    assert lines[4:] == ["| < 0.50 | 1 | +200 | +400 | 0.50 | 10% |",
                         "| 0.50-0.55 | 2 | +40 | +300 | 0.13 | 50% |",
                         "| >= 0.60 | 1 | -10 | +300 | -0.03 | 80% |"]
    assert report.top_adapter_share({"admission_waits": {"base": {"requests": 5}}}) is None
    assert report.popularity_table(runs, peer="triton") == []
    assert "## LoRA cost by the top adapter's share of a round's requests" in report.markdown(runs)


def _with_itl(run: dict, itl: dict[str, list[tuple[float, float]]]) -> dict:
    """SGLang's client's median and 90th-percentile inter-token latency per system, round by round."""
    for m in run["measurements"]:
        median, p90 = itl[m["system"]][m["repeat"]]
        m["sglang_result"] = {"median_itl_ms": median, "p90_itl_ms": p90}
    return run


def test_the_interrupted_table_counts_rounds_whose_p90_gap_was_a_prefill():
    """Three rounds: ours tipped in one (p90 over 3x the median), csgmv in two, the floor in
    none; each LoRA system's mean cost in its tipped rounds and in the others."""
    run = _with_itl(_call(80, [(400.0, 500.0), (20.0, 300.0), (40.0, 100.0)]),
                    {"nolora": [(8.0, 12.0), (8.0, 20.0), (8.0, 11.0)],
                     "vlora": [(8.5, 70.0), (8.4, 14.0), (8.4, 25.2)],  # 25.2 = 3.0x: not over
                     "csgmv": [(9.5, 60.0), (9.4, 15.0), (9.5, 50.0)]})
    lines = report.interrupted_table([run])
    assert lines == ["| point | system | rounds with inter-token p90 over 3x its median | LoRA cost ms a round, "
                     "those rounds (n) | the other rounds (n) |", "|---|---|---|---|---|",
                     "| sgl-mixed | nolora | 0 of 3 | - | - |",
                     "| sgl-mixed | vlora | 1 of 3 | +400 (1) | +30 (2) |",
                     "| sgl-mixed | csgmv | 2 of 3 | +300 (2) | +300 (1) |"]
    assert "## Rounds whose decode was interrupted by prefills" in report.markdown([run])
    # our own client records no inter-token latencies; no round tipped: no section
    assert report.interrupted(_call(80, [(1.0, 2.0)])["measurements"][0]) is None
    calm = _with_itl(_call(80, [(1.0, 2.0)]), {s: [(8.0, 12.0)] for s in ("nolora", "vlora", "csgmv")})
    assert report.interrupted_table([calm]) == []


def test_the_target_margin_is_defined_where_the_ratio_interval_is_not():
    # the floor ran slow in one round, so csgmv "cost" -40 there and some resamples give it nothing
    rounds = _rounds((10.0, 100.0), (-50.0, -40.0), (15.0, 90.0), (5.0, 60.0))
    assert report.ratio_interval(rounds) is None
    mean, (lo, hi) = report.target_margin(rounds, 0.5)
    # per round: 10 - 50, -50 + 20, 15 - 45, 5 - 30
    assert mean == (-40.0 - 30.0 - 30.0 - 25.0) / 4
    assert -40.0 <= lo <= mean <= hi <= -25.0  # every round's margin is below zero: held
    assert report.target_margin(rounds, 0.5) == (mean, (lo, hi))  # seeded
    assert report.target_margin(_rounds((60.0, 100.0), (70.0, 100.0)), 0.5) == (15.0, None)  # two traces
    assert report.target_margin([], 0.5) is None


def test_the_target_table_says_what_each_interval_says_of_its_target():
    held = [_call(80 + 2 * i, [(10.0 + i, 100.0)]) for i in range(4)]
    missed = [_call(90 + 2 * i, [(80.0 + i, 100.0)]) for i in range(4)]
    undecided = [_call(100 + 2 * i, [(cost, 100.0)]) for i, cost in enumerate((0.0, 90.0, 10.0, 80.0))]
    for runs, verdict in ((held, "held"), (missed, "missed"), (undecided, "not decided")):
        lines = report.target_table(runs)
        assert len(lines) == 3 and lines[2].startswith("| sgl-mixed | vlora | csgmv | 0.3x | 4 | ")
        assert lines[2].endswith(f" | {verdict} |"), lines[2]
    one = report.target_table([_call(80, [(10.0, 100.0)])])[2]
    assert one.endswith("| 0.10 (1 round) | -20.0 | not decided (under 3 traces) |"), one
