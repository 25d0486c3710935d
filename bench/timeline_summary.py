"""What ours' iterations cost by mode, from the timelines an end-to-end call saved.

    python bench/timeline_summary.py RESULTS.json LOGS.tar.gz [RESULTS.json LOGS.tar.gz ...] \\
        --out bench/results/timeline_summary_h200.json

Every measurement of a server with an orchestrator saves ``GET /vlora/timeline`` (each timed
iteration: when, mode, prefill tokens, decode requests, seconds) to ``timelines/`` in the call's
logs tarball, and names the file in the results (``timeline.file``). This reads them back and
puts the iterations of every measurement side by side:

- decode steps (no prefill tokens): median ms per mode and per number of decode requests, so
  that modes are compared at the same batch size;
- prefills: per mode and prompt-token band, the 25th percentile, median and 75th percentile ms
  (an eager prefill is bound by the host, whose speed moves in episodes of seconds: the 25th
  percentile is what a prefill costs outside them);
- per measurement: iterations per mode, seconds busy, and whether the timeline is complete;
  and what its merged and mixture iterations cost against unmerged ones of the same shape: each
  such iteration counts its mode's median less the unmerged median at its decode batch size or
  prompt band, both from the call's iterations (iterations of a shape that never ran unmerged are
  left out), next to how many runs of consecutive mixture iterations it had. Mixture saves the
  two switches that unmerging for such a run and merging again after would take, so its extra
  time a run is what to weigh against a switch pair (``switch_seconds_total`` over ``switches``
  in the results' ``orchestrator`` record).

The rows are the orchestrator's own timings (docs/orchestrator.md, "Accounting"), so a server
without one (the floor, SGLang's backends) has none: compare modes with each other here, and
systems through the end-to-end report.
"""

from __future__ import annotations

import json
import statistics
import sys
import tarfile
from collections import Counter, defaultdict
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench import provenance  # noqa: E402
from bench.e2e.timeline_figures import Row, band, band_edge, figures_of, prefills_by_band, quartiles, rows  # noqa: E402
from bench.server_log_counts import read_calls, write_calls  # noqa: E402


def timelines(results: dict[str, Any], logs_path: Path) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """``(measurement, timeline)`` for every measurement whose results name a saved timeline,
    read from the call's logs tarball; a named file missing from it is an error."""
    if not isinstance(results.get("measurements"), list):
        raise ValueError(f"{logs_path}: its results file has no measurements (not an end-to-end call's results)")
    wanted = {m["timeline"]["file"]: m for m in results["measurements"] if (m.get("timeline") or {}).get("file")}
    found: dict[str, dict[str, Any]] = {}
    with tarfile.open(logs_path) as tar:
        for member in tar.getmembers():
            name = member.name.removeprefix("./")
            if member.isfile() and name in wanted:
                found[name] = json.loads(tar.extractfile(member).read())
    missing = sorted(set(wanted) - set(found))
    if missing:
        raise ValueError(f"{logs_path}: the results name timelines it does not hold: {missing}")
    return [(wanted[name], found[name]) for name in wanted]


HISTOGRAM_BIN_MS = 5


def _histograms(prefills: dict[int, list[float]]) -> dict[str, dict[str, int]]:
    """Per band, how many prefills took each :data:`HISTOGRAM_BIN_MS`-wide span of ms (keyed by
    its lower edge): quartiles hide a time that switches between levels, a histogram shows them."""
    return {band(edge): {str(lower): n for lower, n in sorted(Counter(int(ms // HISTOGRAM_BIN_MS) * HISTOGRAM_BIN_MS
                                                                   for ms in v).items())}
            for edge, v in sorted(prefills.items())}


def _shape(tokens: int, requests: int) -> tuple[str, int]:
    """What an iteration is compared by: its prompt band's edge if it prefilled, else its decode batch."""
    return ("prefill", band_edge(tokens)) if tokens else ("decode", requests)


def _over_unmerged(iterations: list[Row], medians: dict[tuple[str, tuple[str, int]], float]
                   ) -> dict[str, dict[str, float]]:
    """Per mode other than unmerge: the iterations compared and the sum of their mode's median
    less the unmerged median at the same shape, ms."""
    out: dict[str, dict[str, float]] = {}
    for mode, tokens, requests, _ in iterations:
        shape = _shape(tokens, requests)
        if mode == "unmerge" or ("unmerge", shape) not in medians:
            continue
        entry = out.setdefault(mode, {"iterations": 0, "ms": 0.0})
        entry["iterations"] += 1
        entry["ms"] += medians[mode, shape] - medians["unmerge", shape]
    return {mode: {"iterations": v["iterations"], "ms": round(v["ms"], 1)} for mode, v in sorted(out.items())}


def _runs_of(mode: str, iterations: list[Row]) -> int:
    """How many runs of consecutive ``mode`` iterations the timeline holds."""
    return sum(1 for i, row in enumerate(iterations)
               if row[0] == mode and (i == 0 or iterations[i - 1][0] != mode))


def summarise(measured: list[tuple[dict[str, Any], dict[str, Any]]]) -> dict[str, Any]:
    """Decode steps by mode and batch size, prefills by mode and band, and per measurement its
    figures (:func:`bench.e2e.timeline_figures.figures_of`: iterations per mode, seconds busy,
    decode steps' median, prefills by band in any mode), its prefills per mode, their histogram,
    and its merged and mixture iterations against unmerged ones; ms."""
    decode: dict[tuple[str, int], list[float]] = defaultdict(list)
    prefill: dict[tuple[int, str], list[float]] = defaultdict(list)
    read = [(measurement, timeline, rows(timeline)) for measurement, timeline in measured]
    for _, _, iterations in read:
        for mode, tokens, requests, ms in iterations:
            if tokens:
                prefill[band_edge(tokens), mode].append(ms)
            else:
                decode[mode, requests].append(ms)
    medians = {(mode, ("decode", n)): statistics.median(v) for (mode, n), v in decode.items()}
    medians |= {(mode, ("prefill", edge)): statistics.median(v) for (edge, mode), v in prefill.items()}
    measurements = []
    for measurement, timeline, iterations in read:
        measurements.append({
            "system": measurement["system"], "point": measurement["point"], "repeat": measurement.get("repeat"),
            "trace_seed": measurement.get("trace_seed"), "complete": timeline.get("complete"),
            **figures_of(iterations),
            "prefills_by_mode": dict(sorted(Counter(mode for mode, tokens, _, _ in iterations if tokens).items())),
            "prefill_histogram_ms": _histograms(prefills_by_band(iterations)),
            "over_unmerged_ms": _over_unmerged(iterations, medians),
            "mixture_runs": _runs_of("mixture", iterations),
        })
    return {
        "decode_steps": [{"mode": mode, "decode_requests": n, "steps": len(v), "median_ms": round(statistics.median(v), 3)}
                         for (mode, n), v in sorted(decode.items(), key=lambda kv: (kv[0][1], kv[0][0]))],
        "prefills": [{"mode": mode, "tokens": band(edge), "prefills": len(v), **quartiles(v)}
                     for (edge, mode), v in sorted(prefill.items())],
        "measurements": measurements,
    }


def call_summary(results_name: str, results: dict[str, Any], measured: list) -> dict[str, Any]:
    return {"results": results_name, "run_id": results["run_id"],
            "extra_server_args": results.get("setup", {}).get("extra_server_args", []),
            **summarise(measured), "provenance": provenance.record(results, results["date"])}


def markdown(calls: list[dict[str, Any]]) -> list[str]:
    """Decode steps by batch size with the modes side by side, then prefills by band."""
    lines = []
    for call in calls:
        modes = sorted({r["mode"] for r in call["decode_steps"]} | {r["mode"] for r in call["prefills"]})
        steps = {(r["mode"], r["decode_requests"]): r for r in call["decode_steps"]}
        lines += [f"{call['results']}: decode step ms, median (steps)", "",
                  "| decode requests | " + " | ".join(modes) + " |", "|---" * (len(modes) + 1) + "|"]
        for n in sorted({r["decode_requests"] for r in call["decode_steps"]}):
            cells = [f"{steps[m, n]['median_ms']:.2f} ({steps[m, n]['steps']})" if (m, n) in steps else "-" for m in modes]
            lines.append(f"| {n} | " + " | ".join(cells) + " |")
        lines += ["", "| prefill tokens | mode | prefills | p25 ms | median ms | p75 ms |", "|---|---|---|---|---|---|"]
        lines += [f"| {r['tokens']} | {r['mode']} | {r['prefills']} | {r['p25']:.1f} | {r['median']:.1f} | {r['p75']:.1f} |"
                  for r in call["prefills"]]
        compared = [m for m in call["measurements"] if m["over_unmerged_ms"]]
        if compared:
            lines += ["", "| repeat | merge iterations, ms over unmerged | mixture iterations, ms over unmerged | mixture runs |",
                      "|---|---|---|---|"]
            for m in compared:
                cells = [f"{m['over_unmerged_ms'][mode]['iterations']}, {m['over_unmerged_ms'][mode]['ms']:+.1f}"
                         if mode in m["over_unmerged_ms"] else "-" for mode in ("merge", "mixture")]
                lines.append(f"| {m['repeat']} | " + " | ".join(cells) + f" | {m['mixture_runs']} |")
        lines.append("")
    return lines


def main(argv: list[str] | None = None) -> dict[str, Any]:
    every_call: list = []  # every measurement's timeline, for the figures over all calls

    def per_call(results_path: Path, logs_path: Path) -> dict[str, Any]:
        try:
            results = json.loads(results_path.read_text())
            measured = timelines(results, logs_path)
        except (OSError, json.JSONDecodeError, tarfile.TarError, ValueError) as e:
            raise SystemExit(f"timeline_summary: {results_path} with {logs_path}: {e}") from e
        every_call.extend(measured)
        return call_summary(results_path.name, results, measured)

    calls, args = read_calls(argv, __doc__, per_call)
    print("\n".join(markdown(calls)))
    pooled = {key: value for key, value in summarise(every_call).items() if key != "measurements"}
    return write_calls("ours' iterations from the timelines each measurement saved (GET /vlora/timeline): decode "
                       "steps by mode and decode requests, prefills by mode and prompt-token band, per measurement "
                       "its iterations and prefills per mode, decode steps' median and prefills by band; ms",
                       "bench/timeline_summary.py", calls, args, extra={"pooled": pooled})


if __name__ == "__main__":
    main()
