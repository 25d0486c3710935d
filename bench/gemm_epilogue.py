"""The base GEMM with the LoRA expand in its epilogue, against cuBLAS, per prefill cell (GPU only).

    python bench/gemm_epilogue.py [--iters 20] [--tag gemm_epilogue_h200]

For the rank-64 prefill cells of ``bench/kernels.py`` (same tensors, same CUDA-graph timing
over copies that pass 5x the L2), times:

* ``merged``: cuBLAS's base GEMM alone (the reference of every percentage);
* ``in_gemm``: ``ops.lora_apply_static_in_gemm``, the best entry point so far;
* ``shrink_gemm``: cuBLAS's GEMM over the cell's A rows (the shrink the epilogue reads);
* ``plain[cfg]``: :func:`sglang_vlora.atmm.gemm_epilogue.gemm_lora` without LoRA, per tile config:
  how far the Triton GEMM is from cuBLAS's;
* ``fused[cfg]``: the same with the LoRA delta in the epilogue;
* ``op``: ``shrink_gemm`` then ``fused`` at its best config, in one graph: what an entry point
  built on it would cost;
* ``tma[cfg]``: a plain Triton GEMM through tensor descriptors (the copy engine's loads and
  stores), one tile per program or persistent: whether a Triton GEMM that could carry the
  epilogue gets nearer cuBLAS than the pointer-load one.

``err`` is the bf16 LoRA delta of ``fused`` (its output minus ``plain``'s at the same config)
against the fp32 delta of ``bench/kernels.py``. Writes ``<out>/<tag>.json``.
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
from bench.kernels import SCALE, Cell  # noqa: E402
from bench.mode_cost import parse_positive  # noqa: E402
from sglang_vlora.atmm import gemm_epilogue  # noqa: E402
from sglang_vlora.atmm.gemm_epilogue import GemmConfig  # noqa: E402
from sglang_vlora.atmm.tune import graph_replay_us  # noqa: E402

CELLS = [(shape, req, per, ad) for shape in ("proj", "qkv", "gate_up")
         for req, per, ad in ((4, 256, 1), (4, 256, 4), (4, 1024, 1), (4, 1024, 4), (1, 8192, 1))]
CONFIGS = [  # block_m, block_n, block_k, num_warps, num_stages
    (128, 128, 64, 4, 4),
    (128, 128, 64, 8, 3),
    (128, 256, 64, 8, 3),
    (128, 256, 64, 8, 4),
    (256, 128, 64, 8, 3),
    (64, 256, 64, 4, 4),
]


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
    num_m = tl.cdiv(M, BLOCK_M)
    num_n = tl.cdiv(N, BLOCK_N)
    per_group = GROUP_M * num_n
    for tile in tl.range(tl.program_id(0), num_m * num_n, NUM_PROGRAMS, flatten=True):
        first_m = (tile // per_group) * GROUP_M
        size_m = min(num_m - first_m, GROUP_M)
        pid_m = first_m + (tile % per_group) % size_m
        pid_n = (tile % per_group) // size_m
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
        for k in range(0, tl.cdiv(K, BLOCK_K)):
            a = a_desc.load([pid_m * BLOCK_M, k * BLOCK_K])
            b = b_desc.load([pid_n * BLOCK_N, k * BLOCK_K])
            acc = tl.dot(a, b.T, acc)
        c_desc.store([pid_m * BLOCK_M, pid_n * BLOCK_N], acc.to(c_desc.dtype))


def tma_gemm(x: torch.Tensor, w: torch.Tensor, out: torch.Tensor, spec: tuple) -> None:
    """``out = x @ w.T`` by :func:`_tma_gemm_kernel`; ``spec`` one of :data:`TMA_CONFIGS`."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    bm, bn, bk, warps, stages, persistent = spec
    m, k = x.shape
    n = w.shape[0]
    tiles = triton.cdiv(m, bm) * triton.cdiv(n, bn)
    programs = min(tiles, torch.cuda.get_device_properties(0).multi_processor_count) if persistent else tiles
    _tma_gemm_kernel[(programs,)](
        TensorDescriptor.from_tensor(x, [bm, bk]), TensorDescriptor.from_tensor(w, [bn, bk]),
        TensorDescriptor.from_tensor(out, [bm, bn]), m, n, k, programs,
        BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk, GROUP_M=8, num_warps=warps, num_stages=stages,
    )


def prepare(cell: Cell) -> None:
    d_in, width = cell.d_in, cell.offsets[-1]
    slots, scales = gemm_epilogue.token_maps(cell.seg_starts, cell.seg_lens, cell.slots,
                                             [SCALE] * cell.adapters, cell.tokens, "cuda")
    cell.token_slots, cell.token_scales = slots, scales
    for t in cell.sets:
        t["a_rows"] = t["a"].reshape(-1, d_in)
        t["inter"] = torch.empty(cell.tokens, t["a_rows"].shape[0], device="cuda", dtype=torch.bfloat16)
        t["zero"] = torch.zeros(width, device="cuda", dtype=torch.bfloat16)


def fused(cell: Cell, t: dict, cfg: GemmConfig, lora: bool = True) -> torch.Tensor:
    x = t["x"][: cell.tokens]
    if not lora:
        return gemm_epilogue.gemm_lora(x, t["w"], None, None, None, None, None, None, cell.offsets, cfg)
    return gemm_epilogue.gemm_lora(x, t["w"], None, t["inter"], t["b"], cell.token_slots, cell.token_scales,
                                   cell.items.ranks, cell.offsets, cfg)


def shrink(cell: Cell, t: dict) -> None:
    torch.mm(t["x"][: cell.tokens], t["a_rows"].t(), out=t["inter"])


def time_all(cell: Cell, call, iters: int) -> float:
    for t in cell.sets:
        call(t)
    torch.cuda.synchronize()
    return round(graph_replay_us(lambda: [call(t) for t in cell.sets], iters) / cell.copies, 2)


def measure(cell: Cell, iters: int) -> dict:
    prepare(cell)
    us = {"merged": time_all(cell, lambda t: cell.run("merged", t), iters),
          "in_gemm": time_all(cell, lambda t: cell.run("atmm_in_gemm", t), iters),
          "shrink_gemm": time_all(cell, lambda t: shrink(cell, t), iters)}
    plain, lora = {}, {}
    for spec in CONFIGS:
        cfg = GemmConfig(block_m=spec[0], block_n=spec[1], block_k=spec[2], num_warps=spec[3], num_stages=spec[4])
        key = "x".join(map(str, spec))
        try:
            plain[key] = time_all(cell, lambda t, cfg=cfg: fused(cell, t, cfg, lora=False), iters)
            lora[key] = time_all(cell, lambda t, cfg=cfg: fused(cell, t, cfg), iters)
        except Exception as exc:  # a config that does not fit (shared memory, slice offsets)
            plain[key] = lora[key] = f"{type(exc).__name__}: {exc}"[:160]
    tma = {}
    for spec in TMA_CONFIGS:
        key = "x".join(map(str, spec[:5])) + ("p" if spec[5] else "")
        try:
            tma[key] = time_all(cell, lambda t, spec=spec: tma_gemm(t["x"][: cell.tokens], t["w"],
                                                                     t["out"][: cell.tokens], spec), iters)
        except Exception as exc:  # a config that does not fit, or no tensor descriptors here
            tma[key] = f"{type(exc).__name__}: {exc}"[:160]
    timed = {k: v for k, v in lora.items() if isinstance(v, float)}
    best = min(timed, key=timed.get)
    spec = [int(v) for v in best.split("x")]
    cfg = GemmConfig(block_m=spec[0], block_n=spec[1], block_k=spec[2], num_warps=spec[3], num_stages=spec[4])

    def op(t: dict) -> None:
        shrink(cell, t)
        fused(cell, t, cfg)

    us["op"] = time_all(cell, op, iters)
    t = cell.sets[0]
    shrink(cell, t)
    delta = fused(cell, t, cfg).float() - fused(cell, t, cfg, lora=False).float()
    ref = cell.reference_delta(t)
    err = ((delta - ref).norm() / ref.norm()).item()
    merged = us["merged"]
    best_plain = min(v for v in plain.values() if isinstance(v, float))
    best_tma = min((v for v in tma.values() if isinstance(v, float)), default=None)
    t["out"].zero_()
    tma_spec = TMA_CONFIGS[0]
    tma_gemm(t["x"][: cell.tokens], t["w"], t["out"][: cell.tokens], tma_spec)
    tma_err = ((t["out"][: cell.tokens].float() - t["x"][: cell.tokens].float() @ t["w"].float().t()).norm()
               / (t["x"][: cell.tokens].float() @ t["w"].float().t()).norm()).item()
    return {"us": us, "plain_us": plain, "fused_us": lora, "tma_us": tma, "tma_err": round(tma_err, 5),
            "best": best, "err": round(err, 5),
            "pct": {"in_gemm": round(100 * (us["in_gemm"] - merged) / merged, 1),
                    "shrink_gemm": round(100 * us["shrink_gemm"] / merged, 1),
                    "best_plain_over_cublas": round(100 * (best_plain - merged) / merged, 1),
                    "fused_over_plain_same_cfg": round(100 * (lora[best] - plain[best]) / merged, 1)
                    if isinstance(plain[best], float) else None,
                    "best_tma_over_cublas": None if best_tma is None else round(100 * (best_tma - merged) / merged, 1),
                    "op": round(100 * (us["op"] - merged) / merged, 1)}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--iters", type=parse_positive, default=20)
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
        row = {"shape": shape, "tokens": cell.tokens, "adapters": cell.adapters, "rank": 64, **measure(cell, args.iters)}
        rows.append(row)
        print(json.dumps({k: row[k] for k in ("shape", "tokens", "adapters", "best", "err", "tma_err", "pct")}),
              flush=True)
        print(json.dumps(row["tma_us"]), flush=True)
        (args.out / f"{args.tag}.json").write_text(json.dumps(doc, indent=1) + "\n")
        del cell
        torch.cuda.empty_cache()
    print("| cell | cuBLAS us | in_gemm % | best Triton GEMM vs cuBLAS % | epilogue % | shrink GEMM % | op % |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        p = r["pct"]
        print(f"| {r['shape']} {r['tokens']}x{r['adapters']} | {r['us']['merged']} | {p['in_gemm']} | "
              f"{p['best_plain_over_cublas']} | {p['fused_over_plain_same_cfg']} | {p['shrink_gemm']} | {p['op']} |")


if __name__ == "__main__":
    main()
