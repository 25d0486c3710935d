"""Read back the ``gc pause:`` and ``triton compile:`` lines that
``bench/stall_probes/sitecustomize.py`` wrote into server logs: per log, the pauses by
generation (count, total and longest ms), the compiles by kernel, and every pause or compile of at
least ``--list-ms``, with its end time (unix seconds, as an iteration timeline's ``at``). With
``--rounds RESULTS.json`` (the end-to-end call's results file), each listed one also names the
measurement it fell in (system and round; a server's log, named after its system, only its own
measurements), and each log counts those that fell in one: a pause or compile before the first
round or while another server is measured delays no measured request.

Usage: python bench/stall_probes/summary.py LOG [LOG ...] [--list-ms 100] [--rounds RESULTS.json] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

import probe_output

PAUSE = re.compile(r"gc pause: pid (\d+) gen (-?\d+) ms ([\d.]+) collected (\d+) uncollectable (\d+) "
                   r"frozen (\d+) at ([\d.]+)")
COMPILE = re.compile(r"triton compile: pid (\d+) kernel (\S+) ms (-?[\d.]+) warmup ([01]) at ([\d.]+)"
                     r"(?: sig ((?:(?! spec )[^\n])*))?(?: spec ([^\n]*))?")


def pauses(text: str) -> list[dict[str, Any]]:
    """Every ``gc pause:`` line of a log, in order."""
    return [{"pid": int(m[1]), "generation": int(m[2]), "ms": float(m[3]), "collected": int(m[4]),
             "uncollectable": int(m[5]), "frozen": int(m[6]), "at": float(m[7])} for m in PAUSE.finditer(text)]


def compiles(text: str) -> list[dict[str, Any]]:
    """Every ``triton compile:`` line of a log, in order."""
    return [{"pid": int(m[1]), "kernel": m[2], "ms": float(m[3]), "warmup": m[4] == "1", "at": float(m[5]),
             "signature": m[6] or "", "variant": m[7] or ""} for m in COMPILE.finditer(text)]


def _totals(events: list[dict[str, Any]], key: str) -> dict[str, dict[str, float]]:
    totals: dict[str, dict[str, float]] = {}
    for e in events:
        t = totals.setdefault(str(e[key]), {"count": 0, "total_ms": 0.0, "max_ms": 0.0})
        t["count"] += 1
        t["total_ms"] = round(t["total_ms"] + e["ms"], 1)
        t["max_ms"] = max(t["max_ms"], e["ms"])
    return totals


def measured_windows(results: dict[str, Any]) -> list[tuple[float, float, str]]:
    """Each measurement of an end-to-end results file that ran: its start and end (unix
    seconds) and ``system #round``."""
    return [(m["started_at_unix"], m["started_at_unix"] + m["seconds"], f"{m['system']} #{m['repeat']}")
            for m in results.get("measurements", [])
            if m.get("status") == "ok" and m.get("started_at_unix") is not None and m.get("seconds") is not None]


def windows_for_log(log: Path, windows: list[tuple[float, float, str]]) -> list[tuple[float, float, str]]:
    """The measurements that a server's log can delay: the harness names each server's log
    after its system (``vlora.log``), and a server only gets requests in its own measurements;
    a log named after no system of the call (a client's, the harness's) keeps them all."""
    own = [w for w in windows if w[2].rsplit(" #", 1)[0] == log.stem]
    return own or windows


def window_of(at: float, windows: list[tuple[float, float, str]]) -> str:
    """The measurement during which an event ending at ``at`` ran, or "" for none."""
    return next((label for start, end, label in windows if start <= at <= end), "")


def summarise(text: str, list_ms: float, windows: list[tuple[float, float, str]] | None = None) -> dict[str, Any]:
    found_pauses, found_compiles = pauses(text), compiles(text)
    long = sorted([{"what": f"gc gen {p['generation']}", **p} for p in found_pauses if p["ms"] >= list_ms]
                  + [{"what": f"compile {c['kernel']}", **c} for c in found_compiles if c["ms"] >= list_ms],
                  key=lambda e: e["at"])
    summary = {"gc_by_generation": _totals(found_pauses, "generation"),
               "compiles_by_kernel": _totals(found_compiles, "kernel"), "long": long}
    if windows is not None:
        for e in long:
            e["measurement"] = window_of(e["at"], windows)
        summary["long_in_measurements"] = sum(bool(e["measurement"]) for e in long)
    return summary


def _read_windows(parser: argparse.ArgumentParser, path: Path) -> list[tuple[float, float, str]]:
    try:
        results = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        parser.error(f"--rounds {path}: not a readable JSON results file ({exc})")
    windows = measured_windows(results) if isinstance(results, dict) else []
    if not windows:
        parser.error(f"--rounds {path}: no measurement that ran with its start and length "
                     "(an end-to-end results file from bench/run_e2e.py run)")
    return windows


def _line(totals: dict[str, dict[str, float]], label: str) -> str:
    return ", ".join(f"{label}{k}: {v['count']} ({v['total_ms']:.0f} ms, longest {v['max_ms']:.0f})"
                     for k, v in sorted(totals.items())) or "none logged"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("logs", nargs="+", type=Path)
    parser.add_argument("--list-ms", type=float, default=100.0, help="list every pause or compile at least this long")
    parser.add_argument("--rounds", type=Path,
                        help="the end-to-end call's results JSON: name the measurement each listed one fell in")
    parser.add_argument("--json", type=Path, help="also write the summary here (a .json path)")
    args = parser.parse_args(argv)
    probe_output.check_json_path(parser, args.json)
    missing = [str(path) for path in args.logs if not path.is_file()]
    if missing:
        parser.error(f"no such log file: {', '.join(missing)}")
    if args.list_ms < 0:
        parser.error("--list-ms must be at least 0")
    windows = None if args.rounds is None else _read_windows(parser, args.rounds)
    summary = {str(path): summarise(path.read_text(errors="replace"), args.list_ms,
                                    None if windows is None else windows_for_log(path, windows))
               for path in args.logs}
    for name, s in summary.items():
        print(f"{name}\n  gc pauses: {_line(s['gc_by_generation'], 'gen ')}\n"
              f"  Triton compiles: {_line(s['compiles_by_kernel'], '')}")
        if windows is not None:
            print(f"  of the {len(s['long'])} listed, in a measurement: {s['long_in_measurements']}")
        for e in s["long"]:
            variant = f" ({e['variant']})" if e.get("variant") else ""
            during = f" during {e['measurement']}" if e.get("measurement") else ""
            print(f"  {e['ms']:.0f} ms {e['what']} pid {e['pid']} at {e['at']:.2f}{during}{variant}")
    if args.json:
        probe_output.write(args.json, {"logs": summary}, "bench/stall_probes/summary.py", argv)
    return summary


if __name__ == "__main__":
    main()
