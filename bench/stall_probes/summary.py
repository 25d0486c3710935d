"""Read back the ``gc pause:`` and ``triton compile:`` lines that
``bench/stall_probes/sitecustomize.py`` wrote into server logs: per log, the pauses by
generation (count, total and longest ms), the compiles by kernel, and every pause or compile of at
least ``--list-ms``, with its end time (unix seconds, as an iteration timeline's ``at``).

Usage: python bench/stall_probes/summary.py LOG [LOG ...] [--list-ms 100] [--json OUT]
"""

from __future__ import annotations

import argparse
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


def summarise(text: str, list_ms: float) -> dict[str, Any]:
    found_pauses, found_compiles = pauses(text), compiles(text)
    long = sorted([{"what": f"gc gen {p['generation']}", **p} for p in found_pauses if p["ms"] >= list_ms]
                  + [{"what": f"compile {c['kernel']}", **c} for c in found_compiles if c["ms"] >= list_ms],
                  key=lambda e: e["at"])
    return {"gc_by_generation": _totals(found_pauses, "generation"),
            "compiles_by_kernel": _totals(found_compiles, "kernel"), "long": long}


def _line(totals: dict[str, dict[str, float]], label: str) -> str:
    return ", ".join(f"{label}{k}: {v['count']} ({v['total_ms']:.0f} ms, longest {v['max_ms']:.0f})"
                     for k, v in sorted(totals.items())) or "none logged"


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("logs", nargs="+", type=Path)
    parser.add_argument("--list-ms", type=float, default=100.0, help="list every pause or compile at least this long")
    parser.add_argument("--json", type=Path, help="also write the summary here (a .json path)")
    args = parser.parse_args(argv)
    probe_output.check_json_path(parser, args.json)
    missing = [str(path) for path in args.logs if not path.is_file()]
    if missing:
        parser.error(f"no such log file: {', '.join(missing)}")
    if args.list_ms < 0:
        parser.error("--list-ms must be at least 0")
    summary = {str(path): summarise(path.read_text(errors="replace"), args.list_ms) for path in args.logs}
    for name, s in summary.items():
        print(f"{name}\n  gc pauses: {_line(s['gc_by_generation'], 'gen ')}\n"
              f"  Triton compiles: {_line(s['compiles_by_kernel'], '')}")
        for e in s["long"]:
            variant = f" ({e['variant']})" if e.get("variant") else ""
            print(f"  {e['ms']:.0f} ms {e['what']} pid {e['pid']} at {e['at']:.2f}{variant}")
    if args.json:
        probe_output.write(args.json, {"logs": summary}, "bench/stall_probes/summary.py", argv)
    return summary


if __name__ == "__main__":
    main()
