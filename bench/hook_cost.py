"""The Python work behind the orchestrator's host time a decision, on this machine's CPU.

    python bench/hook_cost.py RESULTS.json LOGS.tar.gz [RESULTS.json LOGS.tar.gz ...] \\
        [--requests 1 3 8 32] [--repeats 2000] [--out bench/results] [--tag hook_cost_cpu]

An end-to-end call's results hold, per measurement of a server with an orchestrator, the host
time of its scheduler hooks (``hook_seconds_total`` over ``hook_calls``: wall time inside the
scheduler process) and its timeline (every timed iteration: mode, prefill tokens, decode
requests, seconds) in the logs tarball. This times, on the CPU it runs on, the two parts of a
decision that grow with the serving it saw:

* ``cost model``: the measurement's iterations replayed through a fresh
  :class:`~sglang_vlora.orchestrator.cost_model.MeasuredCosts` as the scheduler feeds it (each
  iteration recorded, then the snapshot the decision reads, refitted when due): microseconds an
  iteration, and how many snapshots were rebuilt;
* ``decision``: the ``vlora`` policy's ``decide`` on states of N requests in flight (one
  waiting, the rest running; 80% on the merged adapter, the rest on two others), with the cost
  model the replays ended with: microseconds a decision.

Next to them, each measurement's hook time as its server reported it, and its requests in flight
(decode batch sizes of its timeline): what the hooks took there against what this Python work
takes here. Writes ``<out>/<tag>.json`` and ``.png`` and prints a table.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
import tarfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import provenance  # noqa: E402
from bench.mode_cost import parse_positive  # noqa: E402
from bench.plotting import pyplot, save_figure  # noqa: E402
from bench.timeline_summary import timelines  # noqa: E402
from sglang_vlora.orchestrator import CostModel, Mode, Request, SchedulerState  # noqa: E402
from sglang_vlora.orchestrator.cost_model import MeasuredCosts  # noqa: E402
from sglang_vlora.orchestrator.policy import PolicyConfig, make_policy  # noqa: E402

LAYERS = 28  # Qwen2-VL-7B's: only switch fits use it, and the replays record none
RANKS = {"l00": 64, "l01": 64, "l02": 64}


def replay(timeline: dict[str, Any]) -> tuple[float, int, int, MeasuredCosts]:
    """``(seconds, iterations, snapshots rebuilt, costs)`` of feeding ``timeline`` to a fresh
    cost model, one record and one snapshot an iteration."""
    columns = timeline["columns"]
    rows = [dict(zip(columns, values, strict=True)) for values in timeline["iterations"]]
    costs = MeasuredCosts(LAYERS)
    rebuilt, last = 0, None
    started = time.perf_counter()
    for row in rows:
        costs.record_iteration(Mode(row["mode"]), row["prefill_tokens"], row["decode_requests"], row["seconds"])
        snapshot = costs.snapshot()
        if snapshot is not last:
            rebuilt, last = rebuilt + 1, snapshot
    return time.perf_counter() - started, len(rows), rebuilt, costs


def in_flight(timeline: dict[str, Any]) -> dict[str, float]:
    """Median and largest decode batch of a timeline (its requests in flight while decoding)."""
    index = timeline["columns"].index("decode_requests")
    sizes = [row[index] for row in timeline["iterations"] if row[index]]
    return {"median": float(statistics.median(sizes)), "max": max(sizes)} if sizes else {"median": 0.0, "max": 0}


def state(requests: int) -> SchedulerState:
    """One waiting request and ``requests - 1`` running ones, 80% of them on the merged ``l00``."""
    adapters = ["l00"] * 8 + ["l01", "l02"]
    running = [Request(f"r{i}", adapters[i % len(adapters)], 0.05 * i, 600, 8, 600, 2) for i in range(requests - 1)]
    waiting = [Request("w0", "l01", 1.0, 600, 8)]
    return SchedulerState(now=1.2, waiting=waiting, running=running, mode=Mode.MERGE, merged="l00", ranks=RANKS,
                          recent_arrivals=tuple(["l00"] * 26 + ["l01"] * 3 + ["l02"] * 3))


def decision_us(cost: CostModel, requests: int, repeats: int) -> float:
    policy = make_policy("vlora", PolicyConfig(theta=0.4, max_batch=2, adapter_slots=4, admission="all",
                                              keep_merged="plurality"), cost)
    s = state(requests)
    started = time.perf_counter()
    for _ in range(repeats):
        policy.decide(s)
    return (time.perf_counter() - started) / repeats * 1e6


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    plt = pyplot()
    if plt is None:
        return
    fig, ax = plt.subplots(figsize=(max(6.0, 0.5 * len(rows) + 2), 4))
    labels = [f"{r['call']}\n{r['system']} #{r['repeat']}" for r in rows]
    ax.bar(labels, [r["server_hook_us"] for r in rows], label="hooks, as the server reported (wall)")
    ax.bar(labels, [r["cost_model_us"] for r in rows], label="cost model replayed here (CPU)")
    ax.set_ylabel("us a decision")
    ax.tick_params(axis="x", labelsize=6, rotation=90)
    ax.legend(fontsize=7)
    save_figure(plt, fig, path)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("pairs", nargs="+", type=Path, help="RESULTS.json LOGS.tar.gz, one pair a call")
    ap.add_argument("--requests", nargs="+", type=parse_positive, default=[1, 3, 8, 32])
    ap.add_argument("--repeats", type=parse_positive, default=2000)
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    ap.add_argument("--tag", default="hook_cost_cpu")
    args = ap.parse_args(argv)
    if len(args.pairs) % 2:
        ap.error("give RESULTS.json LOGS.tar.gz pairs")
    rows, last_costs = [], None
    for results_path, logs_path in zip(args.pairs[::2], args.pairs[1::2], strict=True):
        try:
            results = json.loads(results_path.read_text())
            measured = [(m, t) for m, t in timelines(results, logs_path)
                        if (m.get("orchestrator") or {}).get("hook_calls")]
            replays = [replay(t) for _, t in measured]
        except (OSError, json.JSONDecodeError, tarfile.TarError, ValueError, KeyError, TypeError) as e:
            raise SystemExit(f"bench/hook_cost.py: {results_path} with {logs_path}: {e!r}") from e
        if replays:
            last_costs = replays[-1][3]
        for (measurement, timeline), (seconds, iterations, rebuilt, _) in zip(measured, replays, strict=True):
            orch = measurement["orchestrator"]
            rows.append({
                "call": results_path.stem, "system": measurement["system"], "repeat": measurement["repeat"],
                "decisions": orch["hook_calls"],
                "server_hook_us": round(orch["hook_seconds_total"] / orch["hook_calls"] * 1e6, 1),
                "decode_batch": in_flight(timeline), "iterations": iterations, "snapshots_rebuilt": rebuilt,
                "cost_model_us": round(seconds / max(iterations, 1) * 1e6, 1),
            })
    if last_costs is None:
        raise SystemExit("bench/hook_cost.py: no measurement with hook times and a timeline in these calls")
    decisions = {str(n): round(decision_us(last_costs.snapshot(), n, args.repeats), 1) for n in args.requests}
    doc = {
        "what": __doc__.split("\n\n")[0],
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "command": " ".join(["python", "bench/hook_cost.py", *(sys.argv[1:] if argv is None else argv)]),
        "provenance": provenance.record(),
        "rows": rows,
        "decision_us_by_requests": decisions,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.tag}.json").write_text(json.dumps(doc, indent=1) + "\n")
    plot(rows, args.out / f"{args.tag}.png")
    print("| call | system | repeat | decisions | hooks us a decision (server, wall) | decode batch median (max) "
          "| cost model us an iteration (here) | snapshots rebuilt |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['call']} | {r['system']} | {r['repeat']} | {r['decisions']} | {r['server_hook_us']} | "
              f"{r['decode_batch']['median']} ({r['decode_batch']['max']}) | {r['cost_model_us']} | "
              f"{r['snapshots_rebuilt']} of {r['iterations']} |")
    print("\nthe vlora policy's decision here, us:", ", ".join(f"{n} requests {us}" for n, us in decisions.items()))
    return doc


if __name__ == "__main__":
    main()
