"""The open-loop client against the shared CPU server: a handful of retrieval requests."""

from __future__ import annotations

import json

import pytest

from bench.client import main


def test_client_runs_a_small_retrieval_workload(server, tmp_path):
    out = tmp_path / "results.json"
    main([
        "--url", server.url, "--workload", "retrieval", "--rate", "4", "--duration", "3",
        "--max-requests", "8", "--adapters", "a8", "b16", "c32", "--max-new-tokens", "4",
        "--out", str(out), "--no-progress",
    ])
    report = json.loads(out.read_text())
    m, reqs = report["metrics"], report["requests"]
    assert 2 <= m["requests"] == len(reqs) <= 8
    assert m["errors"] == 0, [r["error"] for r in reqs if r["error"]]
    assert {r["adapter"] for r in reqs} <= {"a8", "b16", "c32"}
    for r in reqs:
        assert r["output_tokens"] == r["expected_output_tokens"] == 4  # ignore_eos: exactly the cap
        assert 0 < r["ttft_s"] <= r["latency_s"]
        assert r["sent_s"] >= r["arrival_s"] - 1e-3  # open loop: never early
    assert m["output_tokens"] == sum(r["output_tokens"] for r in reqs)
    latency_sum = sum(r["latency_s"] for r in reqs)
    assert m["latency_sum_s"] == pytest.approx(latency_sum)
    assert m["avg_token_latency_s"] == pytest.approx(latency_sum / m["output_tokens"])
    lat = m["latency_s"]
    assert 0 < lat["p50"] <= lat["p95"] <= lat["p99"] <= max(r["latency_s"] for r in reqs)
    assert m["throughput"]["requests_per_s"] == pytest.approx(len(reqs) / m["span_s"])
    slo = m["slo"]["visual_retrieval"]
    assert slo["requests"] == len(reqs)
    assert slo["met"] == sum(r["latency_s"] <= r["slo_s"] for r in reqs)


def test_unknown_adapter_is_recorded_as_an_error(server, tmp_path):
    out = tmp_path / "results.json"
    report = main([
        "--url", server.url, "--workload", "retrieval", "--rate", "10", "--duration", "1",
        "--max-requests", "2", "--adapters", "nope", "--max-new-tokens", "2", "--skew", "1",
        "--out", str(out), "--no-progress",
    ])
    m = report["metrics"]
    assert m["errors"] == m["requests"] >= 1 and m["output_tokens"] == 0
    assert m["avg_token_latency_s"] is None and m["slo"]["visual_retrieval"]["attainment"] == 0
    assert all(r["error"] for r in report["requests"])
