"""Where a video-understanding request's time goes: SGLang's own per-request timestamps
around fixed requests, one at a time, on the end-to-end benchmark's server.

    python bench/video_timeline.py --out DIR [--scale gpu] [--rounds 6] \\
        [--variant NAME='SERVER FLAGS' ...] [--profile]

Each server is the end-to-end benchmark's ``vlora`` server (:mod:`bench.e2e`: same model,
adapters with task heads, the setup's flags, none of a call's own) plus ``--enable-metrics``,
which makes SGLang return each request's timestamps in ``meta_info``. A ``--variant`` is one
more server side by side with extra flags, e.g. ``vit_triton='--mm-attention-backend
triton_attn'`` (the ``video`` call's vision encoder). The stages of a request, in milliseconds:

* ``preprocess``: received by the HTTP server until handed to the scheduler (image
  decoding, the image processor, tokenisation);
* ``to_forward``: handed over until its first forward starts (transport, queue);
* ``prefill``: first forward start until its prefill is done (the vision encoder and the
  language model's prefill, in one forward or several chunks);
* ``decode``: the rest of the server's time (decode steps);
* ``client``: the client's latency minus the server's span (HTTP, response).

The stamps come from three processes (HTTP server, scheduler, client), each converted from
its own monotonic clock to wall time: a stage of a few milliseconds can read slightly
negative.

Scenarios, one request (or one chunk's pair) each, the kinds taking turns in every round;
every request has frames of its own, so nothing but the shared system prompt is cached:

* ``understand_lm``: the understanding request of the ``video`` points (6 frames of
  448 px), answered by LM decoding (8 tokens);
* ``understand_head``: the same request answered by the adapter's task head;
* ``understand_prefill``: the same request with 1 output token by the LM head;
* ``text_prefill``: text-only ``input_ids`` as long as the understanding prompt, 1 token,
  same adapter: the language model's prefill without the vision encoder;
* ``detect``: a chunk's detection request (1 frame, 48 tokens);
* ``chunk_lm`` / ``chunk_head``: detection and understanding sent together, as the
  ``video`` points send them; the understanding request's stages are reported.

``--profile`` also records one ``understand_prefill`` request per server under SGLang's
torch profiler and summarises its GPU time (``bench/profile_server.py``'s summary): how
much of the prefill the GPU is busy, and with which kernels.

Writes ``DIR/video_timeline.json`` (per scenario and stage: median, min, max over the
rounds; every request's raw stages), the servers' logs to ``DIR/logs``, and prints a table.
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench import provenance, workloads  # noqa: E402
from bench.e2e import plan, servers  # noqa: E402
from bench.workloads import Request  # noqa: E402

SCENARIOS = ("understand_lm", "understand_head", "understand_prefill", "text_prefill", "detect",
             "chunk_lm", "chunk_head")
STAGES = ("preprocess", "to_forward", "prefill", "decode", "client", "total")
METRICS_FLAG = "--enable-metrics"
TEXT_IDS = (32, 256)  # ordinary tokens of the tiny and Qwen2 tokenizers (as bench/workloads.py's traces)


def stages(meta: dict[str, Any], client_s: float) -> dict[str, float] | None:
    """A request's stages in ms from its ``meta_info``; None without SGLang's timestamps."""
    keys = ("request_received_ts", "api_server_dispatch_finish_ts", "forward_entry_time",
            "prefill_finished_time", "request_finished_ts")
    if any(k not in meta for k in keys):
        return None
    received, dispatched, forward, prefilled, finished = (meta[k] for k in keys)
    span = finished - received
    return {
        "preprocess": 1e3 * (dispatched - received),
        "to_forward": 1e3 * (forward - dispatched),
        "prefill": 1e3 * (prefilled - forward),
        "decode": 1e3 * (finished - prefilled),
        "client": 1e3 * (client_s - span),
        "total": 1e3 * client_s,
    }


def post(client: httpx.Client, url: str, payload: dict[str, Any]) -> dict[str, Any]:
    t0 = time.perf_counter()
    resp = client.post(url + "/generate", json=payload)
    seconds = time.perf_counter() - t0
    if resp.status_code != 200:
        raise RuntimeError(f"HTTP {resp.status_code}: {resp.text[:300]}")
    meta = resp.json()["meta_info"]
    return {"stages": stages(meta, seconds), "prompt_tokens": meta.get("prompt_tokens"),
            "cached_tokens": meta.get("cached_tokens"), "output_tokens": meta.get("completion_tokens"),
            "head": meta.get("vlora_head") is not None}


def chunks(names: list[str], count: int, scale: str, seed: int) -> list[tuple[Request, Request]]:
    """``count`` chunks of one stream, each as (detection, understanding by LM decoding)."""
    point = plan.points_of(scale)["video-lm"]
    caps = {t: min(n, point.output_cap) for t, n in workloads.OUTPUT_TOKENS.items()} if point.output_cap else None
    reqs = workloads.video_analytics(names[:1], 1, count * point.chunk_s, seed=seed,
                                     detection_stride=workloads.FRAMES_PER_CHUNK, frame_size=point.frame_size,
                                     output_tokens=caps, chunk_period_s=point.chunk_s)
    by_chunk: dict[int, dict[str, Request]] = {}
    for r in reqs:
        by_chunk.setdefault(r.meta["chunk"], {})[r.task] = r
    pairs = [(c["object_detection"], c["video_understanding"]) for _, c in sorted(by_chunk.items())]
    if len(pairs) < count:
        raise RuntimeError(f"the workload made {len(pairs)} chunks, {count} needed")
    return pairs[:count]


def as_head(request: Request) -> dict[str, Any]:
    payload = json.loads(json.dumps(request.payload))
    payload["sampling_params"] = {"max_new_tokens": 1, "temperature": 0, "ignore_eos": True,
                                  "custom_params": {"vlora_head": True}}
    return payload


def with_tokens(request: Request, n: int) -> dict[str, Any]:
    payload = json.loads(json.dumps(request.payload))
    payload["sampling_params"]["max_new_tokens"] = n
    return payload


def text_payload(adapter: str | None, length: int, rng: np.random.Generator) -> dict[str, Any]:
    return {"input_ids": rng.integers(*TEXT_IDS, size=length).tolist(), "lora_path": adapter,
            "sampling_params": {"max_new_tokens": 1, "temperature": 0, "ignore_eos": True}}


def run_scenario(client: httpx.Client, url: str, scenario: str, pair: tuple[Request, Request],
                 text_length: int, rng: np.random.Generator) -> dict[str, Any]:
    detect, understand = pair
    if scenario == "understand_lm":
        return post(client, url, understand.payload)
    if scenario == "understand_head":
        return post(client, url, as_head(understand))
    if scenario == "understand_prefill":
        return post(client, url, with_tokens(understand, 1))
    if scenario == "text_prefill":
        return post(client, url, text_payload(understand.adapter, text_length, rng))
    if scenario == "detect":
        return post(client, url, detect.payload)
    second = understand.payload if scenario == "chunk_lm" else as_head(understand)
    with ThreadPoolExecutor(max_workers=2) as pool:
        first = pool.submit(post, client, url, detect.payload)
        result = pool.submit(post, client, url, second)
        first.result()
        return result.result()


def summary(samples: list[dict[str, float]]) -> dict[str, dict[str, float]]:
    return {s: {"median": round(statistics.median(v), 1), "min": round(min(v), 1), "max": round(max(v), 1)}
            for s in STAGES if (v := [x[s] for x in samples])}


def profile_prefill(client: httpx.Client, url: str, request: Request, trace_dir: Path) -> dict[str, Any]:
    """One ``understand_prefill`` request under SGLang's torch profiler, summarised."""
    from bench.profile_server import load_events, profiled, summarise

    trace, result = profiled(url, trace_dir, "video", lambda: post(client, url, with_tokens(request, 1)))
    return {**summarise(load_events(trace), decode=False), "request": result, "trace": trace.name}


def measure_server(srv: Any, names: list[str], rounds: int, scale: str, seed: int,
                   profile_dir: Path | None) -> dict[str, Any]:
    count = rounds * len(SCENARIOS) + 4 + (1 if profile_dir else 0)
    pairs = chunks(names, count, scale, seed)
    rng = np.random.default_rng(seed)
    raw: dict[str, list[dict[str, Any]]] = {s: [] for s in SCENARIOS}
    with httpx.Client(timeout=httpx.Timeout(300.0), trust_env=False) as client:
        first = post(client, srv.url, pairs[0][1].payload)  # warm-up, and the prompt's length
        text_length = int(first["prompt_tokens"])
        for i, scenario in enumerate(("understand_head", "chunk_lm", "text_prefill")):
            run_scenario(client, srv.url, scenario, pairs[1 + i], text_length, rng)
        k = 4
        for r in range(rounds):
            order = SCENARIOS[r % len(SCENARIOS):] + SCENARIOS[: r % len(SCENARIOS)]
            for scenario in order:
                raw[scenario].append(run_scenario(client, srv.url, scenario, pairs[k], text_length, rng))
                k += 1
        profile = profile_prefill(client, srv.url, pairs[k][1], profile_dir) if profile_dir else None
    out: dict[str, Any] = {"understanding_prompt_tokens": text_length, "scenarios": {}}
    for scenario, results in raw.items():
        timed = [r["stages"] for r in results if r["stages"] is not None]
        out["scenarios"][scenario] = {"stages_ms": summary(timed) if timed else None, "requests": results}
    if profile is not None:
        out["profile_understand_prefill"] = profile
    return out


def print_table(results: dict[str, Any]) -> None:
    print(f"{'server':16} {'scenario':20} " + " ".join(f"{s:>11}" for s in STAGES) + "   (median ms)")
    for name, entry in results["servers"].items():
        if "scenarios" not in entry:
            print(f"{name:16} {entry.get('status')}: {entry.get('reason', '')[:100]}")
            continue
        for scenario, data in entry["scenarios"].items():
            st = data["stages_ms"] or {}
            print(f"{name:16} {scenario:20} " + " ".join(f"{st.get(s, {}).get('median', float('nan')):11.1f}"
                                                        for s in STAGES))


def parse_variant(text: str) -> tuple[str, list[str]]:
    name, sep, flags = text.partition("=")
    if not sep or not name:
        raise argparse.ArgumentTypeError(f"a variant is NAME='FLAGS', got {text!r}")
    return name, shlex.split(flags)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--scale", choices=("gpu", "cpu"), default="gpu")
    ap.add_argument("--rounds", type=int, default=6, help="requests of each scenario (the kinds take turns)")
    ap.add_argument("--variant", type=parse_variant, action="append", default=[],
                    help="one more server with these extra flags, NAME='FLAGS' (repeatable)")
    ap.add_argument("--profile", action="store_true", help="also profile one understanding prefill per server")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if args.rounds < 1:
        ap.error("--rounds must be >= 1")
    args.out.mkdir(parents=True, exist_ok=True)
    setup = plan.setup_of(args.scale)
    model, adapters, info = servers.prepare_assets(setup, REPO / ".cache" / "bench")
    names = list(adapters)
    system = plan.SYSTEMS["vlora"]
    configs = {"vlora": [METRICS_FLAG], **{n: [METRICS_FLAG, *flags] for n, flags in args.variant}}
    gpu = provenance.gpu_info()
    results: dict[str, Any] = {"assets": info, "rounds": args.rounds, "servers": {}}
    live = {}
    env = servers.server_env()
    log_dir = args.out / "logs"
    log_dir.mkdir(exist_ok=True)
    for name, extra in configs.items():
        cmd = servers.command(system, setup, model, adapters, extra)
        live[name] = servers.server_process.start(cmd, log_dir / f"{name}.log", env=env, cwd=REPO, name=name,
                                                  model_dir=model, adapters=adapters)
        results["servers"][name] = {"command": shlex.join(cmd), "extra_flags": extra}
    try:
        failed = servers.wait_all(live, setup.start_timeout_s)
        for name, srv in live.items():
            entry = results["servers"][name]
            if name in failed:
                entry.update(status="failed", reason=failed[name], log_tail=srv.log_tail(40))
                continue
            entry["status"] = "ran"
            profile_dir = args.out / "traces" / name if args.profile else None
            try:
                entry.update(measure_server(srv, names, args.rounds, args.scale, args.seed, profile_dir))
            except (RuntimeError, httpx.HTTPError) as e:
                entry.update(status="failed", reason=f"{type(e).__name__}: {e}", log_tail=srv.log_tail(40))
            print(f"[video] {name}: {entry['status']}", flush=True)
    finally:
        servers.stop_all(live)
    provenance.save_run(args.out / "video_timeline.json", results, gpu, "bench/video_timeline.py",
                        sys.argv[1:] if argv is None else argv)
    print_table(results)
    return results


if __name__ == "__main__":
    main()
