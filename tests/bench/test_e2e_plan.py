"""The end-to-end benchmark's pure parts: plan, status reading, aggregation.
No server; milliseconds."""

from __future__ import annotations

import json
import statistics

import pytest

from bench import figures_e2e
from bench import report as bench_report
from bench.e2e import plan, report, servers


def test_gpu_points_meet_the_size_rule_and_issue_workloads():
    for point in plan.GPU_POINTS.values():  # at least 60 s of arrivals or 400 requests
        assert point.requests >= 400 or point.arrivals_s >= 60, point.id
    shapes = {(p.input_len, p.output_len) for p in plan.GPU_POINTS.values() if p.client == "sglang"}
    assert {(1024, 1), (16, 64), (1024, 64)} <= shapes
    assert all(p.rate == 8.0 for p in plan.GPU_POINTS.values() if p.client == "sglang")
    vision = [p for p in plan.GPU_POINTS.values() if p.client != "sglang"]
    assert all(min(p.image_sizes) >= 448 and p.frame_size >= 448 for p in vision)
    assert {p.top_share for p in vision if p.client == "retrieval"} == {0.8, 0.25}
    assert plan.GPU_POINTS["video-heads"].only == ("vlora",)


def test_every_call_names_known_systems_and_points():
    for call in plan.CALLS.values():
        assert set(call.systems) <= set(plan.SYSTEMS)
        assert set(call.points) <= set(plan.points_of(call.scale))
    covered = {s for name in plan.FULL for s in plan.CALLS[name].systems}
    # the full benchmark runs every system but ten variants, run by name (--systems): two of the
    # admission rules, vlora_plurality (our defaults spelled out) and vlora_admit_all, the merged
    # adapter kept while popular (vlora_keep_popular, with share 0.4, and over 64 arrivals), and ATMM alone
    # with the LoRA in its GEMM, with every eager shrink as its own kernel, with the shrink inside
    # the base GEMM up to 1536 or 2048 tokens or without the one kernel of small eager batches; and
    # the floor's twin, which only the resolution call runs
    assert covered == set(plan.SYSTEMS) - {"nolora_twin", "vlora_plurality", "vlora_admit_all", "vlora_keep_popular",
                                           "vlora_popular_40", "vlora_popular_64_40",
                                           "unmerge_only_lora_gemm",
                                           "unmerge_only_separate_shrink", "unmerge_only_in_gemm_1536",
                                           "unmerge_only_in_gemm_2048", "unmerge_only_no_small_gemm"}
    assert plan.SYSTEMS["unmerge_only_lora_gemm"].flags() == [
        "--plugin", "vlora", "--vlora-policy", "unmerge-only", "--vlora-lora-gemm", "on"]
    assert plan.SYSTEMS["unmerge_only_separate_shrink"].flags() == [
        "--plugin", "vlora", "--vlora-policy", "unmerge-only", "--vlora-eager-in-gemm-max-tokens", "0"]
    assert plan.SYSTEMS["unmerge_only_in_gemm_1536"].flags() == [
        "--plugin", "vlora", "--vlora-policy", "unmerge-only", "--vlora-eager-in-gemm-max-tokens", "1536"]
    assert plan.SYSTEMS["unmerge_only_in_gemm_2048"].flags()[-2:] == ["--vlora-eager-in-gemm-max-tokens", "2048"]
    assert plan.SYSTEMS["unmerge_only_no_small_gemm"].flags() == [
        "--plugin", "vlora", "--vlora-policy", "unmerge-only", "--vlora-eager-small-gemm-max-tokens", "0"]
    assert plan.SYSTEMS["vlora"].flags() == ["--plugin", "vlora"]  # ours: the defaults, nothing tuned
    assert not plan.SYSTEMS["nolora"].lora and plan.SYSTEMS["nolora"].flags() == []
    assert plan.SYSTEMS["vlora_plurality"].flags() == [
        "--plugin", "vlora", "--vlora-admission", "all", "--vlora-keep-merged", "plurality"]


def test_order_rotates_systems_between_repeats():
    call = plan.get_call("mixed-skewed", repeats=3)
    order = plan.order(call, ["nolora", "vlora", "csgmv"])
    assert [m.system for m in order] == ["nolora", "vlora", "csgmv", "vlora", "csgmv", "nolora",
                                         "csgmv", "nolora", "vlora"]
    assert [m.repeat for m in order] == [0] * 3 + [1] * 3 + [2] * 3
    video = plan.order(plan.get_call("video"), ["vlora", "csgmv"])
    assert [(m.system, m.point) for m in video if m.point == "video-heads"] == [("vlora", "video-heads")] * 2
    assert plan.order(call, ["csgmv"]) == [plan.Measurement("csgmv", "sgl-mixed", r) for r in range(3)]


def test_the_block_call_runs_the_headline_workload_in_six_rotating_rounds_of_100_requests():
    blocks, full = plan.get_call("mixed-skewed-blocks"), plan.get_call("mixed-skewed")
    assert (blocks.systems, blocks.points) == (full.systems, full.points)
    point = plan.points_of("gpu")["sgl-mixed"]
    assert plan.scaled(point, blocks.scale_requests).requests == 100 and blocks.repeats == 6
    order = plan.order(blocks, list(blocks.systems))
    assert [m.repeat for m in order] == [r for r in range(6) for _ in range(3)]
    firsts = [order[3 * r].system for r in range(6)]
    assert {s: firsts.count(s) for s in blocks.systems} == {"nolora": 2, "vlora": 2, "csgmv": 2}


def test_the_twin_call_runs_the_block_call_with_a_second_identical_floor():
    twin, blocks = plan.get_call("mixed-skewed-blocks-twin"), plan.get_call("mixed-skewed-blocks")
    assert (twin.points, twin.scale_requests) == (blocks.points, blocks.scale_requests) and twin.repeats == 5
    assert twin.systems == ("nolora", "nolora_twin", "vlora", "csgmv")
    floor, other = plan.SYSTEMS["nolora"], plan.SYSTEMS["nolora_twin"]
    assert (other.lora, other.plugin, other.flags()) == (floor.lora, floor.plugin, floor.flags())
    firsts = [m.system for m in plan.order(twin, list(twin.systems))[::4]]
    assert set(firsts) == set(twin.systems)  # each system goes first in some round


def test_the_vision_block_call_runs_vision_skewed_in_six_rotating_rounds_of_38_requests():
    blocks, full = plan.get_call("vision-skewed-blocks"), plan.get_call("vision-skewed")
    assert (blocks.systems, blocks.points, blocks.server_args) == (full.systems, full.points, full.server_args)
    point = plan.points_of("gpu")["vision-skewed"]
    assert plan.scaled(point, blocks.scale_requests).requests == 38 and blocks.repeats == 6
    firsts = [m.system for m in plan.order(blocks, list(blocks.systems))[::3]]
    assert {s: firsts.count(s) for s in blocks.systems} == {"nolora": 2, "vlora": 2, "csgmv": 2}


def test_vision_calls_run_triton_vision_attention_and_gpu_feature_transport_unless_the_user_says_otherwise():
    for name in ("vision-skewed", "vision-skewed-blocks", "vision-uniform", "video", "short"):
        call = plan.get_call(name, systems=["vlora"])  # overrides keep the call's flags
        assert call.server_args == plan.VISION_FLAGS, name
    for name in ("mixed-skewed", "uniform", "prefill", "decode", "cpu-smoke"):
        assert plan.get_call(name).server_args == (), name
    video = plan.get_call("video")
    user = ["--cuda-graph-backend-prefill", "breakable", "--cuda-graph-max-bs-prefill", "2048"]
    assert plan.server_args(video, user) == [*user, "--mm-attention-backend", "triton_attn",
                                             "--mm-feature-transport", "cuda_ipc"]
    assert plan.server_args(video, ["--mm-attention-backend", "sdpa"]) == [
        "--mm-attention-backend", "sdpa", "--mm-feature-transport", "cuda_ipc"]
    assert plan.server_args(video, ["--mm-attention-backend=sdpa", "--mm-feature-transport=cpu"]) == [
        "--mm-attention-backend=sdpa", "--mm-feature-transport=cpu"]
    assert plan.server_args(plan.get_call("decode"), user) == user


def test_flag_value_reads_both_forms_and_the_last_one_wins():
    flags = ["--mm-feature-transport", "cpu", "--enable-metrics", "--mm-feature-transport=cuda_ipc"]
    assert plan.flag_value(flags, "--mm-feature-transport") == "cuda_ipc"
    assert plan.flag_value(flags[:3], "--mm-feature-transport") == "cpu"
    assert plan.flag_value(flags, "--enable-metrics") is None
    assert plan.flag_value(flags, "--mm-attention-backend") is None


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"name": "nope"}, "--call 'nope' is not a call"),
    ({"name": "video", "systems": ["punica"]}, "--systems: 'punica'"),
    ({"name": "video", "points": ["vision-tiny"]}, "--points: 'vision-tiny' is not a gpu point"),
    ({"name": "video", "repeats": 0}, "--repeats must be >= 1"),
])
def test_bad_call_overrides_name_the_flag(kwargs, match):
    with pytest.raises(ValueError, match=match):
        plan.get_call(**kwargs)


def test_bad_points_are_refused():
    with pytest.raises(ValueError, match="client must be"):
        plan.Point("x", "http", "x", rate=1, requests=1)
    with pytest.raises(ValueError, match="input_len and output_len"):
        plan.Point("x", "sglang", "x", rate=1, requests=1)


def test_status_delta_reads_fields_it_does_not_know():
    before = {"orchestrator": {"iterations": {"merge": 2, "unmerge": 5}, "switches": 1, "policy": "vlora",
                               "decision_reasons": {"merge": 1, "below_max_batch": 4, "starving": 0},
                               "max_batch": 32}, "switch_count": 3}
    after = {"orchestrator": {"iterations": {"merge": 7, "unmerge": 5, "mixture": 4}, "switches": 4,
                              "decisions": {"merge": 3}, "policy": "vlora", "max_batch": 48, "theta_s": 2.5,
                              "keep_merged": "plurality",
                              "decision_reasons": {"merge": 4, "below_max_batch": 9, "starving": 0},
                              "new_field": [1, 2]}, "switch_count": 6}
    summary = servers.orchestrator_summary(before, after)
    assert summary["iterations"] == {"merge": 5, "unmerge": 0, "mixture": 4}
    assert summary["decisions"] == {"merge": 3} and summary["switches"] == 3 and summary["mode_switches"] == 3
    assert summary["decision_reasons"] == {"merge": 3, "below_max_batch": 5, "starving": 0}
    rows = report.orchestrator_table([{"call": {"name": "c"}, "measurements": [
        {"status": "ok", "system": "vlora", "point": "p", "repeat": 0, "orchestrator": summary}]}])
    assert "| merge 3 | merge 3, below_max_batch 5 | 3 |" in rows[-1], rows[-1]  # the zeros left out
    # as after, not a delta
    assert summary["config"] == {
        "policy": "vlora", "keep_merged": "plurality", "theta_s": 2.5, "max_batch": 48}
    assert servers.orchestrator_summary(before, None) is None
    flat = servers.orchestrator_summary(None, {"iterations": {"unmerge": 2}, "switches": 0})
    assert flat["iterations"] == {"unmerge": 2} and flat["switches"] == 0


def test_the_orchestrators_host_time_is_a_difference_per_measurement():
    """The scheduler hooks' host time and the iterations they decided for, over the
    measurement only; the table shows ms and us a decision."""
    before = {"orchestrator": {"hook_calls": 100, "hook_seconds_total": 0.05}}
    after = {"orchestrator": {"hook_calls": 600, "hook_seconds_total": 0.2}}
    summary = servers.orchestrator_summary(before, after)
    assert summary["hook_calls"] == 500 and summary["hook_seconds_total"] == pytest.approx(0.15)
    rows = report.orchestrator_table([{"call": {"name": "c"}, "measurements": [
        {"status": "ok", "system": "vlora", "point": "p", "repeat": 0, "orchestrator": summary}]}])
    assert rows[-1].endswith("| 150.0 (300) |"), rows[-1]
    idle = servers.orchestrator_summary(after, after)
    rows = report.orchestrator_table([{"call": {"name": "c"}, "measurements": [
        {"status": "ok", "system": "vlora", "point": "p", "repeat": 0, "orchestrator": idle}]}])
    assert rows[-1].endswith("| 0.0 |"), rows[-1]


def test_the_hooks_parts_are_differences_per_measurement_and_shown_a_decision():
    """``hook_seconds_by_part`` comes through as each part's difference over the measurement;
    the table gives each in us a decision after the total."""
    parts = ("timings", "requests", "decide", "apply", "batch")
    before = {"orchestrator": {"hook_calls": 100, "hook_seconds_total": 0.05,
                               "hook_seconds_by_part": dict.fromkeys(parts, 0.01)}}
    after = {"orchestrator": {"hook_calls": 600, "hook_seconds_total": 0.2, "hook_seconds_by_part": {
        "timings": 0.02, "requests": 0.015, "decide": 0.07, "apply": 0.0125, "batch": 0.035}}}
    summary = servers.orchestrator_summary(before, after)
    assert summary["hook_seconds_by_part"] == pytest.approx(
        {"timings": 0.01, "requests": 0.005, "decide": 0.06, "apply": 0.0025, "batch": 0.025})
    rows = report.orchestrator_table([{"call": {"name": "c"}, "measurements": [
        {"status": "ok", "system": "vlora", "point": "p", "repeat": 0, "orchestrator": summary}]}])
    assert rows[-1].endswith("| 150.0 (300: timings 20, requests 10, decide 120, apply 5, batch 50) |"), rows[-1]


def test_summary_takes_admission_waits_batches_without_work_compiles_and_allocator_as_differences():
    waits = {"requests": 10, "total_s": 2.0, "max_s": 0.9, "over_s": {"0.25": 3, "1": 0}}
    before = {"orchestrator": {"admission_waits": {"a8": waits}}, "batches_without_lora_work": {"graph": 79},
              "kernel_compiles": {"count": 40, "seconds": 30.0, "by_kernel": {"_shrink_kernel": 20}},
              "cuda_allocator": {"num_alloc_retries": 3, "num_device_alloc": 100, "num_device_free": 10}}
    after = {"orchestrator": {"admission_waits": {
        "a8": {"requests": 25, "total_s": 2.5, "max_s": 0.9, "over_s": {"0.25": 3, "1": 0}},
        "b16": {"requests": 4, "total_s": 1.2, "max_s": 0.6, "over_s": {"0.25": 2, "1": 0}}}},
        "batches_without_lora_work": {"graph": 1575, "eager": 7},
        "kernel_compiles": {"count": 42, "seconds": 31.5, "by_kernel": {"_shrink_kernel": 22}},
        "cuda_allocator": {"num_alloc_retries": 3, "num_device_alloc": 160, "num_device_free": 70}}
    summary = servers.orchestrator_summary(before, after)
    assert summary["cuda_allocator"] == {"num_alloc_retries": 0, "num_device_alloc": 60, "num_device_free": 60}
    assert summary["admission_waits"]["a8"] == {"requests": 15, "total_s": 0.5, "over_s": {"0.25": 0, "1": 0}}
    assert summary["admission_waits"]["b16"] == {"requests": 4, "total_s": 1.2, "over_s": {"0.25": 2, "1": 0}}
    assert summary["batches_without_lora_work"] == {"graph": 1496, "eager": 7}
    rows = report.orchestrator_table([{"call": {"name": "c"}, "measurements": [
        {"status": "ok", "system": "vlora", "point": "p", "repeat": 0, "orchestrator": summary}]}])
    assert summary["kernel_compiles"] == {"count": 2, "seconds": 1.5, "by_kernel": {"_shrink_kernel": 2}}
    assert rows[-1].endswith("| graph 1496, eager 7 | a8 0/15, b16 2/4 | 2 (1.50 s) | - | - |"), rows[-1]
    # a server that names the variants: those compiled during the measurement are listed
    before["kernel_compiles"]["by_variant"] = {"_shrink_kernel BLOCK_M=16 w4 s2": 20}
    after["kernel_compiles"]["by_variant"] = {"_shrink_kernel BLOCK_M=16 w4 s2": 20,
                                              "_shrink_kernel BLOCK_M=64 w4 s3": 2}
    summary = servers.orchestrator_summary(before, after)
    rows = report.orchestrator_table([{"call": {"name": "c"}, "measurements": [
        {"status": "ok", "system": "vlora", "point": "p", "repeat": 0, "orchestrator": summary}]}])
    assert rows[-1].endswith("| 2 (1.50 s): _shrink_kernel BLOCK_M=64 w4 s3 x2 | - | - |"), rows[-1]


def test_summary_lists_the_stalls_of_the_measurement_only():
    """Iterations over twice their fit: the counters as differences, and of the listed ones
    those the reading before the measurement did not list; the table names the longest."""
    old = [1000.5, "merge", 1500, 0, 0.3, 0.05]
    before = {"orchestrator": {"cost_model": {"slow_iterations": {"count": 1, "excess_s": 0.25, "last": [old]}}}}
    new = [[1010.0, "unmerge", 0, 12, 0.09, 0.009], [1011.2, "mixture", 1391, 3, 0.95, 0.06]]
    after = {"orchestrator": {"cost_model": {"slow_iterations": {"count": 3, "excess_s": 1.221,
                                                                  "last": [old, *new]}}}}
    summary = servers.orchestrator_summary(before, after)
    assert summary["slow_iterations"] == {"count": 2, "excess_s": pytest.approx(0.971), "new": new}
    rows = report.orchestrator_table([{"call": {"name": "c"}, "measurements": [
        {"status": "ok", "system": "vlora", "point": "p", "repeat": 0, "orchestrator": summary}]}])
    assert rows[-1].endswith("| 2 (+0.97 s), longest mixture 1391 tokens / 3 requests 950 ms against 60 | - |"), rows[-1]
    # a server that does not report them: no entry, "-" in the table
    assert "slow_iterations" not in servers.orchestrator_summary({}, {"orchestrator": {"switches": 0}})


def _measurement(system, point, repeat, mean, p99=None, status="ok"):
    metrics = {"e2e_ms": {"mean": mean, "p50": mean, "p95": mean, "p99": p99 or 2 * mean},
               "ttft_ms": {"mean": mean / 10, "p50": None, "p95": None, "p99": None},
               "tpot_ms": {"mean": 1.0}, "requests": 400, "completed": 400, "errors": 0}
    return {"system": system, "point": point, "repeat": repeat, "status": status, "metrics": metrics}


def _run(run_id, measurements, scale="gpu"):
    return {"schema": report.SCHEMAS[0], "run_id": run_id, "call": {"name": run_id, "scale": scale},
            "date": "2026-11-23T06:00:00+00:00", "device": "NVIDIA H200", "platform": "Linux", "cpu_count": 16,
            "versions": {"sglang": "0.5.23", "torch": "2.11", "triton": "3.6"},
            "code": {"revision": "a" * 40, "dirty": False},
            "points": {"sgl-mixed": {"label": "1024 in / 64 out"}}, "systems": {}, "caveats": ["c"],
            "measurements": measurements, "_file": f"{run_id}.json"}


def test_lora_cost_pairs_each_repeat_with_its_own_floor():
    runs = [
        _run("one", [_measurement("nolora", "sgl-mixed", 0, 800), _measurement("vlora", "sgl-mixed", 0, 900),
                     _measurement("csgmv", "sgl-mixed", 0, 1200), _measurement("nolora", "sgl-mixed", 1, 700),
                     _measurement("vlora", "sgl-mixed", 1, 760), _measurement("csgmv", "sgl-mixed", 1, 1000)]),
        # A second call on a slower machine: its floor is its own.
        _run("two", [_measurement("nolora", "sgl-mixed", 0, 1000), _measurement("vlora", "sgl-mixed", 0, 1080),
                     _measurement("csgmv", "sgl-mixed", 0, 1300, status="skipped")]),
    ]
    agg = report.aggregate(runs)["sgl-mixed"]
    assert agg["vlora"]["lora_cost"]["values"] == [100, 60, 80]
    assert agg["vlora"]["lora_cost"]["mean"] == pytest.approx(80)
    assert (agg["vlora"]["lora_cost"]["min"], agg["vlora"]["lora_cost"]["max"]) == (60, 100)
    assert agg["csgmv"]["e2e_mean"]["n"] == 2  # the skipped one is not a repeat
    assert agg["csgmv"]["lora_cost"]["mean"] == pytest.approx(350)
    assert "lora_cost" not in agg["nolora"]
    r = report.ratios(report.aggregate(runs))["sgl-mixed"]
    assert r["lora_cost_vs_csgmv"] == pytest.approx(80 / 350)
    assert r["mean_e2e_vs_triton"] is None


def test_report_refuses_mixed_scales_and_old_files(tmp_path):
    a, b = tmp_path / "a.json", tmp_path / "b.json"
    a.write_text(json.dumps(_run("a", [])))
    b.write_text(json.dumps(_run("b", [], scale="cpu")))
    with pytest.raises(ValueError, match="different scales"):
        report.load([a, b])
    b.write_text(json.dumps({"schema": "sglang-vlora/e2e/v1"}))
    with pytest.raises(ValueError, match="older e2e results"):
        report.load([b])


def test_headline_goes_into_the_placeholder_then_its_figures_block():
    runs = [_run("one", [_measurement("nolora", "sgl-mixed", 0, 800), _measurement("vlora", "sgl-mixed", 0, 900),
                         _measurement("csgmv", "sgl-mixed", 0, 1200)])]
    runs[0]["code"]["dirty"] = True
    combined = report.merged(runs, ["bench/results/e2e/one.json"])
    assert combined["provenance"]["git"] == {"commit": "a" * 40, "clean": False, "from": None}
    assert combined["runs"][0]["measurements"] == runs[0]["measurements"] and "_file" not in combined["runs"][0]
    # what the figures do not read stays in the source files only
    runs[0]["shim_calls"] = {"rmsnorm": 3}
    runs[0]["measurements"][0] |= {"per_request": [1.0], "sglang_result": {"x": 1}, "client_command": "c",
                                   "vlora_status": {}, "orchestrator": {"iterations": {}}, "per_adapter": {}}
    slim = report.merged(runs, ["bench/results/e2e/one.json"])["runs"][0]
    assert "shim_calls" not in slim and set(slim["measurements"][0]) == set(runs[0]["measurements"][1])
    runs[0]["measurements"][0]["metrics"]["e2e_ms"]["mean"] = 812.3456789
    slim = report.merged(runs, ["bench/results/e2e/one.json"])["runs"][0]
    assert slim["measurements"][0]["metrics"]["e2e_ms"]["mean"] == 812.3457  # 4 decimals: the file stays small
    text = "intro\n<!-- e2e-headline:begin -->\nno results yet\n<!-- e2e-headline:end -->\nafter\n"
    first = report.put_headline(text, figures_e2e.block_text(combined))
    assert first.startswith("intro\n<!-- figures:e2e-headline -->\n") and first.endswith("-->\nafter\n")
    assert "no results yet" not in first
    assert "| 1024 in / 64 out | 800 (n=1) | 900 (n=1) | 1200 (n=1) | 0.25 (1 round) |" in first
    assert "aaaaaaaaaa DIRTY" in first and "WARNING" in first
    assert "From `bench/results/e2e_h200.json`" in first and "(uncommitted changes)" in first
    # The figures block, as bench/report.py finds it, is rewritten in place the next time.
    assert bench_report.MARKER.search(first)["name"] == "e2e-headline"
    runs[0]["measurements"][1]["metrics"]["e2e_ms"]["mean"] = 950
    second = report.put_headline(first, figures_e2e.block_text(report.merged(runs, ["x"])))
    assert "| 950 (n=1) |" in second and second.count("figures:e2e-headline") == 2
    with pytest.raises(ValueError, match="no e2e headline block"):
        report.put_headline("no markers", "x")


def test_memory_check_counts_prefill_graphs_and_the_feature_pool(tmp_path):
    """Four 7B-shaped servers with prefill CUDA graphs ran out of memory on the 139.8 GiB H200;
    the check refuses them up front and lets three through (and four without those graphs)."""
    from bench import e2e_assets

    (tmp_path / "config.json").write_text(json.dumps({"text_config": e2e_assets.QWEN2VL_7B_TEXT,
                                                      "vision_config": e2e_assets.QWEN2VL_7B_VISION}))
    h200 = {"memory_free_mib": 143156}
    graphs = ["--cuda-graph-backend-prefill", "breakable", "--cuda-graph-max-bs-prefill", "2048"]
    plan_3 = servers.check_memory(plan.GPU_SETUP, tmp_path, 3, h200, graphs)
    assert 32 < plan_3["estimated_gib_per_server"] < 36
    with pytest.raises(ValueError, match="4 servers need about 13[0-9] GiB"):
        servers.check_memory(plan.GPU_SETUP, tmp_path, 4, h200, graphs)
    assert servers.check_memory(plan.GPU_SETUP, tmp_path, 4, h200)["estimated_gib_per_server"] < 26
    assert servers.check_memory(plan.GPU_SETUP, tmp_path, 4, None, graphs) is None  # no GPU: nothing to plan
    for ipc in (["--mm-feature-transport", "cuda_ipc"], ["--mm-feature-transport=cuda_ipc"]):
        with_pool = servers.check_memory(plan.GPU_SETUP, tmp_path, 3, h200, graphs + ipc)
        assert with_pool["estimated_gib_per_server"] == pytest.approx(plan_3["estimated_gib_per_server"] + 1.0)
    cpu_transport = servers.check_memory(plan.GPU_SETUP, tmp_path, 3, h200, graphs + ["--mm-feature-transport", "cpu"])
    assert cpu_transport == plan_3


def test_heads_speedup_pairs_the_video_points_run_with_the_same_flags():
    def point(ms: float) -> dict:
        return {"vlora": {"video_understanding_mean": {"mean": ms}}}

    agg = {"video-lm": point(400.0), "video-heads": point(320.0),
           "video-lm [--mm-attention-backend triton_attn]": point(300.0),
           "video-heads [--mm-attention-backend triton_attn]": point(200.0),
           "video-lm [--disable-radix-cache]": point(500.0)}  # no heads point with these flags
    assert report.heads_speedup(agg) == pytest.approx({"": 1.25, "[--mm-attention-backend triton_attn]": 1.5})
    lines = report._speedup_lines(agg)
    assert lines == ["Video understanding on 6 frames, ours: task heads answer 1.25x faster than LM decoding.",
                     "Video understanding on 6 frames, ours, --mm-attention-backend triton_attn: task heads answer "
                     "1.50x faster than LM decoding."]


def test_the_speed_issues_two_workloads_run_atmm_alone_in_rounds_taking_turns_beside_both_sglang_backends():
    for name, point in (("prefill-blocks", "sgl-prefill"), ("decode-blocks", "sgl-decode")):
        call = plan.get_call(name)
        assert call.systems == ("nolora", "unmerge_only", "csgmv", "triton") and call.points == (point,)
        assert plan.scaled(plan.points_of("gpu")[point], call.scale_requests).requests == 100 and call.repeats == 5
        firsts = [m.system for m in plan.order(call, list(call.systems))[::4]]
        assert set(firsts) == set(call.systems), name  # each system goes first in some round


def test_the_provenance_line_counts_the_calls_with_pinned_servers():
    unpinned = _run("one", [])
    pinned = _run("two", []) | {"setup": {"cpu_pinning": {"cpus_per_server": 3, "servers": {}, "client": [0]}}}
    assert "pinned" not in report.provenance_line([unpinned]) and "CPUs of its own" not in report.provenance_line([unpinned])
    line = report.provenance_line([unpinned, pinned, _run("three", []) | {"setup": {"cpu_pinning": None}}])
    assert "3 call(s). 1 of them with each server on CPUs of its own (`--cpus-per-server`)." in line


def test_the_host_table_puts_each_measurements_server_and_gpu_beside_its_unqueued_prefill():
    host = {"wall_s": 20.0, "processes": 4, "cpu_s": 31.5, "cpu_per_wall_s": 1.575, "voluntary_switches": 9000,
            "involuntary_switches": 400, "cpus": [3, 4, 5], "cpus_busy_share": 0.52, "cpus_steal_share": 0.013}
    clocks = {"samples": 40, "clocks.sm": {"mean": 1905.4, "min": 1755.0, "max": 1980.0},
              "clocks_event_reasons.active": {"0x0000000000000000": 39, "0x0000000000000004": 1}}
    probe = {"samples": 39, "kept": 37, "by_cpu_ms": {"3": 6.0, "4": 6.3}, "loop_ms": {"median": 6.1, "p10": 5.9, "p90": 7.84, "max": 9.0}}
    slow = _measurement("csgmv", "sgl-mixed", 1, 1300) | {"host": host, "gpu_clocks": clocks, "host_probe": probe,
                                                          "per_request": {"ttft_ms": [80.0 + i for i in range(20)]}}
    old = _measurement("nolora", "sgl-mixed", 1, 1000)  # a call from before these figures
    assert report.host_table([_run("old", [old])]) == []
    lines = report.host_table([_run("one", [old, slow])])
    assert len(lines) == 3
    assert lines[2] == ("| one | sgl-mixed | 1 | csgmv | 82.0 | 31.5 | 1.57 | 20 | 0.52 | 0.013 | 6.10 (7.84), CPU 4 6.30 | 1905 (1755) | "
                        "0x0000000000000000 39, 0x0000000000000004 1 |")
    no_gpu = slow | {"gpu_clocks": None}
    assert report.host_table([_run("cpu", [no_gpu])])[2].endswith("| 6.10 (7.84), CPU 4 6.30 | - | - |")
    counted = slow | {"host_probe": probe | {"ghz": {"median": 2.104}, "ipc": {"median": 1.756}}}
    assert report.host_table([_run("pmu", [counted])])[2].endswith("| 6.10 (7.84), CPU 4 6.30; 2.10 GHz, 1.76 IPC | 1905 (1755) | "
                                                                    "0x0000000000000000 39, 0x0000000000000004 1 |")
    no_probe = slow | {"host_probe": {"error": "no samples"}}  # and a call from before the probe
    for m in (no_probe, {k: v for k, v in slow.items() if k != "host_probe"}):
        assert report.host_table([_run("cpu", [m])])[2].endswith("| 0.013 | - | 1905 (1755) | "
                                                                  "0x0000000000000000 39, 0x0000000000000004 1 |")


def test_mean_e2e_above_a_peer_is_counted_by_round_and_by_call():
    # call one: ATMM above csgmv in round 1 only, below over its two rounds; call two: above over both
    one = _run("one", [_measurement("unmerge_only", "sgl-mixed", 0, 900), _measurement("csgmv", "sgl-mixed", 0, 1200),
                       _measurement("unmerge_only", "sgl-mixed", 1, 1010), _measurement("csgmv", "sgl-mixed", 1, 1000)])
    two = _run("two", [_measurement("unmerge_only", "sgl-mixed", 0, 1100), _measurement("csgmv", "sgl-mixed", 0, 1000),
                       _measurement("unmerge_only", "sgl-mixed", 1, 950), _measurement("csgmv", "sgl-mixed", 1, 1000),
                       _measurement("unmerge_only", "sgl-mixed", 2, 990, status="failed")])
    lines = report.above_table([one, two])
    assert lines[2:] == ["| sgl-mixed | unmerge_only | csgmv | 2 of 4 | - | 2 of 4 | 1 of 2 | two (1025 against 1000 ms) |"]
    assert report.above_table([_run("floor only", [_measurement("nolora", "sgl-mixed", 0, 800)])]) == []
    # the same second call with its CPU blocks rotating: its rounds are also counted apart
    rotation = {"cpus_per_server": 3, "servers": {}, "client": [12], "rotation": "by round"}
    turning = two | {"setup": {"cpu_pinning": rotation}}
    fixed = one | {"setup": {"cpu_pinning": {k: v for k, v in rotation.items() if k != "rotation"}}}
    assert report.above_table([fixed, turning])[2:] == [
        "| sgl-mixed | unmerge_only | csgmv | 2 of 4 | 1 of 2 | 2 of 4 | 1 of 2 | two (1025 against 1000 ms) |"]
    assert [report.rotated(r) for r in (one, fixed, turning)] == [False, False, True]
    # the P99 is counted on its own: below on the mean, above on the P99; a round without a P99 not counted
    tail = _run("tail", [_measurement("vlora", "sgl-mixed", 0, 900, p99=2500), _measurement("csgmv", "sgl-mixed", 0, 1000, p99=2000),
                         _measurement("vlora", "sgl-mixed", 1, 900, p99=1500), _measurement("csgmv", "sgl-mixed", 1, 1000, p99=2000)])
    no_p99 = _measurement("vlora", "sgl-mixed", 2, 900)
    no_p99["metrics"]["e2e_ms"]["p99"] = None
    tail["measurements"] += [no_p99, _measurement("csgmv", "sgl-mixed", 2, 1000, p99=100)]
    assert report.above_table([tail])[2:] == ["| sgl-mixed | vlora | csgmv | 0 of 3 | - | 1 of 3 | 0 of 1 | - |"]


def test_calls_of_one_parallel_start_are_told_apart_from_calls_alone_with_their_lora_costs():
    def call(run_id: str, tag: str, floor: float, ours: float, csgmv: float) -> dict:
        rounds = [_measurement("nolora", "sgl-mixed", 0, floor), _measurement("vlora", "sgl-mixed", 0, ours),
                  _measurement("csgmv", "sgl-mixed", 0, csgmv)]
        return _run(run_id, rounds) | {"command": f"python bench/run_e2e.py run --call c --tag {tag} --seed 1"}

    left = call("left", "e2e_c_20261130T141105_gpu0", 1000, 1040, 1400)
    # the same start running another workload on the other GPU
    right = call("right", "e2e_d-blocks_20261130T141105_gpu1", 1100, 1160, 1500)
    alone = call("alone", "e2e_c_20261130T142428_gpu0", 900, 1000, 1200)   # a start of one line
    plain = call("plain", "e2e_c_20261130T143141", 800, 850, 1000)         # not from gpu_parallel.sh
    assert [report.parallel_start(r) for r in (left, right, alone, plain)] == [
        "20261130T141105", "20261130T141105", "20261130T142428", None]
    assert report.beside_another([left, right, alone, plain]) == {
        "left": True, "right": True, "alone": False, "plain": False}
    assert report.neighbour_table([left, right, alone, plain])[2:] == [
        "| sgl-mixed | aaaaaaaaaa | no | 2 | 850.0 | +75.0 (n=2) | - | +250.0 (n=2) | - |",
        "| sgl-mixed | aaaaaaaaaa | yes | 2 | 1050.0 | +50.0 (n=2) | - | +400.0 (n=2) | - |"]
    # no call beside another: nothing to compare, no table
    assert report.neighbour_table([alone, plain]) == []


def test_the_probe_table_correlates_each_calls_unqueued_prefills_with_its_servers_cpu_speed():
    def probed(system: str, repeat: int, loop: float | None, ttft: float) -> dict:
        m = _measurement(system, "sgl-mixed", repeat, 1000) | {"per_request": {"ttft_ms": [ttft + i for i in range(20)]}}
        return m | {"host_probe": {"loop_ms": {"median": loop}} if loop else {"error": "no samples"}}

    # the prefill follows the loop exactly (TTFT p10 = 40 x loop + 2) but in one measurement
    slow_cpus = [probed("nolora", 0, 1.8, 74.0), probed("csgmv", 0, 2.9, 118.0), probed("triton", 0, 2.0, 82.0),
                 probed("unmerge_only", 0, 2.5, 102.0), probed("nolora", 1, 2.2, 70.0)]
    lines = report.probe_table([_run("pinned", slow_cpus)])
    assert lines[:2] == ["| call | point | measurements | fixed loop ms, median on the server's CPUs (min-max) | "
                         "TTFT p10 ms (min-max) | correlation | by ranks |", "|---|---|---|---|---|---|---|"]
    assert lines[2].startswith("| pinned | sgl-mixed | 5 | 1.80-2.90 | 72.0-120.0 | ")
    pearson, spearman = (float(c) for c in lines[2].strip("| ").split(" | ")[-2:])
    xs, ys = [1.8, 2.9, 2.0, 2.5, 2.2], [76.0, 120.0, 84.0, 104.0, 72.0]
    assert pearson == pytest.approx(statistics.correlation(xs, ys), abs=0.005) and 0.8 < pearson < 1
    assert spearman == pytest.approx(0.7, abs=0.005)  # ranks 1,5,2,4,3 against 2,5,3,4,1
    # measurements without a probe (calls before it, or an error) count for nothing; under four, no row
    assert report.probe_table([_run("few", slow_cpus[:3] + [probed("nolora", 2, None, 60.0)])]) == []
    assert report.probe_table([_run("flat", [probed("nolora", r, 2.0, 70.0 + r) for r in range(5)])]) == []
    assert report._ranks([3.0, 1.0, 3.0, 2.0]) == [3.5, 1.0, 3.5, 2.0]


def test_cost_parts_split_a_lora_cost_into_first_token_decode_steps_and_waits():
    def timed(system: str, e2e: float, ttft: float, tpot: float, median_itl: float, first_ttft: float) -> dict:
        m = _measurement(system, "sgl-mixed", 0, e2e)
        m["metrics"] |= {"ttft_ms": {"mean": ttft}, "tpot_ms": {"mean": tpot}, "output_tokens": 6400, "completed": 100}
        return m | {"sglang_result": {"median_itl_ms": median_itl},
                    "per_request": {"ttft_ms": [first_ttft + i for i in range(20)]}}

    # 64 tokens a request: E2E = TTFT + 63 x TPOT; the floor's steps 7 ms, ATMM's 7.5
    floor = timed("nolora", 100 + 63 * 10, 100, 10, 7, 50)
    atmm = timed("unmerge_only", 120 + 63 * 12, 120, 12, 7.5, 59)
    lines = report.cost_parts_table([_run("one", [floor, atmm])])
    assert lines[2] == "| sgl-mixed | unmerge_only | 1 | +146.0 | +20.0 | +31.5 | +94.5 | +9.0 | 10.5 |"
    # one-token outputs have no decode to split, and a round without the floor no cost
    one_token = {**atmm, "metrics": atmm["metrics"] | {"output_tokens": 100}}
    assert report.cost_parts_table([_run("prefill", [floor, one_token])]) == []
    assert report.cost_parts_table([_run("no floor", [atmm])]) == []
    no_itl = {**atmm, "sglang_result": {}}
    assert report.cost_parts_table([_run("our client", [floor, no_itl])]) == []
    no_ttft = {**atmm, "metrics": atmm["metrics"] | {"ttft_ms": {"mean": None}}}
    assert report.cost_parts_table([_run("no first token", [floor, no_ttft])]) == []
    # a system the plan does not name sorts after the plan's own
    other = {**atmm, "system": "zz_other"}
    rows = report.cost_parts_table([_run("two", [floor, other, atmm])])[2:]
    assert [row.split(" | ")[1] for row in rows] == ["unmerge_only", "zz_other"]


def test_iteration_table_sets_revisions_side_by_side_from_the_kept_timeline_figures():
    def with_figures(repeat: int, step: float | None, bands: dict[str, float], status: str = "ok") -> dict:
        m = _measurement("unmerge_only", "sgl-mixed", repeat, 900, status=status)
        by_band = {band: {"prefills": 3, "p25": ms - 5, "median": ms, "p75": ms + 5} for band, ms in bands.items()}
        return m | {"timeline": {"file": "t.json", "iterations": 9, "complete": True, "figures": {
            "iterations": {"unmerge": 9}, "busy_s": 1.0, "decode_step_median_ms": step, "prefill_ms_by_band": by_band}}}

    older = _run("older", [with_figures(0, 8.0, {"1024-2047": 50.0}), with_figures(1, 9.0, {"1024-2047": 60.0}),
                           with_figures(2, 10.0, {"1024-2047": 70.0, "2048-4095": 90.0}),
                           _measurement("nolora", "sgl-mixed", 0, 800)])  # the floor keeps no timeline
    unread = with_figures(2, 7.0, {})
    unread["timeline"]["figures"] = {"error": "KeyError: 'columns'"}  # a timeline the runner could not read
    newer = _run("newer", [with_figures(0, None, {"8192+": 200.0, "1-255": 40.0}),
                           with_figures(1, 7.0, {"1024-2047": 99.0}, status="failed"), unread])  # neither counts
    newer["code"] = {"revision": "b" * 40, "dirty": True}  # a dirty checkout's rounds are named so
    lines = report.iteration_table([newer, older])
    assert lines[2:] == [
        "| sgl-mixed | unmerge_only | aaaaaaaaaa | 3 | 9.00 (3) | 1024-2047 60.0 (3); 2048-4095 90.0 (1) |",
        "| sgl-mixed | unmerge_only | bbbbbbbbbb DIRTY | 1 | - | 1-255 40.0 (1); 8192+ 200.0 (1) |"]
    # calls from before the figures were kept have no rows, and no table without any
    assert report.iteration_table([_run("before", [_measurement("unmerge_only", "sgl-mixed", 0, 900)])]) == []


def test_unqueued_revision_table_sets_each_revisions_prefill_cost_side_by_side():
    def timed(system: str, repeat: int, first_ttft: float | None) -> dict:
        m = _measurement(system, "sgl-mixed", repeat, 900)
        if first_ttft is not None:  # the 10th percentile of 20 TTFTs is the third smallest: first + 2
            m["per_request"] = {"ttft_ms": [first_ttft + i for i in range(20)]}
        return m

    older = _run("older", [timed("nolora", 0, 60.0), timed("unmerge_only", 0, 65.0), timed("csgmv", 0, 80.0),
                           timed("nolora", 1, 70.0), timed("unmerge_only", 1, 77.0), timed("csgmv", 1, None)])
    newer = _run("newer", [timed("nolora", 0, 80.0), timed("unmerge_only", 0, 91.0), timed("csgmv", 0, 104.0),
                           timed("unmerge_only", 1, 95.0)])  # a round without the floor: no row of its own
    newer["code"] = {"revision": "b" * 40, "dirty": False}
    lines = report.unqueued_revision_table([newer, older])
    assert lines[0] == ("| point | revision | rounds | floor's TTFT p10 ms | vlora over the floor's, ms | "
                        "unmerge_only over the floor's, ms | csgmv over the floor's, ms | triton over the floor's, ms |")
    assert lines[2:] == ["| sgl-mixed | aaaaaaaaaa | 2 | 67.0 | - | +6.0 (n=2) | +20.0 (n=1) | - |",
                         "| sgl-mixed | bbbbbbbbbb | 1 | 82.0 | - | +11.0 (n=1) | +24.0 (n=1) | - |"]
    # one revision alone: the unqueued table already says it, no table
    assert report.unqueued_revision_table([older]) == []


def test_floor_table_says_how_a_rounds_cost_goes_with_its_floor_and_its_own_prefill():
    def timed(system: str, repeat: int, mean: float, first_ttft: float | None) -> dict:
        m = _measurement(system, "sgl-mixed", repeat, mean)
        if first_ttft is not None:  # the 10th percentile of 20 TTFTs is the third smallest: first + 2
            m["per_request"] = {"ttft_ms": [first_ttft + i for i in range(20)]}
        return m

    floors = [800.0, 900.0, 1000.0, 1100.0]
    costs = [120.0, 90.0, 60.0, 30.0]  # a slower floor, a smaller cost: r = -1
    prefills = [10.0, 8.0, 6.0, 4.0]  # the unqueued prefill's cost falls with it: r = +1
    measured = []
    for r, (floor, cost, prefill) in enumerate(zip(floors, costs, prefills, strict=True)):
        measured += [timed("nolora", r, floor, 50.0), timed("unmerge_only", r, floor + cost, 50.0 + prefill),
                     timed("csgmv", r, floor + 100 + r, None)]  # no TTFTs: no second r
    lines = report.floor_table([_run("one", measured)])
    assert lines[2:] == ["| sgl-mixed | csgmv | 4 | +1.00 | - |", "| sgl-mixed | unmerge_only | 4 | -1.00 | +1.00 |"]
    # under four rounds beside a floor, no row; without the floor, none at all
    assert report.floor_table([_run("few", measured[:9])]) == []
    assert report.floor_table([_run("no floor", [m for m in measured if m["system"] != "nolora"])]) == []
