"""The benchmark's split of one measurement's results by adapter and by request, and the
report's tables that set them against the floor's same requests."""

import pytest

from bench import client
from bench.e2e import measure


def result(index: int, latency_s: float | None, error: str | None = None) -> client.Result:
    return client.Result(index, None, "vqa", "retrieval", 0.1 * index, 0.1 * index, latency_s and latency_s / 2,
                         latency_s, 4, 4, 1.0, error)


def test_results_split_by_the_adapter_each_request_names_with_lora_on():
    # the floor's requests name no adapter; the labels say which each would have used
    results = [result(0, 0.2), result(1, 0.4), result(2, 0.6), result(3, None, "timeout"), result(4, 1.0)]
    groups = measure.per_adapter(results, ["a", "b", "a", "a", None])
    assert list(groups) == ["a", "b", "base"]  # most requested first
    assert (groups["a"]["requests"], groups["a"]["completed"]) == (3, 2)
    assert groups["a"]["e2e_ms"]["mean"] == pytest.approx(400.0)
    assert groups["a"]["ttft_ms"]["mean"] == pytest.approx(200.0)
    assert groups["base"]["e2e_ms"]["p50"] == pytest.approx(1000.0)


def test_labels_must_cover_every_result():
    with pytest.raises(ValueError, match="2 adapter labels for 3 results"):
        measure.per_adapter([result(0, 0.1), result(1, 0.1), result(2, 0.1)], ["a", "b"])


def test_report_sets_each_group_against_the_floors_same_requests():
    from bench.e2e import report

    def measurement(system: str, top_ms: float, other_ms: tuple[float, float]) -> dict:
        groups = measure.per_adapter(
            [result(0, top_ms / 1e3), result(1, top_ms / 1e3), result(2, other_ms[0] / 1e3),
             result(3, other_ms[1] / 1e3)], ["a", "a", "b", "c"])
        return {"system": system, "point": "vision-skewed", "repeat": 0, "status": "ok", "per_adapter": groups}

    run = {"call": {"name": "vision-skewed"}, "measurements": [
        measurement("nolora", 300.0, (300.0, 500.0)), measurement("vlora", 310.0, (500.0, 600.0))]}
    floor_row, ours_row = report.adapter_table([run])[2:]
    assert floor_row == "| vision-skewed | vision-skewed | 0 | nolora | 2, 300 | 2, 400 |"
    # others: mean of 500 and 600 = 550, 150 over the floor's 400 for the same two requests
    assert ours_row == "| vision-skewed | vision-skewed | 0 | vlora | 2, 310 (+10) | 2, 550 (+150) |"


def test_per_request_lists_latencies_by_request_index():
    results = [result(2, 0.6), result(0, 0.2), result(1, None, "timeout")]
    rows = measure.per_request(results)
    assert rows == {"index": [0, 1, 2], "e2e_ms": [200.0, None, 600.0], "ttft_ms": [100.0, None, 300.0]}


def test_report_pairs_each_request_with_the_floors_same_request():
    from bench.e2e import report

    def measurement(system: str, repeat: int, latencies_ms: list[float | None]) -> dict:
        results = [result(i, None if ms is None else ms / 1e3, None if ms is not None else "timeout")
                   for i, ms in enumerate(latencies_ms)]
        return {"system": system, "point": "vision-skewed", "repeat": repeat, "status": "ok",
                "per_request": measure.per_request(results)}

    run = {"call": {"name": "vision-skewed"}, "measurements": [
        measurement("nolora", 0, [300.0, 400.0, 500.0, 600.0, 700.0]),
        # one slow request (a queueing tail) moves the mean by +400 ms, the median not at all
        measurement("vlora", 0, [310.0, 410.0, 510.0, 2600.0, None]),
        measurement("nolora", 1, [300.0, 300.0, 300.0]),
        measurement("vlora", 1, [330.0, 330.0, 330.0]),
        measurement("csgmv", 2, [400.0]),  # no floor in this repeat: not paired
    ]}
    lines = report.paired_table([run])
    # repeat 0: differences +10, +10, +10, +2000 (the failed request is left out): median +10
    # repeat 1: +30 each; over the repeats: mean 20 (10-30)
    assert lines[2:] == ["| vision-skewed | vlora | 20.0 (10.0-30.0, n=2) | 4, 3 |"]
    assert report.paired_table([{"call": {"name": "x"}, "measurements": []}]) == []


def test_sglang_client_gets_one_command_line_for_every_system(tmp_path):
    """The floor's run draws the adapters too (then sends none), so its arrival times are the
    LoRA systems' own: the command line has no per-system part."""
    from bench.e2e import plan
    from sglang_vlora.server_process import ServerProcess

    srv = ServerProcess(url="http://127.0.0.1:1", log_path=tmp_path / "log", process=None, command=[])
    point = plan.CPU_POINTS["sgl-mixed"]
    argv = measure.sglang_argv(srv, point, ["a", "b"], 3, tmp_path / "out.jsonl")
    assert argv[argv.index("--lora-name") + 1: argv.index("--lora-name") + 3] == ["a", "b"]
    assert "--output-details" in argv and argv[argv.index("--seed") + 1] == "3"
    assert "--lora-name" not in measure.sglang_argv(srv, point, [], 3, tmp_path / "out.jsonl")


def test_the_share75_point_asks_sglangs_skewed_law_at_4_whose_top_adapter_has_three_quarters(tmp_path):
    """SGLang's client weighs adapter i by alpha**-i: at 4 over 4 adapters the top one has 64/85."""
    from bench.e2e import plan
    from sglang_vlora.server_process import ServerProcess

    srv = ServerProcess(url="http://127.0.0.1:1", log_path=tmp_path / "log", process=None, command=[])
    point = plan.GPU_POINTS["sgl-mixed-share75"]
    argv = measure.sglang_argv(srv, point, ["a", "b", "c", "d"], 3, tmp_path / "out.jsonl")
    alpha = float(argv[argv.index("--lora-zipf-alpha") + 1])
    assert argv[argv.index("--lora-request-distribution") + 1] == "skewed"
    weights = [alpha ** -i for i in range(4)]
    assert round(weights[0] / sum(weights), 2) == 0.75
    assert plan.CALLS["mixed-share75-blocks"].points == ("sgl-mixed-share75",)


def test_sglang_details_give_each_requests_latencies_in_request_order():
    raw = {"ttfts": [0.1, 0.0, 0.2], "itls": [[0.01, 0.02], [], [0.05]], "errors": ["", "timeout", ""]}
    rows = measure.sglang_per_request(raw)
    assert rows["index"] == [0, 1, 2]
    assert rows["ttft_ms"] == [100.0, None, 200.0]
    assert rows["e2e_ms"] == [pytest.approx(130.0), None, pytest.approx(250.0)]
    assert measure.sglang_per_request({"ttfts": None}) is None


def test_points_run_with_extra_server_flags_are_kept_apart(tmp_path):
    """A call run with ``--server-args --disable-radix-cache`` measured another workload: its
    points get their own rows and LoRA costs, and a merged file is not renamed twice."""
    import json

    from bench.e2e import report

    def run(run_id: str, extra: list[str], floor_ms: float, ours_ms: float) -> dict:
        def m(system: str, ms: float) -> dict:
            return {"system": system, "point": "sgl-prefill", "repeat": 0, "status": "ok",
                    "metrics": {"e2e_ms": {"mean": ms, "p99": ms}, "ttft_ms": {"mean": ms}, "errors": 0,
                                "requests": 4}}

        return {"schema": report.SCHEMAS[0], "run_id": run_id, "call": {"name": "prefill", "scale": "gpu"},
                "setup": {"extra_server_args": extra}, "device": "GPU", "platform": "Linux", "cpu_count": 16,
                "date": "2026-11-24T00:00:00+00:00",
                "versions": {"sglang": "0.5.23"}, "code": {"revision": "a" * 40, "dirty": False},
                "points": {"sgl-prefill": {"label": "random-ids 1024 in / 1 out"}},
                "measurements": [m("nolora", floor_ms), m("vlora", ours_ms)]}

    paths = []
    logging = "--enable-request-time-stats-logging"  # logs only: the same point
    for name, extra, floor_ms, ours_ms in (("plain", [], 100.0, 130.0),
                                           ("flags", ["--disable-radix-cache"], 110.0, 120.0),
                                           ("logged", [logging], 100.0, 120.0),
                                           ("both", ["--disable-radix-cache", logging], 100.0, 115.0)):
        paths.append(tmp_path / f"{name}.json")
        paths[-1].write_text(json.dumps(run(name, extra, floor_ms, ours_ms)))
    runs = report.load(paths)
    agg = report.aggregate(runs)
    assert sorted(agg) == ["sgl-prefill", "sgl-prefill [--disable-radix-cache]"]
    assert agg["sgl-prefill"]["vlora"]["lora_cost"]["values"] == [30.0, 20.0]
    assert agg["sgl-prefill [--disable-radix-cache]"]["vlora"]["lora_cost"]["values"] == [10.0, 15.0]
    table = report.headline(runs, "test")
    assert "| random-ids 1024 in / 1 out |" in table
    assert "| random-ids 1024 in / 1 out, --disable-radix-cache |" in table
    merged = tmp_path / "merged.json"
    merged.write_text(json.dumps(report.merged(runs, [str(p) for p in paths])))
    assert sorted(report.aggregate(report.load([merged]))) == sorted(agg)


def test_points_a_call_shortened_are_kept_apart_from_the_full_ones(tmp_path):
    """The block call's 100-request rounds measure another protocol than the 400-request
    repeats: their own rows and LoRA costs, their label naming the length; with extra server
    flags both go into the name."""
    import json

    from bench.e2e import plan, report

    full = plan.points_of("gpu")["sgl-mixed"].requests

    def run(run_id: str, requests: int, extra: list[str], ours_ms: float) -> dict:
        def m(system: str, ms: float) -> dict:
            return {"system": system, "point": "sgl-mixed", "repeat": 0, "status": "ok",
                    "metrics": {"e2e_ms": {"mean": ms, "p99": ms}, "ttft_ms": {"mean": ms}, "errors": 0,
                                "requests": requests}}

        return {"schema": report.SCHEMAS[0], "run_id": run_id, "call": {"name": "x", "scale": "gpu"},
                "setup": {"extra_server_args": extra}, "device": "GPU", "platform": "Linux", "cpu_count": 16,
                "date": "2026-11-27T00:00:00+00:00", "versions": {"sglang": "0.5.23"},
                "code": {"revision": "a" * 40, "dirty": False},
                "points": {"sgl-mixed": {"label": "random-ids 1024 in / 64 out, Zipf 2", "requests": requests}},
                "measurements": [m("nolora", 900.0), m("vlora", ours_ms)]}

    paths = []
    for name, requests, extra, ours_ms in (("full", full, [], 1000.0), ("blocks", 100, [], 950.0),
                                           ("blocks_flags", 100, ["--disable-radix-cache"], 990.0)):
        paths.append(tmp_path / f"{name}.json")
        paths[-1].write_text(json.dumps(run(name, requests, extra, ours_ms)))
    agg = report.aggregate(report.load(paths))
    assert sorted(agg) == ["sgl-mixed", "sgl-mixed [--disable-radix-cache; 100 requests a repeat]",
                           "sgl-mixed [100 requests a repeat]"]
    assert agg["sgl-mixed"]["vlora"]["lora_cost"]["values"] == [100.0]
    assert agg["sgl-mixed [100 requests a repeat]"]["vlora"]["lora_cost"]["values"] == [50.0]
    table = report.headline(report.load(paths), "test")
    assert "| random-ids 1024 in / 64 out, Zipf 2, 100 requests a repeat |" in table


def test_unqueued_table_takes_each_repeats_tenth_percentile_of_ttft():
    """The fastest tenth of the requests found no queue: their TTFT is one prefill's latency,
    set against the floor's in the same repeat; a queue behind the rest does not move it."""
    from bench.e2e import report

    def measurement(system: str, repeat: int, ttfts: list[float | None]) -> dict:
        return {"system": system, "point": "sgl-prefill", "repeat": repeat, "status": "ok",
                "per_request": {"index": list(range(len(ttfts))), "e2e_ms": ttfts, "ttft_ms": ttfts}}

    floor = [50.0 + i for i in range(20)]  # p10: the third fastest of 20 = 52
    # 19 answered (one failed), one of them queued 900 ms: p10 = the second fastest = 56
    queued = [55.0 + i for i in range(18)] + [900.0, None]
    run = {"call": {"name": "prefill"}, "measurements": [
        measurement("nolora", 0, floor), measurement("unmerge_only", 0, queued),
        measurement("csgmv", 1, floor[:5]),  # fewer than 10 answered: no tenth percentile
    ]}
    lines = report.unqueued_table([run])
    assert lines[2:] == ["| sgl-prefill | nolora | 52.0 (n=1) | - |", "| sgl-prefill | unmerge_only | 56.0 (n=1) | 4.0 (n=1) |"]
    assert report.unqueued_table([{"measurements": []}]) == []
