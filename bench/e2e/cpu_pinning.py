"""Each server of a call on CPU cores of its own (``run --cpus-per-server N``).

Why: without prefill CUDA graphs an eager prefill is bound by its server process's host speed,
and in the rounds at 9b46a17 one server at a time ran for minutes at a speed of its own while
the others in the same rounds did not (docs/perf.md, "Eight more 1024 in / 64 out rounds of
ATMM alone"). With every server pinned to cores no other server uses, and the client to the
rest, where the kernel places a process no longer decides a round. The cores come from this
process's own affinity set: bench/gpu_parallel.sh starts calls side by side each on a share of
the host's CPUs (:func:`shares`), so their blocks never overlap.

The blocks move one server along each round (:func:`blocks_for_round`, :func:`repin`): the
host probe found one server's CPUs running a fixed loop up to 1.5x apart within one
measurement, the same block the slowest in two of three rounds, and a server's unqueued
prefill following its block's speed (docs/perf.md, "Each CPU's speed beside the server's").
Rotated, a slow block slows every system's rounds in turn instead of one system's.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from bench.e2e.host_time import PROC, process_tree

SYS_CPU = Path("/sys/devices/system/cpu")
SYS_NODE = Path("/sys/devices/system/node")


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _cpu_key(cpu: int) -> tuple[int, int, int]:
    """Sort key that keeps a physical core's hardware threads next to each other: package,
    core id, then the CPU number (missing topology files sort by CPU number alone)."""
    topo = SYS_CPU / f"cpu{cpu}" / "topology"
    package = _read(topo / "physical_package_id")
    core = _read(topo / "core_id")
    return (int(package) if package is not None else 0, int(core) if core is not None else cpu, cpu)


def ordered_cpus() -> list[int]:
    """The CPUs this process may run on, ordered so that consecutive blocks take whole
    physical cores where the kernel says which threads share one."""
    return sorted(os.sched_getaffinity(0), key=_cpu_key)


def topology() -> dict[str, Any]:
    """What the host offers this process: its CPUs, their NUMA nodes and which CPUs share a
    physical core (recorded with every call, pinned or not)."""
    cpus = sorted(os.sched_getaffinity(0))
    nodes = {}
    for node in sorted(SYS_NODE.glob("node[0-9]*")):
        cpulist = _read(node / "cpulist")
        if cpulist is not None:
            nodes[node.name] = cpulist
    siblings = sorted({s for cpu in cpus
                       if (s := _read(SYS_CPU / f"cpu{cpu}" / "topology" / "thread_siblings_list")) is not None})
    return {"cpus": cpus, "cpu_count": os.cpu_count(), "numa_nodes": nodes, "thread_siblings": siblings}


def shares(cpus: Sequence[int], calls: int) -> list[list[int]]:
    """``calls`` equal blocks of consecutive ``cpus``, one per call that bench/gpu_parallel.sh
    starts side by side (each under its block, so a pinned call's servers and client keep to
    it). In :func:`ordered_cpus`' order a block takes whole physical cores, and on a host of
    several sockets whole sockets where the division allows; the CPUs the division leaves over
    go to no call. ``ValueError`` where a call would get none."""
    if calls < 1:
        raise ValueError(f"CPU shares for {calls} calls: at least one call")
    size = len(cpus) // calls
    if size < 1:
        raise ValueError(f"{calls} calls side by side but this process may run on {len(cpus)} CPUs")
    return [list(cpus[i * size:(i + 1) * size]) for i in range(calls)]


def assign(cpus: Sequence[int], servers: Sequence[str], per_server: int) -> dict[str, Any]:
    """Blocks of ``per_server`` consecutive CPUs of ``cpus``, one per server in order; the
    client gets the rest, at least one. ``ValueError`` where they do not fit."""
    if per_server < 1:
        raise ValueError(f"--cpus-per-server must be at least 1, not {per_server}")
    needed = per_server * len(servers)
    if needed >= len(cpus):
        raise ValueError(f"{len(servers)} servers x {per_server} CPUs need {needed} CPUs plus at least one for "
                         f"the client, but this process may run on {len(cpus)} ({list(cpus)}): lower "
                         "--cpus-per-server or run fewer systems")
    blocks = {name: list(cpus[i * per_server:(i + 1) * per_server]) for i, name in enumerate(servers)}
    return {"cpus_per_server": per_server, "servers": blocks, "client": list(cpus[needed:]),
            "rotation": "by round: in round r the server i runs on the block of server i + r"}


def blocks_for_round(pinning: dict[str, Any], round_index: int) -> dict[str, list[int]]:
    """Each server's CPUs in round ``round_index`` (0 is :func:`assign`'s): server i takes the
    block of server (i + round_index) modulo the servers, so over as many rounds as servers
    each runs once on every block."""
    names = list(pinning["servers"])
    blocks = [pinning["servers"][name] for name in names]
    return {name: list(blocks[(i + round_index) % len(blocks)]) for i, name in enumerate(names)}


def repin(pid: int, cpus: Sequence[int]) -> int:
    """Move every thread of ``pid`` and of the processes below it to ``cpus``; how many threads
    moved. Threads and processes that end meanwhile are passed over; ``ProcessLookupError`` if
    no thread moved (``pid`` has ended)."""
    moved = 0
    for process in process_tree(pid):
        try:
            tasks = [int(t.name) for t in (PROC / str(process) / "task").iterdir()]
        except FileNotFoundError:
            continue
        for task in tasks:
            try:
                os.sched_setaffinity(task, cpus)
            except ProcessLookupError:
                continue
            moved += 1
    if not moved:
        raise ProcessLookupError(f"no process {pid} to move to CPUs {list(cpus)}")
    return moved
