"""bench/stall_probes: the start-up hook logs real garbage collections of a fresh interpreter and
installs Triton's JIT hooks, and the summary reads both kinds of line back."""

from __future__ import annotations

import importlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import triton.language as tl
from triton.runtime.jit import JITFunction

REPO = Path(__file__).resolve().parents[2]
PROBE_DIR = REPO / "bench" / "stall_probes"
# A collection over a few hundred thousand tracked lists: milliseconds on any machine.
GC_WORK = "import gc\nkept = [[i] for i in range(300000)]\ngc.collect()\n"
# Triton cannot compile without a GPU: call the hooks it would call around a compile.
TRITON_WORK = """
from types import SimpleNamespace
from triton import knobs
assert knobs.runtime.jit_cache_hook(key="k", fn=SimpleNamespace(name="_demo_kernel"), is_manual_warmup=False) is None
knobs.runtime.jit_post_compile_hook(key="k", repr="_demo_kernel[num_warps=4](x: *i64)", fn=SimpleNamespace(name="_demo_kernel"),
                                   is_manual_warmup=True)
"""


def _python(code: str, env_extra: dict[str, str]) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("GC_PAUSE_LOG_MS", "TRITON_COMPILE_LOG")}
    env.update(PYTHONPATH=str(PROBE_DIR), **env_extra)
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)


def _probe_module(name: str):
    """One of the folder's scripts, imported as a module."""
    sys.path.insert(0, str(PROBE_DIR))
    try:
        return importlib.import_module(name)
    finally:
        sys.path.remove(str(PROBE_DIR))


def _summary():
    return _probe_module("summary")


def test_logs_each_collection_over_the_threshold_and_the_summary_reads_them(tmp_path: Path) -> None:
    proc = _python(GC_WORK, {"GC_PAUSE_LOG_MS": "0"})
    assert proc.returncode == 0, proc.stderr
    log = tmp_path / "server.log"
    log.write_text("unrelated line\n" + proc.stderr)
    summary = _summary()
    found = summary.pauses(log.read_text())
    assert found and all(p["ms"] >= 0 and p["at"] > 1e9 for p in found)
    assert any(p["generation"] == 2 for p in found)  # the explicit gc.collect()
    result = summary.main([str(log), "--list-ms", "0", "--json", str(tmp_path / "s.json")])[str(log)]
    assert sum(g["count"] for g in result["gc_by_generation"].values()) == len(found) == len(result["long"])
    written = json.loads((tmp_path / "s.json").read_text())
    assert str(log) in written["command"] and written["logs"][str(log)] == result and "git" in written["provenance"]
    assert result["compiles_by_kernel"] == {}
    assert (tmp_path / "s.json").exists()


def test_the_summary_names_the_measured_round_a_pause_fell_in(tmp_path: Path, capsys) -> None:
    proc = _python(GC_WORK, {"GC_PAUSE_LOG_MS": "0"})
    assert proc.returncode == 0, proc.stderr
    summary = _summary()
    at = [p["at"] for p in summary.pauses(proc.stderr)]
    assert at
    # an end-to-end results file: ours measured while the pauses ran, csgmv then and later, one failed
    measurements = [
        {"system": "vlora", "repeat": 1, "status": "ok", "started_at_unix": min(at) - 1, "seconds": max(at) - min(at) + 2},
        {"system": "csgmv", "repeat": 1, "status": "ok", "started_at_unix": min(at) - 1, "seconds": max(at) - min(at) + 2},
        {"system": "vlora", "repeat": 2, "status": "ok", "started_at_unix": max(at) + 100, "seconds": 10.0},
        {"system": "vlora", "repeat": 3, "status": "skipped", "reason": "time budget"},
    ]
    results = tmp_path / "e2e.json"
    results.write_text(json.dumps({"measurements": measurements}))
    ours, idle = tmp_path / "vlora.log", tmp_path / "nolora.log"
    for log in (ours, idle):
        log.write_text(proc.stderr)
    found = summary.main([str(ours), str(idle), "--list-ms", "0", "--rounds", str(results)])
    assert [e["measurement"] for e in found[str(ours)]["long"]] == ["vlora #1"] * len(at)
    assert found[str(ours)]["long_in_measurements"] == len(at)
    # a log named after no system of the call is read against every measurement
    assert {e["measurement"] for e in found[str(idle)]["long"]} == {"vlora #1"}
    assert "during vlora #1" in capsys.readouterr().out
    # the same server measured only later: nothing of it in a measurement
    later = tmp_path / "later.json"
    later.write_text(json.dumps({"measurements": measurements[2:]}))
    moved = summary.main([str(ours), "--list-ms", "0", "--rounds", str(later)])[str(ours)]
    assert moved["long_in_measurements"] == 0 and {e["measurement"] for e in moved["long"]} == {""}
    # without --rounds the summary reads as before
    assert "long_in_measurements" not in summary.main([str(ours), "--list-ms", "0"])[str(ours)]


def test_logs_triton_compiles_through_its_jit_hooks(tmp_path: Path) -> None:
    pytest.importorskip("triton")
    proc = _python(TRITON_WORK, {"TRITON_COMPILE_LOG": "1"})
    assert proc.returncode == 0, proc.stderr
    found = _summary().compiles(proc.stderr)
    assert len(found) == 1 and found[0]["kernel"] == "_demo_kernel" and found[0]["warmup"] and found[0]["ms"] >= 0
    assert found[0]["signature"] == "_demo_kernel[num_warps=4](x: *i64)"


def _two_tuples_kernel(sources, destinations, n, BLOCK: tl.constexpr):
    pass


def _specialization_data(sources: tuple, destinations: tuple) -> str:
    """What Triton records for a launch of ``_two_tuples_kernel`` on an H100/H200, made by Triton's
    own argument binder and serializer (no GPU needed to specialise the arguments)."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import make_backend
    from triton.runtime.jit import create_function_from_signature, serialize_specialization_data

    target = GPUTarget("cuda", 90, 32)
    backend = make_backend(target)
    kernel = JITFunction(_two_tuples_kernel)  # not @triton.jit, which the CPU suite's interpreter replaces
    bound, specialization, _ = create_function_from_signature(kernel.signature, kernel.params, backend)(
        sources, destinations, 5, BLOCK=256)
    options, signature, constants, attrs = kernel._pack_args(backend, {}, bound, specialization, {})
    return serialize_specialization_data("_two_tuples_kernel", signature, constants, attrs, options, "k", target)


def test_the_compile_log_tells_apart_variants_that_differ_in_pointer_alignment() -> None:
    words = torch.zeros(64, dtype=torch.int64)
    small = torch.zeros(8, dtype=torch.int32)
    aligned = _specialization_data((words[:8], small), (small, words[:8]))
    shifted = _specialization_data((words[1:9], small), (small, words[1:9]))  # 8 bytes past 16
    variant_of = _probe_module("sitecustomize").variant_of
    types = "sources=(*i64,*i32) destinations=(*i32,*i64) n=i32 BLOCK=constexpr"
    assert variant_of({"specialization_data": aligned}) == f"{types} div16 sources.0,sources.1,destinations.0,destinations.1"
    assert variant_of({"specialization_data": shifted}) == f"{types} div16 sources.1,destinations.0"
    assert variant_of(None) == variant_of({"specialization_data": "not json"}) == ""

    hooked = TRITON_WORK.replace("is_manual_warmup=True)", f"is_manual_warmup=False, compile={{'specialization_data': {shifted!r}}})")
    proc = _python(hooked, {"TRITON_COMPILE_LOG": "1"})
    assert proc.returncode == 0, proc.stderr
    found = _summary().compiles(proc.stderr)
    assert found[0]["signature"] == "_demo_kernel[num_warps=4](x: *i64)"
    assert found[0]["variant"] == f"{types} div16 sources.1,destinations.0"


def test_without_the_variables_nothing_is_logged_nor_hooked() -> None:
    code = GC_WORK + "import sys\nif 'triton' in sys.modules: raise SystemExit('triton imported')\n"
    proc = _python(code, {})
    assert proc.returncode == 0 and "gc pause:" not in proc.stderr and "triton compile:" not in proc.stderr


def test_a_high_threshold_logs_nothing() -> None:
    proc = _python(GC_WORK, {"GC_PAUSE_LOG_MS": "100000"})
    assert proc.returncode == 0 and "gc pause:" not in proc.stderr


def _spy_runs():
    return _probe_module("spy_runs")


def _recording(tmp_path: Path, samples: list[list[int]]) -> Path:
    frames = [{"name": "event_loop", "file": "/x/sglang/scheduler.py", "line": 10},
              {"name": "forward", "file": "/x/sglang/model.py", "line": 20},
              {"name": "linear", "file": "/x/torch/functional.py", "line": 5},
              {"name": "poll", "file": "/x/zmq/socket.py", "line": 7},
              {"name": "compile", "file": "/x/triton/jit.py", "line": 9}]
    profile = {"type": "sampled", "name": 'Thread 1 "MainThread"', "unit": "seconds", "samples": samples,
               "weights": [0.01] * len(samples)}
    path = tmp_path / "spy.json"
    path.write_text(json.dumps({"shared": {"frames": frames}, "profiles": [profile]}))
    return path


def test_spy_runs_finds_the_long_stretch_on_one_code_path_and_skips_idle_waits(tmp_path: Path) -> None:
    # moving between code paths every few samples (the path is the sglang frames only)
    working = [[0, 1, 2]] * 3 + [[0, 2]] * 2
    stalled = [[0, 1, 4]] * 40  # 400 ms in one call under forward
    idle = [[0, 3]] * 80  # a long wait for requests: not a stall
    path = _recording(tmp_path, working + stalled + working[::-1] + idle)
    result = _spy_runs().main([str(path), "--min-ms", "100", "--json", str(tmp_path / "runs.json")])
    (found,) = result.values()
    assert len(found) == 1
    assert found[0]["samples"] == 40 and found[0]["ms"] == 400.0 and found[0]["began_s"] == 0.05
    assert found[0]["stack"][-1].startswith("compile (jit.py:9)")


def test_spy_runs_reads_a_real_py_spy_recording(tmp_path: Path) -> None:
    if shutil.which("py-spy") is None:
        pytest.skip("py-spy is not on PATH")
    script = tmp_path / "stall_demo.py"
    script.write_text("import time\n\ndef stall():\n    t = time.perf_counter()\n"
                      "    while time.perf_counter() - t < 0.5:\n        pass\n\nstall()\n")
    out = tmp_path / "demo.json"
    proc = subprocess.run(["py-spy", "record", "--idle", "--nonblocking", "--rate", "100", "--format", "speedscope",
                           "-o", str(out), "--", sys.executable, str(script)], capture_output=True, text=True,
                          timeout=120)
    if proc.returncode != 0:
        pytest.skip(f"py-spy cannot record here: {proc.stderr.strip()[-200:]}")
    found = [r for runs in _spy_runs().main([str(out), "--code-marker", "stall_demo", "--min-ms", "200"]).values()
             for r in runs]
    assert found and any("stall (stall_demo.py" in line for line in found[0]["stack"])


def test_a_threshold_that_is_no_number_is_said_and_the_process_still_runs() -> None:
    proc = _python(GC_WORK + "print('ran')\n", {"GC_PAUSE_LOG_MS": "fast"})
    assert proc.returncode == 0 and proc.stdout.strip() == "ran"
    assert "GC_PAUSE_LOG_MS='fast' is not a number" in proc.stderr and "gc pause: pid" not in proc.stderr


def _refused(module: str, argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as exit_info:
        _probe_module(module).main(argv)
    assert exit_info.value.code == 2
    return capsys.readouterr().err


def test_the_readers_refuse_bad_input_with_a_clear_message(tmp_path: Path, capsys) -> None:
    log = tmp_path / "server.log"
    log.write_text("no probe lines\n")
    assert "no such log file" in _refused("summary", [str(tmp_path / "absent.log")], capsys)
    assert "ending in .json" in _refused("summary", [str(log), "--json", str(tmp_path / "s.txt")], capsys)
    assert "--list-ms must be at least 0" in _refused("summary", [str(log), "--list-ms", "-1"], capsys)
    assert "not a readable JSON results file" in _refused("summary", [str(log), "--rounds", str(log)], capsys)
    assert "not a readable JSON results file" in _refused("summary", [str(log), "--rounds", str(tmp_path / "absent.json")],
                                                          capsys)
    no_rounds = tmp_path / "no_rounds.json"
    for body in ({"measurements": [{"system": "vlora", "repeat": 0, "status": "failed"}]}, [1, 2]):
        no_rounds.write_text(json.dumps(body))
        assert "no measurement that ran" in _refused("summary", [str(log), "--rounds", str(no_rounds)], capsys)
    garbage = tmp_path / "spy.json.gz"
    garbage.write_bytes(b"not gzip")
    assert "not a readable speedscope JSON recording" in _refused("spy_runs", [str(garbage)], capsys)
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"samples": []}))
    assert "not a speedscope recording" in _refused("spy_runs", [str(other)], capsys)
    assert "--top must be at least 1" in _refused("spy_runs", [str(other), "--top", "0"], capsys)
    assert "no folder" in _refused("spy_runs", [str(other), "--json", str(tmp_path / "absent" / "r.json")], capsys)


@pytest.mark.parametrize("args", [["scheduler", "0", "out.json"], ["scheduler", "10", "out.json", "fast"]])
def test_spy_on_refuses_counts_that_are_no_positive_whole_numbers(args: list[str], tmp_path: Path) -> None:
    proc = subprocess.run(["bash", str(PROBE_DIR / "spy_on.sh"), *args[:2], str(tmp_path / args[2]), *args[3:]],
                          capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2 and "whole numbers above 0" in proc.stderr
