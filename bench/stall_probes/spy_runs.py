"""The longest stretches a thread spent under one frame of the server's code, from a py-spy
speedscope recording (``bench/stall_probes/spy_on.sh``).

A stall of a few hundred ms in a scheduler (a compile, a lock, a blocking call in a library)
keeps the path through SGLang's and the plugin's code (each frame's file, function and line) the
same for that long, while a normal forward moves through layers and modules every few ms. For
each thread this lists the ``--top`` longest runs of consecutive samples on one such path,
skipping runs whose leaf is an idle wait, with when each began (seconds from the
recording's start) and the stack of its middle sample.

Usage: python bench/stall_probes/spy_runs.py SPEEDSCOPE.json[.gz] [--top 10] [--min-ms 50]
       [--code-marker sglang] [--process sglang::scheduler] [--json OUT]
"""

from __future__ import annotations

import argparse
import gzip
import json
from pathlib import Path
from typing import Any

import probe_output

# Leaf functions of a thread that waits for work rather than doing it.
IDLE_LEAVES = frozenset({"poll", "select", "epoll_wait", "wait", "sleep", "recv", "recv_multipart", "recv_pyobj",
                         "_recv", "_recv_bytes", "recv_bytes", "_recv_msg", "accept", "acquire", "__enter__",
                         "_wait_for_tstate_lock", "get", "run_forever", "_run_once", "readinto", "read"})
# Files whose frames, as a stack's innermost Python frame, wait (an event loop in C, a pool's queue).
IDLE_FILES = ("asyncio/runners.py", "asyncio/base_events.py", "selectors.py", "threading.py", "queue.py",
              "multiprocessing/connection.py", "multiprocessing/queues.py", "multiprocessing/synchronize.py",
              "zmq/sugar/socket.py", "zmq/sugar/poll.py", "idle_sleeper.py")


def _idle(frame: dict[str, Any]) -> bool:
    """Whether a stack whose innermost Python frame is ``frame`` is a thread waiting for work."""
    name = frame["name"].rsplit(".", 1)[-1]  # "Poller.poll": "poll"
    return name in IDLE_LEAVES or frame.get("file", "").endswith(IDLE_FILES)


def load(path: Path) -> dict[str, Any]:
    """A py-spy speedscope recording (gzipped where the name ends in ``.gz``); ValueError where the
    file is no such recording."""
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        with opener(path, "rt") as f:
            data = json.load(f)
    except (OSError, EOFError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: not a readable speedscope JSON recording ({type(exc).__name__}: {exc})") from exc
    if not (isinstance(data, dict) and isinstance(data.get("profiles"), list)
            and isinstance(data.get("shared", {}).get("frames"), list)):
        raise ValueError(f"{path}: not a speedscope recording (no profiles and shared frames; py-spy record "
                         "--format speedscope writes one)")
    return data


def _code_path(stack: list[int], frames: list[dict[str, Any]], marker: str) -> tuple[int, ...]:
    """The stack's frames of the server's code, outermost first (empty where it has none)."""
    return tuple(index for index in stack if marker in frames[index].get("file", ""))


def runs(profile: dict[str, Any], frames: list[dict[str, Any]], marker: str, min_ms: float) -> list[dict[str, Any]]:
    """The thread's runs of at least ``min_ms`` on one path through ``marker`` frames, longest first."""
    samples, weights = profile.get("samples", []), profile.get("weights", [])
    scale = 1000.0 if profile.get("unit", "seconds") == "seconds" else 1.0
    paths = [_code_path(sample, frames, marker) for sample in samples]
    found: list[dict[str, Any]] = []
    t = 0.0
    start = 0
    while start < len(samples):
        key = paths[start]
        end, began, length = start, t, 0.0
        while end < len(samples) and paths[end] == key:
            length += weights[end] * scale if end < len(weights) else 0.0
            end += 1
        t += length
        middle = samples[(start + end - 1) // 2]
        if key and length >= min_ms and middle and not _idle(frames[middle[-1]]):
            found.append({"ms": round(length, 1), "began_s": round(began / 1000.0, 3), "samples": end - start,
                          "stack": [f"{frames[i]['name']} ({Path(frames[i]['file']).name}:{frames[i].get('line', '')})"
                                    for i in middle if frames[i].get("file")][-14:]})
        start = end
    return sorted(found, key=lambda r: -r["ms"])


def _in_process(profile: dict[str, Any], frames: list[dict[str, Any]], process: str) -> bool:
    """Whether a thread's samples name a process with ``process`` in its name (py-spy puts each
    sample's processes first in its stack, as frames without a file)."""
    if not process:
        return True
    samples = profile.get("samples") or [[]]
    return any(process in frames[i]["name"] for i in samples[0] if not frames[i].get("file"))


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("recording", type=Path)
    parser.add_argument("--top", type=int, default=10)
    parser.add_argument("--min-ms", type=float, default=50.0)
    parser.add_argument("--code-marker", default="sglang", help="a frame is the server's code if its file has this")
    parser.add_argument("--process", default="", help="only threads of processes whose name has this (py-spy "
                        "names each process by its title, e.g. sglang::scheduler)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    probe_output.check_json_path(parser, args.json)
    if args.top < 1 or args.min_ms < 0:
        parser.error("--top must be at least 1 and --min-ms at least 0")
    try:
        data = load(args.recording)
    except ValueError as exc:
        parser.error(str(exc))
    frames = data["shared"]["frames"]
    profiles = [p for p in data["profiles"] if _in_process(p, frames, args.process)]
    result = {p.get("name", "?"): runs(p, frames, args.code_marker, args.min_ms)[: args.top] for p in profiles}
    for thread, found in result.items():
        if not found:
            continue
        print(thread)
        for r in found:
            print(f"  {r['ms']:.0f} ms from {r['began_s']:.2f} s ({r['samples']} samples)")
            for line in r["stack"]:
                print(f"      {line}")
    if args.json:
        probe_output.write(args.json, {"threads": result}, "bench/stall_probes/spy_runs.py", argv)
    return result


if __name__ == "__main__":
    main()
