"""Write a small synthetic trace in the Azure LLM inference trace 2023 format.

    python bench/traces/make_trace.py                    # bench/traces/synthetic_azure.csv, seed 0
    python bench/traces/make_trace.py --rows 300 --seed 1 --out my.csv

Columns ``TIMESTAMP,ContextTokens,GeneratedTokens`` with timestamps written like the Azure
files (``2023-11-16 18:15:46.6805900``). Arrivals are a Poisson process whose rate swings
between 0.5x and 1.5x of ``--rate`` over a minute (the real trace is bursty); token counts
are log-normal, clipped to [16, 4096] context and [1, 512] generated tokens. Same seed,
same file.
"""

from __future__ import annotations

import argparse
import csv
from datetime import datetime, timedelta
from pathlib import Path

import numpy as np

START = datetime(2023, 11, 16, 18, 0, 0)


def make_rows(rows: int, rate: float, seed: int) -> list[tuple[str, int, int]]:
    rng = np.random.default_rng(seed)
    out = []
    t = 0.0
    for _ in range(rows):
        local_rate = rate * (1.0 + 0.5 * np.sin(2 * np.pi * t / 60.0))
        t += rng.exponential(1.0 / local_rate)
        context = int(np.clip(rng.lognormal(np.log(600), 0.9), 16, 4096))
        generated = int(np.clip(rng.lognormal(np.log(60), 0.8), 1, 512))
        stamp = (START + timedelta(seconds=t)).strftime("%Y-%m-%d %H:%M:%S.%f") + "0"
        out.append((stamp, context, generated))
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=300)
    parser.add_argument("--rate", type=float, default=2.0, help="mean requests per second")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=Path(__file__).with_name("synthetic_azure.csv"))
    args = parser.parse_args(argv)
    with open(args.out, "w", newline="", encoding="utf-8") as f:
        writer = csv.writer(f, lineterminator="\n")
        writer.writerow(["TIMESTAMP", "ContextTokens", "GeneratedTokens"])
        writer.writerows(make_rows(args.rows, args.rate, args.seed))
    print(f"wrote {args.rows} rows to {args.out}")


if __name__ == "__main__":
    main()
