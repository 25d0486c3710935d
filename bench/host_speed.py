"""How steady is this machine's host CPU? An eager prefill forward is host-bound, so its time
follows the speed of the core the scheduler runs on.

    python bench/host_speed.py [--seconds 20] [--out bench/results --tag host_speed_h200]

Times a fixed pure-Python loop (``loop_ms``) pinned to one CPU:

* alone, then with a busy loop pinned to each other CPU in turn (``pairs``): a CPU that slows
  it down shares its core (a sibling the guest's topology may not show);
* alone for ``--seconds`` (``drift``): how often, and by how much, it runs slower with nothing
  else of ours running.

Prints a summary and writes JSON with the run's provenance (no GPU needed).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

LOOP = 300_000  # iterations of loop_ms: about 17 ms on the benchmark H200 machine's host
SLOW = 1.25  # a sample this many times its series' median counts as slowed down


def loop_ms(iterations: int = LOOP) -> float:
    """Milliseconds of a fixed pure-Python loop on the calling thread."""
    began = time.perf_counter()
    total = 0
    for i in range(iterations):
        total += i * i % 7
    return (time.perf_counter() - began) * 1e3


def timed_on(cpu: int, repeats: int) -> float:
    """Median of ``repeats`` loops with this process pinned to ``cpu``."""
    os.sched_setaffinity(0, {cpu})
    loop_ms()
    return statistics.median(loop_ms() for _ in range(repeats))


def _spin(cpu: int, stop) -> None:
    os.sched_setaffinity(0, {cpu})
    while not stop.is_set():
        loop_ms(10_000)


def pairs(cpu: int, others: list[int], repeats: int = 5) -> dict[str, float]:
    """The loop's median on ``cpu`` alone (key ``"alone"``) and with a busy loop on each of
    ``others`` in turn (key: that CPU), in milliseconds."""
    row = {"alone": round(timed_on(cpu, repeats), 2)}
    for other in others:
        stop = mp.Event()
        spinner = mp.Process(target=_spin, args=(other, stop), daemon=True)
        spinner.start()
        try:
            time.sleep(0.05)
            row[str(other)] = round(timed_on(cpu, repeats), 2)
        finally:
            stop.set()
            spinner.join()
    return row


def drift(cpu: int, seconds: float) -> list[float]:
    """Loop times (ms) on ``cpu`` alone, back to back for ``seconds``."""
    os.sched_setaffinity(0, {cpu})
    series, began = [], time.monotonic()
    while time.monotonic() - began < seconds:
        series.append(round(loop_ms(), 2))
    return series


def summarise_series(series: list[float], slow: float = SLOW) -> dict[str, float]:
    """Median, 90th percentile and maximum of a series, and the fraction of samples at least
    ``slow`` times the median."""
    if not series:
        raise ValueError("an empty series")
    median = statistics.median(series)
    ranked = sorted(series)
    return {"samples": len(series), "median_ms": median, "p90_ms": ranked[int(0.9 * (len(ranked) - 1))],
            "max_ms": ranked[-1], "slow_fraction": sum(v >= slow * median for v in series) / len(series)}


def slowing_cpus(row: dict[str, float], slow: float = SLOW) -> dict[str, float]:
    """The CPUs whose busy loop made the loop at least ``slow`` times slower than alone, with
    the factor."""
    alone = row["alone"]
    return {cpu: round(v / alone, 2) for cpu, v in row.items() if cpu != "alone" and v >= slow * alone}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cpus", type=int, nargs="+", default=[0], help="CPUs to time the loop on")
    ap.add_argument("--seconds", type=float, default=20.0, help="length of the drift series")
    ap.add_argument("--out", type=Path, default=None, help="write OUT/TAG.json")
    ap.add_argument("--tag", default="host_speed")
    args = ap.parse_args()
    if args.seconds <= 0:
        ap.error("--seconds must be positive")
    available = sorted(os.sched_getaffinity(0))
    for cpu in args.cpus:
        if cpu not in available:
            ap.error(f"CPU {cpu} is not available to this process ({sorted(available)})")
    result = {"pairs": {}, "drift": {}}
    for cpu in args.cpus:
        row = pairs(cpu, [other for other in available if other != cpu])
        result["pairs"][str(cpu)] = {"ms": row, "slowed_by": slowing_cpus(row)}
        print(f"CPU {cpu}: alone {row['alone']} ms; slowed by {result['pairs'][str(cpu)]['slowed_by'] or 'none'}",
              flush=True)
    series = drift(args.cpus[0], args.seconds)
    result["drift"] = {"cpu": args.cpus[0], "series_ms": series, **summarise_series(series)}
    d = result["drift"]
    print(f"CPU {args.cpus[0]} alone for {args.seconds:g} s: median {d['median_ms']} ms, p90 {d['p90_ms']}, "
          f"max {d['max_ms']}, {100 * d['slow_fraction']:.1f}% of samples >= {SLOW}x the median", flush=True)
    if args.out is not None:
        from bench import provenance

        doc = {"what": f"a {LOOP}-iteration pure-Python loop pinned to one CPU: alone, with a busy loop on each "
                       f"other CPU, and alone back to back for {args.seconds:g} s",
               "cpu_count": os.cpu_count(), "slow_factor": SLOW, **result}
        path = provenance.write_results(args.out, args.tag, doc, "bench/host_speed.py", sys.argv[1:])
        print(f"wrote {path}")

if __name__ == "__main__":
    main()
