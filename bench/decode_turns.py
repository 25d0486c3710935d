"""What a decode step costs per system, the systems taking turns.

    python bench/decode_turns.py --out DIR [--scale gpu] [--rounds 12] [--batch 4] \\
        [--output-tokens 64] [--prompt-tokens 256] [--cpus-per-server K] \\
        [--systems nolora nolora_twin vlora unmerge_only csgmv]

The visual-retrieval point's requests decode a few at a time, and ours' TPOT there sits about a
millisecond over the floor's although most of its decode steps replay the base-only CUDA graph
(the merged adapter's requests need no LoRA work): per-iteration host work, or the prefills
between the decode steps? This measures the decode steps alone. In each round every server of
the end-to-end benchmark's setup (same model, adapters and flags, ``--enable-metrics`` for
SGLang's per-request timestamps) answers the same fresh batch of ``--batch`` text requests,
sent together, ``--output-tokens`` tokens each, the servers in a rotated order:

* ``top``: every request on the top adapter (ours merges it: merged decode steps);
* ``mix``: one request on the second adapter, the others on the top one (ours keeps the top
  adapter merged and runs the batch in mixture).

A request's TPOT is SGLang's decode stage (prefill done to finished) over its output tokens
after the first. Per scenario and system: the median TPOT over each round's requests, its
median / min / max over the rounds, and the round-by-round excess over the floor's (a second
floor, ``nolora_twin``, reads what the harness resolves). Plugin systems also record the modes
their iterations ran in (``ran_in``) and the orchestrator's hook time across the scenario
(``hook_us_per_decision``, ``decisions``): what its host work per iteration is next to what
the step costs. Writes ``DIR/decode_turns.json`` and ``.png`` (TPOT over the floor per scenario,
the bars' ends the rounds' min and max), the servers' logs to ``DIR/logs`` and prints a table.

    python bench/decode_turns.py --replot RESULTS.json     # the table and PNG of a results file again
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from bench import provenance  # noqa: E402
from bench.e2e import cpu_pinning, plan, servers  # noqa: E402
from bench.plotting import pyplot, save_figure  # noqa: E402
from bench.video_timeline import METRICS_FLAG, TEXT_IDS, post  # noqa: E402

SCENARIOS = ("top", "mix")
DEFAULT_SYSTEMS = ("nolora", "nolora_twin", "vlora", "unmerge_only", "csgmv")


def round_payloads(r: int, seed: int, batch: int, prompt_tokens: int, output_tokens: int) -> list[dict[str, Any]]:
    """Round ``r``'s requests without an adapter (each server puts its own in): fresh
    prompts, so that no server reuses another round's cache."""
    rng = np.random.default_rng([seed, r])
    return [{"input_ids": rng.integers(*TEXT_IDS, size=prompt_tokens).tolist(), "lora_path": None,
             "sampling_params": {"max_new_tokens": output_tokens, "temperature": 0, "ignore_eos": True}}
            for _ in range(batch)]


def adapters_for(scenario: str, batch: int, top: str, other: str) -> list[str]:
    """The adapter of each of a scenario's requests on a LoRA server."""
    if scenario == "top":
        return [top] * batch
    if scenario == "mix":
        return [other] + [top] * (batch - 1)
    raise ValueError(f"unknown scenario {scenario!r}; known: {list(SCENARIOS)}")


def tpot_ms(result: dict[str, Any]) -> float | None:
    """SGLang's decode stage over the output tokens after the first; None without timestamps."""
    stages, tokens = result.get("stages"), result.get("output_tokens") or 0
    if not stages or tokens < 2:
        return None
    return stages["decode"] / (tokens - 1)


def orchestrator_status(client: httpx.Client, url: str) -> dict[str, Any]:
    resp = client.get(url + "/vlora/status")
    resp.raise_for_status()
    return resp.json()["orchestrator"]


def send_batch(url: str, payloads: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The requests sent together (one client each), their results in order."""
    def one(payload: dict[str, Any]) -> dict[str, Any]:
        with httpx.Client(timeout=httpx.Timeout(300.0), trust_env=False) as client:
            return post(client, url, payload)

    with ThreadPoolExecutor(max_workers=len(payloads)) as pool:
        return list(pool.map(one, payloads))


def measure(client: httpx.Client, system: plan.System, url: str, scenario: str, payloads: list[dict[str, Any]],
            top: str, other: str) -> dict[str, Any]:
    """One scenario's batch on one server: its requests, their TPOTs and, for a plugin server,
    the modes its iterations ran in and the hooks' host time across it."""
    names = adapters_for(scenario, len(payloads), top, other)
    sent = [dict(p, lora_path=name if system.lora else None) for p, name in zip(payloads, names, strict=True)]
    before = orchestrator_status(client, url) if system.plugin else None
    requests = send_batch(url, sent)
    tpots = [t for r in requests if (t := tpot_ms(r)) is not None]
    out: dict[str, Any] = {"tpot_ms": round(statistics.median(tpots), 3) if tpots else None,
                           "requests": requests}
    if before is not None:
        after = orchestrator_status(client, url)
        out["ran_in"] = {mode: n - before["iterations"].get(mode, 0) for mode, n in after["iterations"].items()
                         if n != before["iterations"].get(mode, 0)}
        calls = after["hook_calls"] - before["hook_calls"]
        out["decisions"] = calls
        out["hook_us_per_decision"] = (round(1e6 * (after["hook_seconds_total"] - before["hook_seconds_total"]) / calls, 1)
                                       if calls else None)
    return out


def spread(values: list[float]) -> dict[str, float] | None:
    if not values:
        return None
    return {"median": round(statistics.median(values), 3), "min": round(min(values), 3),
            "max": round(max(values), 3), "rounds": len(values)}


def excess_over_floor(raw: dict[str, dict[str, list[dict[str, Any]]]], floor: str) -> dict[str, dict[str, Any]]:
    """Per scenario and system: its round's median TPOT minus the floor's, over the rounds
    where both have one."""
    out: dict[str, dict[str, Any]] = {}
    for scenario, by_system in raw.items():
        base = [r["tpot_ms"] for r in by_system.get(floor, [])]
        for name, rounds in by_system.items():
            if name == floor:
                continue
            diffs = [r["tpot_ms"] - b for r, b in zip(rounds, base, strict=True)
                     if r["tpot_ms"] is not None and b is not None]
            if diffs:
                out.setdefault(scenario, {})[name] = spread(diffs)
    return out


def summarise(raw: dict[str, dict[str, list[dict[str, Any]]]]) -> dict[str, dict[str, Any]]:
    """Per scenario and system: TPOT over the rounds, modes run and hook time (plugin systems)."""
    out: dict[str, dict[str, Any]] = {}
    for scenario, by_system in raw.items():
        for name, rounds in by_system.items():
            entry: dict[str, Any] = {"tpot_ms": spread([r["tpot_ms"] for r in rounds if r["tpot_ms"] is not None])}
            if any("ran_in" in r for r in rounds):
                modes: dict[str, int] = {}
                for r in rounds:
                    for mode, n in r["ran_in"].items():
                        modes[mode] = modes.get(mode, 0) + n
                entry["iterations_by_mode"] = modes
                entry["hook_us_per_decision"] = spread([r["hook_us_per_decision"] for r in rounds
                                                        if r.get("hook_us_per_decision") is not None])
                entry["decisions_per_round"] = spread([r["decisions"] for r in rounds])
            out.setdefault(scenario, {})[name] = entry
    return out


def print_table(results: dict[str, Any]) -> None:
    print(f"{'scenario':8} {'server':16} {'TPOT ms':>9} {'over floor':>11} {'min..max':>16}  hooks us/decision  modes")
    for scenario, by_system in results["summary"].items():
        for name, entry in by_system.items():
            tpot = entry["tpot_ms"] or {}
            ex = results["tpot_over_floor_ms"].get(scenario, {}).get(name)
            hooks = (entry.get("hook_us_per_decision") or {}).get("median")
            print(f"{scenario:8} {name:16} {tpot.get('median', float('nan')):9.3f} "
                  + (f"{ex['median']:+11.3f} {ex['min']:+7.3f}..{ex['max']:+7.3f}" if ex else f"{'-':>11} {'':16}")
                  + (f"  {hooks:17.1f}" if hooks is not None else f"  {'':17}")
                  + (f"  {entry['iterations_by_mode']}" if entry.get("iterations_by_mode") else ""))


def plot(results: dict[str, Any], path: Path) -> None:
    """TPOT over the floor per scenario and system: the rounds' median, whiskers to min and max."""
    plt = pyplot()
    excess = results["tpot_over_floor_ms"]
    if plt is None or not excess:
        return
    names = sorted({n for by_system in excess.values() for n in by_system}, key=list(results["servers"]).index)
    fig, ax = plt.subplots(figsize=(max(5.0, 1.5 * len(names)), 3.5))
    width = 0.8 / len(excess)
    for k, (scenario, by_system) in enumerate(excess.items()):
        xs = [i + (k - (len(excess) - 1) / 2) * width for i in range(len(names))]
        med = [by_system.get(n, {}).get("median", float("nan")) for n in names]
        lo = [m - by_system[n]["min"] if n in by_system else 0 for n, m in zip(names, med, strict=True)]
        hi = [by_system[n]["max"] - m if n in by_system else 0 for n, m in zip(names, med, strict=True)]
        ax.bar(xs, med, width, yerr=[lo, hi], capsize=3, label=scenario)
    ax.axhline(0, color="black", linewidth=0.6)
    ax.set_xticks(range(len(names)), names, fontsize=8)
    ax.set_ylabel("TPOT over the floor, ms")
    ax.set_title(f"{results['batch']} requests decoding, {results['rounds']} rounds ({results['device']})", fontsize=9)
    ax.legend(fontsize=7)
    save_figure(plt, fig, path)


def replot(path: Path) -> dict[str, Any]:
    try:
        results = json.loads(path.read_text())
        results["summary"], results["tpot_over_floor_ms"], results["batch"]  # noqa: B018 (the fields read)
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise SystemExit(f"{path}: not a decode_turns results file ({type(e).__name__}: {e})") from e
    print_table(results)
    plot(results, path.with_suffix(".png"))
    return results


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--replot", type=Path, metavar="RESULTS", help="print and plot a results file, run nothing")
    ap.add_argument("--out", type=Path)
    ap.add_argument("--scale", choices=("gpu", "cpu"), default="gpu")
    ap.add_argument("--rounds", type=int, default=12, help="batches of each scenario per server")
    ap.add_argument("--batch", type=int, default=4, help="requests decoding together")
    ap.add_argument("--output-tokens", type=int, default=64)
    ap.add_argument("--prompt-tokens", type=int, default=256)
    ap.add_argument("--cpus-per-server", type=int, default=0, metavar="K",
                    help="pin each server to its own block of K CPUs (0: unpinned)")
    ap.add_argument("--systems", nargs="+", default=list(DEFAULT_SYSTEMS), choices=list(plan.SYSTEMS))
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    if args.replot is not None:
        return replot(args.replot)
    if args.out is None:
        ap.error("--out is required to run")
    if args.rounds < 1:
        ap.error("--rounds must be >= 1")
    if args.batch < 2:
        ap.error("--batch must be >= 2 (the mix scenario puts one request on a second adapter)")
    if args.output_tokens < 2 or args.prompt_tokens < 1:
        ap.error("--output-tokens must be >= 2 and --prompt-tokens >= 1")
    if args.cpus_per_server < 0:
        ap.error("--cpus-per-server must be >= 0")
    gpu = servers.refuse_systems(ap, args.systems)
    pinning = None
    if args.cpus_per_server:
        try:
            pinning = cpu_pinning.assign(cpu_pinning.ordered_cpus(), args.systems, args.cpus_per_server)
        except ValueError as e:
            ap.error(str(e))
    setup, model, adapters, info, log_dir = servers.prepare_run(args.out, args.scale, REPO / ".cache" / "bench")
    if len(adapters) < 2:
        raise RuntimeError("the mix scenario needs two adapters")
    top, other = list(adapters)[:2]
    systems = [plan.SYSTEMS[n] for n in args.systems]
    extra = [METRICS_FLAG]
    live = servers.start_all(systems, setup, model, adapters, log_dir, extra,
                             cpus=pinning["servers"] if pinning else None)
    results: dict[str, Any] = {
        "assets": info, "rounds": args.rounds, "batch": args.batch, "output_tokens": args.output_tokens,
        "prompt_tokens": args.prompt_tokens, "adapters": {"top": top, "other": other}, "pinning": pinning,
        "servers": {n: {"command": shlex.join(servers.command(plan.SYSTEMS[n], setup, model, adapters, extra))}
                    for n in args.systems}}
    raw: dict[str, dict[str, list[dict[str, Any]]]] = {s: {n: [] for n in args.systems} for s in SCENARIOS}
    try:
        servers.require_all_up(live, setup.start_timeout_s)
        urls = {s.name: live[s.name].url for s in systems}
        with httpx.Client(timeout=httpx.Timeout(300.0), trust_env=False) as client:
            # warm-up: every server answers each scenario twice (first-use costs, the top adapter
            # merged and popular where a policy merges)
            for w in range(2):
                payloads = round_payloads(args.rounds + w, args.seed, args.batch, args.prompt_tokens, args.output_tokens)
                for system in systems:
                    for scenario in SCENARIOS:
                        measure(client, system, urls[system.name], scenario, payloads, top, other)
            for r in range(args.rounds):
                payloads = round_payloads(r, args.seed, args.batch, args.prompt_tokens, args.output_tokens)
                order = systems[r % len(systems):] + systems[: r % len(systems)]
                kinds = SCENARIOS[r % len(SCENARIOS):] + SCENARIOS[: r % len(SCENARIOS)]
                for system in order:
                    for scenario in kinds:
                        raw[scenario][system.name].append(
                            measure(client, system, urls[system.name], scenario, payloads, top, other))
    finally:
        servers.stop_all(live)
    results["scenarios"] = raw
    results["summary"] = summarise(raw)
    results["tpot_over_floor_ms"] = excess_over_floor(raw, plan.FLOOR) if plan.FLOOR in args.systems else {}
    provenance.save_run(args.out / "decode_turns.json", results, gpu, "bench/decode_turns.py",
                        sys.argv[1:] if argv is None else argv)
    print_table(results)
    plot(results, args.out / "decode_turns.png")
    return results


if __name__ == "__main__":
    main()
