"""One measurement: a point's requests against one server, with either client, in one
metrics layout (milliseconds):

``e2e_ms`` / ``ttft_ms`` / ``tpot_ms`` (mean, p50, p95, p99), ``requests``, ``completed``,
``errors``, ``output_tokens``, ``duration_s``, ``request_throughput``, ``output_throughput``.

* ``sglang`` points run SGLang's own serving benchmark in a child process, an independent
  client: ``python -m sglang.benchmark.serving --backend sglang --dataset-name random-ids
  --random-range-ratio 1`` with adapters by ``--lora-name ... --lora-request-distribution
  skewed --lora-zipf-alpha 2`` (or ``uniform``). In SGLang 0.5.23 that is the module's
  name; ``sglang.bench_serving`` is a deprecated alias.
* ``retrieval`` and ``video`` points run :mod:`bench.client` (open loop, streaming), which
  also reports per task and SLO attainment.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np

from bench import client, workloads
from bench.e2e.plan import Point
from bench.e2e.sglang_client import MODULE, Worker
from bench.workloads import Request
from sglang_vlora.server_process import ServerProcess

DRAIN_S = 60.0  # requests not done this long after the last arrival are cancelled (errors)


def _ms(stats: dict[str, float | None]) -> dict[str, float | None]:
    return {k: None if v is None else v * 1e3 for k, v in stats.items()}


def own_requests(point: Point, adapters: Sequence[str], seed: int, lora: bool) -> list[Request]:
    """The requests of a ``retrieval`` or ``video`` point (``lora`` False: no adapter named,
    for the no-LoRA floor; the same prompts, images and arrival times)."""
    caps = {t: min(n, point.output_cap) for t, n in workloads.OUTPUT_TOKENS.items()} if point.output_cap else None
    if point.client == "retrieval":
        # Long enough for ``requests`` Poisson arrivals with room to spare, then cut there.
        duration = min(point.max_duration_s, 1.3 * point.requests / point.rate + 2.0)
        reqs = workloads.visual_retrieval(adapters, point.rate, duration, skew=point.top_share,
                                          alpha=point.alpha, seed=seed, output_tokens=caps,
                                          max_requests=point.requests, image_sizes=point.image_sizes)
    elif point.client == "video":
        # Each stream sends (30 / stride) detections + 1 understanding per chunk: the streams,
        # the stride and the chunk period set the rate.
        names = list(adapters[: point.streams]) or list(adapters)
        per_chunk = -(-workloads.FRAMES_PER_CHUNK // point.detection_stride) + 1
        per_s = point.streams * per_chunk / point.chunk_s
        duration = min(point.max_duration_s, point.requests / per_s + 2.0)
        reqs = workloads.video_analytics(names, point.streams, duration, seed=seed,
                                         head_adapters=names if point.heads else (),
                                         detection_stride=point.detection_stride, frame_size=point.frame_size,
                                         output_tokens=caps, max_requests=point.requests,
                                         chunk_period_s=point.chunk_s)
    else:
        raise ValueError(f"point {point.id}: {point.client!r} points are run by SGLang's client")
    for r in reqs:
        params = r.payload.setdefault("sampling_params", {}).setdefault("custom_params", {})
        params.update({"vlora_app": r.application, "vlora_slo_ms": r.slo_s * 1e3})
    return reqs if lora else [without_lora(r) for r in reqs]


def without_lora(request: Request) -> Request:
    """A copy of ``request`` that names no adapter and asks for no task head."""
    payload = {k: v for k, v in request.payload.items() if k != "lora_path"}
    sampling = dict(payload.get("sampling_params", {}))
    sampling["custom_params"] = {k: v for k, v in sampling.get("custom_params", {}).items() if k != "vlora_head"}
    payload["sampling_params"] = sampling
    return replace(request, adapter=None, payload=payload)


def text_requests(point: Point, adapters: Sequence[str], n: int, seed: int, lora: bool) -> list[Request]:
    """``n`` random-ids requests shaped like an ``sglang`` point (for the warm-up only)."""
    rng = np.random.default_rng(seed)
    out = []
    for i in range(n):
        payload = {"input_ids": rng.integers(32, 256, size=point.input_len).tolist(),
                   "sampling_params": {"max_new_tokens": point.output_len, "temperature": 0, "ignore_eos": True}}
        if lora:
            payload["lora_path"] = adapters[i % len(adapters)]
        out.append(Request(i * 0.05, payload.get("lora_path"), "text", "text", payload, point.output_len, 60.0))
    return out


def run_own(server: ServerProcess, requests: list[Request],
            adapters: Sequence[str | None] | None = None) -> dict[str, Any]:
    """Send ``requests`` open loop with :mod:`bench.client`; normalized metrics + details.
    ``adapters``: the adapter each request names with LoRA on (default: its own), so that the
    floor's results split by adapter like the others'."""
    results = asyncio.run(client.run(server.url, requests, drain_s=DRAIN_S, progress=False))
    m = client.metrics(results)
    errors = sorted({r.error for r in results if r.error})
    metrics = {
        "e2e_ms": _ms(m["latency_s"]), "ttft_ms": _ms(m["ttft_s"]), "tpot_ms": _ms(m["tpot_s"]),
        "requests": m["requests"], "completed": m["ok"], "errors": m["errors"],
        "output_tokens": m["output_tokens"], "duration_s": m["span_s"],
        "request_throughput": m["throughput"]["requests_per_s"],
        "output_throughput": m["throughput"]["tokens_per_s"],
        "avg_token_latency_ms": None if m["avg_token_latency_s"] is None else m["avg_token_latency_s"] * 1e3,
        "arrivals_s": requests[-1].arrival_s if requests else 0.0,
    }
    labels = [r.adapter for r in requests] if adapters is None else list(adapters)
    return {"metrics": metrics, "slo": m["slo"], "per_task": per_task(results),
            "per_adapter": per_adapter(results, labels), "per_request": per_request(results),
            "error_samples": errors[:5]}


def per_request(results: Sequence[client.Result]) -> dict[str, list]:
    """Every request's E2E and TTFT (ms, None when it failed), by its index in the point's
    request list: every system of a call gets the same requests, so a system's latency can
    be set against the floor's for the same request (the report's paired LoRA cost)."""
    ordered = sorted(results, key=lambda r: r.index)

    def ms(value: float | None, ok: bool) -> float | None:
        return round(value * 1e3, 2) if ok and value is not None else None

    return {"index": [r.index for r in ordered], "e2e_ms": [ms(r.latency_s, r.ok) for r in ordered],
            "ttft_ms": [ms(r.ttft_s, r.ok) for r in ordered]}


def per_task(results: Sequence[client.Result]) -> dict[str, Any]:
    out = {}
    for task in sorted({r.task for r in results}):
        mine = [r for r in results if r.task == task]
        ok = [r for r in mine if r.ok]
        out[task] = {"requests": len(mine), "completed": len(ok), "output_tokens": sum(r.output_tokens for r in ok),
                     "e2e_ms": _ms(client._stats([r.latency_s for r in ok]))}
    return out


def per_adapter(results: Sequence[client.Result], adapters: Sequence[str | None]) -> dict[str, Any]:
    """E2E and TTFT per adapter (by result index into ``adapters``; ``base`` for none), most
    requested first: under a skewed load, how the dominant adapter's requests fared against
    the others' (a policy that merges one adapter treats the two differently)."""
    if len(adapters) != len(results):
        raise ValueError(f"{len(adapters)} adapter labels for {len(results)} results")
    groups: dict[str, list[client.Result]] = {}
    for r in results:
        groups.setdefault(adapters[r.index] or "base", []).append(r)
    out = {}
    for name in sorted(groups, key=lambda g: (-len(groups[g]), g)):
        ok = [r for r in groups[name] if r.ok]
        out[name] = {"requests": len(groups[name]), "completed": len(ok),
                     "e2e_ms": _ms(client._stats([r.latency_s for r in ok])),
                     "ttft_ms": _ms(client._stats([r.ttft_s for r in ok if r.ttft_s is not None]))}
    return out


def sglang_argv(server: ServerProcess, point: Point, adapters: Sequence[str], seed: int, out_file: Path) -> list[str]:
    """The client's command line (after ``python -m sglang.benchmark.serving``), the same for
    every system of a call, the floor included: the floor's run sends the requests without
    their adapters (``sglang_client.adapters_dropped``) but draws them, so its arrival times
    are the LoRA systems' own. ``--output-details`` writes every request's TTFT and
    inter-token latencies, in request order (``sglang_per_request``)."""
    argv = ["--backend", "sglang", "--base-url", server.url, "--dataset-name", "random-ids",
            "--random-input-len", str(point.input_len), "--random-output-len", str(point.output_len),
            "--random-range-ratio", "1", "--num-prompts", str(point.requests), "--request-rate", str(point.rate),
            "--seed", str(seed), "--output-file", str(out_file), "--output-details", "--disable-tqdm"]
    if server.model_dir is not None:
        argv += ["--tokenizer", str(server.model_dir)]
    if adapters:  # the client refuses --lora-name without a name
        argv += ["--lora-name", *adapters, "--lora-request-distribution", point.distribution]
        if point.distribution == "skewed":
            argv += ["--lora-zipf-alpha", str(point.zipf_alpha)]
    return argv


# What ``--output-details`` adds to the client's result line, one entry per request
SGLANG_DETAILS = ("input_lens", "output_lens", "ttfts", "itls", "generated_texts", "errors", "cached_tokens",
                  "cached_tokens_details")


def sglang_per_request(raw: dict[str, Any]) -> dict[str, list] | None:
    """Every request's E2E and TTFT (ms, None when it failed) from the client's details, by
    request index: E2E is the TTFT plus the inter-token latencies, which is how the client
    measures a request's latency (first chunk, then every later one). None without details."""
    ttfts, itls, errors = raw.get("ttfts"), raw.get("itls"), raw.get("errors")
    if ttfts is None or itls is None:
        return None
    errors = errors if errors is not None else [""] * len(ttfts)
    e2e, ttft = [], []
    for first, gaps, error in zip(ttfts, itls, errors, strict=True):
        ok = not error and first is not None and first > 0
        ttft.append(round(first * 1e3, 2) if ok else None)
        e2e.append(round((first + sum(gaps)) * 1e3, 2) if ok else None)
    return {"index": list(range(len(ttfts))), "e2e_ms": e2e, "ttft_ms": ttft}


SGLANG_FIELDS = ("e2e_latency", "ttft", "tpot")


def run_sglang(worker: Worker, server: ServerProcess, point: Point, adapters: Sequence[str], seed: int,
               lora: bool, work_dir: Path) -> dict[str, Any]:
    """Run SGLang's serving benchmark against ``server``; its summary line, normalized."""
    work_dir.mkdir(parents=True, exist_ok=True)
    out_file = work_dir / f"sglang_{server.name}_{point.id}_{time.monotonic_ns()}.jsonl"
    argv = sglang_argv(server, point, adapters, seed, out_file)
    t0 = time.monotonic()
    worker.run(argv, timeout_s=point.arrivals_s + DRAIN_S + 120, send_adapters=lora)
    client_s = time.monotonic() - t0
    lines = out_file.read_text().splitlines() if out_file.exists() else []
    if not lines:
        raise RuntimeError(f"{MODULE} wrote no result to {out_file}:\n{worker.log_tail()}")
    raw = json.loads(lines[-1])
    raw.pop("server_info", None)
    requests = sglang_per_request(raw)
    for key in SGLANG_DETAILS:
        raw.pop(key, None)
    stats = {}
    for name, key in zip(("e2e_ms", "ttft_ms", "tpot_ms"), SGLANG_FIELDS, strict=True):
        stats[name] = {"mean": raw.get(f"mean_{key}_ms"), "p50": raw.get(f"median_{key}_ms"),
                       "p95": raw.get(f"p95_{key}_ms"), "p99": raw.get(f"p99_{key}_ms")}
    completed = int(raw.get("completed") or 0)
    metrics = {**stats, "requests": point.requests, "completed": completed, "errors": point.requests - completed,
               "output_tokens": raw.get("total_output_tokens"), "duration_s": raw.get("duration"),
               "request_throughput": raw.get("request_throughput"), "output_throughput": raw.get("output_throughput"),
               "input_tokens": raw.get("total_input_tokens")}
    sent = "" if lora else "   (requests sent without their adapters)"
    return {"metrics": metrics, "client_command": f"python -m {MODULE} " + " ".join(argv) + sent,
            "client_seconds": round(client_s, 1), "sglang_result": raw, "per_request": requests}
