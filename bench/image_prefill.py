"""What one image request's prefill costs per system and mode, the systems taking turns.

    python bench/image_prefill.py --out DIR [--scale gpu] [--rounds 20] \\
        [--systems nolora merge_only unmerge_only csgmv] [--profile [--profile-requests N]]

The vision-skewed end-to-end point's timelines showed ours' prefills of one image and its
prompt reading a median 13 ms longer unmerged than merged, at a load where rounds are decided
by such prefills. This measures that prefill alone: every server of the end-to-end benchmark's
setup (same model, adapters and flags, plus the ``vision-skewed`` calls' vision-encoder flags
and ``--enable-metrics`` for SGLang's per-request timestamps) answers, in each round, the same
fresh requests with 1 output token, the servers in a rotated order:

* ``image448`` / ``image672``: one retrieval request (a new image of that side, its prompt)
  on the top adapter, as the ``vision-skewed`` point sends them (the vision encoder and the
  language model's prefill);
* ``text448``: ``input_ids`` as long as an ``image448`` request's prompt, same adapter: the
  language model's prefill alone.

Every LoRA request names the same adapter, so ``merge_only`` keeps it merged after its first
request (a merged prefill) and ``unmerge_only`` runs it through ATMM (an unmerged one); the
floor gets the same requests without an adapter. Per scenario and system: the stages of
``bench/video_timeline.py`` (``prefill`` is SGLang's first-forward start to prefill done),
median / min / max over the rounds, and per LoRA system the median of its per-round excess
over the floor's prefill.

``--beside-decode N`` runs each measured request beside ``N`` requests of the top adapter (none for
the floor) that are decoding when it arrives, as in the end-to-end benchmark, where a new request's
prefill stops a running decode batch; a server that keeps its top adapter merged then runs a
second adapter's prefill in mixture. ``--mixture-systems`` names plugin systems (with a policy that keeps a popular adapter merged,
e.g. ``vlora_keep_popular``) whose measured requests run in mixture: before each, ``PRIME``
one-token text requests on the top adapter keep it merged and popular, and the measured request
names the second adapter. Every plugin system's request records the modes its iterations ran in
(``ran_in``: the change of ``/vlora/status``'s iteration counts across it), so a table row says
what it measured.

``--profile`` also records ``--profile-requests`` ``image448`` requests per server (default 1,
the servers taking turns) under SGLang's torch profiler and summarises the first with
``bench/profile_server.py``'s summary (GPU busy time, kernels by category, the host's top
operations): whether the prefill waits on the GPU or on the host, and what the LoRA kernels
add. For every one, ``prefill_host_profiled`` keeps the host time of the language model's
prefill and of the vision encoder (SGLang's ranges) and their ratio, with the medians.

Writes ``DIR/image_prefill.json``, the servers' logs to ``DIR/logs`` and prints a table.
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench import provenance, workloads  # noqa: E402
from bench.e2e import plan, servers  # noqa: E402
from bench.video_timeline import METRICS_FLAG, STAGES, TEXT_IDS, post, summary  # noqa: E402

SCENARIOS = ("image448", "image672", "text448")
DEFAULT_SYSTEMS = ("nolora", "merge_only", "unmerge_only", "csgmv")
GPU_SIDES = {"image448": 448, "image672": 672}
CPU_SIDES = {"image448": 56, "image672": 112}  # the CPU point's image sides (the tiny model's ViT)


def image_payload(adapter: str | None, side: int, seed: int) -> dict[str, Any]:
    """One retrieval request with a fresh image of ``side`` px and 1 output token."""
    (request,) = workloads.visual_retrieval(["a"], rate=100.0, duration_s=10.0, skew=1.0, seed=seed,
                                            max_requests=1, image_sizes=(side,))
    payload = dict(request.payload, lora_path=adapter)
    payload["sampling_params"] = dict(payload["sampling_params"], max_new_tokens=1)
    return payload


def text_payload(adapter: str | None, length: int, rng: np.random.Generator) -> dict[str, Any]:
    return {"input_ids": rng.integers(*TEXT_IDS, size=length).tolist(), "lora_path": adapter,
            "sampling_params": {"max_new_tokens": 1, "temperature": 0, "ignore_eos": True}}


def round_payloads(scale: str, r: int, seed: int, text_length: int) -> dict[str, dict[str, Any]]:
    """Round ``r``'s requests without an adapter (each server puts its own in)."""
    sides = CPU_SIDES if scale == "cpu" else GPU_SIDES
    rng = np.random.default_rng([seed, r])
    return {"image448": image_payload(None, sides["image448"], seed * 100_003 + 2 * r),
            "image672": image_payload(None, sides["image672"], seed * 100_003 + 2 * r + 1),
            "text448": text_payload(None, text_length, rng)}


PRIME = 3  # top-adapter requests before each measured request of a mixture system
BESIDE_HEAD_START_S = 0.25  # the beside requests' prefills are done and they decode when the measured one arrives


def for_system(payload: dict[str, Any], system: plan.System, adapter: str) -> dict[str, Any]:
    return dict(payload, lora_path=adapter if system.lora else None)


def iterations_by_mode(client: httpx.Client, url: str) -> dict[str, int]:
    """The plugin server's iteration counts by mode (``/vlora/status``)."""
    resp = client.get(url + "/vlora/status")
    resp.raise_for_status()
    return dict(resp.json()["orchestrator"]["iterations"])


class Measured:
    """How one server is asked: plain systems get the payload as it is (their adapter on it);
    mixture systems get ``PRIME`` top-adapter requests first and the measured one on ``other``;
    with ``beside`` > 0 the measured request runs beside that many top-adapter requests that are
    decoding when it arrives (the floor's have no adapter); plugin systems' results carry ``ran_in``, the modes of the iterations the request ran in."""

    def __init__(self, system: plan.System, url: str, top: str, other: str, mixture: bool, beside: int = 0,
                 beside_tokens: int = 48) -> None:
        self.system, self.url, self.top, self.mixture = system, url, top, mixture
        self.beside, self.beside_tokens = beside, beside_tokens
        self.adapter = other if mixture else top

    def prime(self, client: httpx.Client) -> None:
        if self.mixture:
            for i in range(PRIME):
                post(client, self.url, {"input_ids": [TEXT_IDS[0] + i] * 8, "lora_path": self.top,
                                        "sampling_params": {"max_new_tokens": 1, "temperature": 0}})

    def post(self, client: httpx.Client, payload: dict[str, Any]) -> dict[str, Any]:
        self.prime(client)
        before = iterations_by_mode(client, self.url) if self.system.plugin else None
        with self.beside_running() as measured_done:
            result = post(client, self.url, for_system(payload, self.system, self.adapter))
            measured_done.append(time.perf_counter())
        if before is not None:
            after = iterations_by_mode(client, self.url)
            result["ran_in"] = {mode: after[mode] - before.get(mode, 0) for mode in after
                                if after[mode] != before.get(mode, 0)}
        return result

    @contextmanager
    def beside_running(self) -> Iterator[list[float]]:
        """The requests beside the measured one, decoding when the block starts; the block
        appends when the measured request finished (perf_counter), which they must outlast."""
        measured_done: list[float] = []
        with ThreadPoolExecutor(max_workers=max(1, self.beside)) as pool:
            beside = [pool.submit(self._decode_beside, i) for i in range(self.beside)]
            if beside:
                time.sleep(BESIDE_HEAD_START_S)
            yield measured_done
            for future in beside:
                if measured_done and future.result() < measured_done[0]:
                    raise RuntimeError("a request beside the measured one finished before it: raise "
                                       "--beside-output-tokens")

    def _decode_beside(self, i: int) -> float:
        """One top-adapter request decoding ``beside_tokens`` tokens; when it finished (perf_counter)."""
        payload = {"input_ids": [TEXT_IDS[0] + 1 + i] * 16, "lora_path": self.top if self.system.lora else None,
                   "sampling_params": {"max_new_tokens": self.beside_tokens, "temperature": 0, "ignore_eos": True}}
        with httpx.Client(timeout=httpx.Timeout(300.0), trust_env=False) as client:
            post(client, self.url, payload)
        return time.perf_counter()


def modes_run(requests: list[dict[str, Any]]) -> dict[str, int]:
    """Iterations by mode over ``requests`` (plugin systems)."""
    total: dict[str, int] = {}
    for r in requests:
        for mode, n in r.get("ran_in", {}).items():
            total[mode] = total.get(mode, 0) + n
    return total


def excess_over_floor(raw: dict[str, dict[str, list[dict[str, Any]]]], floor: str) -> dict[str, dict[str, Any]]:
    """Per scenario and system: the median, min and max over rounds of its prefill minus the floor's."""
    out: dict[str, dict[str, Any]] = {}
    for scenario, by_system in raw.items():
        base = [r["stages"]["prefill"] if r["stages"] else None for r in by_system.get(floor, [])]
        for name, results in by_system.items():
            if name == floor:
                continue
            diffs = [r["stages"]["prefill"] - b for r, b in zip(results, base, strict=True)
                     if r["stages"] and b is not None]
            if diffs:
                out.setdefault(scenario, {})[name] = {"median": round(statistics.median(diffs), 2),
                                                      "min": round(min(diffs), 2), "max": round(max(diffs), 2),
                                                      "rounds": len(diffs)}
    return out


def profile_image(server: Measured, payload: dict[str, Any], trace_dir: Path) -> dict[str, Any]:
    """One ``image448`` request under SGLang's torch profiler, summarised (a mixture system's
    priming requests run before the profiler starts; requests beside it, once they decode)."""
    from bench.profile_server import load_events, profiled, summarise

    url = server.url

    def send(client: httpx.Client, measured_done: list[float]) -> dict[str, Any]:
        result = post(client, url, for_system(payload, server.system, server.adapter))
        measured_done.append(time.perf_counter())
        return result

    with httpx.Client(timeout=httpx.Timeout(300.0), trust_env=False) as client:
        server.prime(client)
        with server.beside_running() as measured_done:
            trace, result = profiled(url, trace_dir, "image448", lambda: send(client, measured_done))
    return {**summarise(load_events(trace), decode=False), "request": result, "trace": trace.name}


LM_PREFILL = "user_annotation:sglang.vlm.language_model_prefill"  # SGLang's ranges in the profiled step
VISION_ENCODER = "user_annotation:sglang.vlm.mm_embedding"


def prefill_host(summaries: list[dict[str, Any]]) -> dict[str, Any]:
    """Host time of the profiled prefills, split by SGLang's ranges: the language model's prefill
    (where LoRA runs) and the vision encoder's (no LoRA): per request and the medians. Their
    ratio takes out the host's speed of the moment, which moves a host-bound prefill more than
    any LoRA work does."""
    rows = []
    for summary_ in summaries:
        host = summary_.get("top_host_us_per_step") or {}
        if LM_PREFILL in host and VISION_ENCODER in host:
            lm, vision = host[LM_PREFILL] / 1000, host[VISION_ENCODER] / 1000
            rows.append({"language_model_ms": round(lm, 2), "vision_encoder_ms": round(vision, 2),
                         "ratio": round(lm / vision, 3), "gpu_busy_ms": round(summary_["busy_us_per_step"] / 1000, 2)})
    medians = {k: round(statistics.median(r[k] for r in rows), 3) for k in rows[0]} if rows else {}
    return {"requests": rows, "median": medians, "failed": len(summaries) - len(rows)}


def print_table(results: dict[str, Any]) -> None:
    print(f"{'scenario':10} {'server':18} " + " ".join(f"{s:>11}" for s in STAGES)
          + "  prefill-floor (median ms)  iterations by mode")
    for scenario, by_system in results["scenarios"].items():
        for name, data in by_system.items():
            st = data["stages_ms"] or {}
            excess = results["prefill_over_floor_ms"].get(scenario, {}).get(name, {}).get("median")
            print(f"{scenario:10} {name:18} " + " ".join(f"{st.get(s, {}).get('median', float('nan')):11.1f}"
                                                        for s in STAGES)
                  + (f"  {excess:+.1f}" if excess is not None else "  -")
                  + (f"  {data['iterations_by_mode']}" if data["iterations_by_mode"] else ""))
    for name, server in results["servers"].items():
        host = server.get("prefill_host_profiled", {})
        if host.get("median"):
            print(f"profiled image448 {name:18} median of {len(host['requests'])}: {host['median']}")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--scale", choices=("gpu", "cpu"), default="gpu")
    ap.add_argument("--rounds", type=int, default=20, help="requests of each scenario per server")
    ap.add_argument("--systems", nargs="+", default=list(DEFAULT_SYSTEMS), choices=list(plan.SYSTEMS))
    ap.add_argument("--mixture-systems", nargs="+", default=[], choices=list(plan.SYSTEMS),
                    help="plugin systems among --systems whose measured requests run in mixture (see above)")
    ap.add_argument("--beside-decode", type=int, default=0, metavar="N",
                    help="top-adapter requests decoding beside each measured one (see above)")
    ap.add_argument("--beside-output-tokens", type=int, default=48,
                    help="their output tokens: enough to outlast the measured request")
    ap.add_argument("--profile", action="store_true", help="also profile image448 requests per server")
    ap.add_argument("--profile-requests", type=int, default=1, metavar="N",
                    help="profiled requests per server, the servers taking turns (default 1)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if args.rounds < 1:
        ap.error("--rounds must be >= 1")
    if args.profile_requests < 1:
        ap.error("--profile-requests must be >= 1")
    if args.beside_decode < 0 or args.beside_output_tokens < 1:
        ap.error("--beside-decode must be >= 0 and --beside-output-tokens >= 1")
    for name in args.mixture_systems:
        if name not in args.systems or not plan.SYSTEMS[name].plugin:
            ap.error(f"--mixture-systems: {name} must be a plugin system among --systems")
    gpu = servers.refuse_systems(ap, args.systems)
    setup, model, adapters, info, log_dir = servers.prepare_run(args.out, args.scale, REPO / ".cache" / "bench")
    if args.mixture_systems and len(adapters) < 2:
        raise RuntimeError("--mixture-systems needs two adapters")
    adapter, other = list(adapters)[:2]
    systems = [plan.SYSTEMS[n] for n in args.systems]
    extra = [METRICS_FLAG, *(plan.VISION_FLAGS if args.scale == "gpu" else ())]
    live = servers.start_all(systems, setup, model, adapters, log_dir, extra)
    results: dict[str, Any] = {"assets": info, "rounds": args.rounds, "adapter": adapter,
                               "beside_decode": {"requests": args.beside_decode, "output_tokens": args.beside_output_tokens,
                                                 "head_start_s": BESIDE_HEAD_START_S},
                               "mixture_systems": {n: {"merged": adapter, "requests_on": other, "primed_by": PRIME}
                                                   for n in args.mixture_systems},
                               "servers": {n: {"command": shlex.join(servers.command(plan.SYSTEMS[n], setup, model,
                                                                                     adapters, extra))}
                                           for n in args.systems}}
    raw: dict[str, dict[str, list[dict[str, Any]]]] = {s: {n: [] for n in args.systems} for s in SCENARIOS}
    try:
        servers.require_all_up(live, setup.start_timeout_s)
        asked = {s.name: Measured(s, live[s.name].url, adapter, other, s.name in args.mixture_systems,
                                  args.beside_decode, args.beside_output_tokens) for s in systems}
        with httpx.Client(timeout=httpx.Timeout(300.0), trust_env=False) as client:
            # warm-up: every server answers each kind once (first-use costs, the merge of the adapter)
            warm = round_payloads(args.scale, args.rounds + 1, args.seed, text_length=1)
            first = post(client, live[args.systems[0]].url, for_system(warm["image448"], systems[0], adapter))
            text_length = int(first["prompt_tokens"])  # the text scenario's length: an image448 prompt's
            warm = round_payloads(args.scale, args.rounds + 1, args.seed, text_length)
            for system in systems:
                for scenario in SCENARIOS:
                    asked[system.name].post(client, warm[scenario])
            for r in range(args.rounds):
                payloads = round_payloads(args.scale, r, args.seed, text_length)
                order = systems[r % len(systems):] + systems[: r % len(systems)]
                kinds = SCENARIOS[r % len(SCENARIOS):] + SCENARIOS[: r % len(SCENARIOS)]
                for system in order:
                    for scenario in kinds:
                        raw[scenario][system.name].append(asked[system.name].post(client, payloads[scenario]))
        if args.profile:
            profiles: dict[str, list[dict[str, Any]]] = {s.name: [] for s in systems}
            for p in range(args.profile_requests):
                payloads = round_payloads(args.scale, args.rounds + 2 + p, args.seed, text_length)
                for system in systems[p % len(systems):] + systems[: p % len(systems)]:
                    try:
                        profiles[system.name].append(profile_image(
                            asked[system.name], payloads["image448"], args.out / "traces" / system.name))
                    except (RuntimeError, httpx.HTTPError) as e:  # the timed rounds stand without it
                        profiles[system.name].append({"failed": f"{type(e).__name__}: {e}"})
            for name, summaries in profiles.items():
                results["servers"][name]["profile_image448"] = summaries[0]
                results["servers"][name]["prefill_host_profiled"] = prefill_host(summaries)
    finally:
        servers.stop_all(live)
    results["text_prompt_tokens"] = text_length
    results["scenarios"] = {
        scenario: {name: {"stages_ms": summary([x["stages"] for x in rs if x["stages"]]) or None,
                          "iterations_by_mode": modes_run(rs), "requests": rs}
                   for name, rs in by_system.items()}
        for scenario, by_system in raw.items()}
    results["prefill_over_floor_ms"] = excess_over_floor(raw, plan.FLOOR) if plan.FLOOR in args.systems else {}
    provenance.save_run(args.out / "image_prefill.json", results, gpu, "bench/image_prefill.py",
                        sys.argv[1:] if argv is None else argv)
    print_table(results)
    return results


if __name__ == "__main__":
    main()
