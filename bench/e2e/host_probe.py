"""How fast the host runs a fixed piece of Python while a measurement runs.

An eager prefill is bound by its server's host launches. In the rounds in which one server ran
its prefills a third slower, that server was preempted no more often, lost no CPU time to the
hypervisor, and the GPU's clocks held (docs/perf.md, "Host time and GPU clocks beside the slow
rounds"): what is left is how fast the host executes the same instructions, which no counter
inside a KVM guest reports. Within a round the server's prefill time switched between two
levels, about 48 and 72 ms, in episodes of a fraction of a second to five seconds. Whether that
is one CPU of the guest at a time running slower (the physical core under it shared with a busy
hardware thread on the host, for one) or the whole host is what the probe asks.

So a probe process times a fixed pure-Python loop every half second, moving from CPU to CPU in
turn over the measured server's CPUs (all the call's CPUs when the server is not pinned), and
keeps only the samples during which it was not preempted, so that a sample is a CPU's speed and
not a wait for it; the summary gives each CPU's median. The loop is short (about 2 ms on the
benchmark H200 machine's host) because on a pinned server's CPUs it shares a CPU with the
server a third of the time. The probe process is this module run from the repository's root
(``python -m bench.e2e.host_probe``).
"""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.e2e import host_time
from bench.e2e.side_process import SideProcess
from bench.host_speed import LOOP, loop_ms

REPO = Path(__file__).resolve().parents[2]

INTERVAL_S = 0.5
ITERATIONS = LOOP // 10  # host_speed's loop, a tenth as long: about 1.7 ms on the benchmark H200 machine's host


def involuntary_switches() -> int:
    """This process's involuntary context switches so far."""
    times = host_time.process_times(os.getpid())
    return times.involuntary_switches if times else 0


def current_cpu() -> int:
    """The CPU this process last ran on (field 39 of ``/proc/self/stat``)."""
    with open("/proc/self/stat") as f:
        after_name = f.read().rsplit(")", 1)[1].split()
    return int(after_name[36])


def loop_sample(iterations: int) -> tuple[float, int, bool]:
    """Milliseconds of :func:`bench.host_speed.loop_ms`, the CPU it ran on, and whether the
    kernel preempted the probe meanwhile (a preempted sample holds a wait, not only work)."""
    switches = involuntary_switches()
    ms = loop_ms(iterations)
    return ms, current_cpu(), involuntary_switches() != switches


def probe(interval_s: float, iterations: int, cpus: Sequence[int] | None) -> None:
    """Print ``ms cpu preempted`` a line, every ``interval_s``, on each of ``cpus`` in turn (the
    CPUs this process may use when None), until killed."""
    turn = sorted(cpus or os.sched_getaffinity(0))
    loop_sample(iterations)  # the first run pays for warming the interpreter
    for i in itertools.count():
        os.sched_setaffinity(0, {turn[i % len(turn)]})
        ms, cpu, preempted = loop_sample(iterations)
        print(f"{ms:.3f} {cpu} {int(preempted)}", flush=True)
        time.sleep(interval_s)


class HostProbe(SideProcess):
    """``with HostProbe(cpus) as speed: ...`` then ``speed.summary()``; ``cpus``: where the
    probe runs (the measured server's when it is pinned; None: wherever the kernel puts it)."""

    def __init__(self, cpus: Sequence[int] | None = None, interval_s: float = INTERVAL_S,
                 iterations: int = ITERATIONS) -> None:
        super().__init__()
        self.command = [sys.executable, "-m", "bench.e2e.host_probe", "--interval-s", str(interval_s), "--iterations", str(iterations)]
        if cpus:
            self.command += ["--cpus", ",".join(str(c) for c in cpus)]

    def __enter__(self) -> HostProbe:
        self.start(self.command, "the probe", cwd=REPO)
        return self

    def summary(self) -> dict[str, Any]:
        """The loop's milliseconds over the samples the probe was not preempted in (median,
        10th and 90th percentiles, max, and each CPU's median), and how many samples it took
        and kept; ``{"error": ...}`` if it printed none."""
        rows = []
        for line in self.output.splitlines():
            parts = line.split()
            if len(parts) == 3:
                rows.append((float(parts[0]), int(parts[1]), parts[2] == "1"))
        if not rows:
            return {"error": self.error.strip()[-500:] or "no samples"}
        by_cpu: dict[int, list[float]] = {}
        for ms, cpu, preempted in rows:
            if not preempted:
                by_cpu.setdefault(cpu, []).append(ms)
        kept = sorted(ms for v in by_cpu.values() for ms in v)
        out: dict[str, Any] = {"samples": len(rows), "kept": len(kept),
                               "by_cpu_ms": {str(cpu): round(statistics.median(v), 3) for cpu, v in sorted(by_cpu.items())}}
        if kept:
            out["loop_ms"] = {"median": round(statistics.median(kept), 3),
                              "p10": round(kept[int(0.1 * len(kept))], 3),
                              "p90": round(kept[min(len(kept) - 1, int(0.9 * len(kept)))], 3),
                              "max": round(kept[-1], 3)}
        return out


def _cpu_list(text: str) -> list[int]:
    try:
        cpus = [int(c) for c in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a comma-separated list of CPU numbers: {text!r}") from None
    unknown = sorted(set(cpus) - os.sched_getaffinity(0))
    if unknown:
        raise argparse.ArgumentTypeError(f"CPUs {unknown} are not among this process's {sorted(os.sched_getaffinity(0))}")
    return cpus


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--interval-s", type=float, default=INTERVAL_S)
    parser.add_argument("--iterations", type=int, default=ITERATIONS)
    parser.add_argument("--cpus", type=_cpu_list, help="comma-separated CPUs to run on")
    args = parser.parse_args()
    try:
        probe(args.interval_s, args.iterations, args.cpus)
    except (KeyboardInterrupt, BrokenPipeError):
        pass


if __name__ == "__main__":
    main()
