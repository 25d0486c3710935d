"""End-to-end serving benchmark: one SGLang server per system under test, same model, same
adapters, same workloads (:mod:`bench.workloads`), driven open-loop by :mod:`bench.client`.

    python bench/run_e2e.py --scale cpu            # tiny Qwen2-VL on CPU: checks the harness
    python bench/run_e2e.py --scale gpu            # Qwen2-VL-7B shape, dummy weights, one GPU
    python bench/run_e2e.py --scale cpu --smoke --systems vlora slora_like   # what CI runs
    python bench/run_e2e.py --report bench/results/e2e_gpu.json              # redo md + png

Systems (``--systems``, in this order):

* ``vlora``: ``--plugin vlora --vlora-policy vlora`` (ATMM + Algorithm 1: merge / mixture /
  unmerge per iteration);
* ``slora_like``: plain SGLang, ``--lora-backend triton`` (S-LoRA-style unmerged batching);
* ``punica_like``: plain SGLang, ``--lora-backend csgmv`` (Punica-style SGMV kernels);
* ``dlora_like``: ``--plugin vlora --vlora-policy dlora`` (merge the dominant adapter or
  unmerge everything; no mixture);
* ``merge_only`` / ``unmerge_only``: ``--plugin vlora --vlora-policy merge-only|unmerge-only``.

Each system's server starts once, gets a warm-up (not timed), then runs every sweep point
in turn: request rate, skew (share of the most requested adapter), number of adapters
(all loaded at start; a point uses the first ``n``), and the workloads retrieval / video /
trace. The video-analytics point runs once with LM-head decoding on every system and once
more on the plugin's ``vlora`` system with task heads (one forward pass). A server that
does not start, or dies, is recorded as failed with its log tail, and the run goes on.
Systems that cannot run on this machine (SGLang's triton / csgmv LoRA kernels need a
CUDA GPU) are recorded as skipped with the reason.

Outputs under ``--out`` (default ``bench/results``): ``<tag>.json`` (written after every
point, so a run cut short keeps what it measured), ``<tag>.md`` and ``<tag>_{rate,skew,
adapters,workloads}.png``. ``<tag>`` defaults to ``e2e_<scale>``. Compare systems only
within one run. Details and the JSON layout: docs/bench.md.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import importlib.metadata
import importlib.util
import json
import os
import platform
import re
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench import client, workloads  # noqa: E402
from bench.workloads import Request  # noqa: E402

SCHEMA = "sglang-vlora/e2e/v1"
SWEEPS = ("rate", "skew", "adapters", "workload")
SWEEP_AXIS = {"rate": "request rate (req/s)", "skew": "share of the most requested adapter",
              "adapters": "adapters in the workload", "workload": "workload"}


# ----------------------------------------------------------------------------- systems
@dataclass(frozen=True)
class System:
    name: str
    about: str
    plugin: bool
    policy: str | None = None  # --vlora-policy
    lora_backend: str | None = None  # explicit --lora-backend (plain SGLang)

    @property
    def needs_cuda(self) -> bool:
        """SGLang's own triton / csgmv LoRA kernels are Triton kernels for a CUDA device, and
        SGLang without the plugin's CPU bridges does not start on a machine without a GPU."""
        return not self.plugin

    def server_args(self, scale: Scale) -> list[str]:
        args = []
        if self.plugin:
            args += ["--plugin", "vlora", "--vlora-policy", self.policy, "--vlora-theta", str(scale.theta),
                     "--vlora-max-batch", str(scale.max_batch)]
        if self.lora_backend:
            args += ["--lora-backend", self.lora_backend]
        return args


SYSTEMS = {
    s.name: s
    for s in (
        System("vlora", "V-LoRA (ours): ATMM kernels, orchestrator picks merge / mixture / unmerge per iteration",
               plugin=True, policy="vlora"),
        System("slora_like", "S-LoRA-like: plain SGLang, unmerged batched LoRA with its triton kernels",
               plugin=False, lora_backend="triton"),
        System("punica_like", "Punica-like: plain SGLang, unmerged batched LoRA with its chunked SGMV kernels",
               plugin=False, lora_backend="csgmv"),
        System("dlora_like", "dLoRA-like: ATMM, merge the dominant adapter or unmerge everything (no mixture)",
               plugin=True, policy="dlora"),
        System("merge_only", "merge only: one adapter merged at a time, switch to serve others (ATMM)",
               plugin=True, policy="merge-only"),
        System("unmerge_only", "unmerge only: every request through ATMM beside the base weights",
               plugin=True, policy="unmerge-only"),
    )
}
NO_CUDA_REASON = (
    "needs a CUDA GPU: SGLang's triton / csgmv LoRA kernels are Triton GPU kernels, and plain SGLang "
    "(no --plugin vlora) does not start on a CPU-only machine. Checked on CPU (SGLang 0.5.23): plain SGLang "
    "stops at 'No accelerator ... is available'; with --device cpu and the CPU stub it stops in the LoRA "
    "manager ('Found no NVIDIA driver'); with the plugin's CPU bridges and --lora-backend triton the first "
    "LoRA forward fails in Triton ('0 active drivers')."
)


# ----------------------------------------------------------------------------- scales
@dataclass(frozen=True)
class Scale:
    name: str
    n_adapters: int  # adapters loaded by every server (the largest adapter-count point)
    ranks: tuple[int, ...]
    rates: tuple[float, ...]
    skews: tuple[float, ...]
    adapter_counts: tuple[int, ...]
    base_rate: float
    base_skew: float
    base_adapters: int
    duration_s: float
    video_streams: int
    video_duration_s: float
    detection_stride: int
    trace_rate: float
    trace_duration_s: float
    max_context_tokens: int
    max_new_tokens: int | None  # cap on every request's output tokens (None: the workloads' own)
    trace_max_new_tokens: int
    drain_s: float  # a point's requests still open this long after its last arrival are cancelled
    warmup_s: float  # seconds of retrieval arrivals at the base rate before timing (0: a few requests)
    max_batch: int  # --max-running-requests for all, --vlora-max-batch for the plugin
    theta: float
    max_loras_per_batch: int
    budget_s: float  # wall-clock budget of the whole run
    start_timeout_s: float
    overlap_start: bool  # start the next system's server while this one is measured
    min_system_s: float = 30.0  # do not start a server with less of the budget left
    gpu_memory_fraction: bool = False  # size --mem-fraction-static from the free GPU memory (two servers fit)
    kv_tokens: int = 0  # --max-total-tokens given in server_args (for the memory sizing)
    server_args: tuple[str, ...] = ()
    caveats: tuple[str, ...] = ()


CPU = Scale(
    name="cpu", n_adapters=16, ranks=(8, 16), rates=(1.0, 2.0, 4.0), skews=(0.25, 0.6, 0.9),
    adapter_counts=(2, 8, 16), base_rate=2.0, base_skew=0.6, base_adapters=8, duration_s=2.0,
    video_streams=2, video_duration_s=2.0, detection_stride=15, trace_rate=2.0, trace_duration_s=2.0,
    max_context_tokens=128, max_new_tokens=4, trace_max_new_tokens=4, drain_s=60.0, warmup_s=0.0,
    max_batch=8, theta=1.0, max_loras_per_batch=4, budget_s=1800.0, start_timeout_s=600.0,
    overlap_start=False,
    server_args=("--dtype", "float32"),
    caveats=(
        "CPU scale: a tiny random-weight Qwen2-VL (hidden 128, 2 layers) on CPU with the torch reference "
        "paths. It checks the harness end to end; its numbers say nothing about GPU serving.",
        "SGLang's triton / csgmv LoRA backends cannot run on CPU, so the S-LoRA- and Punica-like peers "
        "are skipped.",
    ),
)
# What CI runs: each sweep has the base point and one more.
SMOKE = replace(
    CPU, name="cpu-smoke", n_adapters=4, rates=(2.0, 4.0), skews=(0.6, 0.9), adapter_counts=(2, 4),
    base_adapters=4, duration_s=1.5, video_streams=1, video_duration_s=1.5, trace_duration_s=1.5,
    max_new_tokens=2, trace_max_new_tokens=2, drain_s=45.0,
)
GPU = Scale(
    name="gpu", n_adapters=64, ranks=(64,), rates=(4.0, 8.0, 16.0), skews=(0.25, 0.6, 0.9),
    adapter_counts=(2, 8, 64), base_rate=8.0, base_skew=0.6, base_adapters=8, duration_s=3.0,
    video_streams=4, video_duration_s=3.0, detection_stride=10, trace_rate=4.0, trace_duration_s=3.0,
    max_context_tokens=1024, max_new_tokens=None, trace_max_new_tokens=128, drain_s=20.0, warmup_s=2.0,
    max_batch=16, theta=6.0, max_loras_per_batch=16, budget_s=450.0, start_timeout_s=240.0,
    overlap_start=True, min_system_s=100.0, gpu_memory_fraction=True, kv_tokens=32768,
    server_args=("--load-format", "dummy", "--dtype", "bfloat16", "--attention-backend", "triton",
                 "--sampling-backend", "pytorch", "--mm-attention-backend", "sdpa",
                 "--max-total-tokens", "32768"),
    caveats=(
        "Model: Qwen2-VL-7B's shape (28 layers, hidden 3584, 32-layer ViT) with --load-format dummy: random "
        "weights, so answers are meaningless; ignore_eos fixes every request's output length. The tokenizer is "
        "the tiny model's (prompt token counts differ from Qwen2's tokenizer). Images are 56 or 112 px (4 or "
        "16 visual tokens).",
        "Adapters: rank 64 on q/k/v/o of every layer, bf16, random values (several adapters share one weight "
        "file; each is loaded and swapped as its own adapter). Each carries a random video-understanding head.",
        "Not a production install (SGLang 0.5.23 run from its Python package on torch 2.11): SGLANG_FORCE_FUSED_OP_BACKEND=torch runs norms, "
        "activations and rotary as plain torch ops, and a stand-in sgl_kernel replaces sglang-kernel. The base "
        "model is slower than in production, so LoRA's share of the time looks smaller. Compare systems with "
        "each other within this run; quote absolute latencies only with this caveat.",
        "Same flags for every system: --attention-backend triton --sampling-backend pytorch "
        "--mm-attention-backend sdpa, decode CUDA graphs on (SGLang's default), --vlora-theta 6 s, "
        "--max-total-tokens 32768, --max-running-requests 16 (the plugin's --vlora-max-batch too), "
        "--max-loras-per-batch 16.",
        "Short runs: each point is a few seconds of arrivals (tens of requests), so p99 is close to the "
        "maximum. To fit one GPU call, the next system's server starts while the current one is measured "
        "(recorded per system as 'overlapped_start_of'); its start-up shares CPU and, briefly, the GPU.",
    ),
)
SCALES = {"cpu": CPU, "gpu": GPU}


# ----------------------------------------------------------------------------- points
@dataclass(frozen=True)
class Point:
    """One workload run against a server."""

    id: str
    workload: str  # retrieval | video | trace
    rate: float | None = None
    skew: float | None = None
    adapters: int = 0
    duration_s: float = 0.0
    heads: bool = False  # video: answer video understanding through task heads
    plugin_only: bool = False  # heads are a plugin feature
    only: tuple[str, ...] = ()  # systems that run it (empty: all)
    label: str = ""  # x value on the workload axis


def plan(scale: Scale, head_systems: Sequence[str]) -> tuple[list[Point], dict[str, dict[str, Any]]]:
    """The points to run (each once, deduplicated) and which sweep each belongs to."""
    points: dict[str, Point] = {}

    def retrieval(rate: float, skew: float, n: int) -> str:
        p = Point(f"retrieval-r{rate:g}-s{skew:g}-n{n}", "retrieval", rate, skew, n, scale.duration_s,
                  label="retrieval")
        points.setdefault(p.id, p)
        return p.id

    sweeps: dict[str, dict[str, Any]] = {
        "rate": {"x": [], "points": []}, "skew": {"x": [], "points": []},
        "adapters": {"x": [], "points": []}, "workload": {"x": [], "points": []},
    }
    base = retrieval(scale.base_rate, scale.base_skew, scale.base_adapters)
    for rate in scale.rates:
        sweeps["rate"]["x"].append(rate)
        sweeps["rate"]["points"].append(retrieval(rate, scale.base_skew, scale.base_adapters))
    for skew in scale.skews:
        sweeps["skew"]["x"].append(skew)
        sweeps["skew"]["points"].append(retrieval(scale.base_rate, skew, scale.base_adapters))
    for n in scale.adapter_counts:
        sweeps["adapters"]["x"].append(n)
        sweeps["adapters"]["points"].append(retrieval(scale.base_rate, scale.base_skew, n))
    n_video = min(scale.video_streams, scale.base_adapters)
    video = Point("video-lm", "video", adapters=n_video, duration_s=scale.video_duration_s, label="video")
    trace = Point(f"trace-r{scale.trace_rate:g}", "trace", rate=scale.trace_rate, skew=scale.base_skew,
                  adapters=scale.base_adapters, duration_s=scale.trace_duration_s, label="trace")
    heads = Point("video-heads", "video", adapters=n_video, duration_s=scale.video_duration_s, heads=True,
                  plugin_only=True, only=tuple(head_systems), label="video (task heads)")
    for p in (video, trace, heads):
        points[p.id] = p
    sweeps["workload"]["x"] = ["retrieval", "video", "trace"]
    sweeps["workload"]["points"] = [base, video.id, trace.id]
    # Base point first (the one every sweep shares), then sweep order.
    order = [base] + [pid for pid in points if pid != base]
    return [points[pid] for pid in order], sweeps


def build_requests(point: Point, scale: Scale, adapters: Sequence[str], seed: int) -> list[Request]:
    names = list(adapters[: point.adapters])
    caps = None
    if scale.max_new_tokens:
        caps = {t: min(n, scale.max_new_tokens) for t, n in workloads.OUTPUT_TOKENS.items()}
    if point.workload == "retrieval":
        reqs = workloads.visual_retrieval(names, point.rate, point.duration_s, skew=point.skew, seed=seed,
                                          output_tokens=caps)
    elif point.workload == "video":
        reqs = workloads.video_analytics(names, scale.video_streams, point.duration_s, seed=seed,
                                         head_adapters=names if point.heads else (),
                                         detection_stride=scale.detection_stride, output_tokens=caps)
    else:
        reqs = workloads.trace_replay(client.DEFAULT_TRACE, names, skew=point.skew, seed=seed, rate=point.rate,
                                      duration_s=point.duration_s, max_context_tokens=scale.max_context_tokens,
                                      max_output_tokens=scale.trace_max_new_tokens)
    for r in reqs:  # application and SLO for the orchestrator (plain SGLang carries and ignores them)
        params = r.payload.setdefault("sampling_params", {}).setdefault("custom_params", {})
        params.update({"vlora_app": r.application, "vlora_slo_ms": r.slo_s * 1e3})
    return reqs


# ----------------------------------------------------------------------------- servers
@dataclass
class Server:
    system: str
    url: str
    log_path: Path
    process: subprocess.Popen
    command: list[str]
    launched: float = field(default_factory=time.monotonic)
    ready_s: float | None = None

    def alive(self) -> bool:
        return self.process.poll() is None

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def gpu_info() -> dict[str, Any] | None:
    """Name and memory of GPU 0 from nvidia-smi, else from torch in a child process (no CUDA
    context in this process: it would hold GPU memory while the servers run)."""
    if not shutil.which("nvidia-smi"):
        return _torch_gpu_info()
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,memory.total,memory.free,driver_version",
             "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    rows = [r.split(", ") for r in out.strip().splitlines() if r.strip()]
    if not rows:
        return None
    name, total, free, driver = rows[0]
    return {"name": name, "count": len(rows), "memory_total_mib": int(float(total)),
            "memory_free_mib": int(float(free)), "driver": driver}


def _torch_gpu_info() -> dict[str, Any] | None:
    import torch

    if not torch.cuda.is_available():
        return None
    code = ("import json, torch; f, t = torch.cuda.mem_get_info(0); print(json.dumps({'name': "
            "torch.cuda.get_device_name(0), 'count': torch.cuda.device_count(), 'memory_total_mib': t >> 20, "
            "'memory_free_mib': f >> 20, 'driver': None}))")
    try:
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
        return json.loads(out.stdout.strip().splitlines()[-1])
    except (OSError, subprocess.SubprocessError, ValueError, IndexError):
        return {"name": "CUDA GPU", "count": torch.cuda.device_count(), "memory_total_mib": None,
                "memory_free_mib": None, "driver": None}


def weight_bytes(model_dir: Path, bytes_per_param: int = 2) -> int:
    """Rough size of a Qwen2-VL's weights from its config (embeddings, decoder, ViT)."""
    cfg = json.loads((model_dir / "config.json").read_text())
    t, v = cfg.get("text_config", cfg), cfg["vision_config"]
    h, inter, layers = t["hidden_size"], t["intermediate_size"], t["num_hidden_layers"]
    kv = t["num_key_value_heads"] * h // t["num_attention_heads"]
    text = 2 * t["vocab_size"] * h + layers * (2 * h * h + 2 * h * kv + 3 * h * inter)
    e = v["embed_dim"]
    vision = v["depth"] * (4 * e * e + 2 * e * e * v["mlp_ratio"]) + 4 * e * e * 4 + 4 * e * e * h // e
    return (text + vision) * bytes_per_param


def kv_bytes(model_dir: Path, tokens: int, bytes_per_value: int = 2) -> int:
    cfg = json.loads((model_dir / "config.json").read_text())
    t = cfg.get("text_config", cfg)
    head_dim = t.get("head_dim", t["hidden_size"] // t["num_attention_heads"])
    return tokens * t["num_hidden_layers"] * 2 * t["num_key_value_heads"] * head_dim * bytes_per_value


def mem_fraction(static_gib: float) -> float | None:
    """--mem-fraction-static that gives a server about ``static_gib`` (weights + KV) of the GPU
    memory free now. SGLang takes the fraction of the memory free when the server starts, so
    a server started while another runs gets the same amount."""
    info = gpu_info()
    if info is None or not info.get("memory_free_mib"):
        return None
    free_gib = info["memory_free_mib"] / 1024
    return round(min(0.88, max(0.05, static_gib / free_gib)), 3)


def server_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SGLANG_VLORA", "SGLANG_USE_CPU"))}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONUNBUFFERED="1")
    extra = [str(REPO)]
    if not plugin_installed():
        extra.insert(0, str(plugin_entry_point_dir()))
    env["PYTHONPATH"] = os.pathsep.join(extra + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p])
    return env


def plugin_installed() -> bool:
    return any(e.name == "vlora" for e in importlib.metadata.entry_points(group="sglang.srt.plugins"))


def plugin_entry_point_dir() -> Path:
    """A dist-info that declares the plugin's entry point, for a machine where the source is only on
    PYTHONPATH (the benchmark GPU machine): SGLang finds plugins through entry points."""
    root = REPO / ".cache" / "bench" / "entry_point"
    info = root / "sglang_vlora-0.1.0.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: sglang-vlora\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text("[sglang.srt.plugins]\nvlora = sglang_vlora.plugin:register\n")
    return root


def launch(system: System, scale: Scale, model: Path, adapters: dict[str, Path], log_dir: Path,
           extra_args: Sequence[str]) -> Server:
    port = free_port()
    cmd = [
        sys.executable, "-m", "sglang.launch_server",
        "--model-path", str(model),
        "--lora-paths", *[f"{n}={p}" for n, p in adapters.items()],
        "--max-lora-rank", str(max(scale.ranks)),
        "--max-loras-per-batch", str(scale.max_loras_per_batch),
        "--max-running-requests", str(scale.max_batch),
        "--host", "127.0.0.1", "--port", str(port),
        *scale.server_args,
        *system.server_args(scale),
        *extra_args,
    ]
    if scale.gpu_memory_fraction and "--mem-fraction-static" not in extra_args:
        # Weights + KV cache + margin. SGLang measures free memory itself a little later, after a
        # server started next to it may have allocated: the margin keeps the KV pool at its size.
        fraction = mem_fraction((weight_bytes(model) + kv_bytes(model, scale.kv_tokens)) / 2**30 + 8.0)
        if fraction is not None:
            cmd += ["--mem-fraction-static", str(fraction)]
    log_dir.mkdir(parents=True, exist_ok=True)
    log_path = log_dir / f"{system.name}.log"
    with open(log_path, "w") as log:
        log.write("$ " + shlex.join(cmd) + "\n")
        log.flush()
        process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=server_env(),
                                   start_new_session=True, cwd=REPO)
    return Server(system.name, f"http://127.0.0.1:{port}", log_path, process, cmd)


def healthy(server: Server) -> bool:
    import httpx

    try:
        return httpx.get(server.url + "/health", timeout=5, trust_env=False).status_code == 200
    except httpx.HTTPError:
        return False


def watch(server: Server, timeout_s: float) -> None:
    """Poll /health in the background from launch on, so that ``ready_s`` is the start-up time
    even for a server that waits while another one is measured."""

    def poll() -> None:
        deadline = server.launched + timeout_s
        while time.monotonic() < deadline and server.alive():
            if healthy(server):
                server.ready_s = time.monotonic() - server.launched
                return
            time.sleep(1.0)

    threading.Thread(target=poll, name=f"watch-{server.system}", daemon=True).start()


def wait_ready(server: Server, timeout_s: float) -> str | None:
    """None once /health has answered 200 (see :func:`watch`); else why not."""
    deadline = server.launched + timeout_s
    while time.monotonic() < deadline:
        if server.ready_s is not None:
            return None
        if not server.alive():
            return f"server exited with code {server.process.returncode} during start-up"
        time.sleep(0.5)
    if server.ready_s is None and healthy(server):
        server.ready_s = time.monotonic() - server.launched
        return None
    return f"no healthy answer within {timeout_s:.0f} s of its launch"


def stop(server: Server) -> None:
    if server.alive():
        try:
            os.killpg(server.process.pid, signal.SIGTERM)
            server.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.process.pid, signal.SIGKILL)
            server.process.wait(timeout=30)
        except ProcessLookupError:
            pass


def vlora_status(server: Server) -> dict[str, Any] | None:
    import httpx

    try:
        resp = httpx.get(server.url + "/vlora/status", timeout=10, trust_env=False)
        return resp.json() if resp.status_code == 200 else None
    except (httpx.HTTPError, ValueError):
        return None


# ----------------------------------------------------------------------------- measuring
def per_task(results: Sequence[client.Result]) -> dict[str, Any]:
    out = {}
    for task in sorted({r.task for r in results}):
        mine = [r for r in results if r.task == task]
        ok = [r for r in mine if r.ok]
        tokens = sum(r.output_tokens for r in ok)
        out[task] = {
            "requests": len(mine), "ok": len(ok), "output_tokens": tokens,
            "latency_s": client._stats([r.latency_s for r in ok]),
            "avg_token_latency_s": sum(r.latency_s for r in ok) / tokens if tokens else None,
        }
    return out


def run_point(server: Server, requests: list[Request], drain_s: float) -> dict[str, Any]:
    results = asyncio.run(client.run(server.url, requests, drain_s=drain_s, progress=False))
    errors = sorted({r.error for r in results if r.error})
    return {"metrics": client.metrics(results), "per_task": per_task(results), "error_samples": errors[:5]}


def warm_up(server: Server, scale: Scale, adapters: Sequence[str], heads: bool, seed: int) -> dict[str, Any]:
    """Untimed requests first: JIT compilation, first adapter loads, first mode switch."""
    names = list(adapters[: scale.base_adapters])
    reqs = workloads.visual_retrieval(names, rate=50.0, duration_s=1.0, skew=scale.base_skew, seed=seed + 99,
                                      output_tokens={"captioning": 4, "referring_expression": 4},
                                      max_requests=max(4, len(names)))
    reqs += workloads.trace_replay(client.DEFAULT_TRACE, names, seed=seed + 99, max_requests=2,
                                   max_context_tokens=scale.max_context_tokens, max_output_tokens=4)
    if heads:
        reqs += workloads.video_analytics(names[:1], 1, 1.0, seed=seed + 99, head_adapters=names[:1],
                                          detection_stride=30, output_tokens={"object_detection": 4})
    reqs.sort(key=lambda r: r.arrival_s)
    first = run_point(server, reqs, drain_s=max(scale.drain_s, 60.0))
    out = {"requests": first["metrics"]["requests"], "ok": first["metrics"]["ok"],
           "error_samples": first["error_samples"]}
    if scale.warmup_s > 0:
        more = workloads.visual_retrieval(names, scale.base_rate, scale.warmup_s, skew=scale.base_skew,
                                          seed=seed + 98)
        if more:
            second = run_point(server, more, drain_s=scale.drain_s)
            out["requests"] += second["metrics"]["requests"]
            out["ok"] += second["metrics"]["ok"]
    return out


# ----------------------------------------------------------------------------- the run
def environment(gpu: dict[str, Any] | None) -> dict[str, Any]:
    import torch

    versions = {"python": platform.python_version(), "torch": torch.__version__,
                "sglang": _version("sglang"), "sglang_vlora": _version("sglang-vlora"),
                "transformers": _version("transformers"), "triton": _version("triton")}
    git = _git_revision()
    if git:
        versions["sglang_vlora_git"] = git
    env_keys = ("SGLANG_FORCE_FUSED_OP_BACKEND", "SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK",
                "SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND", "CUDA_VISIBLE_DEVICES")
    return {
        "device": gpu["name"] if gpu else f"CPU ({platform.processor() or platform.machine()}, {os.cpu_count()} cores)",
        "gpu": gpu,
        "cpu_count": os.cpu_count(),
        "host": platform.node(),
        "platform": platform.platform(),
        "versions": versions,
        "environment": {k: os.environ[k] for k in env_keys if k in os.environ},
    }


def _version(dist: str) -> str | None:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        pass
    spec = importlib.util.find_spec(dist.replace("-", "_"))
    if spec and spec.submodule_search_locations:
        for name in ("version.py", "_version.py", "__init__.py"):
            path = Path(next(iter(spec.submodule_search_locations))) / name
            if path.exists():
                found = re.search(r"__version__\s*=\s*['\"]([^'\"]+)", path.read_text(errors="replace"))
                if found:
                    return found.group(1)
    if dist == "sglang-vlora":
        found = re.search(r'^version = "([^"]+)"', (REPO / "pyproject.toml").read_text(), re.M)
        return found.group(1) if found else None
    return None


def _git_revision() -> str | None:
    try:
        rev = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
                             timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=REPO,
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return rev + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return None


def prepare_assets(scale: Scale, cache: Path) -> tuple[Path, dict[str, Path], dict[str, Any]]:
    import torch

    from bench import e2e_assets

    tiny = e2e_assets.tiny_model(REPO / ".cache" / "tiny")
    if scale.name == "gpu":
        model = e2e_assets.qwen2vl_7b_model(cache / "qwen2vl-7b-shape", tokenizer_from=tiny)
        dtype, desc = torch.bfloat16, "Qwen2-VL-7B shape, --load-format dummy (random weights), tiny tokenizer"
    else:
        model, dtype, desc = tiny, torch.float32, "tiny random Qwen2-VL (sglang_vlora.tiny_model), float32"
    adapters = e2e_assets.adapter_pool(model, cache / f"adapters-{scale.name}", scale.n_adapters, scale.ranks,
                                       heads=True, dtype=dtype)
    setup = {"model": desc, "model_dir": str(model), "adapters": len(adapters), "ranks": list(scale.ranks),
             "adapter_targets": list(e2e_assets.TARGETS), "adapter_dtype": str(dtype).replace("torch.", ""),
             "task_head": {"task": e2e_assets.HEAD_TASK, "labels": list(e2e_assets.ACTIONS)}}
    return model, adapters, setup


def write_json(path: Path, report: dict[str, Any]) -> None:
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(report, indent=1, default=str))
    tmp.replace(path)


def run(args: argparse.Namespace) -> dict[str, Any]:
    t_start = time.monotonic()
    scale = SMOKE if args.smoke else SCALES[args.scale]
    overrides = {k: tuple(v) for k, v in (("rates", args.rates), ("skews", args.skews),
                                           ("adapter_counts", args.adapter_counts)) if v}
    for key in ("duration_s", "budget_s"):
        if getattr(args, key) is not None:
            overrides[key] = getattr(args, key)
    if args.overlap is not None:
        overrides["overlap_start"] = args.overlap
    scale = replace(scale, **overrides)
    if max(scale.adapter_counts + (scale.base_adapters,)) > scale.n_adapters:
        scale = replace(scale, n_adapters=max(scale.adapter_counts + (scale.base_adapters,)))
    systems = [SYSTEMS[s] for s in args.systems]
    gpu = gpu_info()
    head_systems = [s.name for s in systems if s.name == "vlora"] or [s.name for s in systems if s.plugin][:1]
    points, sweeps = plan(scale, head_systems)

    out: Path = args.out
    out.mkdir(parents=True, exist_ok=True)
    tag = args.tag or f"e2e_{scale.name}"
    json_path = out / f"{tag}.json"
    cache = REPO / ".cache" / "bench"
    log_dir = args.log_dir or cache / "logs" / tag

    print(f"[e2e] scale {scale.name}: preparing model and {scale.n_adapters} adapters ...", flush=True)
    model, adapters, setup = prepare_assets(scale, cache)
    names = list(adapters)
    report: dict[str, Any] = {
        "schema": SCHEMA,
        "scale": scale.name,
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": shlex.join([sys.executable, "bench/run_e2e.py", *args.argv]),
        **environment(gpu),
        "setup": {**setup, "scale": asdict(scale), "seed": args.seed, "extra_server_args": args.server_args},
        "caveats": list(scale.caveats),
        "metric_notes": {
            "avg_token_latency_s": "paper §6.1: sum of request latencies / sum of output tokens (ok requests)",
            "latency_s": "end-to-end request latency, mean / p50 / p95 / p99 (ok requests)",
            "throughput": "output tokens/s and finished requests/s from first send to last completion",
            "slo": "per application: share of requests done within their SLO (errors count as misses)",
        },
        "points": {p.id: asdict(p) for p in points},
        "sweeps": sweeps,
        "systems": {},
    }
    for s in systems:
        report["systems"][s.name] = {"about": s.about, "plugin": s.plugin, "policy": s.policy,
                                     "lora_backend": s.lora_backend or ("atmm" if s.plugin else "csgmv"),
                                     "status": "pending", "points": {}}
    write_json(json_path, report)
    budget_end = t_start + scale.budget_s

    runnable = []
    for s in systems:
        entry = report["systems"][s.name]
        if s.needs_cuda and gpu is None and not args.force:
            entry.update(status="skipped", reason=NO_CUDA_REASON)
            print(f"[e2e] {s.name}: skipped ({NO_CUDA_REASON.split(':')[0]})", flush=True)
        else:
            runnable.append(s)
    write_json(json_path, report)

    # Servers are measured one at a time, in --systems order. With overlap_start, up to two are
    # alive: the one measured and the next one starting (or ready and idle).
    queue, live = list(runnable), {}
    max_live = 2 if scale.overlap_start else 1

    def top_up(limit: int = max_live) -> None:
        while queue and len(live) < limit:
            nxt = queue.pop(0)
            if time.monotonic() > budget_end - scale.min_system_s:
                for s in [nxt, *queue]:
                    report["systems"][s.name].update(status="skipped",
                                                     reason="time budget of the run (--budget-s) spent")
                queue.clear()
                return
            print(f"[e2e] {nxt.name}: starting server ...", flush=True)
            live[nxt.name] = launch(nxt, scale, model, adapters, log_dir, args.server_args)
            watch(live[nxt.name], scale.start_timeout_s)
            e = report["systems"][nxt.name]
            e.update(server_command=shlex.join(live[nxt.name].command), log=str(live[nxt.name].log_path),
                     launched_at_s=round(time.monotonic() - t_start, 1))

    def on_signal(signum: int, _frame: Any) -> None:
        raise SystemExit(f"signal {signum}")

    previous_handler = signal.signal(signal.SIGTERM, on_signal)
    try:
        # One server at first: SGLang sizes its memory from what is free when it starts, so a
        # second server starts only once the first holds its memory (then while it is measured).
        top_up(1)
        for system in runnable:
            server = live.get(system.name)
            if server is None:
                continue
            entry = report["systems"][system.name]
            why = wait_ready(server, scale.start_timeout_s)
            if why is not None:
                stop(server)
                tail = server.log_tail()
                entry.update(status="failed", reason=why, log_tail=tail)
                print(f"[e2e] {system.name}: FAILED to start: {why}\n--- log tail ({server.log_path}) ---\n"
                      f"{tail}\n---", flush=True)
            else:
                entry["start_s"] = round(server.ready_s, 1)
                print(f"[e2e] {system.name}: ready after {server.ready_s:.0f} s", flush=True)
                top_up()
                others = [o for n, o in live.items() if n != system.name and o.ready_s is None]
                try:
                    measure_system(system, server, scale, points, names, entry, json_path, report, args.seed,
                                   budget_end)
                except Exception:  # a harness or client error: keep the other systems' results
                    entry.update(status="error", reason=traceback.format_exc(limit=5)[-2000:],
                                 log_tail=server.log_tail())
                    print(f"[e2e] {system.name}: ERROR\n{entry['reason']}", flush=True)
                finally:
                    stop(server)
                # Servers that were starting while this one was measured (start-up shares CPU and GPU).
                if others:
                    entry["overlapped_start_of"] = {
                        o.system: "started" if o.ready_s is not None else "still starting" for o in others}
            del live[system.name]
            write_json(json_path, report)
            (out / f"{tag}.md").write_text(markdown(report))
            top_up()
    finally:
        for server in live.values():
            stop(server)
        signal.signal(signal.SIGTERM, previous_handler)

    report["wall_s"] = round(time.monotonic() - t_start, 1)
    report["video_heads"] = heads_comparison(report)
    write_json(json_path, report)
    files = write_report(report, out, tag)
    report["files"] = [str(json_path), *map(str, files)]
    write_json(json_path, report)
    print(f"[e2e] done in {report['wall_s']:.0f} s: {', '.join(report['files'])}", flush=True)
    return report


def measure_system(system: System, server: Server, scale: Scale, points: Sequence[Point], names: Sequence[str],
                   entry: dict[str, Any], json_path: Path, report: dict[str, Any], seed: int,
                   budget_end: float) -> None:
    t0 = time.monotonic()
    entry["warmup"] = warm_up(server, scale, names, heads=system.plugin, seed=seed)
    entry["warmup"]["seconds"] = round(time.monotonic() - t0, 1)
    entry["status"] = "running"
    write_json(json_path, report)
    for point in points:
        if point.only and system.name not in point.only or point.plugin_only and not system.plugin:
            continue
        if not server.alive():
            entry.update(status="crashed", reason="server died during the run", log_tail=server.log_tail())
            print(f"[e2e] {system.name}: server DIED\n{entry['log_tail']}", flush=True)
            return
        if time.monotonic() + point.duration_s + 5 > budget_end:
            entry["points"][point.id] = {"skipped": "time budget of the run (--budget-s) spent"}
            entry["status"] = "partial"
            continue
        requests = build_requests(point, scale, names, seed)
        before = vlora_status(server) if system.plugin else None
        t = time.monotonic()
        result = run_point(server, requests, scale.drain_s)
        result["seconds"] = round(time.monotonic() - t, 1)
        if system.plugin:
            after = vlora_status(server)
            result["vlora_status"] = {"before": before, "after": after}
            result["orchestrator"] = orchestrator_delta(before, after)
        entry["points"][point.id] = result
        m = result["metrics"]
        print(f"[e2e] {system.name} {point.id}: {m['ok']}/{m['requests']} ok, avg token latency "
              f"{_fmt(m['avg_token_latency_s'], 1e3)} ms, p95 {_fmt(m['latency_s']['p95'], 1)} s", flush=True)
        write_json(json_path, report)
    if entry["status"] == "running":
        entry["status"] = "ok"
    if not server.alive():
        entry.update(status="crashed", reason="server died during the run", log_tail=server.log_tail())


def orchestrator_delta(before: dict[str, Any] | None, after: dict[str, Any] | None) -> dict[str, Any] | None:
    """Batches per inference mode and weight switches during one point (from /vlora/status)."""
    b, a = ((x or {}).get("orchestrator") for x in (before, after))
    if not a:
        return None
    b = b or {}
    return {
        "iterations": {m: n - b.get("iterations", {}).get(m, 0) for m, n in a.get("iterations", {}).items()},
        "switches": a.get("switches", 0) - b.get("switches", 0),
        "switch_seconds": a.get("switch_seconds_total", 0.0) - b.get("switch_seconds_total", 0.0),
    }


def heads_comparison(report: dict[str, Any]) -> dict[str, Any] | None:
    """Video analytics with task heads vs LM-head decoding of the same answers, on one system."""
    for name, entry in report["systems"].items():
        heads, lm = entry["points"].get("video-heads"), entry["points"].get("video-lm")
        if heads and lm and "metrics" in heads and "metrics" in lm:
            def summary(res: dict[str, Any]) -> dict[str, Any]:
                m = res["metrics"]
                return {"avg_token_latency_s": m["avg_token_latency_s"], "latency_s": m["latency_s"],
                        "slo": m["slo"].get("video_analytics"), "errors": m["errors"],
                        "video_understanding": res["per_task"].get("video_understanding"),
                        "object_detection": res["per_task"].get("object_detection")}
            return {"system": name, "task_heads": summary(heads), "lm_head": summary(lm)}
    return None


# ----------------------------------------------------------------------------- reports
def _fmt(value: float | None, scale: float = 1.0, digits: int = 2) -> str:
    return "-" if value is None else f"{value * scale:.{digits}f}"


def point_value(report: dict[str, Any], system: str, pid: str) -> dict[str, Any] | None:
    res = report["systems"][system]["points"].get(pid)
    return res if res and "metrics" in res else None


def write_report(report: dict[str, Any], out: Path, tag: str) -> list[Path]:
    md = out / f"{tag}.md"
    md.write_text(markdown(report))
    return [md, *plots(report, out, tag)]


def markdown(report: dict[str, Any]) -> str:
    systems = list(report["systems"])
    lines = [
        f"# End-to-end benchmark: {report['scale']} scale",
        "",
        f"{report['date']} on {report['device']}; torch {report['versions']['torch']}, SGLang "
        f"{report['versions']['sglang']}, sglang-vlora {report['versions']['sglang_vlora']}"
        f"{' (' + report['versions']['sglang_vlora_git'] + ')' if report['versions'].get('sglang_vlora_git') else ''}.",
        f"Model: {report['setup']['model']}; {report['setup']['adapters']} adapters, ranks "
        f"{report['setup']['ranks']}.",
        "",
        f"Command: `{report['command']}`",
        "",
        "Compare systems only within this run. Avg token latency is the paper's metric (§6.1): the sum of "
        "request latencies over the sum of output tokens.",
        "",
        "## Systems",
        "",
        "| system | status | server start (s) | what |",
        "|---|---|---|---|",
    ]
    notes: dict[str, list[str]] = {}  # full reason -> systems
    for name in systems:
        e = report["systems"][name]
        status = e["status"]
        if e.get("reason"):
            short = e["reason"].split(":")[0] if len(e["reason"]) > 60 else e["reason"]
            status += f" ({short})"
            if short != e["reason"]:
                notes.setdefault(e["reason"], []).append(name)
        lines.append(f"| {name} | {status} | {e.get('start_s', '-')} | {e['about']} |")
    lines += [""] + [f"- {', '.join(names)}: {reason}" for reason, names in notes.items()] if notes else []
    for sweep in SWEEPS:
        s = report["sweeps"][sweep]
        lines += ["", f"## {sweep.capitalize()} sweep: avg token latency (ms) vs {SWEEP_AXIS[sweep]}", "",
                  "| " + SWEEP_AXIS[sweep] + " | " + " | ".join(systems) + " |",
                  "|---" * (len(systems) + 1) + "|"]
        for x, pid in zip(s["x"], s["points"], strict=True):
            cells = []
            for name in systems:
                res = point_value(report, name, pid)
                cells.append(_fmt(res["metrics"]["avg_token_latency_s"], 1e3) if res else "-")
            lines.append(f"| {x} | " + " | ".join(cells) + " |")
    lines += ["", "## Every point", "",
              "| system | point | ok / requests | avg token latency (ms) | p50 (s) | p95 (s) | p99 (s) | tokens/s "
              "| SLO attainment | batches merge / mixture / unmerge, switches |", "|---|---|---|---|---|---|---|---|---|---|"]
    for name in systems:
        for pid in report["points"]:
            res = report["systems"][name]["points"].get(pid)
            if not res:
                continue
            if "metrics" not in res:
                lines.append(f"| {name} | {pid} | {res.get('skipped', '-')} | | | | | | | |")
                continue
            m = res["metrics"]
            lat = m["latency_s"]
            slo = ", ".join(f"{app} {v['attainment']:.0%}" for app, v in m["slo"].items())
            orch = res.get("orchestrator")
            modes = "-"
            if orch:
                it = orch["iterations"]
                modes = f"{it.get('merge', 0)} / {it.get('mixture', 0)} / {it.get('unmerge', 0)}, {orch['switches']}"
            lines.append(
                f"| {name} | {pid} | {m['ok']} / {m['requests']} | {_fmt(m['avg_token_latency_s'], 1e3)} | "
                f"{_fmt(lat['p50'])} | {_fmt(lat['p95'])} | {_fmt(lat['p99'])} | "
                f"{_fmt(m['throughput']['tokens_per_s'], 1, 1)} | {slo} | {modes} |")
    vh = report.get("video_heads")
    if vh:
        lines += ["", f"## Video analytics: task heads vs LM-head decoding ({vh['system']})", "",
                  "| answers by | avg token latency (ms) | p50 (s) | p95 (s) | video understanding latency, "
                  "mean (s) | SLO attainment | errors |", "|---|---|---|---|---|---|---|"]
        for label, key in (("task heads (one forward pass)", "task_heads"), ("LM head (decoding)", "lm_head")):
            v = vh[key]
            vu = (v.get("video_understanding") or {}).get("latency_s", {})
            slo = v["slo"]["attainment"] if v.get("slo") else None
            lines.append(f"| {label} | {_fmt(v['avg_token_latency_s'], 1e3)} | {_fmt(v['latency_s']['p50'])} | "
                         f"{_fmt(v['latency_s']['p95'])} | {_fmt(vu.get('mean'))} | "
                         f"{'-' if slo is None else f'{slo:.0%}'} | {v['errors']} |")
        lines += ["", "A head request finishes after prefill and counts one output token, so the average token "
                  "latency is not comparable between the two rows; compare the video understanding latency and "
                  "the SLO attainment."]
    failed = [(n, e) for n, e in report["systems"].items() if e.get("log_tail")]
    if report.get("caveats"):
        lines += ["", "## What differs from a production install", ""] + [f"- {c}" for c in report["caveats"]]
    for name, e in failed:
        lines += ["", f"## {name}: server log tail", "", "```", e["log_tail"][-4000:], "```"]
    return "\n".join(lines) + "\n"


def plots(report: dict[str, Any], out: Path, tag: str) -> list[Path]:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("[e2e] matplotlib missing: no plots", flush=True)
        return []
    files = []
    systems = list(report["systems"])
    title = f"{report['device']}, {report['scale']} scale"
    for sweep in ("rate", "skew", "adapters"):
        s = report["sweeps"][sweep]
        fig, axes = plt.subplots(1, 2, figsize=(11, 4))
        for name in systems:
            xs, atl, p95 = [], [], []
            for x, pid in zip(s["x"], s["points"], strict=True):
                res = point_value(report, name, pid)
                if res and res["metrics"]["avg_token_latency_s"] is not None:
                    xs.append(x)
                    atl.append(res["metrics"]["avg_token_latency_s"] * 1e3)
                    p95.append(res["metrics"]["latency_s"]["p95"])
            if xs:
                axes[0].plot(xs, atl, marker="o", label=name)
                axes[1].plot(xs, p95, marker="o", label=name)
        for ax, ylabel in zip(axes, ("avg token latency (ms)", "p95 request latency (s)"), strict=True):
            ax.set_xlabel(SWEEP_AXIS[sweep])
            ax.set_ylabel(ylabel)
            ax.grid(alpha=0.3)
            if sweep == "adapters":
                ax.set_xscale("log", base=2)
        if axes[0].lines:
            axes[0].legend(fontsize=8)
        else:
            axes[0].text(0.5, 0.5, "no system measured", ha="center", transform=axes[0].transAxes)
        fig.suptitle(f"End-to-end: {sweep} sweep ({title})")
        fig.tight_layout()
        path = out / f"{tag}_{sweep}.png"
        fig.savefig(path, dpi=110)
        plt.close(fig)
        files.append(path)
    # Workloads (and task heads) as grouped bars.
    s = report["sweeps"]["workload"]
    groups = list(zip(s["x"], s["points"], strict=True)) + [("video (heads)", "video-heads")]
    systems = [n for n in systems if any(point_value(report, n, pid) for _, pid in groups)] or systems
    fig, ax = plt.subplots(figsize=(9, 4))
    width = 0.8 / max(1, len(systems))
    for k, name in enumerate(systems):
        vals = []
        for _, pid in groups:
            res = point_value(report, name, pid)
            vals.append(res["metrics"]["latency_s"]["mean"] if res and res["metrics"]["latency_s"]["mean"] else 0.0)
        ax.bar([g + k * width for g in range(len(groups))], vals, width, label=name)
    ax.set_xticks([g + 0.4 - width / 2 for g in range(len(groups))], [g for g, _ in groups])
    ax.set_ylabel("mean request latency (s)")
    ax.grid(axis="y", alpha=0.3)
    if ax.patches:
        ax.legend(fontsize=8)
    ax.set_title(f"End-to-end: workloads ({title})")
    fig.tight_layout()
    path = out / f"{tag}_workloads.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    files.append(path)
    return files


# ----------------------------------------------------------------------------- CLI
def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--scale", choices=sorted(SCALES), default=None,
                   help="cpu: tiny model; gpu: 7B shape, dummy weights (default: gpu if nvidia-smi sees one)")
    p.add_argument("--smoke", action="store_true", help="minimal CPU settings (what CI runs)")
    p.add_argument("--systems", nargs="+", choices=list(SYSTEMS), default=list(SYSTEMS))
    p.add_argument("--rates", nargs="+", type=float, help="override the rate sweep")
    p.add_argument("--skews", nargs="+", type=float, help="override the skew sweep")
    p.add_argument("--adapter-counts", nargs="+", type=int, help="override the adapter-count sweep")
    p.add_argument("--duration-s", type=float, help="seconds of arrivals per retrieval point")
    p.add_argument("--budget-s", type=float, help="wall-clock budget: later points and systems are skipped")
    p.add_argument("--overlap", action=argparse.BooleanOptionalAction, default=None,
                   help="start the next server while one is measured (default: on at GPU scale)")
    p.add_argument("--force", action="store_true", help="also try systems that cannot run on this machine")
    p.add_argument("--server-args", nargs=argparse.REMAINDER, default=[],
                   help="extra sglang.launch_server arguments for every system (must come last)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    p.add_argument("--tag", default=None, help="file name stem (default e2e_<scale>)")
    p.add_argument("--log-dir", type=Path, default=None)
    p.add_argument("--report", type=Path, default=None, metavar="JSON",
                   help="only rewrite the markdown and plots from a results JSON")
    argv = list(sys.argv[1:] if argv is None else argv)
    args = p.parse_args(argv)
    args.argv = argv
    if args.scale is None:
        args.scale = "cpu" if args.smoke or gpu_info() is None else "gpu"
    if args.smoke and args.scale != "cpu":
        p.error("--smoke is a CPU setting")
    return args


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    if args.report is not None:
        report = json.loads(args.report.read_text())
        files = write_report(report, args.report.parent, args.report.stem)
        print(f"[e2e] wrote {', '.join(map(str, files))}")
        return report
    return run(args)


if __name__ == "__main__":
    main()
