"""How fast the host runs a fixed piece of Python while a measurement runs.

An eager prefill is bound by its server's host launches. In the rounds in which one server ran
its prefills a third slower, that server was preempted no more often, lost no CPU time to the
hypervisor, and the GPU's clocks held (docs/perf.md, "Host time and GPU clocks beside the slow
rounds"): what is left is how fast the host executes the same instructions, which no counter
inside a KVM guest reports unless it has a virtual PMU. Within a round the server's prefill time switched between two
levels, about 48 and 72 ms, in episodes of a fraction of a second to five seconds. Whether that
is one CPU of the guest at a time running slower (the physical core under it shared with a busy
hardware thread on the host, for one) or the whole host is what the probe asks.

So a probe process times a fixed pure-Python loop every half second, moving from CPU to CPU in
turn over the measured server's CPUs (all the call's CPUs when the server is not pinned), and
keeps only the samples during which it was not preempted, so that a sample is a CPU's speed and
not a wait for it; the summary gives each CPU's median. Where the guest has hardware counters
(:mod:`bench.e2e.cpu_counters`), each sample also counts the loop's cycles and instructions,
which split a slower loop into a lower clock or fewer instructions a cycle. The loop is short (about 2 ms on the
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
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from bench.e2e import host_time
from bench.e2e.cpu_counters import CpuCounters
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


def loop_sample(iterations: int, counters: CpuCounters | None = None
                ) -> tuple[float, int, bool, tuple[int, int] | None]:
    """Milliseconds of :func:`bench.host_speed.loop_ms`, the CPU it ran on, whether the kernel
    preempted the probe meanwhile (a preempted sample holds a wait, not only work), and the
    cycles and instructions it took where ``counters`` has them."""
    switches = involuntary_switches()
    before = counters.read() if counters else None
    ms = loop_ms(iterations)
    after = counters.read() if counters else None
    return ms, current_cpu(), involuntary_switches() != switches, CpuCounters.between(before, after)


def probe(interval_s: float, iterations: int, cpus: Sequence[int] | None) -> None:
    """Print whether the hardware counters are there (``# counters: ...``), then ``ms cpu
    preempted cycles instructions`` a line (``-`` for counts it has not), every ``interval_s``,
    on each of ``cpus`` in turn (the CPUs this process may use when None), until killed."""
    turn = sorted(cpus or os.sched_getaffinity(0))
    counters = CpuCounters()
    print(f"# counters: {counters.error or 'cycles, instructions'}", flush=True)
    loop_sample(iterations, counters)  # the first run pays for warming the interpreter
    for i in itertools.count():
        os.sched_setaffinity(0, {turn[i % len(turn)]})
        ms, cpu, preempted, counts = loop_sample(iterations, counters)
        cycles, instructions = counts or ("-", "-")
        print(f"{ms:.3f} {cpu} {int(preempted)} {cycles} {instructions}", flush=True)
        time.sleep(interval_s)


def _spread(values: list[float], digits: int) -> dict[str, float]:
    """Median, 10th and 90th percentiles and max of ``values`` (not empty)."""
    values = sorted(values)
    return {"median": round(statistics.median(values), digits),
            "p10": round(values[int(0.1 * len(values))], digits),
            "p90": round(values[min(len(values) - 1, int(0.9 * len(values)))], digits),
            "max": round(values[-1], digits)}


class HostProbe(SideProcess):
    """``with HostProbe(cpus) as speed: ...`` then ``speed.summary()``; ``cpus``: where the
    probe runs (the measured server's when it is pinned; None: wherever the kernel puts it)."""

    def __init__(self, cpus: Sequence[int] | None = None, interval_s: float = INTERVAL_S,
                 iterations: int = ITERATIONS) -> None:
        super().__init__()
        self.cpus = list(cpus) if cpus else None
        self.command = [sys.executable, "-m", "bench.e2e.host_probe", "--interval-s", str(interval_s), "--iterations", str(iterations)]
        if cpus:
            self.command += ["--cpus", ",".join(str(c) for c in cpus)]

    def __enter__(self) -> HostProbe:
        self.start(self.command, "the probe", cwd=REPO, cpus=self.cpus)
        return self

    def summary(self) -> dict[str, Any]:
        """The loop's milliseconds over the samples the probe was not preempted in (median,
        10th and 90th percentiles, max, and each CPU's median), how many samples it took and
        kept, and, where the hardware counters are there, the clock (GHz: cycles a second of
        the loop) and instructions a cycle the same way; ``counters`` says whether they are;
        ``{"error": ...}`` if it printed no sample."""
        rows, counters = [], None
        for line in self.output.splitlines():
            if line.startswith("# counters: "):
                counters = line.removeprefix("# counters: ")
                continue
            parts = line.split()
            if len(parts) == 5:
                counts = None if "-" in parts[3:] else (int(parts[3]), int(parts[4]))
                rows.append((float(parts[0]), int(parts[1]), parts[2] == "1", counts))
        if not rows:
            return {"error": self.error.strip()[-500:] or "no samples"}
        by_cpu: dict[int, list[tuple[float, tuple[int, int] | None]]] = {}
        for ms, cpu, preempted, counts in rows:
            if not preempted:
                by_cpu.setdefault(cpu, []).append((ms, counts))
        kept = [sample for samples in by_cpu.values() for sample in samples]
        out: dict[str, Any] = {
            "samples": len(rows), "kept": len(kept), "counters": counters,
            "by_cpu_ms": {str(cpu): round(statistics.median(ms for ms, _ in v), 3) for cpu, v in sorted(by_cpu.items())}}
        if kept:
            out["loop_ms"] = _spread([ms for ms, _ in kept], 3)
        ghz = {cpu: [c[0] / (ms * 1e6) for ms, c in v if c] for cpu, v in by_cpu.items()}
        ipc = {cpu: [c[1] / c[0] for _, c in v if c and c[0]] for cpu, v in by_cpu.items()}
        if any(ghz.values()):
            out["ghz"] = _spread([g for v in ghz.values() for g in v], 3)
            out["ipc"] = _spread([i for v in ipc.values() for i in v], 3)
            out["by_cpu_ghz"] = {str(cpu): round(statistics.median(v), 3) for cpu, v in sorted(ghz.items()) if v}
            out["by_cpu_ipc"] = {str(cpu): round(statistics.median(v), 3) for cpu, v in sorted(ipc.items()) if v}
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


def _positive(kind: type[int] | type[float]) -> Callable[[str], int | float]:
    def parse(text: str) -> int | float:
        try:
            value = kind(text)
        except ValueError:
            value = 0
        if value <= 0:
            raise argparse.ArgumentTypeError(f"not a positive {kind.__name__}: {text!r}")
        return value
    return parse


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--interval-s", type=_positive(float), default=INTERVAL_S)
    parser.add_argument("--iterations", type=_positive(int), default=ITERATIONS)
    parser.add_argument("--cpus", type=_cpu_list, help="comma-separated CPUs to run on")
    args = parser.parse_args()
    try:
        probe(args.interval_s, args.iterations, args.cpus)
    except (KeyboardInterrupt, BrokenPipeError):
        pass


if __name__ == "__main__":
    main()
