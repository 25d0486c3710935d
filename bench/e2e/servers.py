"""The servers of one call: built from the same model and adapters, started side by side
(one GPU holds them all), warmed up, stopped. Launching itself is
:mod:`sglang_vlora.server_process`, shared with the test fixtures.

Why side by side: a server start costs ~85 s on the benchmark machine (imports in three
processes, CUDA-graph capture) and a GPU command may run 10 minutes, so one call starts all
its systems' servers at once and measures them one at a time. How they stay out of each
other's way:

* memory: every server gets the same ``--max-total-tokens`` (the KV cache is capped, not
  sized from what is free) and a ``--mem-fraction-static`` high enough that the cap is
  reached even for the server whose memory baseline is taken after the others loaded; the
  call is refused up front when the servers' estimated footprint exceeds the free memory;
* compute: only the measured server gets requests; the others idle in
  ``--sleep-on-idle`` (their schedulers block on their sockets instead of spinning on a
  CPU core, and launch no GPU work), and the first measurement waits until every server's
  start-up is over;
* warm-up: every server gets an untimed burst of each point's kind of request (JIT
  compilation, first adapter loads, the orchestrator's first cost measurements) before
  any measurement;
* cache: every measurement starts from an empty prefix cache (:func:`flush_cache`), so no
  point or repeat times prefills that an earlier one's identical prompts left cached.
"""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from bench import provenance
from bench.e2e import plan
from bench.e2e.plan import Setup, System, flag_value
from sglang_vlora import server_process
from sglang_vlora.server_process import ServerProcess

REPO = Path(__file__).resolve().parents[2]
GIB = 2**30
MEM_FRACTION = 0.85
# Per server beyond weights and KV cache: CUDA context, decode graphs, activations, plugin buffers.
OVERHEAD_GIB = 6.0
# The same with prefill CUDA graphs (``--cuda-graph-backend-prefill``). Measured on the H200 with
# the 7B-shaped model and graphs up to 2048 tokens: three servers left 40 GiB of 139.8 free after
# their captures (about 33 GiB each, 14 beyond weights and KV cache), and four of them ran out of
# memory in their warm-up at 33.5-35.9 GiB each.
PREFILL_GRAPH_OVERHEAD_GIB = 15.0
# ``--mm-feature-transport cuda_ipc``: the tokenizer's GPU pool for processed pixels, SGLang's
# default ``SGLANG_MM_FEATURE_CACHE_MB`` (1024 MiB), outside ``--mem-fraction-static``.
FEATURE_POOL_GIB = 1.0


def prepare_assets(setup: Setup, cache: Path) -> tuple[Path, dict[str, Path], dict[str, Any]]:
    """The model directory, ``setup.adapters`` adapters (name -> folder) and their description."""
    import torch

    from bench import e2e_assets

    tiny = e2e_assets.tiny_model(REPO / ".cache" / "tiny")
    if setup.scale == "gpu":
        model = e2e_assets.qwen2vl_7b_model(cache / "qwen2vl-7b-shape", tokenizer_from=tiny)
        dtype, desc = torch.bfloat16, "Qwen2-VL-7B shape, --load-format dummy (random weights), tiny tokenizer"
    else:
        model, dtype, desc = tiny, torch.float32, "tiny random Qwen2-VL (sglang_vlora.tiny_model), float32"
    adapters = e2e_assets.adapter_pool(model, cache / f"adapters-{setup.scale}-{setup.adapters}", setup.adapters,
                                       setup.ranks, heads=True, dtype=dtype)
    info = {"model": desc, "adapters": len(adapters), "adapter_names": list(adapters), "ranks": list(setup.ranks),
            "adapter_targets": list(e2e_assets.TARGETS), "adapter_dtype": str(dtype).replace("torch.", ""),
            "task_head": {"task": e2e_assets.HEAD_TASK, "labels": list(e2e_assets.ACTIONS)}}
    return model, adapters, info


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


def check_memory(setup: Setup, model: Path, n_servers: int, gpu: dict[str, Any] | None,
                 extra: Sequence[str] = ()) -> dict[str, Any] | None:
    """The memory plan of ``n_servers`` side by side (``extra``: the server flags every
    system gets on top of the setup's); ValueError when they cannot fit."""
    if gpu is None or setup.scale != "gpu":
        return None
    tokens = int(setup.common_flags[setup.common_flags.index("--max-total-tokens") + 1])
    overhead = PREFILL_GRAPH_OVERHEAD_GIB if "--cuda-graph-backend-prefill" in extra else OVERHEAD_GIB
    if flag_value(extra, "--mm-feature-transport") == "cuda_ipc":
        overhead += FEATURE_POOL_GIB
    per_server = (weight_bytes(model) + kv_bytes(model, tokens)) / GIB + overhead
    free = gpu["memory_free_mib"] / 1024
    if n_servers * per_server > 0.95 * free:
        raise ValueError(
            f"{n_servers} servers need about {n_servers * per_server:.0f} GiB ({per_server:.0f} GiB each: "
            f"weights, a {tokens}-token KV cache, {overhead:.0f} GiB of graphs and activations) but "
            f"{free:.0f} GiB of GPU memory is free: run fewer systems per call (--systems)")
    return {"servers": n_servers, "estimated_gib_per_server": round(per_server, 1), "free_gib": round(free, 1),
            "mem_fraction_static": MEM_FRACTION, "max_total_tokens": tokens}


def command(system: System, setup: Setup, model: Path, adapters: dict[str, Path],
            extra: Sequence[str] = ()) -> list[str]:
    flags = list(setup.common_flags) + (list(setup.lora_flags) if system.lora else []) + system.flags()
    if setup.scale == "gpu":
        flags += ["--mem-fraction-static", str(MEM_FRACTION)]
    return server_process.server_command(model, adapters if system.lora else None, flags + list(extra))


def server_env() -> dict[str, str]:
    """The servers' environment: the repository on ``PYTHONPATH`` (the plugin's source),
    plus its entry point where the package is not installed."""
    paths = [REPO]
    if not server_process.plugin_installed():
        paths.insert(0, server_process.entry_point_dir(REPO / ".cache" / "bench" / "entry_point"))
    return server_process.server_env(paths)


def start_all(systems: Sequence[System], setup: Setup, model: Path, adapters: dict[str, Path], log_dir: Path,
              extra: Sequence[str] = (), cpus: Mapping[str, Sequence[int]] | None = None) -> dict[str, ServerProcess]:
    """Every system's server, started without waiting; ``cpus`` pins a server by name
    (:mod:`bench.e2e.cpu_pinning`)."""
    env = server_env()
    servers = {}
    for s in systems:
        cmd = command(s, setup, model, adapters, extra)
        servers[s.name] = server_process.start(cmd, log_dir / f"{s.name}.log", env=env, cwd=REPO, name=s.name,
                                               model_dir=model, adapters=adapters if s.lora else {},
                                               cpus=(cpus or {}).get(s.name))
    return servers


def wait_all(servers: dict[str, ServerProcess], timeout_s: float) -> dict[str, str]:
    """Wait until every server answers or fails; name -> why it failed (empty: all up)."""
    pending, failed = dict(servers), {}
    while pending:
        for name, srv in list(pending.items()):
            reason = server_process.start_failure(srv)  # exited, or its port already taken
            if reason is not None:
                failed[name] = reason
            elif server_process.healthy(srv):
                srv.ready_s = round(time.monotonic() - srv.launched, 1)
            elif time.monotonic() - srv.launched > timeout_s:
                failed[name] = f"no healthy answer within {timeout_s:.0f} s of its launch"
            else:
                continue
            del pending[name]
        if pending:
            time.sleep(1.0)
    return failed


def require_all_up(servers: dict[str, ServerProcess], timeout_s: float) -> None:
    """:func:`wait_all`, raising ``RuntimeError`` with each reason where a server did not start."""
    failed = wait_all(servers, timeout_s)
    if failed:
        raise RuntimeError(f"servers failed to start: {failed}")


def stop_all(servers: dict[str, ServerProcess], grace_s: float = 20.0) -> None:
    """SIGTERM to every server first, then wait (so stopping N servers takes one grace period)."""
    for srv in servers.values():
        server_process.terminate(srv)
    deadline = time.monotonic() + grace_s
    for srv in servers.values():
        server_process.stop(srv, grace_s=max(1.0, deadline - time.monotonic()))


FLUSH_WAIT_S = 60.0  # longest wait for requests still in flight before the flush gives up


def flush_cache(server: ServerProcess, wait_s: float = FLUSH_WAIT_S) -> None:
    """Empty the server's prefix (radix) cache, waiting up to ``wait_s`` for requests still in
    flight. Every measurement starts from an empty cache: two points or repeats that send the
    same prompts and images would otherwise find the earlier one's KV cached and time
    prefills that never ran (the video points' task-head requests hit the LM points' cache
    for every prompt token). Raises RuntimeError when the server does not flush."""
    code, body = server_process.get_json(f"{server.url}/flush_cache?timeout={wait_s:g}", timeout_s=wait_s + 10)
    if code != 200:
        raise RuntimeError(f"flush_cache answered {code}: {body[:200]!r}")


def _json_or_none(url: str, timeout_s: float) -> dict[str, Any] | None:
    """GET ``url``: its JSON body when it answers 200 with JSON, else None."""
    code, body = server_process.get_json(url, timeout_s=timeout_s)
    if code != 200:
        return None
    try:
        return json.loads(body)
    except ValueError:
        return None


def vlora_status(server: ServerProcess) -> dict[str, Any] | None:
    """``GET /vlora/status`` (None if it does not answer with JSON)."""
    return _json_or_none(server.url + "/vlora/status", timeout_s=10)


def vlora_timeline(server: ServerProcess, since: float) -> dict[str, Any] | None:
    """``GET /vlora/timeline?since=``: every iteration the orchestrator timed after unix time
    ``since`` (None if it does not answer with JSON: a server without an orchestrator)."""
    return _json_or_none(f"{server.url}/vlora/timeline?since={since:.3f}", timeout_s=30)


def status_delta(before: Any, after: Any) -> Any:
    """What changed during a measurement: counters (numbers in both snapshots) as
    differences, nested dicts field by field, anything else as it is after. Read this way,
    fields the orchestrator adds or renames later come through without code changes."""
    if isinstance(after, dict):
        before = before if isinstance(before, dict) else {}
        return {k: status_delta(before.get(k), v) for k, v in after.items()}
    numeric = (int, float)
    if isinstance(after, numeric) and not isinstance(after, bool) and isinstance(before, numeric) \
            and not isinstance(before, bool):
        return after - before
    return after


def orchestrator_summary(before: dict[str, Any] | None, after: dict[str, Any] | None) -> dict[str, Any] | None:
    """Decisions and their reasons, iterations per mode, switches, admission waits per adapter,
    batches that ran without LoRA work, kernel launches that compiled, iterations far slower
    than the cost model's fit (stalls) and the CUDA caching allocator's retries, device
    allocations and frees during a measurement,
    from whatever of those ``/vlora/status`` reports (under ``orchestrator``, or at the top level)."""
    if not after:
        return None
    delta = status_delta(before or {}, after)
    orch = delta.get("orchestrator") if isinstance(delta.get("orchestrator"), dict) else delta
    counters = ("iterations", "decisions", "decision_reasons", "switches", "switch_seconds_total",
                "hook_calls", "hook_seconds_total", "hook_seconds_by_part")
    summary = {k: orch[k] for k in counters if k in orch}
    if isinstance(orch.get("admission_waits"), dict):
        # per adapter: the counters' differences (a longest wait is not a counter: left out)
        summary["admission_waits"] = {
            name: {k: v for k, v in waits.items() if k != "max_s"}
            for name, waits in orch["admission_waits"].items() if isinstance(waits, dict)
        }
    config = (after.get("orchestrator") or {}) if isinstance(after.get("orchestrator"), dict) else after
    keys = ("policy", "admission", "keep_merged", "theta_s", "max_batch")
    summary["config"] = {k: config[k] for k in keys if k in config}
    if "switch_count" in delta:
        summary["mode_switches"] = delta["switch_count"]
    if isinstance(delta.get("batches_without_lora_work"), dict):
        summary["batches_without_lora_work"] = delta["batches_without_lora_work"]
    if isinstance(delta.get("kernel_compiles"), dict):
        summary["kernel_compiles"] = delta["kernel_compiles"]
    if isinstance(delta.get("cuda_allocator"), dict):
        summary["cuda_allocator"] = delta["cuda_allocator"]
    slow = _slow_iterations(after)
    if slow:  # counters as differences; of the listed ones, those the reading before did not list
        seen = {tuple(x) for x in _slow_iterations(before or {}).get("last", [])}
        changed = _slow_iterations(delta)
        summary["slow_iterations"] = {"count": changed.get("count"), "excess_s": changed.get("excess_s"),
                                      "new": [x for x in slow.get("last", []) if tuple(x) not in seen]}
    return summary


def _slow_iterations(status: dict[str, Any]) -> dict[str, Any]:
    """The ``cost_model.slow_iterations`` of a ``/vlora/status`` reading (or of a difference
    of two), under ``orchestrator`` or at the top level; {} where it has none."""
    orch = status.get("orchestrator") if isinstance(status.get("orchestrator"), dict) else status
    slow = (orch.get("cost_model") or {}).get("slow_iterations") if isinstance(orch.get("cost_model"), dict) else None
    return slow if isinstance(slow, dict) else {}


def refuse_systems(ap: Any, names: Sequence[str]) -> dict[str, Any] | None:
    """For a script that starts ``names``' servers itself: refuse, through the argument parser
    ``ap``, a system named twice or one that needs a CUDA GPU where there is none, before any
    server starts. Returns the GPU's description (None without one)."""
    if len(set(names)) != len(names):
        ap.error("--systems names a system twice")
    gpu = provenance.gpu_info()
    no_cuda = [n for n in names if plan.SYSTEMS[n].needs_cuda and gpu is None]
    if no_cuda:
        ap.error(f"{', '.join(no_cuda)}: {plan.NO_CUDA_REASON}")
    return gpu


def prepare_run(out: Path, scale: str, cache: Path) -> tuple[Setup, Path, dict[str, Path], dict[str, Any], Path]:
    """For a script that starts servers itself: ``out`` and its ``logs`` folder made, and the
    setup of ``scale`` with its model and adapters built (or found) under ``cache``:
    ``(setup, model, adapters, their description, log folder)``."""
    out.mkdir(parents=True, exist_ok=True)
    setup = plan.setup_of(scale)
    model, adapters, info = prepare_assets(setup, cache)
    log_dir = out / "logs"
    log_dir.mkdir(exist_ok=True)
    return setup, model, adapters, info, log_dir
