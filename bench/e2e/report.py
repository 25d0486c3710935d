"""Results of any number of calls merged: repeats, spread, LoRA cost over the floor,
markdown, plots, and the README's headline table.

Every measurement of the same (system, point) in the given results files is one repeat.
Per (system, point) the report gives the mean over repeats of each repeat's mean E2E
latency with its spread (min / max / stdev), the same for P99 and TTFT, and the **LoRA
cost over the floor**: in each repeat, the system's mean E2E minus the no-LoRA server's
mean E2E for the same point in the same call and repeat (so each difference is taken on
one machine, minutes apart), then mean / min / max over repeats. Results of different
points are never mixed; results of different scales (gpu / cpu) are refused together. A call
run with extra server flags (``run --server-args``, e.g. ``--disable-radix-cache``) measured
other points: its point ids and labels carry the flags (:func:`key_points_by_flags`).
"""

from __future__ import annotations

import json
import random
import re
import statistics
import textwrap
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any, NamedTuple

from bench import provenance
from bench.e2e import plan, servers, timeline_figures
from bench.provenance import revision_label

SCHEMAS = ("sglang-vlora/e2e/v2",)
MERGED_SCHEMA = "sglang-vlora/e2e-merged/v1"
# Where the headline table goes before its first rendering; afterwards it is a figures block
# of bench/report.py (bench/figures_e2e.py), re-rendered by either script.
PLACEHOLDER = re.compile(r"<!-- e2e-headline:begin[^>]*-->.*?<!-- e2e-headline:end -->", re.S)
FIGURES_BLOCK = re.compile(r"<!-- figures:e2e-headline -->\n.*?<!-- /figures:e2e-headline -->", re.S)
SYSTEM_ORDER = list(plan.SYSTEMS)


def load(paths: Iterable[Path]) -> list[dict[str, Any]]:
    """Results files, checked: known schema, one scale and one device for all. A merged file
    (see :func:`merged`) contributes its runs."""
    runs = []
    for path in paths:
        data = json.loads(Path(path).read_text())
        if data.get("schema") == MERGED_SCHEMA:
            runs += [{**r, "_file": str(path)} for r in data["runs"]]
            continue
        if data.get("schema") not in SCHEMAS:
            raise ValueError(f"{path}: schema {data.get('schema')!r} is not one of {SCHEMAS} "
                             "(older e2e results cannot be merged with these)")
        data["_file"] = str(path)
        runs.append(key_points_by_flags(data))
    if not runs:
        raise ValueError("no results files given")
    scales = {r["call"]["scale"] for r in runs}
    if len(scales) > 1:
        raise ValueError(f"results of different scales {sorted(scales)} cannot be merged")
    devices = {r.get("device") for r in runs}
    if len(devices) > 1:
        raise ValueError(f"results of different devices {sorted(map(str, devices))} cannot be merged: a point's "
                         "repeats would pool two machines' speeds; report each device's files apart")
    return runs


# Server flags that change what a server logs, not what it computes: a run with them measures
# the same point (bench/forward_times.py reads the request time stats).
LOGGING_FLAGS = frozenset({"--enable-request-time-stats-logging"})


def key_points_by_flags(run: dict[str, Any]) -> dict[str, Any]:
    """``run`` with its points named after the extra server flags it ran with, if any
    (``sgl-prefill [--disable-radix-cache]``), and after their requests a repeat where the call
    shortened them (``sgl-mixed [100 requests a repeat]``), so that no table or ratio mixes them
    with the same point run under the call's own flags and length. Flags that only make the
    servers log (:data:`LOGGING_FLAGS`) do not rename. Idempotent: a merged file keeps the names."""
    if run.get("points_keyed_by_flags"):
        return run
    flags = (run.get("setup") or {}).get("extra_server_args") or []
    extra = " ".join(f for f in flags if f not in LOGGING_FLAGS)
    full = plan.points_of(run["call"]["scale"]) if "scale" in run.get("call", {}) else {}
    tags = {}
    for pid, p in run["points"].items():
        shortened = pid in full and p.get("requests") not in (None, full[pid].requests)
        tags[pid] = [t for t in (extra, f"{p.get('requests')} requests a repeat" if shortened else "") if t]
    if not any(tags.values()):
        return run
    key = {pid: f"{pid} [{'; '.join(t)}]" if t else pid for pid, t in tags.items()}
    points = {key[pid]: {**p, "label": ", ".join([p["label"], *tags[pid]])} for pid, p in run["points"].items()}
    measurements = [{**m, "point": key.get(m["point"], m["point"])} for m in run["measurements"]]
    return {**run, "points": points, "measurements": measurements, "points_keyed_by_flags": True}


def _spread(values: Sequence[float]) -> dict[str, Any] | None:
    if not values:
        return None
    return {"mean": statistics.fmean(values), "min": min(values), "max": max(values), "n": len(values),
            "stdev": statistics.stdev(values) if len(values) > 1 else None, "values": list(values)}


def aggregate(runs: Sequence[dict[str, Any]]) -> dict[str, dict[str, dict[str, Any]]]:
    """point -> system -> figures over repeats (see the module docstring)."""
    samples: dict[tuple[str, str], dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    floor: dict[tuple[str, str, int], float] = {}
    for run in runs:
        for m in run["measurements"]:
            if m.get("status") == "ok" and m["system"] == plan.FLOOR and m["metrics"]["e2e_ms"]["mean"] is not None:
                floor[run["run_id"], m["point"], m["repeat"]] = m["metrics"]["e2e_ms"]["mean"]
    for run in runs:
        for m in run["measurements"]:
            if m.get("status") != "ok":
                continue
            met, key = m["metrics"], (m["point"], m["system"])
            if met["e2e_ms"]["mean"] is None:
                continue
            s = samples[key]
            s["e2e_mean"].append(met["e2e_ms"]["mean"])
            for name, value in (("e2e_p99", met["e2e_ms"]["p99"]), ("ttft_mean", met["ttft_ms"]["mean"]),
                                ("tpot_mean", (met.get("tpot_ms") or {}).get("mean")),
                                ("error_share", met["errors"] / met["requests"] if met["requests"] else None)):
                if value is not None:
                    s[name].append(value)
            base = floor.get((run["run_id"], m["point"], m["repeat"]))
            if base is not None and m["system"] != plan.FLOOR:
                s["lora_cost"].append(met["e2e_ms"]["mean"] - base)
            vu = (m.get("per_task") or {}).get("video_understanding")
            if vu and vu["e2e_ms"]["mean"] is not None:
                s["video_understanding_mean"].append(vu["e2e_ms"]["mean"])
    out: dict[str, dict[str, dict[str, Any]]] = defaultdict(dict)
    for (point, system), s in samples.items():
        out[point][system] = {name: _spread(values) for name, values in s.items()}
    return out


def _mean(agg: dict[str, dict[str, Any]], system: str, figure: str) -> float | None:
    spread = (agg.get(system) or {}).get(figure)
    return spread["mean"] if spread else None


def _ratio_of_means(systems: dict[str, dict[str, Any]], system: str, peer: str, figure: str) -> float | None:
    ours, theirs = _mean(systems, system, figure), _mean(systems, peer, figure)
    return ours / theirs if ours is not None and theirs else None


def ratios(agg: dict[str, dict[str, dict[str, Any]]]) -> dict[str, dict[str, float | None]]:
    """Per point, ours against SGLang's backends and unmerge-only: LoRA cost ratios and
    mean / P99 E2E ratios (None where a figure is missing)."""
    out = {}
    for point, systems in agg.items():
        r: dict[str, float | None] = {}
        for peer in ("csgmv", "triton", "unmerge_only"):
            for fig, name in (("lora_cost", "lora_cost"), ("e2e_mean", "mean_e2e"), ("e2e_p99", "p99_e2e")):
                r[f"{name}_vs_{peer}"] = _ratio_of_means(systems, "vlora", peer, fig)
        out[point] = r
    return out


def heads_speedup(agg: dict[str, dict[str, dict[str, Any]]]) -> dict[str, float]:
    """Video-understanding latency by LM decoding over by task heads (ours), per server
    flags: ``""`` for the points run with the call's own flags, else the flags in brackets
    that both points were keyed by (:func:`key_points_by_flags`)."""
    out = {}
    for point in agg:
        if point != "video-lm" and not point.startswith("video-lm ["):
            continue
        flags = point[len("video-lm"):]
        lm = _mean(agg[point], "vlora", "video_understanding_mean")
        heads = _mean(agg.get("video-heads" + flags, {}), "vlora", "video_understanding_mean")
        if lm and heads:
            out[flags.strip()] = lm / heads
    return out


def _speedup_lines(agg: dict[str, dict[str, dict[str, Any]]]) -> list[str]:
    return [f"Video understanding on 6 frames, ours{', ' + flags[1:-1] if flags else ''}: task heads answer "
            f"{speed:.2f}x faster than LM decoding." for flags, speed in sorted(heads_speedup(agg).items())]


def _f(value: float | None, digits: int = 0) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _cell(spread: dict[str, Any] | None, digits: int = 0) -> str:
    """``mean (min-max, n)``."""
    if not spread:
        return "-"
    if spread["n"] == 1:
        return f"{_f(spread['mean'], digits)} (n=1)"
    return f"{_f(spread['mean'], digits)} ({_f(spread['min'], digits)}-{_f(spread['max'], digits)}, n={spread['n']})"


def provenance_line(runs: Sequence[dict[str, Any]]) -> str:
    revs = sorted({revision_label(r.get("code", {})) for r in runs})
    devices = sorted({r["device"] for r in runs})
    dates = sorted(r["date"] for r in runs)
    v = runs[0]["versions"]
    dirty = any("DIRTY" in x or "unknown" in x for x in revs)
    warn = " **WARNING: not from a clean, known revision.**" if dirty else ""
    pinned = sum(1 for r in runs if r.get("setup", {}).get("cpu_pinning"))
    pins = f" {pinned} of them with each server on CPUs of its own (`--cpus-per-server`)." if pinned else ""
    return (f"{', '.join(devices)}; {dates[0][:16]} to {dates[-1][:16]} UTC; code {', '.join(revs)}; SGLang "
            f"{v.get('sglang')}, torch {v.get('torch')}, Triton {v.get('triton')}; {len(runs)} call(s).{pins}{warn}")


def points_table(agg: dict[str, dict[str, dict[str, Any]]], runs: Sequence[dict[str, Any]]) -> list[str]:
    labels = {pid: p["label"] for r in runs for pid, p in r["points"].items()}
    lines = ["| point | system | mean E2E ms (min-max, n) | LoRA cost over floor ms | P99 E2E ms | TTFT ms "
             "| TPOT ms | errors |", "|---|---|---|---|---|---|---|---|"]
    for point in sorted(agg, key=lambda p: list(labels).index(p) if p in labels else 99):
        for system in sorted(agg[point], key=SYSTEM_ORDER.index):
            a = agg[point][system]
            err = a.get("error_share")
            errors = f"{err['max']:.1%}" if err and err["max"] else "-"
            lines.append(f"| {labels.get(point, point)} | {system} | {_cell(a.get('e2e_mean'))} | "
                         f"{_cell(a.get('lora_cost'), 1)} | {_cell(a.get('e2e_p99'))} | "
                         f"{_cell(a.get('ttft_mean'), 1)} | {_cell(a.get('tpot_mean'), 2)} | "
                         f"{errors} |")
    return lines


def orchestrator_table(runs: Sequence[dict[str, Any]]) -> list[str]:
    lines = ["| call | system | point | repeat | iterations per mode | decisions | decision reasons | switches "
             "| max batch, theta | batches without LoRA work | admitted after waiting > 0.25 s | kernel compiles "
             "| iterations over 2x their fit | hook host ms (us a decision: its parts) |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for run in runs:
        for m in run["measurements"]:
            status = m.get("vlora_status")
            # from the recorded /vlora/status readings where the run kept them (what today's
            # summary takes from them), else the summary the run wrote
            orch = servers.orchestrator_summary(status.get("before"), status.get("after")) if status else None
            orch = orch or m.get("orchestrator")
            if m.get("status") != "ok" or not orch:
                continue
            cfg = orch.get("config", {})
            lines.append(f"| {run['call']['name']} | {m['system']} | {m['point']} | {m['repeat']} | "
                         f"{_counts(orch.get('iterations'))} | {_counts(orch.get('decisions'))} | "
                         f"{_nonzero_counts(orch.get('decision_reasons'))} | "
                         f"{orch.get('switches', '-')} | {cfg.get('max_batch', '-')}, {cfg.get('theta_s', '-')} | "
                         f"{_counts(orch.get('batches_without_lora_work'))} | {_long_waits(orch.get('admission_waits'))} | "
                         f"{_compiles(orch.get('kernel_compiles'))} | {_stalls(orch.get('slow_iterations'))} | "
                         f"{_hook_time(orch)} |")
    return lines


def _hook_time(orch: dict[str, Any]) -> str:
    """The orchestrator's scheduler hooks' host time over the measurement, ms, and per
    iteration it decided for, us, with its parts per iteration where the server reports them
    (``hook_seconds_by_part``); "-" where it does not report the time."""
    seconds, calls = orch.get("hook_seconds_total"), orch.get("hook_calls")
    if seconds is None:
        return "-"
    if not calls:
        return f"{seconds * 1e3:.1f}"
    parts = orch.get("hook_seconds_by_part") or {}
    split = ", ".join(f"{name} {part / calls * 1e6:.0f}" for name, part in parts.items())
    return f"{seconds * 1e3:.1f} ({seconds / calls * 1e6:.0f}{': ' + split if split else ''})"


def _stalls(slow: dict[str, Any] | None) -> str:
    """Iterations during the measurement that took over twice what the cost model's fit
    predicts (by more than 20 ms): how many, their summed excess, and the longest's mode,
    work and seconds against the prediction; "-" where the server does not report them."""
    if not slow or slow.get("count") is None:
        return "-"
    text = f"{slow['count']} (+{slow.get('excess_s') or 0.0:.2f} s)"
    new = slow.get("new") or []
    if new:
        _, mode, tokens, requests, seconds, predicted = max(new, key=lambda x: x[4] - x[5])
        text += f", longest {mode} {tokens} tokens / {requests} requests {seconds * 1000:.0f} ms against {predicted * 1000:.0f}"
    return text


def _compiles(compiles: dict[str, Any] | None) -> str:
    """Kernel launches that compiled a variant during the measurement, their seconds, and
    which variants (where the server names them): each is one a compile-ahead missed."""
    if not compiles:
        return "-"
    text = f"{compiles.get('count', 0)} ({compiles.get('seconds', 0.0):.2f} s)"
    variants = {k: v for k, v in (compiles.get("by_variant") or {}).items() if v}
    if variants:
        text += ": " + "; ".join(f"{k} x{v}" for k, v in sorted(variants.items()))
    return text


def _long_waits(waits: dict[str, Any] | None, over: str = "0.25") -> str:
    """Per adapter, requests admitted after waiting more than ``over`` seconds, of all admitted."""
    if not waits:
        return "-"
    return ", ".join(f"{name} {w.get('over_s', {}).get(over, 0)}/{w.get('requests', 0)}" for name, w in waits.items())


def _split(groups: dict[str, Any]) -> tuple[tuple[int, float | None], tuple[int, float | None]]:
    """(requests, mean E2E ms) of the most requested adapter and of all the others together."""
    def part(items: list[dict[str, Any]]) -> tuple[int, float | None]:
        done = [(g["completed"], g["e2e_ms"]["mean"]) for g in items if g["completed"] and g["e2e_ms"]["mean"] is not None]
        n = sum(c for c, _ in done)
        return sum(g["requests"] for g in items), (sum(c * v for c, v in done) / n if n else None)

    top, *others = groups.values()
    return part([top]), part(others)


def adapter_table(runs: Sequence[dict[str, Any]]) -> list[str]:
    """Our client's measurements split into the most requested adapter's requests and the
    others', each against the floor's same requests in the same call and repeat."""
    lines = ["| call | point | repeat | system | top adapter: requests, mean E2E ms (over floor) "
             "| others: requests, mean E2E ms (over floor) |", "|---|---|---|---|---|---|"]
    for run in runs:
        ok = [m for m in run["measurements"] if m.get("status") == "ok" and m.get("per_adapter")]
        floors = {(m["point"], m["repeat"]): _split(m["per_adapter"]) for m in ok if m["system"] == plan.FLOOR}
        for m in ok:
            parts, base = _split(m["per_adapter"]), floors.get((m["point"], m["repeat"]))
            cells = []
            for i, (n, mean) in enumerate(parts):
                over = None if base is None or mean is None or base[i][1] is None else mean - base[i][1]
                cells.append(f"{n}, {_f(mean)}" + ("" if over is None or m["system"] == plan.FLOOR else f" ({over:+.0f})"))
            lines.append(f"| {run['call']['name']} | {m['point']} | {m['repeat']} | {m['system']} | "
                         f"{cells[0]} | {cells[1]} |")
    return lines if len(lines) > 2 else []


def paired_table(runs: Sequence[dict[str, Any]]) -> list[str]:
    """Measurements request by request against the floor: every system of a call gets the
    same requests at the same times (same seed; SGLang's client draws the floor's adapters
    too, sending none), so per repeat the median over requests of
    (system's E2E - floor's E2E for the same request) is a LoRA cost that a few slow
    requests (queueing tails) move far less than the difference of means does."""
    costs: dict[tuple[str, str], list[tuple[float, int]]] = defaultdict(list)
    for run in runs:
        ok = [m for m in run["measurements"] if m.get("status") == "ok" and m.get("per_request")]
        floors = {(m["point"], m["repeat"]): m["per_request"] for m in ok if m["system"] == plan.FLOOR}
        for m in ok:
            floor = floors.get((m["point"], m["repeat"]))
            if m["system"] == plan.FLOOR or floor is None:
                continue
            theirs = dict(zip(floor["index"], floor["e2e_ms"], strict=True))
            diffs = [e2e - theirs[i] for i, e2e in zip(m["per_request"]["index"], m["per_request"]["e2e_ms"],
                                                         strict=True)
                     if e2e is not None and theirs.get(i) is not None]
            if diffs:
                costs[m["point"], m["system"]].append((statistics.median(diffs), len(diffs)))
    if not costs:
        return []
    lines = ["| point | system | median paired LoRA cost ms (min-max, n repeats) | requests paired per repeat |",
             "|---|---|---|---|"]
    for (point, system), values in sorted(costs.items()):
        medians = [v for v, _ in values]
        spread = {"mean": statistics.fmean(medians), "min": min(medians), "max": max(medians), "n": len(medians)}
        lines.append(f"| {point} | {system} | {_cell(spread, 1)} | {', '.join(str(n) for _, n in values)} |")
    return lines


def _measured_rounds(run: dict[str, Any]) -> dict[tuple[str, int], dict[str, dict[str, Any]]]:
    """``run``'s measurements that have a mean E2E, by round (point, repeat) and system."""
    by_round: dict[tuple[str, int], dict[str, dict[str, Any]]] = defaultdict(dict)
    for m in run["measurements"]:
        if m.get("status") == "ok" and (m.get("metrics") or {}).get("e2e_ms", {}).get("mean") is not None:
            by_round[m["point"], m["repeat"]][m["system"]] = m
    return by_round


def trace_table(runs: Sequence[dict[str, Any]], min_traces: int = 3) -> list[str]:
    """Per point, request trace by request trace (a round's client seed, :func:`round_trace`):
    how many rounds ran it, how long the floor's client took to run it (first request sent to
    last answered, mean over those rounds) and each system's LoRA cost over the floor of its
    round, mean over them; the trace the floor ran fastest (its arrivals densest) first. Points
    with fewer than ``min_traces`` traces are left out. The rounds of one trace are one unit of
    the headline's interval (:func:`ratio_interval`)."""
    floor_s: dict[tuple[str, int], list[float]] = defaultdict(list)
    costs: dict[tuple[str, int], dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for run in runs:
        for (point, _), by_system in _measured_rounds(run).items():
            floor = by_system.get(plan.FLOOR)
            trace = None if floor is None else round_trace(run, floor)
            if trace is None:
                continue
            key = (point, trace)
            if floor["metrics"].get("duration_s") is not None:
                floor_s[key].append(floor["metrics"]["duration_s"])
            for system, m in by_system.items():
                if system != plan.FLOOR:
                    costs[key][system].append(m["metrics"]["e2e_ms"]["mean"] - floor["metrics"]["e2e_ms"]["mean"])
    lines: list[str] = []
    for point in sorted({p for p, _ in costs}):
        traces = sorted((t for p, t in costs if p == point),
                        key=lambda t: (statistics.fmean(floor_s[point, t]) if floor_s[point, t] else float("inf"), t))
        if len(traces) < min_traces:
            continue
        systems = [s for s in SYSTEM_ORDER if any(s in costs[point, t] for t in traces)]
        lines += ["", f"{point}:", "", "| client seed | rounds | floor's client run s | "
                  + " | ".join(f"{s} LoRA cost ms (n)" for s in systems) + " |",
                  "|---|---|---|" + "---|" * len(systems)]
        for t in traces:
            cells = [f"{statistics.fmean(v):+.0f} ({len(v)})" if (v := costs[point, t].get(s)) else "-"
                     for s in systems]
            run_s = f"{statistics.fmean(floor_s[point, t]):.1f}" if floor_s[point, t] else "-"
            lines.append(f"| {t} | {len(floor_s[point, t]) or '-'} | {run_s} | " + " | ".join(cells) + " |")
    return lines[1:]


# Upper bounds of the rows of :func:`popularity_table` (the last row is everything above).
SHARE_BOUNDS = (0.5, 0.55, 0.6)


def top_adapter_share(orchestrator: dict[str, Any] | None) -> float | None:
    """The most requested adapter's share of one measurement's adapter requests, from ours'
    admission counts (``admission_waits``, base-model requests left out); None without any."""
    waits = (orchestrator or {}).get("admission_waits") or {}
    counts = [w.get("requests", 0) for name, w in waits.items() if name != "base" and isinstance(w, dict)]
    total = sum(counts)
    return max(counts) / total if total else None


# The rows' labels, lowest share first.
SHARE_ROWS = (f"< {SHARE_BOUNDS[0]:.2f}",
              *(f"{low:.2f}-{high:.2f}" for low, high in zip(SHARE_BOUNDS[:-1], SHARE_BOUNDS[1:], strict=True)),
              f">= {SHARE_BOUNDS[-1]:.2f}")


def _share_row(share: float) -> str:
    return SHARE_ROWS[sum(share >= bound for bound in SHARE_BOUNDS)]


def popularity_table(runs: Sequence[dict[str, Any]], system: str = "vlora", peer: str = "csgmv") -> list[str]:
    """Per point, the rounds that measured the floor, ``system`` and ``peer``, grouped by how
    much of the round's traffic its most requested adapter had (read from ``system``'s own
    admission counts: SGLang's client does not record a request's adapter): rounds, the two
    LoRA costs summed and their ratio, and the share of ``system``'s iterations that ran
    merged or in mixture. Why: a skewed workload's popularity is drawn per request, so the top
    adapter's share moves from round to round (SGLang's skewed 2 over 4 adapters: 8/15
    expected, 0.48 to 0.63 over 100 requests), and with it what merging can save."""
    rows: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    for run in runs:
        for (point, _), by_system in _measured_rounds(run).items():
            if not {plan.FLOOR, system, peer} <= set(by_system):
                continue
            ours = by_system[system]
            share = top_adapter_share(ours.get("orchestrator"))
            if share is None:
                continue
            floor = by_system[plan.FLOOR]["metrics"]["e2e_ms"]["mean"]
            row = rows[point, _share_row(share)]
            row["ours"].append(ours["metrics"]["e2e_ms"]["mean"] - floor)
            row["peer"].append(by_system[peer]["metrics"]["e2e_ms"]["mean"] - floor)
            iterations = ours["orchestrator"].get("iterations") or {}
            if sum(iterations.values()):
                row["folded"].append((iterations.get("merge", 0) + iterations.get("mixture", 0))
                                     / sum(iterations.values()))
    lines: list[str] = []
    for point in sorted({p for p, _ in rows}):
        lines += ["", f"{point}:", "", f"| top adapter's share of the round's requests | rounds | {system} LoRA cost ms "
                  f"a round | {peer} LoRA cost ms a round | {system} / {peer} (sums) | {system}'s iterations merged "
                  "or in mixture |", "|---|---|---|---|---|---|"]
        for label in SHARE_ROWS:
            row = rows.get((point, label))
            if not row:
                continue
            n, theirs = len(row["ours"]), sum(row["peer"])
            ratio = _f(sum(row["ours"]) / theirs, 2) if theirs > 0 else "-"
            folded = f"{statistics.fmean(row['folded']):.0%}" if row["folded"] else "-"
            lines.append(f"| {label} | {n} | {sum(row['ours']) / n:+.0f} | {theirs / n:+.0f} | {ratio} | {folded} |")
    return lines[1:]


UNQUEUED_QUANTILE = 0.1  # the TTFT quantile taken as a request's latency without a queue ahead of it


def unqueued_ttft(measurement: dict[str, Any]) -> float | None:
    """The measurement's TTFT at :data:`UNQUEUED_QUANTILE` (None under 10 requests with a TTFT)."""
    ttfts = sorted(t for t in (measurement.get("per_request") or {}).get("ttft_ms", []) if t is not None)
    return ttfts[int(UNQUEUED_QUANTILE * len(ttfts))] if len(ttfts) >= 10 else None


def unqueued_table(runs: Sequence[dict[str, Any]]) -> list[str]:
    """Per repeat, the 10th percentile of the requests' TTFT: at these loads the fastest tenth
    of the requests found no queue ahead of them, so it is one prefill's latency as served
    under load (the mean also holds every wait, which near saturation is most of it and
    varies by tens of milliseconds between repeats of one trace). Against the floor's in
    the same call and repeat: a LoRA system's per-request prefill cost with the queueing
    taken out."""
    values: dict[tuple[str, str], list[tuple[float, float | None]]] = defaultdict(list)
    for run in runs:
        ok = [m for m in run["measurements"] if m.get("status") == "ok" and m.get("per_request")]
        low = {}
        for m in ok:
            if (value := unqueued_ttft(m)) is not None:
                low[m["point"], m["system"], m["repeat"]] = value
        for (point, system, repeat), value in low.items():
            floor = low.get((point, plan.FLOOR, repeat))
            values[point, system].append((value, None if floor is None or system == plan.FLOOR else value - floor))
    if not values:
        return []
    lines = ["| point | system | TTFT p10 ms (min-max, n repeats) | over the floor's p10 ms |", "|---|---|---|---|"]
    for (point, system), vals in sorted(values.items()):
        costs = [c for _, c in vals if c is not None]
        lines.append(f"| {point} | {system} | {_cell(_spread([v for v, _ in vals]), 1)} | "
                     f"{_cell(_spread(costs), 1)} |")
    return lines


def host_table(runs: Sequence[dict[str, Any]]) -> list[str]:
    """Per measurement, the unqueued prefill next to what the server's processes did on the
    host (``host``: :mod:`bench.e2e.host_time`), how long a fixed loop took on its CPUs
    (``host_probe``: :mod:`bench.e2e.host_probe`, median, 90th percentile and the CPU with the
    slowest median; the loop's clock and instructions a cycle where the host counts them) and
    the GPU's
    clocks (``gpu_clocks``): a slow round's server either got less CPU (involuntary switches,
    busy or stolen CPUs), ran on a slower host (the loop took longer), or ran on a GPU at
    lower clocks."""
    lines = []
    for run in runs:
        for m in run["measurements"]:
            host = m.get("host")
            if m.get("status") != "ok" or not host:
                continue
            wall = host["wall_s"] or None
            switches = f"{host['involuntary_switches'] / wall:.0f}" if wall else "-"
            clocks = m.get("gpu_clocks") or {}
            sm = clocks.get("clocks.sm")
            sm_text = f"{sm['mean']:.0f} ({sm['min']:.0f})" if sm else "-"
            reasons = next((clocks[k] for k in ("clocks_event_reasons.active", "clocks_throttle_reasons.active")
                            if k in clocks), None)
            probe = m.get("host_probe") or {}
            loop, by_cpu = probe.get("loop_ms"), probe.get("by_cpu_ms") or {}
            loop_text = f"{loop['median']:.2f} ({loop['p90']:.2f})" if loop else "-"
            if loop and by_cpu:
                slowest = max(by_cpu, key=by_cpu.get)
                loop_text += f", CPU {slowest} {by_cpu[slowest]:.2f}"
            if probe.get("ghz"):
                loop_text += f"; {probe['ghz']['median']:.2f} GHz, {probe['ipc']['median']:.2f} IPC"
            lines.append(f"| {Path(run['_file']).stem} | {m['point']} | {m['repeat']} | {m['system']} | "
                         f"{_f(unqueued_ttft(m), 1)} | {host['cpu_s']} | {_f(host['cpu_per_wall_s'], 2)} | "
                         f"{switches} | {_f(host['cpus_busy_share'], 2)} | {_f(host['cpus_steal_share'], 3)} | "
                         f"{loop_text} | {sm_text} | "
                         f"{_counts(reasons) if reasons else '-'} |")
    return _table(("call", "point", "round", "system", "TTFT p10 ms", "server CPU s", "CPU s a second",
                   "involuntary switches a second", "its CPUs busy", "stolen",
                   "fixed loop ms median (p90), slowest CPU", "GPU SM MHz mean (min)", "clock-event reasons (samples)"),
                  lines)


def _table(header: Sequence[str], rows: list[str]) -> list[str]:
    """A markdown table of ``rows`` under ``header``'s cells; nothing without rows."""
    if not rows:
        return []
    return ["| " + " | ".join(header) + " |", "|" + "---|" * len(header), *rows]


def _ranks(values: Sequence[float]) -> list[float]:
    """Each value's rank (1 for the smallest; tied values share their mean rank)."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in order[i:j + 1]:
            ranks[k] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def probe_table(runs: Sequence[dict[str, Any]], min_measurements: int = 4) -> list[str]:
    """Per call and point with the probe's loop time in at least ``min_measurements``
    measurements: how closely the servers' unqueued prefills (:func:`unqueued_ttft`) followed
    the loop's median on their CPUs, as a correlation over the measurements (Pearson's, and
    Spearman's over ranks). A prefill without prefill graphs is bound by its server's host, so
    where one server's CPUs ran slow its prefills should too; a correlation near zero would put
    the slow rounds elsewhere."""
    lines = []
    for run in runs:
        pairs: dict[str, list[tuple[float, float]]] = defaultdict(list)
        for m in run["measurements"]:
            loop = (m.get("host_probe") or {}).get("loop_ms")
            ttft = unqueued_ttft(m) if m.get("status") == "ok" else None
            if loop and ttft is not None:
                pairs[m["point"]].append((loop["median"], ttft))
        for point, xy in sorted(pairs.items()):
            loops, ttfts = [x for x, _ in xy], [y for _, y in xy]
            if len(xy) < min_measurements or len(set(loops)) < 2 or len(set(ttfts)) < 2:
                continue
            pearson = statistics.correlation(loops, ttfts)
            spearman = statistics.correlation(_ranks(loops), _ranks(ttfts))
            lines.append(f"| {Path(run['_file']).stem} | {point} | {len(xy)} | {min(loops):.2f}-{max(loops):.2f} | "
                         f"{min(ttfts):.1f}-{max(ttfts):.1f} | {pearson:.2f} | {spearman:.2f} |")
    return _table(("call", "point", "measurements", "fixed loop ms, median on the server's CPUs (min-max)",
                   "TTFT p10 ms (min-max)", "correlation", "by ranks"), lines)


def rotated(run: dict[str, Any]) -> bool:
    """Whether ``run`` moved its servers' CPU blocks round by round (``--cpus-per-server`` since
    the rotation): each system then meets a slow block in its turn, not one system for a call."""
    return bool(((run.get("setup") or {}).get("cpu_pinning") or {}).get("rotation"))


def above_table(runs: Sequence[dict[str, Any]]) -> list[str]:
    """Per point, for ours and ATMM alone against csgmv and triton: in how many rounds the
    system's mean E2E was above the peer's, of them in calls whose CPU blocks rotated
    (:func:`rotated`), in how many rounds its P99 E2E was above the peer's, and in how many
    calls its mean was above over the call's rounds taken together, naming those calls. The
    in-server speed issue's target is a mean E2E never above either peer's in a run (one call
    is one run, a round a part of it); the orchestrator issue's, a P99 not above csgmv's."""
    lines = []
    points = sorted({point for run in runs for point, _ in _measured_rounds(run)})
    for point in points:
        for system in ("vlora", "unmerge_only"):
            for peer in ("csgmv", "triton"):
                rounds = above = calls = p99_above = 0
                rotated_rounds = rotated_above = 0
                calls_above = []
                for run in runs:
                    latencies = [(by_system[system]["metrics"]["e2e_ms"], by_system[peer]["metrics"]["e2e_ms"])
                                 for (p, _), by_system in _measured_rounds(run).items()
                                 if p == point and {system, peer} <= set(by_system)]
                    if not latencies:
                        continue
                    pairs = [(ours["mean"], theirs["mean"]) for ours, theirs in latencies]
                    p99_above += sum(ours.get("p99") is not None and theirs.get("p99") is not None
                                     and ours["p99"] > theirs["p99"] for ours, theirs in latencies)
                    rounds_above = sum(ours > theirs for ours, theirs in pairs)
                    rounds += len(pairs)
                    above += rounds_above
                    if rotated(run):
                        rotated_rounds += len(pairs)
                        rotated_above += rounds_above
                    calls += 1
                    ours, theirs = (statistics.fmean(x) for x in zip(*pairs, strict=True))
                    if ours > theirs:
                        calls_above.append(f"{Path(run['_file']).stem} ({ours:.0f} against {theirs:.0f} ms)")
                if rounds:
                    in_rotated = f"{rotated_above} of {rotated_rounds}" if rotated_rounds else "-"
                    lines.append(f"| {point} | {system} | {peer} | {above} of {rounds} | {in_rotated} | "
                                 f"{p99_above} of {rounds} | {len(calls_above)} of {calls} | "
                                 f"{', '.join(calls_above) or '-'} |")
    return _table(("point", "system", "peer", "rounds above", "of them with the CPU blocks rotating",
                   "rounds with the P99 above", "calls above (over their rounds)", "the calls above"), lines)


PARALLEL_TAG = re.compile(r"--tag e2e_\S+_(\d{8}T\d{6})_gpu\d+(?:\s|$)")
NEIGHBOUR_SYSTEMS = ("vlora", "unmerge_only", "csgmv", "triton")


def parallel_start(run: dict[str, Any]) -> str | None:
    """The ``bench/gpu_parallel.sh`` start that ran ``run``: the UTC time in its ``--tag``
    (``e2e_<call>_<time>_gpuN``), which the calls of one start share whatever workload each
    runs; None for a call the script did not start."""
    match = PARALLEL_TAG.search(run.get("command") or "")
    return match.group(1) if match else None


def beside_another(runs: Sequence[dict[str, Any]]) -> dict[str, bool]:
    """Per run id: whether another of ``runs`` came from the same ``gpu_parallel.sh`` start, so
    that it ran at the same time on another GPU of the host."""
    ids_by_start: dict[str, set[str]] = defaultdict(set)
    for run in runs:
        start = parallel_start(run)
        if start:
            ids_by_start[start].add(run["run_id"])
    return {run["run_id"]: len(ids_by_start.get(parallel_start(run) or "", ())) > 1 for run in runs}


def _over_floor_cells(rounds: Sequence[dict[str, float]]) -> str:
    """The last cells of a by-revision row: over ``rounds`` (a figure per system, the floor's
    among them), the floor's mean, then each of :data:`NEIGHBOUR_SYSTEMS`' mean over the floor of
    its own round with how many rounds measured it ("-" where none did)."""
    cells = [f"{statistics.fmean(r[plan.FLOOR] for r in rounds):.1f}"]
    for system in NEIGHBOUR_SYSTEMS:
        costs = [r[system] - r[plan.FLOOR] for r in rounds if system in r]
        cells.append(f"{statistics.fmean(costs):+.1f} (n={len(costs)})" if costs else "-")
    return " | ".join(cells) + " |"


def neighbour_table(runs: Sequence[dict[str, Any]]) -> list[str]:
    """Per point, revision and whether the call ran beside another of these calls
    (:func:`beside_another`): rounds, the floor's mean E2E and each LoRA system's mean cost over
    it (ms a round, over the rounds that measured both). Calls side by side share the host's
    caches and memory: this shows whether that moves one system's cost more than another's."""
    beside = beside_another(runs)
    if not any(beside.values()):
        return []
    groups: dict[tuple[str, str, bool], list[dict[str, float]]] = defaultdict(list)
    for run in runs:
        revision = revision_label(run.get("code") or {})
        for (point, _), by_system in _measured_rounds(run).items():
            if plan.FLOOR in by_system:
                means = {system: m["metrics"]["e2e_ms"]["mean"] for system, m in by_system.items()}
                groups[point, revision, beside[run["run_id"]]].append(means)
    lines = [f"| {point} | {revision} | {'yes' if side else 'no'} | {len(rounds)} | " + _over_floor_cells(rounds)
             for (point, revision, side), rounds in sorted(groups.items())]
    return _table(("point", "revision", "beside another call", "rounds", "floor ms",
                   *(f"{system} LoRA cost ms" for system in NEIGHBOUR_SYSTEMS)), lines)


def unqueued_revision_table(runs: Sequence[dict[str, Any]]) -> list[str]:
    """Per point and revision (:func:`revision_label`): rounds, the floor's unqueued prefill
    (TTFT's 10th percentile, :func:`unqueued_ttft`; mean over rounds) and each LoRA system's
    over the floor's of its own round (mean, rounds). The same cost as
    :func:`unqueued_table`'s, by revision: whether one prefill's LoRA cost moved between sets of
    calls in one system alone or in every LoRA server. Shown where a point has rounds of more
    than one revision."""
    groups: dict[tuple[str, str], list[dict[str, float]]] = defaultdict(list)
    for run in runs:
        revision = revision_label(run.get("code") or {})
        for (point, _), by_system in _measured_rounds(run).items():
            low = {system: value for system, m in by_system.items() if (value := unqueued_ttft(m)) is not None}
            if plan.FLOOR in low:
                groups[point, revision].append(low)
    points = Counter(point for point, _ in groups)
    lines = [f"| {point} | {revision} | {len(rounds)} | " + _over_floor_cells(rounds)
             for (point, revision), rounds in sorted(groups.items()) if points[point] > 1]
    return _table(("point", "revision", "rounds", "floor's TTFT p10 ms",
                   *(f"{system} over the floor's, ms" for system in NEIGHBOUR_SYSTEMS)), lines)


# A round whose inter-token latency has its 90th percentile above this many times its median had
# its decode batch interrupted by prefills in more than one token gap in ten.
INTERRUPTED_P90_OVER_MEDIAN = 3.0


def interrupted(measurement: dict[str, Any]) -> bool | None:
    """Whether more than one of the round's token gaps in ten held a prefill, from SGLang's
    client's inter-token latencies (None without them). The 90th percentile is then a prefill's
    length (40-100 ms eager on the H200) where it is otherwise a decode step's (10-20 ms). In the
    72 share-75 measurements on the H200 (2026-11-28) it read under 2.35x the median or over 5.09x;
    over all 838 H200 measurements with SGLang's client, 46 lie between 2.5x and 5x."""
    result = measurement.get("sglang_result") or {}
    median, p90 = result.get("median_itl_ms"), result.get("p90_itl_ms")
    if not median or p90 is None:
        return None
    return p90 > INTERRUPTED_P90_OVER_MEDIAN * median


def _point_system_order(item: tuple[tuple[str, str], Any]) -> tuple[str, int, str]:
    """Sort key of a ((point, system), value) item: by point, then systems in the plan's order
    (systems it does not name last, by name)."""
    (point, system), _ = item
    order = SYSTEM_ORDER.index(system) if system in SYSTEM_ORDER else len(SYSTEM_ORDER)
    return point, order, system


def interrupted_table(runs: Sequence[dict[str, Any]]) -> list[str]:
    """Per point and system, how many rounds had their decode interrupted by prefills in more
    than one token gap in ten (:func:`interrupted`), and a LoRA system's mean cost over the floor
    in those rounds and in the others. Why: a round at the edge of the server's capacity tips
    into it or not from run to run, and a tipped round costs hundreds of ms, so how many rounds
    of each system tipped decides much of a ratio over a few tens of rounds."""
    rows: dict[tuple[str, str], dict[str, Any]] = defaultdict(lambda: {"rounds": 0, "tipped": 0, "costs": ([], [])})
    for run in runs:
        for (point, _), by_system in _measured_rounds(run).items():
            floor = by_system.get(plan.FLOOR)
            for system, m in by_system.items():
                tipped = interrupted(m)
                if tipped is None:
                    continue
                row = rows[point, system]
                row["rounds"] += 1
                row["tipped"] += tipped
                if floor is not None and system != plan.FLOOR:  # costs: (those rounds, the others)
                    row["costs"][not tipped].append(m["metrics"]["e2e_ms"]["mean"] - floor["metrics"]["e2e_ms"]["mean"])
    if not any(row["tipped"] for row in rows.values()):
        return []
    lines = [f"| point | system | rounds with inter-token p90 over {INTERRUPTED_P90_OVER_MEDIAN:g}x its median | "
             "LoRA cost ms a round, those rounds (n) | the other rounds (n) |", "|---|---|---|---|---|"]
    for (point, system), row in sorted(rows.items(), key=_point_system_order):
        cells = [f"{statistics.fmean(costs):+.0f} ({len(costs)})" if costs else "-" for costs in row["costs"]]
        lines.append(f"| {point} | {system} | {row['tipped']} of {row['rounds']} | {cells[0]} | {cells[1]} |")
    return lines


def _cost_parts(m: dict[str, Any], floor: dict[str, Any]) -> dict[str, float] | None:
    """``m``'s LoRA cost over ``floor`` (same round) in parts of the mean E2E (None where one is
    missing or the outputs are one token): the first token (mean TTFT), the decode steps as
    run uninterrupted (tokens - 1 times the median inter-token time) and the rest, which with
    E2E = TTFT + (tokens - 1) x TPOT is the inter-token time beyond a step: mostly the decode
    batch waiting for other requests' prefills (exact where every output has the same length,
    as in the random-ids points). Also the unqueued prefill (:func:`unqueued_ttft`) over the
    floor's."""
    parts = []
    for x in (m, floor):
        metrics, result = x["metrics"], x.get("sglang_result") or {}
        tokens, completed = metrics.get("output_tokens"), metrics.get("completed")
        first, step = (metrics.get("ttft_ms") or {}).get("mean"), result.get("median_itl_ms")
        if not tokens or not completed or tokens <= completed or first is None or not step:
            return None
        e2e, steps = metrics["e2e_ms"]["mean"], (tokens / completed - 1) * step
        parts.append({"e2e": e2e, "first": first, "steps": steps, "waits": e2e - first - steps,
                      "unqueued": unqueued_ttft(x)})
    ours, base = parts
    cost = {k: ours[k] - base[k] for k in ("e2e", "first", "steps", "waits")}
    cost["unqueued"] = None if None in (ours["unqueued"], base["unqueued"]) else ours["unqueued"] - base["unqueued"]
    return cost


def cost_parts_table(runs: Sequence[dict[str, Any]]) -> list[str]:
    """Per point and LoRA system, its LoRA cost a round split by :func:`_cost_parts`, mean over
    the rounds with the floor. Why: at these loads a request decodes while others' prefills
    run, and an eager prefill stops the decode batch for its whole length, so a prefill's extra
    cost over the floor's is paid once by its own request (first token) and again by every
    request decoding beside it (the waits); the last column is how many times over."""
    rows: dict[tuple[str, str], list[dict[str, float]]] = defaultdict(list)
    for run in runs:
        for (point, _), by_system in _measured_rounds(run).items():
            floor = by_system.get(plan.FLOOR)
            for system, m in by_system.items():
                if floor is not None and system != plan.FLOOR and (parts := _cost_parts(m, floor)) is not None:
                    rows[point, system].append(parts)
    lines = []
    for (point, system), costs in sorted(rows.items(), key=_point_system_order):
        mean = {k: statistics.fmean(c[k] for c in costs) for k in ("e2e", "first", "steps", "waits")}
        unqueued = [c["unqueued"] for c in costs if c["unqueued"] is not None]
        prefill = statistics.fmean(unqueued) if unqueued else None
        prefill_cell = "-" if prefill is None else f"{prefill:+.1f}"
        times = f"{mean['waits'] / prefill:.1f}" if prefill and prefill > 0 else "-"
        lines.append(f"| {point} | {system} | {len(costs)} | {mean['e2e']:+.1f} | {mean['first']:+.1f} | "
                     f"{mean['steps']:+.1f} | {mean['waits']:+.1f} | {prefill_cell} | {times} |")
    return _table(("point", "system", "rounds", "LoRA cost ms a round", "of it: first token", "decode steps "
                   "(median inter-token time)", "decode waiting for prefills (the rest)",
                   "unqueued prefill over the floor's ms", "waits / unqueued prefill"), lines)


def _correlation(xs: Sequence[float], ys: Sequence[float]) -> float | None:
    """Pearson's r of ``xs`` and ``ys``; None under 4 pairs or where either is constant."""
    if len(xs) < 4:
        return None
    try:
        return statistics.correlation(xs, ys)
    except statistics.StatisticsError:
        return None


def floor_table(runs: Sequence[dict[str, Any]]) -> list[str]:
    """Per point and LoRA system with at least 4 rounds beside the floor: how its LoRA cost a
    round goes with that round's floor mean (Pearson's r), and with its own unqueued prefill's
    cost (:func:`unqueued_ttft`, both over the floor's). Why: a round's cost is read against one
    floor round, whose own mean moves with the host; a strongly negative first r says the floor's
    noise, not the system, moves the round's cost."""
    rounds: dict[tuple[str, str], list[tuple[float, float, float | None]]] = defaultdict(list)
    for run in runs:
        for (point, _), by_system in _measured_rounds(run).items():
            floor = by_system.get(plan.FLOOR)
            if floor is None:
                continue
            floor_mean, floor_unqueued = floor["metrics"]["e2e_ms"]["mean"], unqueued_ttft(floor)
            for system, m in by_system.items():
                if system == plan.FLOOR:
                    continue
                unqueued = unqueued_ttft(m)
                prefill = None if None in (unqueued, floor_unqueued) else unqueued - floor_unqueued
                rounds[point, system].append((floor_mean, m["metrics"]["e2e_ms"]["mean"] - floor_mean, prefill))
    lines = []
    for (point, system), figures in sorted(rounds.items(), key=_point_system_order):
        with_floor = _correlation([f for f, _, _ in figures], [c for _, c, _ in figures])
        if with_floor is None:
            continue
        paired = [(c, p) for _, c, p in figures if p is not None]
        with_prefill = _correlation([c for c, _ in paired], [p for _, p in paired])
        cell = "-" if with_prefill is None else f"{with_prefill:+.2f}"
        lines.append(f"| {point} | {system} | {len(figures)} | {with_floor:+.2f} | {cell} |")
    return _table(("point", "system", "rounds", "r: LoRA cost a round with the round's floor mean",
                   "r: LoRA cost with its unqueued prefill's cost"), lines)


def iteration_table(runs: Sequence[dict[str, Any]]) -> list[str]:
    """Per point, system with an orchestrator and revision, from the timeline figures the results
    keep (:mod:`bench.e2e.timeline_figures`; calls since they were kept): the median over rounds of
    a round's median decode step and, per prompt-token band, of a round's median prefill
    iteration, ms. Why: an eager prefill is bound by the host, so the same code's iterations move
    with the host's speed; this shows whether two revisions' rounds ran the same iterations
    without the logs the timelines were saved in."""
    rounds: dict[tuple[str, str, str], list[dict[str, Any]]] = defaultdict(list)
    for run in runs:
        revision = revision_label(run.get("code") or {})
        for m in run["measurements"]:
            figures = (m.get("timeline") or {}).get("figures") if m.get("status") == "ok" else None
            if figures and "error" not in figures:
                rounds[m["point"], m["system"], revision].append(figures)
    lines = []
    for (point, system, revision), figures in sorted(rounds.items()):
        steps = [f["decode_step_median_ms"] for f in figures if f["decode_step_median_ms"] is not None]
        bands: dict[str, list[float]] = defaultdict(list)
        for f in figures:
            for band, quartiles in f["prefill_ms_by_band"].items():
                bands[band].append(quartiles["median"])
        band_cells = "; ".join(f"{band} {statistics.median(bands[band]):.1f} ({len(bands[band])})"
                               for band in timeline_figures.BAND_NAMES if band in bands)
        step_cell = f"{statistics.median(steps):.2f} ({len(steps)})" if steps else "-"
        lines.append(f"| {point} | {system} | {revision} | {len(figures)} | {step_cell} | {band_cells or '-'} |")
    return _table(("point", "system", "revision", "rounds", "decode step ms (rounds)",
                   "prefill iteration ms by prompt tokens (rounds)"), lines)


def _counts(d: Any) -> str:
    if not isinstance(d, dict):
        return "-"
    return ", ".join(f"{k} {v}" for k, v in d.items() if isinstance(v, int | float)) or "-"


def _nonzero_counts(d: Any) -> str:
    """:func:`_counts` without the zeros (a policy gives a few of the decision reasons)."""
    return _counts({k: v for k, v in d.items() if v != 0} if isinstance(d, dict) else d)


def problems(runs: Sequence[dict[str, Any]]) -> list[str]:
    """Failed servers, failed or skipped measurements: listed, never silently dropped."""
    out = []
    for run in runs:
        for name, s in run["systems"].items():
            if s.get("status") not in ("ok", "running"):
                out.append(f"- {run['run_id']}: server {name} {s.get('status')}: {s.get('reason', '')}")
        for m in run["measurements"]:
            if m.get("status") != "ok":
                lines = [x.strip() for x in str(m.get("reason", "")).splitlines() if x.strip()] or [""]
                why = lines[0] if len(lines) == 1 else f"{lines[0]} ... {lines[-1]}"
                out.append(f"- {run['run_id']}: {m['system']} {m['point']} #{m['repeat']} {m['status']}: {why[:300]}")
    return out


def markdown(runs: Sequence[dict[str, Any]]) -> str:
    agg = aggregate(runs)
    lines = ["# End-to-end benchmark", "", provenance_line(runs), "",
             "Files: " + ", ".join(f"`{Path(r['_file']).name}`" for r in runs), "",
             "Each cell: mean over repeats of a repeat's mean (min-max over repeats, n repeats). LoRA cost over "
             "floor: per repeat, the system's mean E2E minus the no-LoRA server's in the same call and repeat.", "",
             "## Every point", "", *points_table(agg, runs), "", "## Ours against the others (ratios of means)", "",
             "| point | LoRA cost / csgmv | / triton | mean E2E / csgmv | P99 / csgmv | mean E2E / unmerge-only |",
             "|---|---|---|---|---|---|"]
    for point, r in ratios(agg).items():
        lines.append(f"| {point} | {_f(r['lora_cost_vs_csgmv'], 2)} | {_f(r['lora_cost_vs_triton'], 2)} | "
                     f"{_f(r['mean_e2e_vs_csgmv'], 2)} | {_f(r['p99_e2e_vs_csgmv'], 2)} | "
                     f"{_f(r['mean_e2e_vs_unmerge_only'], 2)} |")
    speeds = _speedup_lines(agg)
    if speeds:
        lines += ["", *speeds]
    lines += ["", "## What the orchestrator did (from /vlora/status)", "", *orchestrator_table(runs)]
    # Sections shown only where the runs have something for them.
    for title, table in (("LoRA cost request by request", paired_table),
                         ("LoRA cost request trace by request trace (densest arrivals first)", trace_table),
                         ("LoRA cost by the top adapter's share of a round's requests", popularity_table),
                         ("One prefill without a queue: TTFT's 10th percentile", unqueued_table),
                         ("One prefill without a queue, by revision", unqueued_revision_table),
                         ("Rounds whose decode was interrupted by prefills", interrupted_table),
                         ("A LoRA cost in parts: first token, decode steps, decode waiting for prefills",
                          cost_parts_table),
                         ("Ours' iterations by revision (the timelines' figures, median over rounds)",
                          iteration_table),
                         ("A round's LoRA cost against its floor round's mean", floor_table),
                         ("Mean E2E and P99 above a peer's, by round and by call", above_table),
                         ("LoRA cost by revision, alone on the host or beside another call", neighbour_table),
                         ("Against the LoRA-cost targets", target_table),
                         ("Each server on the host, and the GPU's clocks, by measurement", host_table),
                         ("The unqueued prefill against its CPUs' speed, by call", probe_table),
                         ("The most requested adapter's requests and the others' (our client)", adapter_table),
                         ("Not measured", problems)):
        section = table(runs)
        if section:
            lines += ["", f"## {title}", "", *section]
    caveats = sorted({c for r in runs for c in r.get("caveats", [])})
    lines += ["", "## What differs from a production install", "", *[f"- {c}" for c in caveats]]
    return "\n".join(lines) + "\n"


HEADLINE_POINTS = ("sgl-mixed", "sgl-mixed-share75", "vision-skewed", "sgl-mixed-uniform", "sgl-prefill", "sgl-decode", "video-lm")
HEADLINE_SYSTEMS = ("nolora", "nolora_twin", "vlora", "csgmv", "triton", "unmerge_only")


# Ratios the headline shows (figure, system, peer): the LoRA cost ratios of the issues' targets,
# ours' mean E2E over csgmv's (target 0.85x), and the floor's twin over the floor (the harness's
# resolution: two identical servers). A column no point has figures for is left out, but for the first.
HEADLINE_RATIOS = (("lora_cost", "vlora", "csgmv"), ("lora_cost", "vlora", "triton"),
                   ("lora_cost", "unmerge_only", "csgmv"), ("lora_cost", "unmerge_only", "triton"),
                   ("e2e_mean", "vlora", "csgmv"), ("e2e_mean", "unmerge_only", "csgmv"),
                   ("e2e_mean", "unmerge_only", "triton"), ("e2e_mean", "nolora_twin", plan.FLOOR))


class PairedRound(NamedTuple):
    """One round's two figures (LoRA costs or mean E2E ms: ours and the peer's) and the request
    trace it ran. A round's requests (arrivals, prompts, adapters) come from the client's seed,
    the call's ``--seed`` plus the round's index, so calls whose seeds lie within their rounds
    of each other run some traces more than once; such rounds are not independent draws of the
    workload. ``trace`` is None where the round's seed is not known."""
    ours: float
    peer: float
    trace: int | None = None


def round_trace(run: dict[str, Any], measurement: dict[str, Any]) -> int | None:
    """The client seed of ``measurement``'s round: recorded since the runner writes it, else the
    runner's rule (:func:`plan.trace_seed`, the same before it was recorded); None where the
    call's seed is unknown."""
    if measurement.get("trace_seed") is not None:
        return measurement["trace_seed"]
    seed = (run.get("setup") or {}).get("seed")
    return None if seed is None else plan.trace_seed(seed, measurement["repeat"])


def round_means(runs: Sequence[dict[str, Any]], point: str) -> list[tuple[int | None, dict[str, float]]]:
    """Per round (one call's repeat) at ``point``: its request trace (:func:`round_trace`) and
    each system's mean E2E ms."""
    out = []
    for run in runs:
        for (p, _), by_system in _measured_rounds(run).items():
            if p == point:
                trace = round_trace(run, next(iter(by_system.values())))
                out.append((trace, {system: m["metrics"]["e2e_ms"]["mean"] for system, m in by_system.items()}))
    return out


def paired_lora_costs(runs: Sequence[dict[str, Any]], point: str, system: str,
                      peer: str) -> list[PairedRound]:
    """Per round that measured the floor, ``system`` and ``peer`` at ``point``: their two LoRA
    costs over that round's floor."""
    return [PairedRound(means[system] - means[plan.FLOOR], means[peer] - means[plan.FLOOR], trace)
            for trace, means in round_means(runs, point) if {plan.FLOOR, system, peer} <= set(means)]


def paired_means(runs: Sequence[dict[str, Any]], point: str, system: str, peer: str) -> list[PairedRound]:
    """Per round that measured ``system`` and ``peer`` at ``point``: their two mean E2E ms."""
    return [PairedRound(means[system], means[peer], trace)
            for trace, means in round_means(runs, point) if {system, peer} <= set(means)]


# The rounds behind each headline figure's interval.
PAIRED_ROUNDS: dict[str, Callable[..., list[PairedRound]]] = {
    "lora_cost": paired_lora_costs, "e2e_mean": paired_means}


def paired_ratio(rounds: Sequence[PairedRound]) -> float | None:
    """sum(ours) / sum(peer) over ``rounds``: the figure :func:`ratio_interval` brackets.
    None without rounds or where the peer's sum is not positive."""
    theirs = sum(r.peer for r in rounds)
    return sum(r.ours for r in rounds) / theirs if rounds and theirs > 0 else None


def trace_groups(rounds: Sequence[PairedRound]) -> list[tuple[float, float]]:
    """``rounds`` summed per request trace, (sum of ours, sum of the peer's) each: the units a
    bootstrap may draw independently. A round of unknown trace is a group of its own."""
    groups: dict[Any, list[float]] = {}
    for i, r in enumerate(rounds):
        group = groups.setdefault(("round", i) if r.trace is None else r.trace, [0.0, 0.0])
        group[0] += r.ours
        group[1] += r.peer
    return [(ours, peer) for ours, peer in groups.values()]


def bootstrap_interval(groups: Sequence[tuple[float, float]],
                       statistic: Callable[[Sequence[tuple[float, float]]], float | None],
                       resamples: int = 2000, level: float = 0.95) -> tuple[float, float] | None:
    """A percentile bootstrap interval of ``statistic`` over ``groups`` (:func:`trace_groups`:
    each round's two figures, and the rounds of one trace, stay together); None under 3 groups
    or where ``statistic`` of a resample is None. Seeded: the same groups give the same interval."""
    if len(groups) < 3:
        return None
    rng = random.Random(0)
    values = []
    for _ in range(resamples):
        value = statistic([groups[rng.randrange(len(groups))] for _ in groups])
        if value is None:
            return None
        values.append(value)
    values.sort()
    tail = (1 - level) / 2
    return values[int(tail * resamples)], values[min(resamples - 1, int((1 - tail) * resamples))]


def _sum_ratio(groups: Sequence[tuple[float, float]]) -> float | None:
    theirs = sum(peer for _, peer in groups)
    return sum(ours for ours, _ in groups) / theirs if theirs > 0 else None


def ratio_interval(rounds: Sequence[PairedRound], resamples: int = 2000,
                   level: float = 0.95) -> tuple[float, float] | None:
    """A :func:`bootstrap_interval` of sum(ours) / sum(peer) over ``rounds``, drawing whole
    request traces; None under 3 traces or where a resample's peer sum is not positive."""
    return bootstrap_interval(trace_groups(rounds), _sum_ratio, resamples, level)


def target_margin(rounds: Sequence[PairedRound], target: float, resamples: int = 2000,
                  level: float = 0.95) -> tuple[float, tuple[float, float] | None] | None:
    """Ours' LoRA cost minus ``target`` times the peer's, ms a round, over ``rounds``, and a
    :func:`bootstrap_interval` of it drawing whole request traces as :func:`ratio_interval`
    does (None under 3 traces); None without rounds. Unlike the ratio it stays defined where
    the peer's summed cost is near zero or below in a resample (rounds whose floor ran slow),
    and it reads a target directly: an interval below zero holds it, one above zero misses it."""
    if not rounds:
        return None
    # per trace: (summed margin, rounds), so that margin / rounds is the mean a round
    units = trace_groups([PairedRound(r.ours - target * r.peer, 1.0, r.trace) for r in rounds])
    return _sum_ratio(units), bootstrap_interval(units, _sum_ratio, resamples, level)


# The issues' LoRA-cost targets: (system, peer) -> the most the system's cost may be, as a
# share of the peer's.
LORA_COST_TARGETS = {("unmerge_only", "csgmv"): 0.5, ("vlora", "csgmv"): 0.3, ("vlora", "triton"): 0.4}


def target_table(runs: Sequence[dict[str, Any]]) -> list[str]:
    """Per point and target of :data:`LORA_COST_TARGETS` with rounds that measured the floor,
    the system and the peer: the ratio, the margin (:func:`target_margin`) and what its
    interval says of the target."""
    lines = []
    points = sorted({point for run in runs for point, _ in _measured_rounds(run)})
    for point in points:
        for (system, peer), target in LORA_COST_TARGETS.items():
            rounds = paired_lora_costs(runs, point, system, peer)
            margin = target_margin(rounds, target)
            if margin is None:
                continue
            mean, interval = margin
            if interval is None:
                cell, verdict = f"{mean:+.1f}", "not decided (under 3 traces)"
            else:
                cell = f"{mean:+.1f} ({interval[0]:+.1f} to {interval[1]:+.1f})"
                verdict = "held" if interval[1] < 0 else "missed" if interval[0] > 0 else "not decided"
            lines.append(f"| {point} | {system} | {peer} | {target:g}x | {len(rounds)} | {ratio_cell(rounds)} | "
                         f"{cell} | {verdict} |")
    return _table(("point", "system", "peer", "target", "rounds", "LoRA cost ratio",
                   "ours minus target x peer's, ms a round (95% interval)", "the target, by that interval"), lines)


def ratio_cell(rounds: Sequence[PairedRound]) -> str:
    """A table cell for ``rounds``: their ratio with its interval, or, where
    :func:`ratio_interval` gives none (under 3 traces, or a resample in which the peer cost
    nothing), with how many rounds it rests on; "-" without a ratio."""
    ratio = paired_ratio(rounds)
    if ratio is None:
        return "-"
    interval = ratio_interval(rounds)
    if interval:
        return f"{ratio:.2f} ({interval[0]:.2f} to {interval[1]:.2f})"
    return f"{ratio:.2f} ({len(rounds)} round{'s' if len(rounds) > 1 else ''})"


def headline(runs: Sequence[dict[str, Any]], source: str) -> str:
    """The README's table: mean E2E ms (min-max) per headline point and system, and the LoRA
    cost ratios of :data:`HEADLINE_RATIOS`; the revision and files that produced it."""
    agg = aggregate(runs)
    labels = {pid: p["label"] for r in runs for pid, p in r["points"].items()}
    points = [p for base in HEADLINE_POINTS for p in sorted(agg) if p == base or p.startswith(f"{base} [")]
    systems = [s for s in HEADLINE_SYSTEMS if any(s in agg[p] for p in points)]
    rounds = {(p, r): PAIRED_ROUNDS[r[0]](runs, p, r[1], r[2]) for p in points for r in HEADLINE_RATIOS}
    pairs = [r for r in HEADLINE_RATIOS
             if r == HEADLINE_RATIOS[0] or any(paired_ratio(rounds[p, r]) is not None for p in points)]
    names = {"vlora": "ours'", "unmerge_only": "unmerge-only's", "csgmv": "csgmv's", "triton": "triton's",
             "nolora_twin": "the floor's twin's", plan.FLOOR: "the floor's"}
    figures = {"lora_cost": "LoRA cost", "e2e_mean": "mean E2E"}
    lines = [f"Mean E2E latency in ms, mean over repeats (min-max). Ratios: of the sums over the rounds that "
             "measured both systems (and, for a LoRA cost, the floor, each round's cost over its own floor), and "
             "in brackets a 95% bootstrap interval over those rounds, drawing whole request traces (rounds that ran "
             "the same client seed are drawn together; where there is none: under 3 traces, or a peer that cost "
             "nothing in some resample, how many rounds). "
             f"{provenance_line(runs)} Source: {source}.",
             "", "| point | " + " | ".join(systems) + " | "
             + " | ".join(f"{names[a]} {figures[f]} / {names[b]}" for f, a, b in pairs) + " |",
             "|---|" + "---|" * (len(systems) + len(pairs))]
    for point in points:
        cells = [_cell(agg[point].get(s, {}).get("e2e_mean")).replace(", n=", "; n=") for s in systems]
        lines.append(f"| {labels.get(point, point)} | " + " | ".join(cells) + " | "
                     + " | ".join(ratio_cell(rounds[point, pair]) for pair in pairs) + " |")
    speeds = _speedup_lines(agg)
    if speeds:
        lines += ["", *speeds]
    return "\n".join(lines)


def put_headline(text: str, block_text: str) -> str:
    """``text`` with its e2e headline block (or the placeholder for it) replaced by ``block_text``."""
    for pattern in (FIGURES_BLOCK, PLACEHOLDER):
        if pattern.search(text):
            return pattern.sub(lambda _: block_text, text, count=1)
    raise ValueError("no e2e headline block in the file: put <!-- e2e-headline:begin --><!-- e2e-headline:end --> "
                     "where the table goes")


def same_package(runs: Sequence[dict[str, Any]],
                 revisions: Sequence[str]) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """The runs that served the plugin as it is at any of ``revisions`` (its package, CUDA
    sources and pins, :func:`bench.provenance.package_tree`), and a record of the selection.
    Several revisions pool calls whose plugin code differs by what a reader can check
    (each revision is named in the record). A run from a dirty checkout, or whose revision
    this repository does not know, is left out: nothing says which code it ran. Raises
    ValueError for a revision git does not know."""
    fulls, trees_wanted = [], []
    for revision in revisions:
        full = provenance.full_revision(revision)
        if full is None:
            raise ValueError(f"--package-as {revision!r}: not a revision of this repository (git knows none)")
        fulls.append(full)
        trees_wanted.append(provenance.package_tree(full))
    trees: dict[str, str | None] = {}
    kept = []
    for run in runs:
        code = run.get("code") or {}
        rev = code.get("revision")
        if not rev or code.get("dirty") is not False:
            continue
        if rev not in trees:
            trees[rev] = provenance.package_tree(rev)
        if trees[rev] in trees_wanted:
            kept.append(run)
    return kept, {"package_as": fulls, "package_tree": trees_wanted, "calls": len(kept), "of": len(runs)}


def selected_revisions(selection: dict[str, Any]) -> str:
    """The revisions a :func:`same_package` selection kept the calls of, short, joined by "or"."""
    return " or ".join(rev[:10] for rev in selection["package_as"])


def rounded(value: Any, places: int = 4) -> Any:
    """``value`` with every float in it rounded to ``places`` decimals."""
    if isinstance(value, float):
        return round(value, places)
    if isinstance(value, dict):
        return {k: rounded(v, places) for k, v in value.items()}
    if isinstance(value, list):
        return [rounded(v, places) for v in value]
    return value


def merged(runs: Sequence[dict[str, Any]], sources: Sequence[str],
           selection: dict[str, Any] | None = None) -> dict[str, Any]:
    """One results file for the docs: every run, the files they came from, and their
    ``provenance`` (:func:`bench.provenance.combined`). Left out, because the source files
    keep them and the docs' figures use none of them: the raw ``/vlora/status`` snapshots and
    their summary (``orchestrator``), the request-by-request lists (``per_request``, the paired
    comparison's input) and the split by adapter (``per_adapter``), SGLang's client's own result
    and command line per measurement, and the GPU machine's stand-in kernel calls
    (``shim_calls``). The markdown report reads all of them from the source files. Kept, this file would be most of the repository's size, and the tree must
    travel to the GPU machine in 64 MiB with SGLang's carry; for the same reason every float is
    kept to 4 decimals (the docs print at most 2). ``selection`` (from :func:`same_package`)
    records which calls were kept, and why."""
    dropped = ("vlora_status", "orchestrator", "per_request", "per_adapter", "sglang_result", "client_command")
    slim = [{**{k: v for k, v in r.items() if k not in ("_file", "shim_calls")},
             "measurements": [{k: v for k, v in m.items() if k not in dropped} for m in r["measurements"]]}
            for r in runs]
    out = {
        "schema": MERGED_SCHEMA,
        "provenance": provenance.combined([provenance.record(r, r["date"]) for r in runs]),
        "sources": list(sources),
        "runs": rounded(slim),
    }
    if selection is not None:
        out["selection"] = selection
    return out


def plots(runs: Sequence[dict[str, Any]], prefix: Path) -> list[Path]:
    """``<prefix>_e2e.png`` (mean E2E per point and system) and ``<prefix>_lora_cost.png``
    (LoRA cost over the floor): bars are means over repeats, whiskers min-max, dots the
    repeats themselves."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    agg = aggregate(runs)
    labels = {pid: p["label"] for r in runs for pid, p in r["points"].items()}
    title = provenance_line(runs).split(";")[0]
    files = []
    for figure, ylabel, suffix in (("e2e_mean", "mean E2E latency (ms)", "e2e"),
                                   ("lora_cost", "LoRA cost over the no-LoRA floor (ms)", "lora_cost")):
        points = [p for p in agg if any(figure in a and a[figure] for a in agg[p].values())]
        fig, axes = plt.subplots(1, max(1, len(points)), figsize=(4.2 * max(1, len(points)), 4.2), squeeze=False)
        for ax, point in zip(axes[0], points, strict=False):
            systems = [s for s in SYSTEM_ORDER if (agg[point].get(s) or {}).get(figure)]
            for i, system in enumerate(systems):
                sp = agg[point][system][figure]
                ax.bar(i, sp["mean"], color=f"C{SYSTEM_ORDER.index(system)}", alpha=0.75)
                ax.errorbar(i, sp["mean"], yerr=[[sp["mean"] - sp["min"]], [sp["max"] - sp["mean"]]],
                            color="black", capsize=4)
                ax.plot([i] * sp["n"], sp["values"], "k.", markersize=5)
            ax.set_xticks(range(len(systems)), systems, rotation=30, ha="right", fontsize=8)
            ax.set_title(textwrap.fill(labels.get(point, point), 44), fontsize=9)
            ax.set_ylabel(ylabel, fontsize=8)
            ax.grid(axis="y", alpha=0.3)
        if not points:
            axes[0][0].text(0.5, 0.5, "nothing measured", ha="center", transform=axes[0][0].transAxes)
        fig.suptitle(f"End-to-end, {title}: bars = mean over repeats, whiskers = min-max, dots = repeats",
                     fontsize=9)
        fig.tight_layout()
        path = Path(f"{prefix}_{suffix}.png")
        path.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(path, dpi=80)  # many points: the file stays small enough to travel with the tree
        plt.close(fig)
        files.append(path)
    return files
