"""Open-loop benchmark client: sends a workload of :mod:`bench.workloads` to a running
SGLang server, each request at its arrival time whatever the server's state, and
measures it.

    python -m bench.client --url http://127.0.0.1:30000 --workload retrieval --rate 2 \
        --duration 10 --adapters a8 b16 --out results.json

Requests go to ``/generate`` with ``"stream": true``: TTFT is the time to the first
streamed chunk, latency the time to the last one, output tokens the last chunk's
``meta_info.completion_tokens``. Metrics (seconds; errors are left out of the latency
figures and count as SLO misses):

* ``avg_token_latency_s``: sum of request latencies / total output tokens (paper §6.1);
* ``latency_s`` / ``ttft_s``: mean, p50, p95, p99;
* ``tpot_s``: time per output token after the first, ``(latency - ttft) / (tokens - 1)``,
  over requests with more than one output token (mean, p50, p95, p99);
* ``throughput``: output tokens/s and finished requests/s over the run's span (first send
  to last completion);
* ``slo``: per application, the share of requests done within their SLO.

The run stops by itself: arrivals end at ``--duration`` (and ``--max-requests``), and
requests still open ``--drain`` seconds after the last arrival are cancelled and recorded
as errors.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from tqdm import tqdm

from bench import workloads
from bench.workloads import Request

DEFAULT_TRACE = Path(__file__).with_name("traces") / "synthetic_azure.csv"


@dataclass
class Result:
    index: int
    adapter: str | None
    task: str
    application: str
    arrival_s: float
    sent_s: float | None  # actual send time, relative to the run's start (None: cancelled)
    ttft_s: float | None
    latency_s: float | None
    output_tokens: int
    expected_output_tokens: int
    slo_s: float
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None


async def send(client: httpx.AsyncClient, url: str, index: int, req: Request, t0: float) -> Result:
    """Send one request at its arrival time and time it, reading the SSE stream."""
    delay = t0 + req.arrival_s - time.perf_counter()
    if delay > 0:
        await asyncio.sleep(delay)
    start = time.perf_counter()
    result = Result(index, req.adapter, req.task, req.application, req.arrival_s, start - t0,
                    None, None, 0, req.expected_output_tokens, req.slo_s)
    last: dict[str, Any] | None = None
    try:
        async with client.stream("POST", url + "/generate", json={**req.payload, "stream": True}) as resp:
            if resp.status_code != 200:
                body = (await resp.aread()).decode(errors="replace")
                result.error = f"HTTP {resp.status_code}: {body[:300]}"
                return result
            async for line in resp.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[len("data:"):].strip()
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    result.error = f"server error: {chunk['error']}"
                    return result
                if result.ttft_s is None:
                    result.ttft_s = time.perf_counter() - start
                last = chunk
    except (httpx.HTTPError, json.JSONDecodeError) as e:
        result.error = f"{type(e).__name__}: {e}"
        return result
    if last is None:
        result.error = "empty stream"
        return result
    result.latency_s = time.perf_counter() - start
    result.output_tokens = int(last["meta_info"]["completion_tokens"])
    return result


async def run(url: str, requests: Sequence[Request], drain_s: float = 60.0, progress: bool = True) -> list[Result]:
    """Send every request open-loop; results in workload order."""
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(timeout=httpx.Timeout(None), limits=limits, trust_env=False) as client:
        t0 = time.perf_counter()
        tasks = [asyncio.create_task(send(client, url.rstrip("/"), i, r, t0)) for i, r in enumerate(requests)]
        horizon = (requests[-1].arrival_s if requests else 0.0) + drain_s
        bar = tqdm(total=len(tasks), desc="requests", unit="req", disable=not progress)
        pending = set(tasks)
        while pending:
            timeout = t0 + horizon - time.perf_counter()
            if timeout <= 0:
                break
            done, pending = await asyncio.wait(pending, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
            bar.update(len(done))
        bar.close()
        for task in pending:
            task.cancel()
        await asyncio.gather(*pending, return_exceptions=True)
    results = []
    for i, (task, req) in enumerate(zip(tasks, requests, strict=True)):
        if task.cancelled():
            results.append(Result(i, req.adapter, req.task, req.application, req.arrival_s, None,
                                  None, None, 0, req.expected_output_tokens, req.slo_s,
                                  error=f"not done {drain_s} s after the last arrival"))
        else:
            results.append(task.result())
    return results


def _stats(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"mean": None, "p50": None, "p95": None, "p99": None}
    a = np.asarray(values)
    return {"mean": float(a.mean()), **{f"p{q}": float(np.percentile(a, q)) for q in (50, 95, 99)}}


def metrics(results: Sequence[Result]) -> dict[str, Any]:
    ok = [r for r in results if r.ok]
    tokens = sum(r.output_tokens for r in ok)
    latency_sum = sum(r.latency_s for r in ok)
    span = max((r.sent_s + r.latency_s for r in ok), default=0.0) - min((r.sent_s for r in ok), default=0.0)
    slo: dict[str, dict[str, float | int]] = {}
    for app in sorted({r.application for r in results}):
        mine = [r for r in results if r.application == app]
        met = sum(1 for r in mine if r.ok and r.latency_s <= r.slo_s)
        slo[app] = {"requests": len(mine), "met": met, "attainment": met / len(mine)}
    return {
        "requests": len(results),
        "ok": len(ok),
        "errors": len(results) - len(ok),
        "output_tokens": tokens,
        "latency_sum_s": latency_sum,
        "avg_token_latency_s": latency_sum / tokens if tokens else None,
        "latency_s": _stats([r.latency_s for r in ok]),
        "ttft_s": _stats([r.ttft_s for r in ok]),
        "tpot_s": _stats([(r.latency_s - r.ttft_s) / (r.output_tokens - 1) for r in ok if r.output_tokens > 1]),
        "span_s": span,
        "throughput": {
            "tokens_per_s": tokens / span if span > 0 else None,
            "requests_per_s": len(ok) / span if span > 0 else None,
        },
        "slo": slo,
    }


def build_workload(args: argparse.Namespace) -> list[Request]:
    caps = {t: min(n, args.max_new_tokens) for t, n in workloads.OUTPUT_TOKENS.items()} if args.max_new_tokens else None
    if args.workload == "retrieval":
        return workloads.visual_retrieval(
            args.adapters, args.rate, args.duration, skew=args.skew, seed=args.seed,
            output_tokens=caps, max_requests=args.max_requests, image_sizes=args.image_sizes)
    if args.workload == "video":
        return workloads.video_analytics(
            args.adapters, args.streams, args.duration, seed=args.seed, head_adapters=args.head_adapters,
            detection_stride=args.detection_stride, output_tokens=caps, max_requests=args.max_requests,
            chunk_period_s=args.chunk_period,
            frame_size=args.frame_size)
    return workloads.trace_replay(
        args.trace, args.adapters, skew=args.skew, seed=args.seed, rate=args.rate, duration_s=args.duration,
        max_context_tokens=args.max_context_tokens, max_output_tokens=args.max_new_tokens,
        max_requests=args.max_requests)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", required=True, help="server base URL, e.g. http://127.0.0.1:30000")
    parser.add_argument("--workload", choices=("retrieval", "video", "trace"), default="retrieval")
    parser.add_argument("--adapters", nargs="+", required=True, help="adapter names, most requested first")
    parser.add_argument("--rate", type=float, default=None,
                        help="requests/s (retrieval: required; trace: rescale the trace to it)")
    parser.add_argument("--duration", type=float, default=10.0, help="seconds of arrivals")
    parser.add_argument("--max-requests", type=int, default=None)
    parser.add_argument("--skew", type=float, default=0.6, help="share of the most requested adapter")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--max-new-tokens", type=int, default=None, help="cap every request's output tokens")
    parser.add_argument("--image-sizes", nargs="+", type=int, default=list(workloads.IMAGE_SIZES),
                        help="retrieval: image sides in px, multiples of 28")
    parser.add_argument("--frame-size", type=int, default=workloads.FRAME_SIZE, help="video: frame side in px")
    parser.add_argument("--streams", type=int, default=1, help="video: cameras")
    parser.add_argument("--head-adapters", nargs="*", default=[], help="video: adapters answering through heads")
    parser.add_argument("--detection-stride", type=int, default=1, help="video: detect on every k-th frame")
    parser.add_argument("--chunk-period", type=float, default=1.0,
                        help="video: seconds between a stream's 30-frame chunks")
    parser.add_argument("--trace", type=Path, default=DEFAULT_TRACE, help="trace: Azure-format CSV")
    parser.add_argument("--max-context-tokens", type=int, default=None, help="trace: cap prompt tokens")
    parser.add_argument("--drain", type=float, default=60.0, help="seconds to wait after the last arrival")
    parser.add_argument("--out", type=Path, default=Path("results.json"))
    parser.add_argument("--no-progress", action="store_true")
    args = parser.parse_args(argv)
    if args.workload == "retrieval" and args.rate is None:
        parser.error("--workload retrieval needs --rate")

    try:
        requests = build_workload(args)
    except ValueError as e:  # a workload parameter out of range: say which, as for a bad flag
        parser.error(str(e))
    if not requests:
        parser.error("the workload is empty: raise --rate or --duration")
    results = asyncio.run(run(args.url, requests, drain_s=args.drain, progress=not args.no_progress))
    report = {
        "config": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "metrics": metrics(results),
        "requests": [asdict(r) for r in results],
    }
    args.out.write_text(json.dumps(report, indent=1))
    m = report["metrics"]
    print(f"{m['ok']}/{m['requests']} ok, {m['output_tokens']} tokens, "
          f"avg token latency {m['avg_token_latency_s']} s, wrote {args.out}")
    return report


if __name__ == "__main__":
    main()
