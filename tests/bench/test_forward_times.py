"""Forward times under load from SGLang's request time stats: batches rebuilt from the requests'
start times, the forward of a request that ran alone, and its excess over the floor's."""

import json

import pytest

from bench import forward_times
from tests.bench.call_files import write_call


def stats_line(rid: str, queue_ms: float, forward_ms: float, entry_s: float, input_len: int = 1024) -> str:
    return (f"[2026-11-24 05:42:55] ReqTimeStats(rid={rid}, input_len={input_len}, cached_input_len=0, output_len=1, "
            f"attempts=0, type=unified): queue_duration={queue_ms:.2f}ms, forward_duration={forward_ms:.2f}ms, "
            f"entry_time={entry_s:.3f}")


FLUSH = '[2026-11-24 05:42:50] INFO:     127.0.0.1:1 - "GET /flush_cache?timeout=60 HTTP/1.1" 200 OK'


def measurement(forward_ms: float) -> list[str]:
    """Six requests: a first one alone, two that start in one batch, then three more alone
    (the middle two are isolated; the last has no batch after it)."""
    return [
        FLUSH,
        stats_line("a", 0.2, forward_ms, 100.000),
        stats_line("b", 300.0, 90.0, 100.200),  # queued until 100.5 s: one batch with c
        stats_line("c", 0.0, 90.0, 100.500),
        stats_line("HEALTH_CHECK_1", 0.1, 5.0, 100.700),
        stats_line("d", 0.2, forward_ms, 101.000),  # previous batch done at 100.59 s; next starts 102 s
        stats_line("e", 0.2, forward_ms, 102.000),
        stats_line("f", 0.2, forward_ms, 103.000),
    ]


def test_batches_and_isolated_forwards():
    warmup = [stats_line("w", 0.1, 900.0, 99.0)]  # before the first flush: warm-up, not measured
    parts = forward_times.parse(warmup + measurement(50.0) + measurement(60.0))
    assert [len(p) for p in parts] == [6, 6]  # the health check left out
    groups = forward_times.batches(parts[0])
    assert [len(g) for g in groups] == [1, 2, 1, 1, 1]
    # a: nothing before it; b+c: two requests; f: nothing after it. d and e ran alone.
    assert forward_times.isolated_forwards(groups) == [50.0, 50.0]
    summary = forward_times.summarise(parts[1])
    assert summary["requests"] == 6 and summary["batches"] == 5
    assert summary["isolated_forward_ms"] == {"n": 2, "median": 60.0, "mean": 60.0, "p10": 60.0, "p90": 60.0}


def test_a_request_that_waited_for_a_busy_server_is_not_isolated():
    lines = [FLUSH, stats_line("a", 0.0, 50.0, 10.000), stats_line("b", 30.0, 50.0, 10.020),
             stats_line("c", 0.0, 50.0, 11.000)]
    groups = forward_times.batches(forward_times.parse(lines)[0])
    assert [len(g) for g in groups] == [1, 1, 1]
    assert forward_times.isolated_forwards(groups) == []  # b entered while a was running


def test_a_call_gives_each_server_its_measurements_and_the_excess_over_the_floor(tmp_path):
    logs = {"nolora": [line for f in (50.0, 52.0) for line in measurement(f)] * 3,
            "vlora": [line for f in (53.0, 54.0) for line in measurement(f)] * 3}
    measurements = [{"system": s, "point": "p", "repeat": r, "status": "ok", "started_at_s": 10.0 * r + (s == "vlora")}
                    for s in logs for r in range(6)]
    results = {"run_id": "r", "date": "2026-11-24T05:40:00+00:00", "systems": {"vlora": {}, "nolora": {}},
               "measurements": measurements, "setup": {"extra_server_args": ["--enable-request-time-stats-logging"]},
               "device": "GPU", "platform": "Linux", "cpu_count": 16, "versions": {"sglang": "0.5.23"},
               "code": {"revision": "b" * 40, "dirty": False}}
    results_path, logs_path = write_call(tmp_path, results, {f"{name}.log": "\n".join(lines)
                                                            for name, lines in logs.items()})
    doc = forward_times.main([str(results_path), str(logs_path), "--out", str(tmp_path / "forward.json")])
    call = doc["calls"][0]
    assert [r["repeat"] for r in call["servers"]["vlora"]] == list(range(6))
    assert [r["isolated_forward_ms"]["n"] for r in call["servers"]["nolora"]] == [2] * 6
    assert [r["median_ms"] for r in call["over_floor"]["vlora"]] == [3.0, 2.0] * 3
    assert json.loads((tmp_path / "forward.json").read_text()) == doc

    results["measurements"] = measurements[:-1]  # one measurement fewer than the log holds
    (tmp_path / "r.json").write_text(json.dumps(results))
    with pytest.raises(ValueError, match="request-time-stats"):
        forward_times.call_forward_times(tmp_path / "r.json", tmp_path / "r_logs.tar.gz")
