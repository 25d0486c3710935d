"""How a server's processes spent one measurement on the host: CPU time, preemptions, steal.

A server process can run a round's eager prefills slower than the others of its call for
minutes, whatever its LoRA backend, and pinning each server to CPUs of its own did not change
that (docs/perf.md, "Pinned and unpinned"). These figures tell the kinds of slow apart: a
server that waited for a CPU (more involuntary context switches, a busy CPU set), one whose
virtual CPUs the hypervisor took (steal), and one that needed more CPU time for the same work
(a slower CPU). Read from ``/proc`` (Linux), before and after a measurement; nothing is
changed.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PROC = Path("/proc")
TICKS_PER_S = os.sysconf("SC_CLK_TCK")
# /proc/stat's CPU fields: user nice system idle iowait irq softirq steal (guest time is in user)
BUSY_FIELDS = (0, 1, 2, 5, 6)
STEAL_FIELD = 7


@dataclass(frozen=True)
class ProcessTimes:
    """One process's CPU time (all its threads) and context switches (summed over its threads)."""

    cpu_ticks: int
    voluntary_switches: int
    involuntary_switches: int


@dataclass(frozen=True)
class Sample:
    """A server's process tree and the host's CPU counters at one moment."""

    processes: dict[int, ProcessTimes]
    cpu_fields: dict[str, list[int]]
    monotonic_s: float


def _parent_pids() -> dict[int, int]:
    parents = {}
    for stat in PROC.glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue  # a process that ended while the tree was read
        parents[int(stat.parent.name)] = int(fields[1])
    return parents


def process_tree(pid: int) -> list[int]:
    """``pid`` and every process below it, by their parent ids."""
    children: dict[int, list[int]] = {}
    for child, parent in _parent_pids().items():
        children.setdefault(parent, []).append(child)
    tree, todo = [], [pid]
    while todo:
        p = todo.pop()
        tree.append(p)
        todo += children.get(p, [])
    return sorted(tree)


def _switches(status: str) -> tuple[int, int]:
    values = dict(line.split(":", 1) for line in status.splitlines() if "ctxt_switches" in line)
    return int(values["voluntary_ctxt_switches"]), int(values["nonvoluntary_ctxt_switches"])


def process_times(pid: int) -> ProcessTimes | None:
    """``pid``'s times, or None if it has ended."""
    try:
        fields = (PROC / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()
        voluntary = involuntary = 0
        for task in (PROC / str(pid) / "task").iterdir():
            try:
                v, i = _switches((task / "status").read_text())
            except OSError:
                continue  # a thread that ended while its process was read
            voluntary += v
            involuntary += i
    except OSError:
        return None
    # after the command name: state ppid ... utime (index 11) stime (index 12)
    return ProcessTimes(int(fields[11]) + int(fields[12]), voluntary, involuntary)


def cpu_fields() -> dict[str, list[int]]:
    """``/proc/stat``'s CPU lines: ``"cpu"`` (all) and ``"cpuN"``, their tick counters."""
    lines = (PROC / "stat").read_text().splitlines()
    return {parts[0]: [int(x) for x in parts[1:]] for parts in (line.split() for line in lines)
            if parts and parts[0].startswith("cpu")}


def take(pid: int, monotonic_s: float) -> Sample:
    """The process tree under ``pid`` and the host's CPU counters now."""
    processes = {p: t for p in process_tree(pid) if (t := process_times(p)) is not None}
    return Sample(processes, cpu_fields(), monotonic_s)


def _share(before: dict[str, list[int]], after: dict[str, list[int]], names: Sequence[str],
           fields: Sequence[int]) -> float | None:
    if any(name not in before or name not in after for name in names):
        return None  # a CPU that went offline (or came online) between the samples
    total = part = 0
    for name in names:
        delta = [a - b for a, b in zip(after[name], before[name], strict=True)]
        total += sum(delta[:8])
        part += sum(delta[f] for f in fields)
    return round(part / total, 4) if total > 0 else None


def between(before: Sample, after: Sample, cpus: Sequence[int] | None = None) -> dict[str, Any]:
    """What the server's processes did from ``before`` to ``after``, over the processes present
    at both, and the share of ``cpus`` (the server's own when pinned; else every CPU of the host)
    that was busy and that the hypervisor stole."""
    wall_s = after.monotonic_s - before.monotonic_s
    common = sorted(set(before.processes) & set(after.processes))
    ticks = sum(after.processes[p].cpu_ticks - before.processes[p].cpu_ticks for p in common)
    names = [f"cpu{c}" for c in cpus] if cpus else ["cpu"]
    return {
        "wall_s": round(wall_s, 3),
        "processes": len(common),
        "cpu_s": round(ticks / TICKS_PER_S, 2),
        "cpu_per_wall_s": round(ticks / TICKS_PER_S / wall_s, 3) if wall_s > 0 else None,
        "voluntary_switches": sum(after.processes[p].voluntary_switches - before.processes[p].voluntary_switches
                                  for p in common),
        "involuntary_switches": sum(after.processes[p].involuntary_switches
                                    - before.processes[p].involuntary_switches for p in common),
        "cpus": list(cpus) if cpus else "all",
        "cpus_busy_share": _share(before.cpu_fields, after.cpu_fields, names, BUSY_FIELDS),
        "cpus_steal_share": _share(before.cpu_fields, after.cpu_fields, names, (STEAL_FIELD,)),
    }
