"""How long each server's forwards took while measured, from SGLang's own per-request timing.

    python bench/forward_times.py RESULTS.json LOGS.tar.gz [RESULTS.json LOGS.tar.gz ...] \\
        --out bench/results/e2e_forward_times_h200.json

For a call run with ``--server-args --enable-request-time-stats-logging`` every server logs,
per finished request, ``queue_duration`` (in SGLang's waiting queue), ``forward_duration``
(from its batch's start to its completion) and ``entry_time`` (when it entered the queue,
wall clock to the millisecond). That is a profile under load without a profiler: the
server runs at full speed, and the figures come from the same requests the client timed.

A request's ``forward_duration`` is one forward only when nothing ran beside it. Under
SGLang's overlap scheduler the result of batch N is processed after batch N+1 is
launched, so a batch followed closely by another also carries the next one's host time.
So the key figure is the **isolated forward**: a batch of one request that entered an
idle server (the previous batch done at least ``GAP_MS`` before) and was done at least
``GAP_MS`` before the next batch started. For a prefill-only workload that is one
forward of one prompt, and its excess over the no-LoRA floor's is the LoRA cost of one
forward as the server paid it, host time included.

Batches are rebuilt from the requests' start times (``entry_time`` + ``queue_duration``):
requests whose starts lie within ``SAME_BATCH_MS`` started in one batch. Each server's log
is split into its measurements at every ``/flush_cache`` (each measurement starts with one);
the n-th part after the warm-up is the server's n-th measurement of the results file.
"""

from __future__ import annotations

import json
import re
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import provenance  # noqa: E402
from server_log_counts import FLUSH, read_calls, server_logs, write_calls  # noqa: E402

TIME_STATS = re.compile(
    r"ReqTimeStats\(rid=(?P<rid>[^,]+), input_len=(?P<input>\d+), cached_input_len=(?P<cached>\d+), "
    r"output_len=(?P<output>\d+).*?queue_duration=(?P<queue>[\d.]+)ms, "
    r"forward_duration=(?P<forward>[\d.]+)ms, entry_time=(?P<entry>[\d.]+)"
)
SAME_BATCH_MS = 1.0  # entry_time has millisecond resolution; batches start a forward apart
GAP_MS = 2.0


def parse(lines: list[str]) -> list[list[dict]]:
    """The requests of each measurement of one server's log (the parts after each flush),
    health checks left out. Each request: input and output tokens, queue and forward ms,
    its start in ms (wall clock)."""
    parts: list[list[dict]] = []
    for line in lines:
        if FLUSH.search(line):
            parts.append([])
        elif parts and (found := TIME_STATS.search(line)) and not found["rid"].startswith("HEALTH_CHECK"):
            queue, forward = float(found["queue"]), float(found["forward"])
            parts[-1].append({"input": int(found["input"]), "output": int(found["output"]), "queue_ms": queue,
                              "forward_ms": forward, "start_ms": float(found["entry"]) * 1e3 + queue})
    return parts


def batches(requests: list[dict]) -> list[list[dict]]:
    """Requests grouped into the batches they started in, in start order."""
    out: list[list[dict]] = []
    for request in sorted(requests, key=lambda r: r["start_ms"]):
        if out and request["start_ms"] - out[-1][0]["start_ms"] < SAME_BATCH_MS:
            out[-1].append(request)
        else:
            out.append([request])
    return out


def isolated_forwards(groups: list[list[dict]]) -> list[float]:
    """``forward_ms`` of the batches of one request that ran alone (see the module doc)."""
    found = []
    for before, batch, after in zip(groups, groups[1:], groups[2:], strict=False):
        if len(batch) != 1:
            continue
        request = batch[0]
        previous_done = before[0]["start_ms"] + max(r["forward_ms"] for r in before)
        entered = request["start_ms"] - request["queue_ms"]
        done = request["start_ms"] + request["forward_ms"]
        if previous_done + GAP_MS < entered and done + GAP_MS < after[0]["start_ms"]:
            found.append(request["forward_ms"])
    return found


def _spread(values: list[float]) -> dict:
    if len(values) < 2:
        return {"n": len(values)}
    deciles = statistics.quantiles(values, n=10)
    return {"n": len(values), "median": round(statistics.median(values), 2), "mean": round(statistics.mean(values), 2),
            "p10": round(deciles[0], 2), "p90": round(deciles[-1], 2)}


def summarise(requests: list[dict]) -> dict:
    groups = batches(requests)
    return {"requests": len(requests), "batches": len(groups),
            "queue_ms_mean": round(statistics.mean(r["queue_ms"] for r in requests), 2),
            "forward_ms_mean": round(statistics.mean(r["forward_ms"] for r in requests), 2),
            "isolated_forward_ms": _spread(isolated_forwards(groups))}


def call_forward_times(results_path: Path, logs_path: Path) -> dict:
    results = json.loads(results_path.read_text())
    runs: dict[str, list[dict]] = {}
    for name, lines in server_logs(results, logs_path).items():
        parts = [p for p in parse(lines) if p]
        measured = sorted((m for m in results["measurements"] if m["system"] == name and m.get("status") == "ok"),
                          key=lambda m: m["started_at_s"])
        if len(parts) != len(measured):
            raise ValueError(f"{results_path.name}: {name} logged {len(parts)} measurements with request time "
                             f"stats, the results file has {len(measured)} (was the call run with "
                             "--enable-request-time-stats-logging?)")
        runs[name] = [{"point": m["point"], "repeat": m["repeat"], **summarise(p)} for m, p in zip(measured, parts, strict=True)]
    return {"results": results_path.name, "run_id": results["run_id"],
            "extra_server_args": results.get("setup", {}).get("extra_server_args", []),
            "servers": runs, "over_floor": over_floor(runs), "provenance": provenance.record(results, results["date"])}


def over_floor(runs: dict[str, list[dict]], floor: str = "nolora") -> dict:
    """Per LoRA server and repeat: its isolated forward's median and mean minus the floor's
    of the same point and repeat (the same trace)."""
    base = {(r["point"], r["repeat"]): r["isolated_forward_ms"] for r in runs.get(floor, [])}
    out: dict[str, list[dict]] = {}
    for name, measured in runs.items():
        if name == floor:
            continue
        for run in measured:
            own, ref = run["isolated_forward_ms"], base.get((run["point"], run["repeat"]))
            if ref is None or "median" not in own or "median" not in ref:
                continue
            out.setdefault(name, []).append({"point": run["point"], "repeat": run["repeat"],
                                             "median_ms": round(own["median"] - ref["median"], 2),
                                             "mean_ms": round(own["mean"] - ref["mean"], 2)})
    return out


def main(argv: list[str] | None = None) -> dict:
    calls, args = read_calls(argv, __doc__, call_forward_times)
    for call in calls:
        for name, measured in call["servers"].items():
            for run in measured:
                iso = run["isolated_forward_ms"]
                print(f"{call['results']:44} {name:14} {run['point']:12} #{run['repeat']} forward mean "
                      f"{run['forward_ms_mean']:7.1f} ms | isolated n={iso['n']} median {iso.get('median')} "
                      f"mean {iso.get('mean')}")
        for name, rows in call["over_floor"].items():
            print(f"{'':44} {name:14} over the floor (median, mean):",
                  ", ".join(f"#{r['repeat']} {r['median_ms']:+.1f} / {r['mean_ms']:+.1f}" for r in rows))
    return write_calls("per server and measurement of each call, from SGLang's request time stats: requests, "
                       "batches, mean queue and forward ms, and the forward of a request that ran alone "
                       "(isolated_forward_ms); over_floor: each LoRA server's isolated forward minus the no-LoRA "
                       "floor's on the same trace", "bench/forward_times.py", calls, args)


if __name__ == "__main__":
    main()
