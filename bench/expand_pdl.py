"""The in-GEMM expand with and without programmatic dependent launch (GPU only, sm90+).

    python bench/expand_pdl.py [--rounds 3] [--iters 20] [--tag expand_pdl_h200]

``ops.lora_apply_static_in_gemm`` (``atmm_in_gemm`` in ``bench/kernels.py``) launches its expand
right after the GEMM that computed its inputs. With PDL (``SGLANG_VLORA_PDL``, on by default on
Hopper) the expand's programs may be scheduled before that GEMM has completed and wait for it
on the GPU (``triton_kernels.expand_pdl``). For kernel-benchmark cells (same tensors, same
CUDA-graph timing over copies that pass 5x the L2), rank 64, this times the base GEMM alone and
the whole op four ways: PDL off, PDL on as shipped (expands of at most
``triton_kernels.PDL_MAX_ROWS`` rows and ``PDL_MAX_SLICES`` slices), PDL on for expands of any
slice count up to the row limit (``on_all_slices``) and PDL on for every expand
(``on_all_rows``): what the two limits are measured against. They and the base GEMM take turns
over ``--rounds`` rounds in one process, and every way must give the same output bit for bit.

Writes ``<out>/<tag>.json`` (per cell every round's microseconds; the op's extra over the base
GEMM in % of it, from the medians) and a bar plot ``<out>/<tag>.png``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import provenance  # noqa: E402
from bench.kernels import Cell  # noqa: E402
from bench.mode_cost import parse_positive  # noqa: E402
from bench.plotting import pyplot, save_figure  # noqa: E402
from sglang_vlora.atmm import triton_kernels  # noqa: E402
from sglang_vlora.config import PDL_ENV  # noqa: E402

# (shape, mode, requests, tokens per request, adapters): decode cells of bench/kernels.py's
# shapes and of Qwen2-VL-7B's (q2_*), up to 128 requests, and two prefill cells
CELLS = (
    *(("proj", "decode", n, 1, a) for n, a in ((1, 1), (8, 1), (8, 4), (32, 1), (32, 4), (64, 4), (128, 4))),
    *(("qkv", "decode", n, 1, 4) for n in (8, 32, 64)),
    *(("gate_up", "decode", n, 1, 4) for n in (8, 32)),
    *(("q2_o", "decode", n, 1, 4) for n in (8, 16, 32, 48, 64, 128)),
    *(("q2_qkv", "decode", n, 1, 4) for n in (8, 16, 32, 48, 64, 128)),
    ("proj", "prefill", 1, 1024, 1),
    ("proj", "prefill", 4, 1024, 4),
)
SHIPPED = (triton_kernels.PDL_MAX_ROWS, triton_kernels.PDL_MAX_SLICES)
MOST_SLICES = 3
# way: (SGLANG_VLORA_PDL, the most rows and the most slices an expand launched with PDL has)
WAYS = {
    "off": ("0", *SHIPPED),
    "on": ("1", *SHIPPED),
    "on_all_slices": ("1", SHIPPED[0], MOST_SLICES),
    "on_all_rows": ("1", 1 << 30, MOST_SLICES),
}
LABELS = {
    "off": "PDL off",
    "on": "PDL on (shipped)",
    "on_all_slices": "PDL at every slice count",
    "on_all_rows": "PDL at every row and slice count",
}


def use_way(way: str) -> None:
    os.environ[PDL_ENV], triton_kernels.PDL_MAX_ROWS, triton_kernels.PDL_MAX_SLICES = WAYS[way]


def in_gemm_output(cell: Cell, way: str) -> torch.Tensor:
    use_way(way)
    out = cell.in_gemm(cell.sets[0]).clone()
    torch.cuda.synchronize()
    return out


def measure(cell: Cell, rounds: int, iters: int) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {"merged": [], **{way: [] for way in WAYS}}
    for _ in range(rounds):
        times["merged"].append(cell.time_us("merged", iters))
        for way in WAYS:
            use_way(way)
            times[way].append(cell.time_us("atmm_in_gemm", iters))
    return times


def plot(rows: list[dict], device: str, path: Path) -> None:
    plt = pyplot()
    if plt is None:
        return
    labels = [r["cell"].replace(" ", "\n", 2) for r in rows]
    xs = range(len(rows))
    fig, ax = plt.subplots(figsize=(1.1 * len(rows) + 2, 4))
    width = 0.8 / len(WAYS)
    for i, way in enumerate(WAYS):
        shift = (i - (len(WAYS) - 1) / 2) * width
        ax.bar([x + shift for x in xs], [r["extra_pct"][way] for r in rows], width=width, label=LABELS[way])
        for x, r in zip(xs, rows, strict=True):  # every round's extra, over that round's base GEMM
            ax.scatter([x + shift] * len(r["rounds_pct"][way]), r["rounds_pct"][way], color="k", s=6, zorder=3)
    ax.axhline(30, color="grey", linestyle=":", linewidth=1, label="decode target (30%)")
    ax.set_xticks(list(xs), labels, fontsize=7)
    ax.set_ylabel("extra over the base GEMM, % of it")
    ax.set_title(f"in-GEMM expand, with and without PDL, rank 64 ({device})", fontsize=9)
    ax.legend(fontsize=7)
    save_figure(plt, fig, path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=parse_positive, default=3)
    ap.add_argument("--iters", type=parse_positive, default=20)
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    ap.add_argument("--tag", default="expand_pdl")
    args = ap.parse_args()
    if not torch.cuda.is_available() or torch.cuda.get_device_capability() < (9, 0):
        print("bench/expand_pdl.py: needs a CUDA device of compute capability 9.0 or later, nothing measured")
        return
    rows = []
    for shape, mode, requests, per_req, adapters in CELLS:
        cell = Cell(shape, mode, requests, per_req, adapters, 64)
        plain = in_gemm_output(cell, "off")
        exact = all(torch.equal(plain, in_gemm_output(cell, way)) for way in WAYS)
        times = measure(cell, args.rounds, args.iters)
        base = statistics.median(times["merged"])
        row = {
            "cell": f"{shape} {mode} {cell.tokens}x{cell.adapters}",
            "us": times,
            "bit_exact": exact,
            "extra_pct": {w: round(100 * (statistics.median(times[w]) - base) / base, 1) for w in WAYS},
            "rounds_pct": {w: [round(100 * (t - m) / m, 1) for t, m in zip(times[w], times["merged"], strict=True)]
                           for w in WAYS},
        }
        rows.append(row)
        print(row["cell"], f"base {base:.2f} us", row["extra_pct"], "rounds", row["rounds_pct"], "bit-exact", exact,
              flush=True)
        del cell
        torch.cuda.empty_cache()
    os.environ.pop(PDL_ENV)
    triton_kernels.PDL_MAX_ROWS, triton_kernels.PDL_MAX_SLICES = SHIPPED
    device = torch.cuda.get_device_name(0)
    doc = {"what": __doc__.split("\n\n")[0], "device": device, "rank": 64, "pdl_max_rows": SHIPPED[0],
           "pdl_max_slices": SHIPPED[1], "ways": LABELS, "rows": rows}
    path = provenance.write_results(args.out, args.tag, doc, "bench/expand_pdl.py", sys.argv[1:])
    plot(rows, device, args.out / f"{args.tag}.png")
    print("| cell | base GEMM us | " + " | ".join(f"{LABELS[w]} %" for w in WAYS) + " | bit-exact |")
    print("|---|---|" + "---|" * len(WAYS) + "---|")
    for r in rows:
        print(f"| {r['cell']} | {statistics.median(r['us']['merged']):.2f} | "
              + " | ".join(str(r["extra_pct"][w]) for w in WAYS) + f" | {r['bit_exact']} |")
    print("wrote", path)


if __name__ == "__main__":
    main()
