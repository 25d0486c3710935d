"""Where a LoRA server's time goes: SGLang's torch profiler around fixed batches, per system.

    python bench/profile_server.py --out DIR [--systems nolora csgmv atmm] [--scenarios ...]

Starts one server per system on a Qwen2-VL-7B-shaped model (``--load-format dummy``) with
four rank-64 q/k/v/o adapters, all servers at once on the one GPU (start-up is mostly
imports), then profiles them one at a time, so no two servers compute together. Each
scenario is one profiled window (``/start_profile`` .. ``/stop_profile``) around a fixed
batch:

* ``prefill1``: one request of 1024 prompt tokens, one adapter, one output token;
* ``prefill4``: four requests of 256 tokens, four adapters, in one prefill forward;
* ``decode8`` / ``decode32``: 8 / 32 requests of 16 tokens, four adapters round robin,
  64 output tokens; only the decode steps are analysed (CUDA-graph replays);
* ``prefill1_base``: ``prefill1`` without an adapter, on every server: what a LoRA server's
  forward costs when no request in it uses an adapter;
* ``prefill16`` (by name only): one request of 16 tokens, one adapter, one output token, alone:
  the decode workloads' eager prefill of a new request without the decode batch around it, so
  that ``--sample-host`` can attribute its host time (which it cannot beside a background batch);
* ``prefill16_in_decode8`` (``--interleaved`` only): one request of 16 tokens, one adapter, one
  output token, sent while 8 others of 16 tokens (four adapters, 256 output tokens) decode: what
  a new request's eager prefill costs when it interrupts a running decode batch, which is most
  of the 16 in / 64 out workload's LoRA cost (docs/perf.md, "What the timelines show"). Its
  latency is the probe's alone; the background batch is the same in every system's turn.

The trace of each window is summarised (:func:`summarise`): GPU time per kernel category
(base GEMMs, LoRA kernels, attention, copies, other), the GPU's idle time inside the
window, the host calls that wait for the GPU (synchronisations, blocking copies), per
decode step the replay span and the gap to the next step, and per prefill forward the host
time of each decoder layer's base linears (``linear_host_us``). Writes ``DIR/profile.json`` and
prints a table; the raw traces stay in ``DIR/traces``.

The profiler's own host overhead distorts host-bound forwards (a prefill of this
environment's unfused model), so ``--latency N`` also times N requests of each scenario
one after another without the profiler (median and spread of the client's latency): the
LoRA cost of one request that does not queue behind others, per system. For plugin
systems the orchestrator's cost model (``/vlora/status``) is read after the scenarios and
its iteration fits are evaluated at each scenario's batch, next to the profile's time for
the same batch (``cost_model_check``): the fits are measured while serving, the profile
by the profiler, and the two should agree within 25%.

The machine's speed drifts: on the benchmark H200 the same server's forward took 10-15 ms
longer in one minute than in the next (``bench/results/e2e_forward_times_h200.json``), more
than a LoRA forward costs. ``--interleaved N`` therefore times N rounds in which every
system, in turn, answers one batch of each scenario (the order rotated each round), so a
drift hits every system alike, and gives per LoRA system its per-round excess over the
floor's (``interleaved_latency``). ``--repeats 0`` skips the profiles.

``--sample-host RATE`` samples, during each interleaved scenario, every server's scheduler
with py-spy (on PATH) at RATE per second, without the torch profiler's per-op overhead, and
adds ``bench/host_samples.py``'s comparison of its host time per function and request to the
results (``host_samples``; raw samples in ``DIR/spy_<system>_<scenario>.txt``). System
``nolora2`` is a second server without LoRA, a control: what two identical servers differ
by on this machine. The servers run ATMM's module calls inside named profiler ranges
(``SGLANG_VLORA_PROFILE_RANGES=1``) unless the caller's environment sets it to 0, as the
end-to-end servers run; the results record which (``server_env``).
"""

from __future__ import annotations

import argparse
import bisect
import datetime
import gzip
import json
import os
import random
import re
import shlex
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import httpx

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench import e2e_assets, provenance  # noqa: E402
from bench.e2e import plan  # noqa: E402
from sglang_vlora.orchestrator.iteration_fit import IterationFit  # noqa: E402

T = TypeVar("T")
RANK = 64
N_ADAPTERS = 4
KV_TOKENS = 65536
# ATMM's variants start their servers as the end-to-end systems of the same meaning do, so that a
# profile explains those systems: their flags come from the e2e plan.
SYSTEMS = {
    "nolora": [],
    "nolora2": [],  # a second floor: the control
    "csgmv": ["--lora-backend", "csgmv"],
    "triton": ["--lora-backend", "triton"],
    "atmm": plan.SYSTEMS["unmerge_only"].flags(),
    # the same server with ATMM's prepared launches through Triton's launcher, not the driver
    "atmm_triton_launch": plan.SYSTEMS["unmerge_only"].flags(),
    # the same server with eager batches' shrink as its own kernel, not inside the base GEMM
    "atmm_separate_shrink": plan.SYSTEMS["unmerge_only_separate_shrink"].flags(),
    # the same server without the one kernel of small eager batches (the eager path before bef3295)
    "atmm_no_small_gemm": plan.SYSTEMS["unmerge_only_no_small_gemm"].flags(),
    "vlora": ["--plugin", "vlora"],
}
SYSTEM_ENV = {"atmm_triton_launch": {"SGLANG_VLORA_DIRECT_LAUNCH": "0"}}
GPU_FLAGS = ["--attention-backend", "triton", "--sampling-backend", "pytorch", "--mm-attention-backend", "sdpa"]
SCENARIOS = {
    # name: (requests, prompt tokens each, output tokens, adapters used)
    "prefill1": (1, 1024, 1, 1),
    "prefill4": (4, 256, 1, 4),
    "decode8": (8, 16, 64, 4),
    "decode32": (32, 16, 64, 4),
    "prefill1_base": (1, 1024, 1, 0),  # no adapter, also on the LoRA servers
    "prefill16": (1, 16, 1, 1),
    "prefill16_in_decode8": (1, 16, 1, 1),  # prefill16 as the probe; its background batch is in BACKGROUND
}
# Run when --scenarios is not given: the profile's own set (prefill16 and the probe are asked for by name).
DEFAULT_SCENARIOS = ("prefill1", "prefill4", "decode8", "decode32", "prefill1_base")
# Scenarios whose batch is sent while another decodes: (requests, prompt tokens, output tokens)
# of that background batch, its requests on the adapters round robin. Timed in interleaved rounds
# only (a profiled window or a latency run of the probe alone would not have it).
BACKGROUND = {"prefill16_in_decode8": (8, 16, 256)}
# How long the background batch runs before the probe is sent: past its prefill (a 16-token
# eager prefill is 40-80 ms on the H200 server) and into its decode steps (256 of them, 2-3 s).
BACKGROUND_LEAD_S = 0.5
CATEGORIES = (
    ("lora", re.compile(r"lora|shrink|expand|sgmv|atmm", re.I)),
    ("gemm", re.compile(r"gemm|cutlass|xmma|nvjet|cublas|sm90_|sm80_|ampere_|hopper", re.I)),
    ("attention", re.compile(r"attn|attention|flash|_fwd_kernel|_fwd_grouped|decode_|extend", re.I)),
    ("copy", re.compile(r"memcpy|memset|copy", re.I)),
)
# A Qwen2 decoder layer's base linears, in the order its forward calls them.
LAYER_LINEARS = ("qkv", "o", "gate_up", "down")
LINEAR_CHILDREN = 12  # nested host events kept per base linear (linear_host_us)
SYNC_CALLS = re.compile(r"cudaStreamSynchronize|cudaDeviceSynchronize|cudaEventSynchronize|cudaMemcpy(?!Async)")


def category(name: str) -> str:
    for label, pattern in CATEGORIES:
        if pattern.search(name):
            return label
    return "other"


# ------------------------------------------------------------------------- servers
def entry_point_dir(root: Path) -> Path:
    """A dist-info that declares the plugin's entry point (source on PYTHONPATH only)."""
    info = root / "sglang_vlora-0.1.0.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: sglang-vlora\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text("[sglang.srt.plugins]\nvlora = sglang_vlora.plugin:register\n")
    return root


def is_floor(name: str) -> bool:
    """A system without LoRA (``nolora`` and its control ``nolora2``)."""
    return name.startswith("nolora")


def start_server(name: str, model: Path, adapters: dict[str, Path], port: int, log: Path,
                 mem_fraction: float, extra: list[str]) -> subprocess.Popen:
    # Servers start at once: each one's free-memory reading may come after another loaded its
    # weights, so the KV pool is sized in tokens and the fraction only has to pass SGLang's check.
    cmd = [sys.executable, "-m", "sglang.launch_server", "--model-path", str(model), "--load-format", "dummy",
           "--host", "127.0.0.1", "--port", str(port), "--mem-fraction-static", str(mem_fraction),
           "--max-total-tokens", str(KV_TOKENS), "--cuda-graph-max-bs-decode", "32",
           "--max-running-requests", "64", *GPU_FLAGS]
    if not is_floor(name):
        cmd += ["--lora-paths", *[f"{n}={p}" for n, p in adapters.items()],
                "--max-lora-rank", str(RANK), "--max-loras-per-batch", str(N_ADAPTERS)]
    cmd += SYSTEMS[name] + extra
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO), str(entry_point_dir(log.parent / "ep")),
                                         env.get("PYTHONPATH", "")])
    env.setdefault("SGLANG_PROFILE_WITH_STACK", "false")
    env.setdefault("SGLANG_PROFILE_RECORD_SHAPES", "false")
    env.setdefault("SGLANG_VLORA_PROFILE_RANGES", "1")
    env.update(SYSTEM_ENV.get(name, {}))
    with open(log, "w") as out:
        out.write("$ " + shlex.join(cmd) + "\n")
        out.flush()
        return subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)


def wait_healthy(url: str, process: subprocess.Popen, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"server {url} exited with {process.returncode}")
        try:
            if httpx.get(url + "/health", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(2)
    raise RuntimeError(f"server {url} not healthy after {timeout_s} s")


def scheduler_pid(process: subprocess.Popen) -> int:
    """The pid of a server's scheduler process (SGLang titles it ``sglang::scheduler...``)."""
    import psutil

    for child in psutil.Process(process.pid).children(recursive=True):
        try:
            if "sglang::scheduler" in " ".join(child.cmdline()):
                return child.pid
        except psutil.Error:
            continue
    raise RuntimeError(f"no scheduler process under server pid {process.pid}")


def start_samplers(pids: dict[str, int], rate: int, out: Path, scenario: str) -> dict[str, subprocess.Popen]:
    """One py-spy per server's scheduler (non-blocking, per-thread raw stacks)."""
    return {name: subprocess.Popen(["py-spy", "record", "--pid", str(pid), "--rate", str(rate), "--nonblocking",
                                    "--threads", "--format", "raw", "--output", str(out / f"spy_{name}_{scenario}.txt")],
                                   stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
            for name, pid in pids.items()}


def stop_samplers(samplers: dict[str, subprocess.Popen], timeout_s: float = 60.0) -> None:
    """SIGINT makes py-spy write its samples and exit."""
    for sampler in samplers.values():
        sampler.send_signal(signal.SIGINT)
    for name, sampler in samplers.items():
        if sampler.wait(timeout=timeout_s) != 0:
            raise RuntimeError(f"py-spy on {name}'s scheduler exited with {sampler.returncode}")


# ------------------------------------------------------------------------- requests
def batch_payload(n: int, prompt: int, output: int, adapters: int, names: list[str] | None,
                  rng: random.Random) -> dict:
    ids = [[rng.randrange(1000, 20000) for _ in range(prompt)] for _ in range(n)]
    payload = {
        "input_ids": ids,
        "sampling_params": {"max_new_tokens": output, "min_new_tokens": output, "temperature": 0.0},
    }
    if names and adapters:
        payload["lora_path"] = lora_paths(names, adapters, n)
    return payload


def lora_paths(names: list[str], adapters: int, n: int) -> list[str]:
    """The adapters of ``n`` requests: the first ``adapters`` of ``names``, round robin."""
    return [names[i % adapters] for i in range(n)]


def run_batch(url: str, payload: dict) -> float:
    started = time.perf_counter()
    r = httpx.post(url + "/generate", json=payload, timeout=600)
    r.raise_for_status()
    return time.perf_counter() - started


def latency_ms(url: str, scenario: str, names: list[str] | None, rng: random.Random, count: int) -> dict:
    """Client latency of ``count`` requests of ``scenario`` sent one after another, unprofiled."""
    n, prompt, output, adapters = SCENARIOS[scenario]
    samples = sorted(1000 * run_batch(url, batch_payload(n, prompt, output, adapters, names, rng))
                     for _ in range(count))
    def quantile(q: float) -> float:
        return samples[min(len(samples) - 1, int(q * len(samples)))]
    return {"count": count, "median": quantile(0.5), "p10": quantile(0.1), "p90": quantile(0.9),
            "mean": sum(samples) / count}


def _quantiles(samples: list[float]) -> dict:
    ordered = sorted(samples)

    def at(q: float) -> float:
        return round(ordered[min(len(ordered) - 1, int(q * len(ordered)))], 2)

    return {"count": len(ordered), "median": at(0.5), "p10": at(0.1), "p25": at(0.25), "p75": at(0.75),
            "p90": at(0.9), "mean": round(sum(ordered) / len(ordered), 2)}


def _with_adapters(plain: dict, name: str, names: list[str], adapters: int) -> dict:
    """``plain`` with its requests on ``adapters`` of ``names`` round robin; unchanged for a floor."""
    if is_floor(name) or not adapters:
        return plain
    return {**plain, "lora_path": lora_paths(names, adapters, len(plain["input_ids"]))}


def _during(url: str, background: dict, lead_s: float, probe: dict) -> float:
    """Seconds ``probe`` took, sent ``lead_s`` after ``background`` (which is still answered:
    its thread is joined, and an error in it raises here)."""
    errors: list[BaseException] = []

    def send() -> None:
        try:
            run_batch(url, background)
        except BaseException as e:  # noqa: BLE001 (re-raised in the caller's thread)
            errors.append(e)

    thread = threading.Thread(target=send)
    thread.start()
    time.sleep(lead_s)
    seconds = run_batch(url, probe)
    thread.join()
    if errors:
        raise errors[0]
    return seconds


def interleaved_latency(urls: dict[str, str], scenario: str, names: list[str], rounds: int,
                        floor: str = "nolora", seed: int = 0, lead_s: float = BACKGROUND_LEAD_S) -> dict:
    """Client latency of one batch of ``scenario`` per system and round, the systems taking
    turns (the order rotated every round; every system gets the same prompt in a round), and
    per LoRA system its excess over the floor's in the same round. A scenario with a
    :data:`BACKGROUND` batch sends that first and its own batch ``lead_s`` later, and times
    its own batch only."""
    rng = random.Random(seed)
    systems = list(urls)
    samples: dict[str, list[float]] = {name: [] for name in systems}
    n, prompt, output, adapters = SCENARIOS[scenario]
    for r in range(rounds):
        plain = batch_payload(n, prompt, output, adapters, None, rng)
        behind = None
        if scenario in BACKGROUND:
            bn, bprompt, boutput = BACKGROUND[scenario]
            behind = batch_payload(bn, bprompt, boutput, N_ADAPTERS, None, rng)
        turn = r % len(systems)
        for name in systems[turn:] + systems[:turn]:
            batch = _with_adapters(plain, name, names, adapters)
            if behind is None:
                seconds = run_batch(urls[name], batch)
            else:
                seconds = _during(urls[name], _with_adapters(behind, name, names, N_ADAPTERS), lead_s, batch)
            samples[name].append(1000 * seconds)
    out = {name: _quantiles(values) for name, values in samples.items()}
    if floor in samples:
        for name in systems:
            if name != floor:
                out[name]["over_floor"] = _quantiles([a - b for a, b in zip(samples[name], samples[floor],
                                                                              strict=True)])
    return out


TIME_STATS_FLAG = "--enable-request-time-stats-logging"


def add_server_forward_times(interleaved: dict, logs: dict[str, list[str]]) -> None:
    """Put each server's own ``forward_duration`` of the interleaved requests (SGLang's request
    time stats, logged with :data:`TIME_STATS_FLAG`) next to the client's latency, as
    ``server_forward_ms`` and, for LoRA systems, ``server_forward_over_floor_ms`` (the median's
    excess). The interleaved requests are the last ones each server logged, scenario after
    scenario in ``interleaved``'s order."""
    from bench.forward_times import TIME_STATS

    for name, lines in logs.items():
        forwards = [float(m["forward"]) for m in map(TIME_STATS.search, lines)
                    if m and not m["rid"].startswith("HEALTH_CHECK")]
        sizes = [(SCENARIOS[sc][0] + BACKGROUND.get(sc, (0,))[0]) * interleaved[sc][name]["count"]
                 for sc in interleaved if name in interleaved[sc]]
        if len(forwards) < sum(sizes):
            raise ValueError(f"server {name} logged {len(forwards)} request time stats, the interleaved rounds sent "
                             f"{sum(sizes)} requests (was it started with {TIME_STATS_FLAG}?)")
        start = len(forwards) - sum(sizes)
        for scenario, size in zip((sc for sc in interleaved if name in interleaved[sc]), sizes, strict=True):
            if scenario not in BACKGROUND:  # there a request's forward spans the background's steps
                interleaved[scenario][name]["server_forward_ms"] = _quantiles(forwards[start:start + size])
            start += size
    for systems in interleaved.values():
        floor = systems.get("nolora", {}).get("server_forward_ms")
        for name, entry in systems.items():
            if name != "nolora" and floor and "server_forward_ms" in entry:
                entry["server_forward_over_floor_ms"] = round(entry["server_forward_ms"]["median"] - floor["median"], 2)


def _read_log(path: Path) -> list[str]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", errors="replace") as f:
        return f.read().splitlines()


def profiled(url: str, trace_dir: Path, label: str, send: Callable[[], T]) -> tuple[Path, T]:
    """``send()`` inside one window of SGLang's torch profiler (``/start_profile`` ..
    ``/stop_profile``); the window's trace file and what ``send`` returned."""
    trace_dir.mkdir(parents=True, exist_ok=True)
    prefix = f"{label}-{int(time.time() * 1000)}"
    before = set(trace_dir.glob("*"))
    body = {"output_dir": str(trace_dir), "activities": ["CPU", "GPU"], "with_stack": False,
            "record_shapes": False, "profile_prefix": prefix}
    httpx.post(url + "/start_profile", json=body, timeout=60).raise_for_status()
    result = send()
    httpx.post(url + "/stop_profile", timeout=300).raise_for_status()
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        new = [p for p in set(trace_dir.glob("*")) - before if prefix in p.name and p.stat().st_size > 0]
        if new:
            time.sleep(1.0)  # let the writer finish
            return sorted(new)[0], result
        time.sleep(0.5)
    raise RuntimeError(f"no trace for {label} in {trace_dir}")


def profile_scenario(url: str, scenario: str, names: list[str] | None, trace_dir: Path,
                     rng: random.Random) -> tuple[Path, float]:
    n, prompt, output, adapters = SCENARIOS[scenario]
    payload = batch_payload(n, prompt, output, adapters, names, rng)
    return profiled(url, trace_dir, scenario, lambda: run_batch(url, payload))


# ------------------------------------------------------------------------- analysis
def load_events(path: Path) -> list[dict]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as f:
        data = json.load(f)
    return data["traceEvents"] if isinstance(data, dict) else data


def union_us(intervals: list[tuple[float, float]]) -> float:
    total, end = 0.0, float("-inf")
    for start, stop in sorted(intervals):
        if stop <= end:
            continue
        total += stop - max(start, end)
        end = stop
    return total


def summarise(events: list[dict], decode: bool) -> dict:
    """Times in microseconds. Decode windows are reduced to the CUDA-graph replays' kernels."""
    kernels = [e for e in events if e.get("ph") == "X" and e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    runtime = [e for e in events if e.get("ph") == "X" and e.get("cat") == "cuda_runtime"]
    graph_corr = {e["args"].get("correlation") for e in runtime if e["name"] == "cudaGraphLaunch"}
    in_graphs = [k for k in kernels if k.get("args", {}).get("correlation") in graph_corr]
    graph_matched = bool(in_graphs)
    if decode and graph_matched:
        kernels = in_graphs
    if not kernels:
        return {"kernels": 0}
    by_corr: dict[int, list[dict]] = defaultdict(list)
    for k in kernels:
        by_corr[k["args"].get("correlation")].append(k)
    steps = sorted(by_corr.values(), key=lambda ks: min(k["ts"] for k in ks))
    if not (decode and graph_matched):
        steps = [kernels]
    per_cat: dict[str, float] = defaultdict(float)
    counts: dict[str, int] = defaultdict(int)
    names: dict[str, float] = defaultdict(float)
    for k in kernels:
        cat = category(k["name"]) if k.get("cat") == "kernel" else "copy"
        per_cat[cat] += k["dur"]
        counts[cat] += 1
        names[k["name"][:90]] += k["dur"]
    spans = [(min(k["ts"] for k in ks), max(k["ts"] + k["dur"] for k in ks)) for ks in steps]
    busy = [union_us([(k["ts"], k["ts"] + k["dur"]) for k in ks]) for ks in steps]
    periods = [b[0] - a[0] for a, b in zip(spans, spans[1:], strict=False)]
    window = (spans[0][0], spans[-1][1])
    syncs = [e for e in runtime if SYNC_CALLS.search(e["name"]) and window[0] <= e["ts"] <= window[1]]
    vlora = defaultdict(float)
    for e in events:
        if e.get("ph") == "X" and str(e.get("name", "")).startswith("vlora."):
            if window[0] - 50_000 <= e["ts"] <= window[1]:
                vlora[e["name"]] += e["dur"]
    cpu: dict[str, float] = defaultdict(float)
    for e in events:
        if e.get("ph") == "X" and e.get("cat") in ("cpu_op", "cuda_runtime", "cuda_driver", "user_annotation"):
            if window[0] <= e["ts"] <= window[1]:
                cpu[f'{e["cat"]}:{e["name"][:60]}'] += e["dur"]
    n = len(steps)
    return {
        "window_us": window[1] - window[0],
        "linear_host_us": None if decode else linear_host_us(events, window),
        "top_host_us_per_step": dict(sorted(((k, v / n) for k, v in cpu.items()), key=lambda kv: -kv[1])[:20]),
        "steps": n,
        "graph_replays_matched": graph_matched,
        "kernels_per_step": len(kernels) / n,
        "gpu_us_per_step": {c: per_cat[c] / n for c in sorted(per_cat)},
        "kernels_per_step_by_category": {c: counts[c] / n for c in sorted(counts)},
        "span_us_per_step": sum(b - a for a, b in spans) / n,
        "busy_us_per_step": sum(busy) / n,
        "period_us": (sum(periods) / len(periods)) if periods else None,
        "sync_calls_per_step": len(syncs) / n,
        "sync_call_names": sorted({e["name"] for e in syncs}),
        "vlora_host_us_per_step": {k: v / n for k, v in vlora.items()},
        "top_kernels_us_per_step": dict(sorted(((k, v / n) for k, v in names.items()), key=lambda kv: -kv[1])[:12]),
    }


def linear_host_us(events: list[dict], window: tuple[float, float]) -> dict[str, dict] | None:
    """Host microseconds of the base linears (``aten::linear``, outermost calls) started inside
    ``window``, per module of a decoder layer (:data:`LAYER_LINEARS`, by position): median and
    mean over the layers, and ``children_us``: the median per call of the host events nested in
    it on its thread (torch ops, CUDA runtime and driver calls, by category and name; the
    :data:`LINEAR_CHILDREN` largest), which says where a slower call's time goes. None when the
    calls do not come in whole layers (not a Qwen2 forward)."""
    calls = sorted((e for e in events if e.get("ph") == "X" and e.get("cat") == "cpu_op"
                    and e.get("name") == "aten::linear" and window[0] <= e["ts"] <= window[1]),
                   key=lambda e: e["ts"])
    outer, end = [], float("-inf")
    for e in calls:
        if e["ts"] >= end:
            outer.append(e)
            end = e["ts"] + e["dur"]
    per_layer = len(LAYER_LINEARS)
    if not outer or len(outer) % per_layer:
        return None
    host_cats = ("cpu_op", "cuda_runtime", "cuda_driver")
    nested = sorted((e for e in events if e.get("ph") == "X" and e.get("cat") in host_cats
                     and window[0] <= e["ts"] <= window[1] and e.get("name") != "aten::linear"),
                    key=lambda e: e["ts"])
    starts = [e["ts"] for e in nested]
    result, layers = {}, len(outer) // per_layer
    for i, name in enumerate(LAYER_LINEARS):
        mine = outer[i::per_layer]
        children: dict[str, list[float]] = defaultdict(lambda: [0.0] * layers)
        for j, call in enumerate(mine):
            stop = call["ts"] + call["dur"]
            for e in nested[bisect.bisect_left(starts, call["ts"]):bisect.bisect_right(starts, stop)]:
                if e.get("tid") == call.get("tid") and e["ts"] + e["dur"] <= stop:
                    children[f'{e["cat"]}:{e["name"][:60]}'][j] += e["dur"]
        medians = {k: statistics.median(v) for k, v in children.items()}
        result[name] = {"median": statistics.median(c["dur"] for c in mine),
                        "mean": statistics.fmean(c["dur"] for c in mine),
                        "children_us": dict(sorted(medians.items(), key=lambda kv: -kv[1])[:LINEAR_CHILDREN])}
    return result


_FIT_FIELDS = ("fixed_s", "prefill_forward_s", "prefill_token_s", "decode_request_s")  # as /vlora/status names them


def cost_model_check(status: dict, profiled: dict) -> dict:
    """The orchestrator's fitted iteration time per mode at each profiled scenario's batch
    (a prefill forward of its prompt tokens, or a decode step of its requests) against the
    profile's forward span (prefill) or step period (decode), in milliseconds."""
    model = status.get("orchestrator", {}).get("cost_model", {})
    fits = model.get("iteration_fits", {})
    rows = {}
    for scenario, summary in profiled.items():
        n, prompt, _, _ = SCENARIOS[scenario]
        decode = scenario.startswith("decode")
        measured = summary.get("period_us") if decode else summary.get("span_us_per_step")
        tokens, requests = (0, n) if decode else (n * prompt, 0)
        for mode, reported in fits.items():
            fit = IterationFit(*(reported.get(f, 0.0) for f in _FIT_FIELDS), reported.get("samples", 0))
            predicted = fit.seconds(tokens, requests)
            rows[f"{scenario}/{mode}"] = {
                "samples": fit.samples, "fit_ms": 1e3 * predicted,
                "profile_ms": None if measured is None else measured / 1e3,
                "fit_over_profile": None if not measured else 1e6 * predicted / measured,
            }
    return {"cost_model": model, "rows": rows}


def _count(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be >= 0, got {value}")
    return value


# ------------------------------------------------------------------------- main
def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--systems", nargs="+", default=["nolora", "csgmv", "atmm"], choices=list(SYSTEMS))
    ap.add_argument("--scenarios", nargs="+", default=list(DEFAULT_SCENARIOS),
                    choices=list(SCENARIOS))
    ap.add_argument("--repeats", type=_count, default=2,
                    help="profiled windows per scenario (the last is summarised in full, every one's host "
                         "figures in repeat_windows); 0: no profile")
    ap.add_argument("--interleaved", type=_count, default=0,
                    help="also time this many rounds of one unprofiled batch per system and scenario, "
                         "the systems taking turns")
    ap.add_argument("--latency", type=_count, default=0,
                    help="also time this many unprofiled requests of each scenario, one after another")
    ap.add_argument("--mem-fraction", type=float, default=0.7, help="--mem-fraction-static of every server")
    ap.add_argument("--extra", default="", help="extra server flags for every system")
    ap.add_argument("--sample-host", type=_count, default=0, metavar="RATE",
                    help="during each interleaved scenario, sample every server's scheduler with py-spy at RATE/s")
    ap.add_argument("--reread", type=Path, metavar="PROFILE_JSON",
                    help="run nothing: add the server logs' forward times (in --out, server_<system>.log[.gz]) "
                         "to this earlier run's interleaved latency, into --out/profile.json")
    args = ap.parse_args()
    if args.latency and args.repeats == 0:
        ap.error("--latency times requests before each profile: it needs --repeats > 0 (or use --interleaved)")
    if args.sample_host and not args.interleaved:
        ap.error("--sample-host samples the interleaved rounds: it needs --interleaved > 0")
    during = [s for s in args.scenarios if s in BACKGROUND]
    if during and (args.repeats or args.latency or args.sample_host):
        ap.error(f"{', '.join(during)}: timed only in interleaved rounds, beside its background batch "
                 "(--repeats 0 --interleaved N, no --latency or --sample-host)")
    if args.sample_host and shutil.which("py-spy") is None:
        ap.error("--sample-host needs py-spy on PATH (pip install py-spy)")
    args.out.mkdir(parents=True, exist_ok=True)
    if args.reread:
        reread(args.reread, args.out)
        return
    work = Path(tempfile.mkdtemp(prefix="vlora_profile_"))
    tiny = e2e_assets.tiny_model(work / "tiny")
    model = e2e_assets.qwen2vl_7b_model(work / "qwen2vl7b", tiny)
    adapters = e2e_assets.adapter_pool(model, work / "adapters", N_ADAPTERS, [RANK], heads=False,
                                       dtype=__import__("torch").bfloat16)
    names = list(adapters)
    fraction = args.mem_fraction
    servers = {}
    for i, name in enumerate(args.systems):
        port = 31000 + i
        log = args.out / f"server_{name}.log"
        servers[name] = (f"http://127.0.0.1:{port}",
                         start_server(name, model, adapters, port, log, fraction, shlex.split(args.extra)))
    results: dict = {"systems": {}, "cost_model": {}, "scenarios": {k: dict(zip(("requests", "prompt", "output", "adapters"), v,
                                                              strict=True)) for k, v in SCENARIOS.items()}}
    for scenario, background in BACKGROUND.items():
        results["scenarios"][scenario]["background"] = dict(zip(("requests", "prompt", "output"), background,
                                                                strict=True))
    try:
        for url, process in servers.values():
            wait_healthy(url, process, 900)
        for name, (url, _) in servers.items():
            rng = random.Random(0)
            lora_names = None if is_floor(name) else names
            for scenario in args.scenarios:  # warm-up: Triton JIT, graph replays, tile look-ups
                n, prompt, output, adapters_used = SCENARIOS[scenario]
                run_batch(url, batch_payload(n, prompt, min(output, 8), adapters_used, lora_names, rng))
            trace_dir = args.out / "traces" / name
            trace_dir.mkdir(parents=True, exist_ok=True)
            results["systems"][name] = {}
            for scenario in args.scenarios if args.repeats > 0 else ():
                latency = latency_ms(url, scenario, lora_names, rng, args.latency) if args.latency else None
                windows = [profile_scenario(url, scenario, lora_names, trace_dir, rng) for _ in range(args.repeats)]
                trace, seconds = windows[-1]
                summaries = [summarise(load_events(path), decode=scenario.startswith("decode")) for path, _ in windows]
                summary = summaries[-1]
                # Every window's host figures: the host's speed changes from one window to the next.
                summary["repeat_windows"] = [{key: s.get(key) for key in ("window_us", "linear_host_us")}
                                             for s in summaries]
                summary["request_s"] = seconds
                if latency:
                    summary["latency_ms"] = latency
                summary["trace"] = str(trace.relative_to(args.out))
                results["systems"][name][scenario] = summary
                print(name, scenario, json.dumps(summary)[:400], flush=True)
            if "--plugin" in SYSTEMS[name] and args.repeats > 0:
                status = httpx.get(url + "/vlora/status", timeout=30).json()
                results["cost_model"][name] = cost_model_check(status, results["systems"][name])
        if args.interleaved:
            urls = {name: url for name, (url, _) in servers.items()}
            pids = {name: scheduler_pid(process) for name, (_, process) in servers.items()} if args.sample_host else {}
            results["interleaved_latency"] = {}
            if pids:
                results["host_samples"] = {}
            for scenario in args.scenarios:
                samplers = start_samplers(pids, args.sample_host, args.out, scenario) if pids else {}
                time.sleep(2.0 if samplers else 0.0)  # py-spy attached before the first request
                results["interleaved_latency"][scenario] = interleaved_latency(urls, scenario, names, args.interleaved)
                if samplers:
                    stop_samplers(samplers)
                    results["host_samples"][scenario] = sampled_host_time(args.out, scenario, list(pids),
                                                                          args.sample_host, args.interleaved)
            # Which layouts the plugin's servers ran their batches in (eager, eager_in_gemm, graphs).
            results["lora_batches"] = {name: httpx.get(url + "/vlora/status", timeout=30).json().get("lora_batches")
                                       for name, url in urls.items() if "--plugin" in SYSTEMS[name]}
            print("lora_batches", json.dumps(results["lora_batches"]), flush=True)
            if TIME_STATS_FLAG in shlex.split(args.extra):
                add_server_forward_times(results["interleaved_latency"],
                                         {name: _read_log(args.out / f"server_{name}.log") for name in servers})
    finally:
        for _, process in servers.values():
            try:
                os.killpg(process.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    gpu = provenance.gpu_info()
    results["environment"] = provenance.environment(gpu)
    results["device"] = results["environment"]["device"]
    results["date"] = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
    results["command"] = "python bench/profile_server.py " + shlex.join(sys.argv[1:])
    # Named ranges around ATMM's module calls (on unless the caller set 0, as the e2e servers run)
    results["server_env"] = {"SGLANG_VLORA_PROFILE_RANGES": os.environ.get("SGLANG_VLORA_PROFILE_RANGES", "1")}
    results["provenance"] = provenance.record(results["environment"], results["date"])
    (args.out / "profile.json").write_text(json.dumps(results, indent=1))
    print_table(results)


def sampled_host_time(out: Path, scenario: str, systems: list[str], rate: int, requests: int) -> dict:
    """``bench/host_samples.py``'s comparison of one interleaved scenario's samples."""
    from bench.host_samples import compare, module_calls, scheduler_stacks, without_lines

    lined = {name: scheduler_stacks((out / f"spy_{name}_{scenario}.txt").read_text(errors="replace").splitlines(),
                                    keep_lines=True) for name in systems}
    result = compare({name: without_lines(stacks) for name, stacks in lined.items()}, float(rate), requests, "nolora",
                     top=80)
    for name, stacks in lined.items():
        result["systems"][name]["module_calls"] = module_calls(stacks, float(rate), requests)
    return result


def reread(profile_path: Path, out: Path) -> None:
    """``--reread``: an earlier run's results with its servers' forward times added."""
    results = json.loads(profile_path.read_text())
    if "interleaved_latency" not in results:
        raise SystemExit(f"{profile_path}: no interleaved latency to add forward times to")
    names = {name for systems in results["interleaved_latency"].values() for name in systems}
    logs = {}
    for name in sorted(names):
        found = [p for p in (out / f"server_{name}.log", out / f"server_{name}.log.gz") if p.exists()]
        if not found:
            raise SystemExit(f"no server_{name}.log[.gz] in {out}")
        logs[name] = _read_log(found[0])
    add_server_forward_times(results["interleaved_latency"], logs)
    results["forward_times_command"] = "python bench/profile_server.py " + shlex.join(sys.argv[1:])
    (out / "profile.json").write_text(json.dumps(results, indent=1))
    print_table(results)


def print_table(results: dict) -> None:
    for system, check in results.get("cost_model", {}).items():
        for key, row in check["rows"].items():
            ratio = row["fit_over_profile"]
            print(f"cost model {system:8} {key:18} fit {row['fit_ms']:8.2f} ms ({row['samples']} samples), profile "
                  f"{row['profile_ms'] or 0:8.2f} ms, fit/profile {ratio if ratio is None else round(ratio, 2)}")
    floor = results["systems"].get("nolora", {})
    for system, scenarios in results["systems"].items():
        for scenario, s in scenarios.items():
            lat = s.get("latency_ms")
            if lat:
                base = floor.get(scenario, {}).get("latency_ms")
                cost = f" LoRA cost {lat['median'] - base['median']:+.2f}" if base and system != "nolora" else ""
                print(f"latency {system:8} {scenario:9} median {lat['median']:.2f} ms "
                      f"(p10 {lat['p10']:.2f}, p90 {lat['p90']:.2f}, n={lat['count']}){cost}")
    for scenario, systems in results.get("interleaved_latency", {}).items():
        for system, lat in systems.items():
            over = lat.get("over_floor")
            cost = f" over the floor median {over['median']:+.2f} (p25 {over['p25']:+.2f}, p75 {over['p75']:+.2f})" \
                if over else ""
            forward = lat.get("server_forward_ms")
            if forward:
                cost += f"; server forward median {forward['median']:.2f} ms"
            print(f"interleaved {system:8} {scenario:9} median {lat['median']:.2f} ms (n={lat['count']}){cost}")
    cats = ("gemm", "lora", "attention", "copy", "other")
    print(f"{'system':8} {'scenario':9} {'steps':>5} " + " ".join(f"{c:>9}" for c in cats)
          + f" {'busy':>9} {'span':>9} {'period':>9} {'syncs':>6}")
    for system, scenarios in results["systems"].items():
        for scenario, s in scenarios.items():
            if not s.get("steps"):
                continue
            g = s["gpu_us_per_step"]
            period = s["period_us"] or 0.0
            print(f"{system:8} {scenario:9} {s['steps']:5d} " + " ".join(f"{g.get(c, 0.0):9.1f}" for c in cats)
                  + f" {s['busy_us_per_step']:9.1f} {s['span_us_per_step']:9.1f} {period:9.1f}"
                  + f" {s['sync_calls_per_step']:6.1f}")


if __name__ == "__main__":
    main()
