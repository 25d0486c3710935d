"""Read back the ``gc pause:`` lines that ``bench/gc_pauses/sitecustomize.py`` wrote into server
logs: per log, the pauses by generation (count, total and longest ms) and every pause of at
least ``--list-ms``, with its end time (unix seconds, as an iteration timeline's ``at``).

Usage: python bench/gc_pauses/summary.py LOG [LOG ...] [--list-ms 100] [--json OUT]
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

PAUSE = re.compile(r"gc pause: pid (\d+) gen (-?\d+) ms ([\d.]+) collected (\d+) uncollectable (\d+) "
                   r"frozen (\d+) at ([\d.]+)")


def pauses(text: str) -> list[dict[str, Any]]:
    """Every ``gc pause:`` line of a log, in order."""
    return [{"pid": int(m[1]), "generation": int(m[2]), "ms": float(m[3]), "collected": int(m[4]),
             "uncollectable": int(m[5]), "frozen": int(m[6]), "at": float(m[7])} for m in PAUSE.finditer(text)]


def summarise(found: list[dict[str, Any]], list_ms: float) -> dict[str, Any]:
    by_generation: dict[str, dict[str, float]] = {}
    for p in found:
        g = by_generation.setdefault(str(p["generation"]), {"count": 0, "total_ms": 0.0, "max_ms": 0.0})
        g["count"] += 1
        g["total_ms"] = round(g["total_ms"] + p["ms"], 1)
        g["max_ms"] = max(g["max_ms"], p["ms"])
    return {"by_generation": by_generation, "long": [p for p in found if p["ms"] >= list_ms]}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("logs", nargs="+", type=Path)
    parser.add_argument("--list-ms", type=float, default=100.0, help="list every pause at least this long")
    parser.add_argument("--json", type=Path, help="also write the summary here")
    args = parser.parse_args(argv)
    summary = {str(path): summarise(pauses(path.read_text(errors="replace")), args.list_ms) for path in args.logs}
    for name, s in summary.items():
        parts = ", ".join(f"gen {g}: {v['count']} ({v['total_ms']:.0f} ms, longest {v['max_ms']:.0f})"
                          for g, v in sorted(s["by_generation"].items()))
        print(f"{name}: {parts or 'no pause logged'}")
        for p in s["long"]:
            print(f"  {p['ms']:.0f} ms gen {p['generation']} pid {p['pid']} at {p['at']:.2f} (frozen {p['frozen']})")
    if args.json:
        args.json.write_text(json.dumps(summary, indent=1) + "\n")
    return summary


if __name__ == "__main__":
    main()
