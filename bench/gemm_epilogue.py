"""The base GEMM with the LoRA expand inside it, against cuBLAS, per prefill cell (GPU only).

    python bench/gemm_epilogue.py [--iters 10] [--rounds 5] [--tag gemm_epilogue_h200]

A design probe, not an ATMM entry point: every other entry point ends in an expand that
reads or writes the whole output beside the base GEMM (docs/atmm.md). Here a Triton GEMM
over the base weight, with tensor-descriptor (TMA) loads and stores, adds each token's
``scale * inter @ B.T`` into its accumulator: one MMA of depth ``rank`` per slot among a
tile's rows, so the output is written once. For the rank-64 prefill cells of
``bench/kernels.py`` (same tensors, same CUDA-graph timing over copies that pass 5x the L2),
times:

* ``merged``: cuBLAS's base GEMM alone (the reference of every percentage);
* ``in_gemm``: ``ops.lora_apply_static_in_gemm``, the best entry point so far;
* ``shrink_gemm``: cuBLAS's GEMM over the cell's A rows (every slot's shrink columns);
* ``tma[cfg]``: the plain Triton GEMM, per tile config (``p``: persistent, one program per
  SM): how far it is from cuBLAS;
* ``fused``: the GEMM with the LoRA MMAs, over ``shrink_gemm``'s output, the MMAs before the
  K loop (``lora_first``) or after it;
* ``raw``: the same without the masks and the per-row scale (timing only: what the MMAs cost
  once the shrink writes its tiles scaled and zero-padded);
* ``op``: ATMM's graph-safe shrink (``ops.lora_shrink_static``, a row per token here) then
  ``fused``: an entry point built on it.

The calls of a cell take turns, ``--rounds`` times (:func:`time_interleaved`); ``spread`` is
each call's max / min over its rounds. ``err``: the bf16 LoRA delta of ``op`` (its output
minus the plain GEMM's) against the fp32 delta of ``bench/kernels.py``, and the plain GEMM
against fp32. Writes ``<out>/<tag>.json``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import statistics
import sys
from pathlib import Path

import torch
import triton
import triton.language as tl

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import provenance  # noqa: E402
from bench.kernels import Cell  # noqa: E402
from bench.mode_cost import parse_positive  # noqa: E402
from sglang_vlora.atmm import (
    gemm_lora,  # noqa: E402
    ops,  # noqa: E402
)
from sglang_vlora.atmm.gemm_lora import lora_tile, tile_origin  # noqa: E402
from sglang_vlora.atmm.tune import capture_graph, replay_median_us  # noqa: E402

CELLS = [(shape, req, per, ad) for shape in ("proj", "qkv", "gate_up")
         for req, per, ad in ((4, 256, 1), (4, 256, 4), (4, 1024, 1), (4, 1024, 4), (1, 8192, 1))]


TMA_CONFIGS = [  # block_m, block_n, block_k, num_warps, num_stages, persistent
    (128, 256, 64, 8, 3, False),
    (128, 256, 64, 8, 4, False),
    (128, 128, 64, 8, 4, False),
    (128, 256, 64, 8, 3, True),
    (128, 128, 64, 8, 4, True),
]


@triton.jit
def _tma_gemm_kernel(a_desc, b_desc, c_desc, M, N, K, NUM_PROGRAMS, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                     BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    """``c = a @ b.T`` through tensor descriptors (the copy engine's tile loads and stores),
    each program looping over tiles ``pid, pid + NUM_PROGRAMS, ...`` (one tile each when the
    grid covers them all)."""
    tiles = tl.cdiv(M, BLOCK_M) * tl.cdiv(N, BLOCK_N)
    for tile in tl.range(tl.program_id(0), tiles, NUM_PROGRAMS, flatten=True):
        row0, col0 = tile_origin(tile, M, N, BLOCK_M, BLOCK_N, GROUP_M)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k in range(0, tl.cdiv(K, BLOCK_K)):
            acc = tl.dot(a_desc.load([row0, k * BLOCK_K]), b_desc.load([col0, k * BLOCK_K]).T, acc)
        c_desc.store([row0, col0], acc.to(c_desc.dtype))


@triton.jit
def _lora_tile(acc, i_desc, bb_desc, slot, slots, scales, ranks_ptr, row0, col0, s, N, slot_width,
               R_BLOCK: tl.constexpr, DTYPE: tl.constexpr, RAW: tl.constexpr):
    """``acc + scale * inter @ B.T`` over the tile's rows of ``slot`` (the others masked).
    RAW (timing only, not a right result in general): no masks and no scale, the two tiles
    straight from their loads into the MMA, as if the shrink had written them scaled, padded
    and the rows' slots all alike."""
    if RAW:
        return tl.dot(i_desc.load([row0, slot * slot_width + s * R_BLOCK]), bb_desc.load([slot * N + col0, 0]).T, acc)
    return lora_tile(acc, i_desc, bb_desc, slot, slots, scales, ranks_ptr, row0, col0, s, N, slot_width, R_BLOCK,
                     DTYPE)


@triton.jit
def _tma_lora_kernel(a_desc, b_desc, c_desc, i_desc, bb_desc, tok_slots_ptr, tok_scales_ptr, ranks_ptr, M, N, K,
                     off1, off2, slot_width, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                     R_BLOCK: tl.constexpr, GROUP_M: tl.constexpr, LORA_FIRST: tl.constexpr,
                     RAW: tl.constexpr):
    """``c = a @ b.T + scale * inter @ B.T`` per token, tensor-descriptor loads: one MMA per
    slot among the tile's rows into the GEMM's accumulator (the intermediate's rows of other
    slots, and columns past the slot's rank, masked to zero). LORA_FIRST: the LoRA MMAs
    start the accumulator, before the K loop; else they follow it, the lowest and highest
    slot unrolled and a loop over any between."""
    row0, col0 = tile_origin(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    rows = row0 + tl.arange(0, BLOCK_M)
    valid = rows < M
    slots = tl.load(tok_slots_ptr + rows, mask=valid, other=-1)
    scales = tl.load(tok_scales_ptr + rows, mask=valid, other=0.0)
    s = (col0 >= off1).to(tl.int32) + (col0 >= off2).to(tl.int32)
    lo = tl.min(tl.where(slots >= 0, slots, 1 << 30))
    hi = tl.max(slots)
    dtype = c_desc.dtype
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    if LORA_FIRST:
        for slot in range(lo, hi + 1):
            acc = _lora_tile(acc, i_desc, bb_desc, slot, slots, scales, ranks_ptr, row0, col0, s, N, slot_width,
                             R_BLOCK, dtype, RAW)
    for k in range(0, tl.cdiv(K, BLOCK_K)):
        a = a_desc.load([row0, k * BLOCK_K])
        b = b_desc.load([col0, k * BLOCK_K])
        acc = tl.dot(a, b.T, acc)
    if not LORA_FIRST:
        if hi >= 0:
            acc = _lora_tile(acc, i_desc, bb_desc, lo, slots, scales, ranks_ptr, row0, col0, s, N, slot_width,
                             R_BLOCK, dtype, RAW)
        if hi > lo:
            acc = _lora_tile(acc, i_desc, bb_desc, hi, slots, scales, ranks_ptr, row0, col0, s, N, slot_width,
                             R_BLOCK, dtype, RAW)
            for slot in range(lo + 1, hi):
                acc = _lora_tile(acc, i_desc, bb_desc, slot, slots, scales, ranks_ptr, row0, col0, s, N,
                                 slot_width, R_BLOCK, dtype, RAW)
    c_desc.store([row0, col0], acc.to(dtype))


def tma_lora(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor, inter: torch.Tensor, slot_width: int,
             b_buffer: torch.Tensor, token_slots: torch.Tensor, token_scales: torch.Tensor, ranks: torch.Tensor,
             offsets: list[int], spec: tuple, lora_first: bool = False, raw: bool = False) -> None:
    """:func:`_tma_lora_kernel` over ``inter`` (a row per token; slot ``j``'s columns at ``j *
    slot_width``, 0 where each row holds only its own slot's)."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    bm, bn, bk, warps, stages, _ = spec
    m, k = x.shape
    n = w.shape[0]
    rank_block = max(16, triton.next_power_of_2(b_buffer.shape[2]))
    offs = [int(o) for o in offsets] + [n] * (4 - len(offsets))
    grid = (triton.cdiv(m, bm) * triton.cdiv(n, bn),)
    _tma_lora_kernel[grid](
        TensorDescriptor.from_tensor(x, [bm, bk]), TensorDescriptor.from_tensor(w, [bn, bk]),
        TensorDescriptor.from_tensor(out, [bm, bn]), TensorDescriptor.from_tensor(inter, [bm, rank_block]),
        TensorDescriptor.from_tensor(b_buffer.reshape(-1, b_buffer.shape[2]), [bn, rank_block]),
        token_slots, token_scales, ranks, m, n, k, offs[1], offs[2], slot_width,
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, R_BLOCK=rank_block, GROUP_M=8, LORA_FIRST=lora_first, RAW=raw,
        num_warps=warps, num_stages=stages,
    )


def tma_gemm(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor, spec: tuple, programs: int | None = None) -> None:
    """``out = x @ w.T`` by :func:`_tma_gemm_kernel`; ``spec`` one of :data:`TMA_CONFIGS`;
    ``programs``: the persistent grid (default: one program per SM)."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    bm, bn, bk, warps, stages, persistent = spec
    m, k = x.shape
    n = w.shape[0]
    tiles = triton.cdiv(m, bm) * triton.cdiv(n, bn)
    if programs is None:
        programs = min(tiles, torch.cuda.get_device_properties(0).multi_processor_count) if persistent else tiles
    _tma_gemm_kernel[(programs,)](
        TensorDescriptor.from_tensor(x, [bm, bk]), TensorDescriptor.from_tensor(w, [bn, bk]),
        TensorDescriptor.from_tensor(out, [bm, bn]), m, n, k, programs,
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=8, num_warps=warps, num_stages=stages,
    )


def prepare(cell: Cell) -> None:
    d_in, width = cell.d_in, cell.offsets[-1]
    cell.token_slots, cell.token_scales = gemm_lora.token_maps(cell.items, cell.tokens, "cuda")
    for t in cell.sets:
        t["a_rows"] = t["a"].reshape(-1, d_in)
        t["inter"] = torch.empty(cell.tokens, t["a_rows"].shape[0], device="cuda", dtype=torch.bfloat16)
        t["zero"] = torch.zeros(width, device="cuda", dtype=torch.bfloat16)


def shrink(cell: Cell, t: dict) -> None:
    torch.mm(t["x"][: cell.tokens], t["a_rows"].t(), out=t["inter"])


def capture(cell: Cell, call) -> torch.cuda.CUDAGraph:
    """One CUDA graph of ``call`` over every input set (each set run once before)."""
    for t in cell.sets:
        call(t)
    torch.cuda.synchronize()
    graph = capture_graph(lambda: [call(t) for t in cell.sets])
    torch.cuda.synchronize()
    return graph


def time_interleaved(cell: Cell, calls: dict, iters: int, rounds: int) -> tuple[dict, dict]:
    """Per call, the median over ``rounds`` of its median replay (us per input set), the calls
    taking turns in every round, so a drift of the GPU's clocks during the cell reaches them
    alike (single runs of one cell moved by up to 10% between calls); and each call's
    spread (max / min of its rounds). A call that fails to run gets its error instead."""
    graphs, out, spread = {}, {}, {}
    for name, call in calls.items():
        try:
            graphs[name] = capture(cell, call)
        except Exception as exc:  # a config that does not fit (shared memory)
            out[name] = f"{type(exc).__name__}: {exc}"[:160]
    samples = {name: [] for name in graphs}
    for _ in range(rounds):
        for name, graph in graphs.items():
            samples[name].append(replay_median_us(graph, iters) / cell.copies)
    for name, values in samples.items():
        out[name] = round(statistics.median(values), 2)
        spread[name] = round(max(values) / min(values), 3)
    return out, spread


def measure(cell: Cell, iters: int, rounds: int) -> dict:
    prepare(cell)
    x = lambda t: t["x"][: cell.tokens]  # noqa: E731
    out = lambda t: t["out"][: cell.tokens]  # noqa: E731
    spec = TMA_CONFIGS[0]

    def fused(t: dict, first: bool, raw: bool = False) -> None:
        tma_lora(x(t), t["w"], out(t), t["inter"], t["a"].shape[1], t["b"], cell.token_slots, cell.token_scales,
                 cell.items.ranks, cell.offsets, spec, first, raw)

    def op(t: dict, first: bool) -> None:
        inter = ops.lora_shrink_static(x(t), t["a"], cell.static, cell.s, zero_fill=False)
        tma_lora(x(t), t["w"], out(t), inter, 0, t["b"], cell.token_slots, cell.token_scales, cell.items.ranks,
                 cell.offsets, spec, first)

    calls = {
        "merged": lambda t: cell.run("merged", t),
        "in_gemm": lambda t: cell.run("atmm_in_gemm", t),
        "shrink_gemm": lambda t: shrink(cell, t),
        **{"tma_" + "x".join(map(str, c[:5])) + ("p" if c[5] else ""): (lambda t, c=c: tma_gemm(x(t), t["w"], out(t), c))
           for c in TMA_CONFIGS},
        **{f"{kind}_{'first' if first else 'after'}": (lambda t, kind=kind, first=first:
                                                          fused(t, first, raw=kind == "raw") if kind != "op"
                                                          else op(t, first))
           for kind in ("fused", "raw", "op") for first in (False, True)},
    }
    us, spread = time_interleaved(cell, calls, iters, rounds)
    t = cell.sets[0]
    ref = cell.reference_delta(t)
    errors = {}
    for first in (False, True):
        tma_gemm(x(t), t["w"], out(t), spec)
        base = out(t).float().clone()
        op(t, first)
        errors["op_first" if first else "op_after"] = round(((out(t).float() - base - ref).norm() / ref.norm()).item(),
                                                            5)
    plain = x(t).float() @ t["w"].float().t()
    tma_gemm(x(t), t["w"], out(t), spec)
    errors["tma"] = round(((out(t).float() - plain).norm() / plain.norm()).item(), 5)
    merged = us["merged"]

    def pct(prefix: str) -> float | None:
        timed = [v for k, v in us.items() if k.startswith(prefix) and isinstance(v, float)]
        return round(100 * (min(timed) - merged) / merged, 1) if timed else None

    return {"us": us, "spread": spread, "err": errors,
            "pct": {"in_gemm": pct("in_gemm"), "shrink_gemm": round(100 * us["shrink_gemm"] / merged, 1),
                    "tma_gemm": pct("tma_"), "fused": pct("fused_"), "raw": pct("raw_"), "op": pct("op_")}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--iters", type=parse_positive, default=10)
    ap.add_argument("--rounds", type=parse_positive, default=5)
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    ap.add_argument("--tag", default="gemm_epilogue")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("bench/gemm_epilogue.py: no CUDA device, nothing measured")
        return
    rows = []
    args.out.mkdir(parents=True, exist_ok=True)
    doc = {"what": __doc__.split("\n\n")[0], "device": torch.cuda.get_device_name(0),
           "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
           "python": platform.python_version(), "torch": torch.__version__,
           "triton": __import__("triton").__version__,
           "command": " ".join(["python", "bench/gemm_epilogue.py", *sys.argv[1:]]),
           "provenance": provenance.record(), "rows": rows}
    for shape, requests, per_req, adapters in CELLS:
        cell = Cell(shape, "prefill", requests, per_req, adapters, 64)
        row = {"shape": shape, "tokens": cell.tokens, "adapters": cell.adapters, "rank": 64, **measure(cell, args.iters, args.rounds)}
        rows.append(row)
        print(json.dumps(row), flush=True)
        (args.out / f"{args.tag}.json").write_text(json.dumps(doc, indent=1) + "\n")
        del cell
        torch.cuda.empty_cache()
    print("| cell | cuBLAS us | in_gemm % | TMA GEMM % | fused % | fused, no masks % | shrink + fused % |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        p = r["pct"]
        print(f"| {r['shape']} {r['tokens']}x{r['adapters']} | {r['us']['merged']} | {p['in_gemm']} | {p['tma_gemm']} | "
              f"{p['fused']} | {p['raw']} | {p['op']} |")


if __name__ == "__main__":
    main()
