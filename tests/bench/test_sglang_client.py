"""SGLang's serving client through the benchmark's worker, against the real CPU test server:
the floor's way of running it (adapters drawn, none sent) and the per-request records."""

from __future__ import annotations

import json
import re

from bench.e2e import measure, plan, servers
from bench.e2e.sglang_client import Worker
from sglang_vlora.server_process import get_json


def _without_work(server) -> int:
    code, body = get_json(server.url + "/vlora/status", timeout_s=10)
    assert code == 200, body
    return sum(json.loads(body)["batches_without_lora_work"].values())


def test_floor_run_sends_no_adapter_and_both_runs_record_every_request(server, tmp_path):
    point = plan.CPU_POINTS["sgl-mixed"]
    names = sorted(server.adapters)
    worker = Worker(tmp_path / "client.log", env=servers.server_env())
    try:
        before = _without_work(server)
        with_adapters = measure.run_sglang(worker, server, point, names, 7, True, tmp_path)
        # every request named an adapter: every batch had LoRA work
        assert _without_work(server) == before
        floor = measure.run_sglang(worker, server, point, names, 7, False, tmp_path)
        # the same command line, every request sent without its adapter: base-model batches only
        assert _without_work(server) > before
    finally:
        worker.close()
    assert floor["client_command"].endswith("(requests sent without their adapters)")

    def command(run: dict) -> str:
        return re.sub(r"--output-file \S+ ", "", run["client_command"].split("   (")[0])

    assert command(floor) == command(with_adapters)
    for run in (with_adapters, floor):
        assert run["metrics"]["completed"] == point.requests
        rows = run["per_request"]
        assert rows["index"] == list(range(point.requests))
        assert all(e is not None and t is not None and 0 < t <= e for e, t in zip(rows["e2e_ms"], rows["ttft_ms"],
                                                                                  strict=True))
        assert "ttfts" not in run["sglang_result"]  # the details live in per_request only
