"""The profile's cost-model check evaluates the orchestrator's fits at the profiled batches."""

from __future__ import annotations

import pytest

from bench.profile_server import cost_model_check


def test_cost_model_check_evaluates_each_fit_at_the_profiled_batch() -> None:
    fit = {"fixed_s": 0.008, "prefill_forward_s": 0.05, "prefill_token_s": 2e-5, "decode_request_s": 1e-4,
           "samples": 40}
    status = {"orchestrator": {"cost_model": {"iteration_fits": {"unmerge": fit}}}}
    rows = cost_model_check(status, {"prefill4": {"span_us_per_step": 80_000.0},
                                     "decode8": {"period_us": 8_000.0}})["rows"]
    # prefill4: four 256-token prompts in one forward
    assert rows["prefill4/unmerge"]["fit_ms"] == pytest.approx(8 + 50 + 1024 * 0.02)
    assert rows["prefill4/unmerge"]["fit_over_profile"] == pytest.approx((8 + 50 + 20.48) / 80)
    # decode8: a step of eight requests, no prefill forward
    assert rows["decode8/unmerge"]["fit_ms"] == pytest.approx(8 + 0.8)
    assert rows["decode8/unmerge"]["profile_ms"] == pytest.approx(8.0)


def test_cost_model_check_without_fits_or_profile_times() -> None:
    assert cost_model_check({}, {"decode8": {"period_us": 8_000.0}})["rows"] == {}
    status = {"orchestrator": {"cost_model": {"iteration_fits": {"merge": {"fixed_s": 0.01, "samples": 3}}}}}
    row = cost_model_check(status, {"decode8": {"period_us": None}})["rows"]["decode8/merge"]
    assert row["profile_ms"] is None and row["fit_over_profile"] is None


def test_a_negative_latency_count_is_refused() -> None:
    import argparse

    from bench.profile_server import _count

    assert _count("0") == 0 and _count("25") == 25
    with pytest.raises(argparse.ArgumentTypeError, match=">= 0"):
        _count("-3")


def test_interleaved_latency_takes_turns_and_pairs_each_round_with_the_floor() -> None:
    """Real HTTP servers (stdlib) stand in for SGLang's ``/generate``: one answers at once, the
    other 30 ms later. Every round each system gets the same prompt, the order rotates, the
    LoRA system names its adapter, and its excess over the floor is paired per round."""
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    from bench.profile_server import interleaved_latency

    seen: list[tuple[str, dict]] = []

    def server(name: str, delay_s: float) -> ThreadingHTTPServer:
        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802 (http.server's name)
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                seen.append((name, body))
                threading.Event().wait(delay_s)
                data = b"{}"
                self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args) -> None:
                pass

        httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
        return httpd

    floor, lora = server("nolora", 0.0), server("atmm", 0.03)
    try:
        urls = {name: f"http://127.0.0.1:{s.server_address[1]}" for name, s in (("nolora", floor), ("atmm", lora))}
        out = interleaved_latency(urls, "prefill4", ["a0", "a1", "a2", "a3"], rounds=4)
    finally:
        floor.shutdown()
        lora.shutdown()
    assert [name for name, _ in seen] == ["nolora", "atmm", "atmm", "nolora"] * 2  # turns rotate
    for first, second in zip(seen[::2], seen[1::2], strict=True):
        assert first[1]["input_ids"] == second[1]["input_ids"]  # one prompt per round
        assert len(first[1]["input_ids"]) == 4 and len(first[1]["input_ids"][0]) == 256
    assert all("lora_path" not in body for name, body in seen if name == "nolora")
    assert all(body["lora_path"] == ["a0", "a1", "a2", "a3"] for name, body in seen if name == "atmm")
    assert out["nolora"]["count"] == out["atmm"]["count"] == 4 and "over_floor" not in out["nolora"]
    assert 20 < out["atmm"]["over_floor"]["median"] < 1000


def test_server_forward_times_are_the_last_requests_each_server_logged() -> None:
    """The interleaved rounds are the last requests in each server's log, scenario after
    scenario; warm-up and health checks before them are not counted."""
    from bench.profile_server import add_server_forward_times

    def line(rid: str, forward_ms: float) -> str:
        return (f"[t] ReqTimeStats(rid={rid}, input_len=16, cached_input_len=0, output_len=1, attempts=0, "
                f"type=unified): queue_duration=0.10ms, forward_duration={forward_ms:.2f}ms, entry_time=1.000")

    def log(warmup: float, prefill: float, decode: float) -> list[str]:
        return ([line("w", warmup), line("HEALTH_CHECK_1", 1.0)] + [line("p", prefill)] * 2
                + [line("d", decode)] * 16)  # 2 rounds of prefill1 (1 request), then of decode8 (8 requests)

    interleaved = {"prefill1": {"nolora": {"count": 2}, "atmm": {"count": 2}},
                   "decode8": {"nolora": {"count": 2}, "atmm": {"count": 2}}}
    add_server_forward_times(interleaved, {"nolora": log(900.0, 40.0, 500.0), "atmm": log(900.0, 45.0, 530.0)})
    assert interleaved["prefill1"]["atmm"]["server_forward_ms"]["median"] == 45.0
    assert interleaved["prefill1"]["atmm"]["server_forward_over_floor_ms"] == 5.0
    assert interleaved["decode8"]["atmm"]["server_forward_over_floor_ms"] == 30.0
    assert "server_forward_over_floor_ms" not in interleaved["decode8"]["nolora"]
    with pytest.raises(ValueError, match="enable-request-time-stats-logging"):
        add_server_forward_times({"decode8": {"atmm": {"count": 5}}}, {"atmm": log(1.0, 1.0, 1.0)})
