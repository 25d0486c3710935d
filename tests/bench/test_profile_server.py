"""bench/profile_server.py: the cost-model check, interleaved rounds, forward times and host sampling."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from bench.profile_server import cost_model_check

REPO = Path(__file__).resolve().parents[2]


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


def _fake_generate_server(name: str, delay_s: float, seen: list):
    """A real HTTP server (stdlib) standing in for SGLang's ``/generate``: records each body
    under ``name`` and answers after ``delay_s``."""
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

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


def _interleave(delays: dict[str, float], scenario: str, rounds: int) -> tuple[dict, list]:
    from bench.profile_server import interleaved_latency

    seen: list = []
    servers = {name: _fake_generate_server(name, delay, seen) for name, delay in delays.items()}
    try:
        urls = {name: f"http://127.0.0.1:{s.server_address[1]}" for name, s in servers.items()}
        return interleaved_latency(urls, scenario, ["a0", "a1", "a2", "a3"], rounds=rounds), seen
    finally:
        for s in servers.values():
            s.shutdown()


def test_host_sampling_without_interleaved_rounds_or_py_spy_is_refused() -> None:
    import subprocess
    import sys

    run = subprocess.run([sys.executable, "bench/profile_server.py", "--out", "/nonexistent", "--repeats", "1",
                          "--sample-host", "500"], cwd=REPO, capture_output=True, text=True)
    assert run.returncode == 2 and "--sample-host samples the interleaved rounds" in run.stderr

    bare = {"PATH": str(Path(sys.executable).parent), "HOME": "/nonexistent"}  # no py-spy on it
    if (Path(sys.executable).parent / "py-spy").exists():
        pytest.skip("py-spy sits beside this interpreter")
    run = subprocess.run([sys.executable, "bench/profile_server.py", "--out", "/nonexistent", "--repeats", "0",
                          "--interleaved", "5", "--sample-host", "500"], cwd=REPO, capture_output=True, text=True,
                         env=bare)
    assert run.returncode == 2 and "--sample-host needs py-spy on PATH" in run.stderr


def test_interleaved_latency_takes_turns_and_pairs_each_round_with_the_floor() -> None:
    """One server answers at once, the other 150 ms later (a margin the CI machine's load does not eat:
    30 ms read as 14 there once). Every round each system gets the
    same prompt, the order rotates, the LoRA system names its adapter, and its excess over the
    floor is paired per round."""
    out, seen = _interleave({"nolora": 0.0, "atmm": 0.15}, "prefill4", rounds=4)
    assert [name for name, _ in seen] == ["nolora", "atmm", "atmm", "nolora"] * 2  # turns rotate
    for first, second in zip(seen[::2], seen[1::2], strict=True):
        assert first[1]["input_ids"] == second[1]["input_ids"]  # one prompt per round
        assert len(first[1]["input_ids"]) == 4 and len(first[1]["input_ids"][0]) == 256
    assert all("lora_path" not in body for name, body in seen if name == "nolora")
    assert all(body["lora_path"] == ["a0", "a1", "a2", "a3"] for name, body in seen if name == "atmm")
    assert out["nolora"]["count"] == out["atmm"]["count"] == 4 and "over_floor" not in out["nolora"]
    assert 100 < out["atmm"]["over_floor"]["median"] < 1000


def test_the_control_floor_and_the_base_only_scenario_send_no_adapter() -> None:
    """``nolora2`` (a second server without LoRA) is paired with the floor like a LoRA system
    but never names an adapter; ``prefill1_base`` names none on any server."""
    out, seen = _interleave({"nolora": 0.0, "nolora2": 0.0, "atmm": 0.0}, "prefill1", rounds=3)
    assert all("lora_path" not in body for name, body in seen if name != "atmm")
    assert all(body["lora_path"] == ["a0"] for name, body in seen if name == "atmm")
    assert out["nolora2"]["over_floor"]["count"] == 3
    _, seen = _interleave({"nolora": 0.0, "atmm": 0.0}, "prefill1_base", rounds=2)
    assert len(seen) == 4 and all("lora_path" not in body for _, body in seen)


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


def test_host_samplers_attach_to_the_scheduler_and_write_on_sigint(tmp_path) -> None:
    """A stand-in server whose child is titled like SGLang's scheduler: ``scheduler_pid`` finds
    the child, and py-spy (where installed) samples it until SIGINT and writes raw stacks that
    ``bench/host_samples.py`` reads."""
    import shutil
    import subprocess
    import sys
    import time

    from bench.host_samples import scheduler_stacks
    from bench.profile_server import scheduler_pid, start_samplers, stop_samplers

    child = ("import sys, threading, time\n"
             "def run_event_loop():\n"
             "    t = time.time()\n"
             "    while time.time() - t < 20: sum(range(1000))\n"
             "run_event_loop()\n")
    parent = subprocess.Popen([sys.executable, "-c",
                               f"import subprocess, sys; subprocess.run([sys.executable, '-c', {child!r}, "
                               "'sglang::scheduler_TP0'])"])
    try:
        deadline = time.monotonic() + 10
        while True:
            try:
                pid = scheduler_pid(parent)
                break
            except RuntimeError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)
        assert pid != parent.pid
        if shutil.which("py-spy") is None:
            pytest.skip("py-spy is not installed here (the GPU benchmark carries it)")
        samplers = start_samplers({"nolora": pid}, 200, tmp_path, "prefill1")
        time.sleep(1.5)
        stop_samplers(samplers)
        lines = (tmp_path / "spy_nolora_prefill1.txt").read_text().splitlines()
        assert any("run_event_loop" in line and "MainThread" in line for line in lines)
        assert not scheduler_stacks(lines)  # no SGLang event loop in the stand-in: nothing counted
    finally:
        parent.kill()
        subprocess.run(["pkill", "-f", "sglang::scheduler_TP0"], check=False)


def _linear(ts: float, dur: float) -> dict:
    return {"ph": "X", "cat": "cpu_op", "name": "aten::linear", "ts": ts, "dur": dur}


def test_linear_host_times_are_taken_per_layer_module_by_position() -> None:
    from bench.profile_server import linear_host_us

    events = []
    for layer in range(3):  # qkv 10/20/30 us, o 40, gate_up 50, down 60 (+layer)
        base = 1000.0 * layer
        for i, dur in enumerate((10.0 * (layer + 1), 40.0, 50.0, 60.0 + layer)):
            events.append(_linear(base + 100 * i, dur))
    events.append(_linear(5.0, 2.0))  # nested inside the first qkv call: not a call of its own
    events.append({"ph": "X", "cat": "cpu_op", "name": "aten::mm", "ts": 50.0, "dur": 5.0})
    events.append(_linear(9000.0, 99.0))  # after the window
    got = linear_host_us(events, (0.0, 5000.0))
    assert {k: got["qkv"][k] for k in ("median", "mean")} == {"median": 20.0, "mean": 20.0}
    assert got["o"]["median"] == 40.0 and got["gate_up"]["mean"] == 50.0
    assert got["down"]["median"] == 61.0
    assert got["qkv"]["children_us"] == {}  # the nested aten::linear is the call's own, not a child


def test_linear_host_times_say_what_each_call_holds() -> None:
    from bench.profile_server import linear_host_us

    events = []
    for layer in range(3):  # each o call: an addmm of 4 + layer us holding a launch of 2 us (thread 1)
        base = 1000.0 * layer
        for i in range(4):
            events.append({**_linear(base + 100 * i, 30.0), "tid": 1})
        o = base + 100
        events.append({"ph": "X", "cat": "cpu_op", "name": "aten::addmm", "ts": o + 1, "dur": 4.0 + layer, "tid": 1})
        events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "ts": o + 2, "dur": 2.0,
                       "tid": 1})
        events.append({"ph": "X", "cat": "cuda_runtime", "name": "cudaMemcpyAsync", "ts": o + 3, "dur": 9.0,
                       "tid": 2})  # another thread's call inside the span: not the linear's
        events.append({"ph": "X", "cat": "cpu_op", "name": "aten::empty", "ts": o + 25, "dur": 20.0,
                       "tid": 1})  # ends after the call: not inside it
    got = linear_host_us(events, (0.0, 5000.0))
    assert got["o"]["children_us"] == {"cpu_op:aten::addmm": 5.0, "cuda_runtime:cudaLaunchKernel": 2.0}
    assert got["qkv"]["children_us"] == {}


def test_linear_host_times_need_whole_layers() -> None:
    from bench.profile_server import linear_host_us

    assert linear_host_us([_linear(0.0, 1.0), _linear(10.0, 1.0)], (0.0, 100.0)) is None
    assert linear_host_us([], (0.0, 100.0)) is None


def test_the_probe_scenario_is_sent_while_its_background_batch_decodes_and_timed_alone() -> None:
    """``prefill16_in_decode8``: each turn sends the background batch (8 prompts of 16 tokens,
    256 output tokens, the four adapters round robin), then the probe (one prompt of 16 tokens, one
    output token) while the background is still unanswered; the floor names no adapter in either,
    every system gets the same prompts in a round, and the time is the probe's own."""
    from bench.profile_server import interleaved_latency

    seen: list = []
    servers = {name: _fake_generate_server(name, 0.5, seen) for name in ("nolora", "atmm")}
    try:
        urls = {name: f"http://127.0.0.1:{s.server_address[1]}" for name, s in servers.items()}
        started = time.perf_counter()
        out = interleaved_latency(urls, "prefill16_in_decode8", ["a0", "a1", "a2", "a3"], rounds=2, lead_s=0.05)
        elapsed = time.perf_counter() - started
    finally:
        for s in servers.values():
            s.shutdown()
    assert [name for name, _ in seen] == ["nolora", "nolora", "atmm", "atmm", "atmm", "atmm", "nolora", "nolora"]
    backgrounds, probes = seen[0::2], seen[1::2]
    for _, body in backgrounds:
        assert len(body["input_ids"]) == 8 and len(body["input_ids"][0]) == 16
        assert body["sampling_params"]["max_new_tokens"] == 256
    for _, body in probes:
        assert len(body["input_ids"]) == 1 and len(body["input_ids"][0]) == 16
        assert body["sampling_params"]["max_new_tokens"] == 1
    assert all("lora_path" not in body for name, body in seen if name == "nolora")
    assert [body["lora_path"] for name, body in backgrounds if name == "atmm"] == [["a0", "a1", "a2", "a3"] * 2] * 2
    assert [body["lora_path"] for name, body in probes if name == "atmm"] == [["a0"], ["a0"]]
    assert backgrounds[0][1]["input_ids"] == backgrounds[1][1]["input_ids"] != backgrounds[2][1]["input_ids"]
    # Each turn overlaps the two (about 0.55 s; one after the other would take 1.05 s), and the probe,
    # answered 0.5 s after it was sent, is timed from its own sending.
    assert elapsed < 4 * 0.8
    assert out["nolora"]["count"] == out["atmm"]["count"] == 2
    assert 490 <= out["atmm"]["median"] < 1000 and "over_floor" in out["atmm"]


def test_the_lone_small_prefill_sends_one_16_token_request_and_nothing_behind_it() -> None:
    """``prefill16`` is the probe without its background batch: per system and round one request
    of 16 prompt tokens on one adapter, so host samples of the round are that prefill's alone."""
    out, seen = _interleave({"nolora": 0.0, "atmm": 0.0}, "prefill16", rounds=2)
    assert len(seen) == 4  # no background requests
    assert all(len(body["input_ids"]) == 1 and len(body["input_ids"][0]) == 16 for _, body in seen)
    assert all(body["sampling_params"]["max_new_tokens"] == 1 for _, body in seen)
    assert all(body["lora_path"] == ["a0"] for name, body in seen if name == "atmm")
    assert out["atmm"]["over_floor"]["count"] == 2
    from bench.profile_server import DEFAULT_SCENARIOS, SCENARIOS

    assert "prefill16" not in DEFAULT_SCENARIOS and set(DEFAULT_SCENARIOS) <= set(SCENARIOS)  # asked for by name


def test_the_probe_scenario_is_refused_outside_interleaved_rounds() -> None:
    import subprocess
    import sys

    run = subprocess.run([sys.executable, "bench/profile_server.py", "--out", "/nonexistent", "--repeats", "1",
                          "--scenarios", "prefill16_in_decode8"], cwd=REPO, capture_output=True, text=True)
    assert run.returncode == 2 and "timed only in interleaved rounds" in run.stderr
    run = subprocess.run([sys.executable, "bench/profile_server.py", "--out", "/nonexistent", "--repeats", "0",
                          "--interleaved", "3", "--sample-host", "500", "--scenarios", "prefill1",
                          "prefill16_in_decode8"], cwd=REPO, capture_output=True, text=True)
    assert run.returncode == 2 and "timed only in interleaved rounds" in run.stderr  # host samples would count it


def test_the_profiled_atmm_variants_run_the_e2e_harness_flags() -> None:
    """A profile of a variant explains the end-to-end system of the same meaning only if both
    start the server with the same flags: ATMM alone, without the in-GEMM shrink, without the one
    kernel of small eager batches."""
    from bench.profile_server import SYSTEMS

    assert SYSTEMS["atmm"] == ["--plugin", "vlora", "--vlora-policy", "unmerge-only"]
    assert SYSTEMS["atmm_separate_shrink"] == [*SYSTEMS["atmm"], "--vlora-eager-in-gemm-max-tokens", "0"]
    assert SYSTEMS["atmm_no_small_gemm"] == [*SYSTEMS["atmm"], "--vlora-eager-small-gemm-max-tokens", "0"]
