"""Where the shrink-inside-the-GEMM op's time goes, per kernel-benchmark cell (GPU only).

    python bench/in_gemm_parts.py [--ranks 64] [--iters 30] [--tag in_gemm_parts_h200]

``ops.lora_apply_static_in_gemm`` is two launches: one GEMM over the base weight with the
cell's adapters' A rows appended (``[W; A]``), then the expand, which reads the GEMM's base
columns and each token's slot columns and writes ``base + LoRA`` into a new output. For the
cells of ``bench/kernels.py`` (same tensors, same CUDA-graph timing over copies that pass 5x
the L2), this times apart:

* ``merged``: the base GEMM alone (``x @ W.T``);
* ``gemm_ext``: the GEMM over ``[W; A]`` alone: its excess over ``merged`` is what the
  appended columns cost (their work, and any wave or tile quantisation they cause);
* ``expand``: the op's expand alone, over a stored GEMM output (the table's tile config);
* ``in_gemm``: the whole op;
* ``copy``: a plain Triton copy of the base columns into a new output, tiles of 64x128: the
  same bytes the expand moves (it reads the base, writes the output), so ``expand / copy`` is
  how far the expand is from this GPU's memory floor for its traffic.

Writes ``<out>/<tag>.json`` (rows of microseconds, ``parts`` in % of ``merged``) and a bar
plot ``<out>/<tag>.png``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import provenance  # noqa: E402
from bench.kernels import Cell  # noqa: E402
from bench.mode_cost import parse_positive  # noqa: E402
from bench.plotting import pyplot, save_figure  # noqa: E402
from sglang_vlora.atmm import in_gemm, ops  # noqa: E402
from sglang_vlora.atmm.tune import graph_replay_us  # noqa: E402

# (shape, mode, requests, tokens per request, adapters): decode and prefill cells of bench/kernels.py
CELLS = (
    ("proj", "decode", 8, 1, 1),
    ("proj", "decode", 32, 1, 4),
    ("qkv", "decode", 32, 1, 4),
    ("gate_up", "decode", 32, 1, 4),
    ("proj", "prefill", 1, 1024, 1),
    ("proj", "prefill", 4, 1024, 4),
    ("proj", "prefill", 1, 8192, 1),
    ("qkv", "prefill", 4, 1024, 1),
    ("gate_up", "prefill", 4, 1024, 1),
)
COPY_TILE = (64, 128)


@triton.jit
def _copy_kernel(src_ptr, dst_ptr, stride_src, stride_dst, rows, cols, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    mask = (offs_m[:, None] < rows) & (offs_n[None, :] < cols)
    offs_m = offs_m.to(tl.int64)
    tile = tl.load(src_ptr + offs_m[:, None] * stride_src + offs_n[None, :], mask=mask)
    tl.store(dst_ptr + offs_m[:, None] * stride_dst + offs_n[None, :], tile, mask=mask)


def copy_columns(src: torch.Tensor, dst: torch.Tensor) -> None:
    """``dst.copy_(src)`` for a row-strided ``src`` view and contiguous ``dst`` (unit column stride)."""
    rows, cols = dst.shape
    grid = (triton.cdiv(rows, COPY_TILE[0]), triton.cdiv(cols, COPY_TILE[1]))
    _copy_kernel[grid](src, dst, src.stride(0), dst.stride(0), rows, cols, BLOCK_M=COPY_TILE[0], BLOCK_N=COPY_TILE[1])


def parts(us: dict[str, float]) -> dict[str, float]:
    """The op's time split in % of the base GEMM: the appended columns, the expand, what is
    left (launch gaps between the two), and the expand against the copy floor (x)."""
    merged = us["merged"]
    return {
        "appended_columns_pct": round(100 * (us["gemm_ext"] - merged) / merged, 1),
        "expand_pct": round(100 * us["expand"] / merged, 1),
        "rest_pct": round(100 * (us["in_gemm"] - us["gemm_ext"] - us["expand"]) / merged, 1),
        "in_gemm_pct": round(100 * (us["in_gemm"] - merged) / merged, 1),
        "copy_floor_pct": round(100 * us["copy"] / merged, 1),
        "expand_over_copy": round(us["expand"] / us["copy"], 2),
    }


def measure(cell: Cell, iters: int) -> dict[str, float]:
    """Microseconds of each part on ``cell`` (every input set run once before the capture)."""
    width = cell.offsets[-1]
    for t in cell.sets:
        cell.w_ext(t)
        t["y"] = torch.nn.functional.linear(t["x"][: cell.tokens], t["w_ext"])
        t["new"] = torch.empty(cell.tokens, width, device="cuda", dtype=torch.bfloat16)

    def expand(t: dict) -> None:
        inter, layout = in_gemm.split_output(t["y"], width, t["b"].shape[0])
        ops.lora_expand_static(inter, t["b"], cell.covering, cell.offsets, t["new"], gemm_layout=layout)

    calls = {
        "merged": lambda t: cell.run("merged", t),
        "gemm_ext": lambda t: torch.mm(t["x"][: cell.tokens], t["w_ext"].t(), out=t["y"]),
        "expand": expand,
        "in_gemm": lambda t: cell.run("atmm_in_gemm", t),
        "copy": lambda t: copy_columns(t["y"][:, :width], t["new"]),
    }
    us = {}
    for name, call in calls.items():
        for t in cell.sets:
            call(t)
        torch.cuda.synchronize()
        us[name] = round(graph_replay_us(lambda call=call: [call(t) for t in cell.sets], iters) / cell.copies, 2)
    return us


def plot(rows: list[dict], device: str, path: Path) -> None:
    plt = pyplot()
    if plt is None:
        return
    labels = [f"{r['shape']} {r['mode']}\n{r['tokens']} tok, {r['adapters']} ad, r{r['rank']}" for r in rows]
    fig, ax = plt.subplots(figsize=(1.3 * len(rows) + 2, 4))
    bottom = [0.0] * len(rows)
    for key, label in (("appended_columns_pct", "appended columns"), ("expand_pct", "expand"), ("rest_pct", "rest")):
        values = [max(r["parts"][key], 0.0) for r in rows]
        ax.bar(labels, values, bottom=bottom, label=label)
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    ax.scatter(labels, [r["parts"]["copy_floor_pct"] for r in rows], color="k", marker="_", s=400,
               label="copy of the base columns (memory floor of the expand)", zorder=3)
    ax.set_ylabel("% of the base GEMM")
    ax.set_title(f"shrink in the GEMM, by part ({device})", fontsize=9)
    ax.tick_params(axis="x", labelsize=7)
    ax.legend(fontsize=7)
    save_figure(plt, fig, path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--ranks", nargs="+", type=parse_positive, default=[64])
    ap.add_argument("--iters", type=parse_positive, default=30)
    ap.add_argument("--modes", nargs="+", choices=["decode", "prefill"], default=["decode", "prefill"])
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    ap.add_argument("--tag", default="in_gemm_parts")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("bench/in_gemm_parts.py: no CUDA device, nothing measured")
        return
    rows = []
    for rank in args.ranks:
        for shape, mode, requests, per_req, adapters in CELLS:
            if mode not in args.modes:
                continue
            cell = Cell(shape, mode, requests, per_req, adapters, rank)
            us = measure(cell, args.iters)
            row = {"shape": shape, "mode": mode, "rank": rank, "tokens": cell.tokens, "adapters": cell.adapters,
                   "us": us, "parts": parts(us)}
            rows.append(row)
            print(json.dumps(row), flush=True)
            del cell
            torch.cuda.empty_cache()
    device = torch.cuda.get_device_name(0)
    doc = {
        "what": __doc__.split("\n\n")[0],
        "device": device,
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "command": " ".join(["python", "bench/in_gemm_parts.py", *sys.argv[1:]]),
        "provenance": provenance.record(),
        "rows": rows,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.tag}.json").write_text(json.dumps(doc, indent=1) + "\n")
    plot(rows, device, args.out / f"{args.tag}.png")
    print("| cell | merged us | appended columns % | expand % | rest % | whole op % | copy floor % | expand / copy |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        p = r["parts"]
        print(f"| {r['shape']} {r['mode']} {r['tokens']}x{r['adapters']} r{r['rank']} | {r['us']['merged']} | "
              f"{p['appended_columns_pct']} | {p['expand_pct']} | {p['rest_pct']} | {p['in_gemm_pct']} | "
              f"{p['copy_floor_pct']} | {p['expand_over_copy']} |")


if __name__ == "__main__":
    main()
