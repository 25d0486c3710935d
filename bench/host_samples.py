"""Where each server's scheduler spends its host time, from py-spy samples, against the floor's.

    python bench/host_samples.py --rate 500 --requests 60 [--out FILE.json] nolora=SPY.txt atmm=SPY.txt ...

Input: py-spy's raw output (``py-spy record --threads --format raw``) of one server's scheduler
per system, every server having answered the same requests (``bench/profile_server.py
--sample-host`` writes ``spy_<system>_<scenario>.txt`` per interleaved scenario and puts this
comparison into its results). Only the scheduler's main thread inside its event
loop is counted (start-up, CUDA-graph capture and the tokenizer are left out). A sample is
py-spy's view of that thread while it was on the CPU, so the counts give host time without the
torch profiler's per-op overhead; time spent waiting for the GPU shows up in the call that
waits (a synchronising copy), idle time not at all.

Per system and function: inclusive milliseconds per request (samples / rate / requests), and
for each LoRA system its excess over the floor's. Functions are named as py-spy names them
(``Class.method (file)``, without the line). ``--modules`` adds, per decoder module (q/k/v,
o, gate/up, down), the host time inside its linear's call and the lines that took most of it.
"""

from __future__ import annotations

import argparse
import json
import re
from collections import Counter
from pathlib import Path

EVENT_LOOP = "Scheduler.run_event_loop"
MAIN_THREAD = re.compile(r"^thread \(\w+\): MainThread$")
_LINE = re.compile(r":\d+\)$")
_DECODER_LAYER = re.compile(r"^\w*DecoderLayer\.forward \(")  # the language model's layers, not a ViT's blocks
_BLOCK = re.compile(r"^\w*?(Attention|MLP)\.forward \(")  # a decoder layer's attention / MLP block
_LINEAR = re.compile(r"^(Column|Row)ParallelLinear(?:WithLoRA)?\.forward \(")


def frame_name(frame: str) -> str:
    """``Class.method (file.py:123)`` -> ``Class.method (file.py)``."""
    return _LINE.sub(")", frame)


def without_lines(stacks: Counter) -> Counter:
    """Stacks read with ``keep_lines`` as :func:`scheduler_stacks` would give them without."""
    out: Counter = Counter()
    for frames, count in stacks.items():
        out[tuple(frame_name(f) for f in frames)] += count
    return out


def scheduler_stacks(lines: list[str], keep_lines: bool = False) -> Counter:
    """Sample counts per stack (a tuple of frame names, outermost first) of the scheduler's
    main thread inside its event loop; ``keep_lines`` keeps each frame's line number."""
    stacks: Counter = Counter()
    for line in lines:
        head, _, count = line.rstrip("\n").rpartition(" ")
        if not head or not count.isdigit():
            continue
        parts = head.split(";")
        thread = next((i for i, part in enumerate(parts) if part.startswith("thread (")), None)
        if thread is None or not MAIN_THREAD.match(parts[thread]):
            continue
        frames = tuple(f if keep_lines else frame_name(f) for f in parts[thread + 1:])
        loop = next((i for i, f in enumerate(frames) if f.startswith(EVENT_LOOP + " ")), None)
        if loop is not None:
            stacks[frames[loop:]] += int(count)
    return stacks


def inclusive_ms(stacks: Counter, rate: float, requests: int) -> dict[str, float]:
    """Milliseconds per request in which each function was on the stack (once per sample)."""
    totals: Counter = Counter()
    for frames, count in stacks.items():
        for name in set(frames):
            totals[name] += count
    return {name: 1e3 * count / rate / requests for name, count in totals.items()}


def self_ms(stacks: Counter, rate: float, requests: int) -> dict[str, float]:
    """Milliseconds per request in which each function was the innermost frame."""
    totals: Counter = Counter()
    for frames, count in stacks.items():
        totals[frames[-1]] += count
    return {name: 1e3 * count / rate / requests for name, count in totals.items()}


def compare(systems: dict[str, Counter], rate: float, requests: int, floor: str, top: int) -> dict:
    """Per system its event loop's total, its top functions, and against the floor's the
    functions whose inclusive time differs most."""
    out: dict = {"rate_hz": rate, "requests": requests, "floor": floor, "systems": {}}
    inclusive = {name: inclusive_ms(stacks, rate, requests) for name, stacks in systems.items()}
    for name, stacks in systems.items():
        incl = inclusive[name]
        entry = {
            "samples": sum(stacks.values()),
            "top_inclusive_ms": {k: round(v, 3) for k, v in sorted(incl.items(), key=lambda kv: -kv[1])[:top]},
            "top_self_ms": {k: round(v, 3) for k, v in
                            sorted(self_ms(stacks, rate, requests).items(), key=lambda kv: -kv[1])[:top]},
        }
        loop = [k for k in incl if k.startswith(EVENT_LOOP + " ")]
        entry["event_loop_ms"] = round(incl[loop[0]], 3) if loop else 0.0
        if floor in inclusive and name != floor:
            base = inclusive[floor]
            diffs = {k: incl.get(k, 0.0) - base.get(k, 0.0) for k in set(incl) | set(base)}
            entry["over_floor_ms"] = {k: round(v, 3) for k, v in
                                      sorted(diffs.items(), key=lambda kv: -abs(kv[1]))[:top]}
        out["systems"][name] = entry
    return out


def module_kind(frames: tuple[str, ...]) -> str | None:
    """The decoder module a stack is inside: ``qkv`` / ``o`` (a column / row parallel linear,
    LoRA-wrapped or not, under a decoder layer's attention block) or ``gate_up`` / ``down``
    (under its MLP); None outside the language model's decoder layers (a vision encoder's
    blocks have linears too)."""
    layer = next((i for i, f in enumerate(frames) if _DECODER_LAYER.match(f)), None)
    if layer is None:
        return None
    inner = frames[layer + 1:]
    block = next((m for m in map(_BLOCK.match, inner) if m), None)
    linear = next((m for m in map(_LINEAR.match, inner) if m), None)
    if block is None or linear is None:
        return None
    attention = block.group(1) == "Attention"
    return ("qkv" if attention else "gate_up") if linear.group(1) == "Column" else ("o" if attention else "down")


def module_calls(stacks: Counter, rate: float, requests: int, top: int = 4) -> dict[str, dict]:
    """Per decoder module (:func:`module_kind`; ``stacks`` with line numbers kept): host
    milliseconds per request inside its linear's call, and the innermost frames (with their
    lines) that took the most of it: which statement of the call, e.g. the base GEMM's
    ``F.linear``, holds the time."""
    totals: Counter = Counter()
    leaves: dict[str, Counter] = {}
    for frames, count in stacks.items():
        kind = module_kind(frames)
        if kind is None:
            continue
        totals[kind] += count
        leaves.setdefault(kind, Counter())[frames[-1]] += count
    ms = 1e3 / rate / requests
    return {kind: {"ms": round(totals[kind] * ms, 3),
                   "top_leaves_ms": {leaf: round(n * ms, 3) for leaf, n in leaves[kind].most_common(top)}}
            for kind in ("qkv", "o", "gate_up", "down") if kind in totals}


def named_file(text: str) -> tuple[str, Path]:
    """``NAME=FILE`` -> ``(NAME, FILE)``."""
    name, sep, path = text.partition("=")
    if not sep or not name or not path:
        raise argparse.ArgumentTypeError(f"expected NAME=FILE, got {text!r}")
    return name, Path(path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("samples", nargs="+", type=named_file, help="SYSTEM=FILE, py-spy raw samples per system")
    ap.add_argument("--rate", type=float, required=True, help="py-spy's sampling rate (-r), per second")
    ap.add_argument("--requests", type=int, required=True, help="requests each server answered while sampled")
    ap.add_argument("--floor", default="nolora")
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--out", type=Path)
    ap.add_argument("--modules", action="store_true",
                    help="also each decoder module's host time (q/k/v, o, gate/up, down) and its costliest lines")
    args = ap.parse_args()
    if args.rate <= 0 or args.requests <= 0 or args.top <= 0:
        ap.error("--rate, --requests and --top must be positive")
    missing = [str(path) for _, path in args.samples if not path.is_file()]
    if missing:
        ap.error(f"no such samples file: {', '.join(missing)}")
    lined = {name: scheduler_stacks(path.read_text(errors="replace").splitlines(), keep_lines=True)
             for name, path in args.samples}
    systems = {name: without_lines(stacks) for name, stacks in lined.items()}
    empty = [name for name, stacks in systems.items() if not stacks]
    if empty:
        raise SystemExit(f"no scheduler event-loop samples for {', '.join(empty)} (py-spy run with --threads?)")
    result = compare(systems, args.rate, args.requests, args.floor, args.top)
    if args.modules:
        for name, stacks in lined.items():
            result["systems"][name]["module_calls"] = module_calls(stacks, args.rate, args.requests)
    if args.out:
        args.out.write_text(json.dumps(result, indent=1))
    for name, entry in result["systems"].items():
        print(f"{name}: event loop {entry['event_loop_ms']:.2f} ms a request ({entry['samples']} samples)")
        for func, ms in entry.get("over_floor_ms", {}).items():
            print(f"    {ms:+8.3f}  {func}")
        for kind, calls in entry.get("module_calls", {}).items():
            print(f"    {kind:8} {calls['ms']:8.3f} ms: " + ", ".join(f"{leaf} {ms:.3f}"
                                                             for leaf, ms in calls["top_leaves_ms"].items()))


if __name__ == "__main__":
    main()
