"""Whose requests pay a system's LoRA cost: the top adapter's or the others', request by request.

    python bench/cost_by_adapter.py RESULTS.json [RESULTS.json ...] [--point vision-skewed] \\
        [--out bench/results] [--tag cost_by_adapter]

An end-to-end call of the own clients (``retrieval``, ``video``) sends every system of a round
the same requests: same prompts, images and arrival times, rebuilt here from the round's trace
seed (:func:`bench.e2e.measure.own_requests`), which also says each request's adapter (the
floor's copy names none). Per system and round, each request's E2E and TTFT minus the floor's
for the same request, pooled over every round of every call given and split by the round's most
requested adapter ("top": the one the orchestrator merges) against the others. With V-LoRA's
modes the top adapter's requests run merged and the others' in mixture or unmerged, so a cost
that sits on the others' points at the modes, one spread over both at what every iteration
pays. Next to it, per round, the client's TPOT (mean and median over requests) minus the
floor's. Writes ``<out>/<tag>.json`` and ``.png`` and prints a table.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import json
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import provenance  # noqa: E402
from bench.e2e import measure, plan  # noqa: E402
from bench.plotting import pyplot, save_figure  # noqa: E402


def rounds_of(run: dict[str, Any], point: str) -> list[dict[str, dict[str, Any]]]:
    """Per round of ``point`` with the floor measured: its measurements by system."""
    by_round: dict[int, dict[str, Any]] = collections.defaultdict(dict)
    for m in run["measurements"]:
        if m.get("point") == point and m.get("per_request") and m.get("trace_seed") is not None:
            by_round[m["repeat"]][m["system"]] = m
    return [systems for _, systems in sorted(by_round.items()) if plan.FLOOR in systems]


class TraceMismatch(ValueError):
    """The rebuilt requests are not those the round sent."""


def adapters_of(run: dict[str, Any], point: str, seed: int, sent: dict[str, Any]) -> list[str | None]:
    """Each request's adapter in the round of trace ``seed``, in the order sent, rebuilt from
    the point as the call recorded it; checked against ``sent``, a LoRA measurement of that
    round (its requests per adapter, ``per_adapter``)."""
    spec = plan.Point(**run["points"][point])
    adapters = [r.adapter for r in measure.own_requests(spec, run["setup"]["adapter_names"], seed, lora=True)]
    counted = collections.Counter(adapters)
    recorded = {name: group["requests"] for name, group in sent.get("per_adapter", {}).items()}
    if recorded != dict(counted):
        raise TraceMismatch(f"trace {seed} rebuilt as {dict(counted)} requests by adapter, the round sent {recorded}")
    return adapters


def differences(system: dict[str, Any], floor: dict[str, Any], adapters: Sequence[str | None]) -> dict[str, Any]:
    """One round of one system: per request (by index) its E2E and TTFT minus the floor's,
    grouped into the top adapter's and the others'."""
    top = collections.Counter(a for a in adapters if a is not None).most_common(1)[0][0]
    mine, base = system["per_request"], floor["per_request"]
    base_e2e = dict(zip(base["index"], base["e2e_ms"], strict=True))
    base_ttft = dict(zip(base["index"], base["ttft_ms"], strict=True))
    groups: dict[str, dict[str, list[float]]] = {g: {"e2e_ms": [], "ttft_ms": []} for g in ("top", "others")}
    for i, e2e, ttft in zip(mine["index"], mine["e2e_ms"], mine["ttft_ms"], strict=True):
        if i in base_e2e:
            group = groups["top" if adapters[i] == top else "others"]
            group["e2e_ms"].append(e2e - base_e2e[i])
            group["ttft_ms"].append(ttft - base_ttft[i])
    tpot = {q: system["metrics"]["tpot_ms"][q] - floor["metrics"]["tpot_ms"][q] for q in ("mean", "p50")}
    return {"top": top, "groups": groups, "tpot_ms": tpot}


def pooled(rounds: list[dict[str, Any]]) -> dict[str, Any]:
    """Means and medians of the per-request differences over ``rounds`` of one system."""
    out: dict[str, Any] = {"rounds": len(rounds)}
    for group in ("top", "others"):
        e2e = [x for r in rounds for x in r["groups"][group]["e2e_ms"]]
        ttft = [x for r in rounds for x in r["groups"][group]["ttft_ms"]]
        out[group] = {"requests": len(e2e)} | ({
            "e2e_ms_over_floor": {"mean": round(statistics.mean(e2e), 2), "median": round(statistics.median(e2e), 2)},
            "ttft_ms_over_floor": {"mean": round(statistics.mean(ttft), 2),
                                   "median": round(statistics.median(ttft), 2)},
        } if e2e else {})
    out["tpot_ms_over_floor"] = {q: round(statistics.mean(r["tpot_ms"][q] for r in rounds), 3) for q in ("mean", "p50")}
    return out


def analyse(runs: Sequence[dict[str, Any]], point: str) -> dict[str, dict[str, Any]]:
    by_system: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
    for run in runs:
        for systems in rounds_of(run, point):
            lora = next((m for name, m in systems.items() if name != plan.FLOOR), None)
            if lora is None:
                continue
            adapters = adapters_of(run, point, systems[plan.FLOOR]["trace_seed"], lora)
            for name, m in systems.items():
                if name != plan.FLOOR and m["trace_seed"] == systems[plan.FLOOR]["trace_seed"]:
                    by_system[name].append(differences(m, systems[plan.FLOOR], adapters))
    return {name: pooled(rounds) for name, rounds in sorted(by_system.items())}


def plot(result: dict[str, dict[str, Any]], path: Path) -> None:
    plt = pyplot()
    if plt is None:
        return
    names = list(result)
    fig, ax = plt.subplots(figsize=(max(5.0, 1.6 * len(names)), 3.5))
    width = 0.2
    for k, (group, what) in enumerate([(g, w) for g in ("top", "others") for w in ("e2e_ms_over_floor",
                                                                                    "ttft_ms_over_floor")]):
        values = [result[n][group].get(what, {}).get("mean", float("nan")) for n in names]
        ax.bar([i + (k - 1.5) * width for i in range(len(names))], values, width,
               label=f"{group}: {what.split('_ms')[0].upper()}")
    ax.set_xticks(range(len(names)), names)
    ax.set_ylabel("ms over the floor, mean a request")
    ax.legend(fontsize=7)
    save_figure(plt, fig, path)


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("results", nargs="+", type=Path, help="end-to-end results files")
    ap.add_argument("--point", default="vision-skewed")
    ap.add_argument("--out", type=Path, default=Path("bench/results"))
    ap.add_argument("--tag", default="cost_by_adapter")
    args = ap.parse_args(argv)
    runs = []
    for path in args.results:
        try:
            run = json.loads(path.read_text())
            run["measurements"], run["points"], run["setup"]["adapter_names"]  # noqa: B018 (the fields read)
        except (OSError, ValueError, KeyError, TypeError) as e:
            ap.error(f"{path}: not an end-to-end results file ({type(e).__name__}: {e})")
        runs.append(run)
    if not any(args.point in run["points"] for run in runs):
        ap.error(f"no results file has point {args.point!r}")
    try:
        result = analyse([run for run in runs if args.point in run["points"]], args.point)
    except TraceMismatch as e:
        ap.error(str(e))
    except (KeyError, TypeError, ValueError) as e:
        ap.error(f"a measurement of {args.point!r} lacks what this reads (per_request, metrics.tpot_ms, "
                 f"trace_seed): {type(e).__name__}: {e}")
    if not result:
        ap.error(f"no round of {args.point!r} measured the floor and another system from the same trace")
    report = {"point": args.point, "files": [str(p) for p in args.results], "systems": result,
              "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
              "command": "python bench/cost_by_adapter.py " + " ".join(argv if argv is not None else sys.argv[1:]),
              "provenance": provenance.record()}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.tag}.json").write_text(json.dumps(report, indent=1) + "\n")
    plot(result, args.out / f"{args.tag}.png")
    print(f"{args.point}: ms over the floor a request, mean (median), pooled over rounds")
    print("| system | rounds | top adapter: requests, E2E, TTFT | others: requests, E2E, TTFT | TPOT mean, p50 |")
    print("|---|---|---|---|---|")
    for name, r in result.items():
        cells = []
        for group in ("top", "others"):
            g = r[group]
            cells.append(f"{g['requests']}, {g['e2e_ms_over_floor']['mean']:+.1f} ({g['e2e_ms_over_floor']['median']:+.1f}), "
                         f"{g['ttft_ms_over_floor']['mean']:+.1f} ({g['ttft_ms_over_floor']['median']:+.1f})"
                         if g["requests"] else "0")
        tpot = r["tpot_ms_over_floor"]
        print(f"| {name} | {r['rounds']} | {cells[0]} | {cells[1]} | {tpot['mean']:+.2f}, {tpot['p50']:+.2f} |")
    return report


if __name__ == "__main__":
    main()
