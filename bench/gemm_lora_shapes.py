"""The LoRA inside ATMM's GEMM against SGLang's base GEMM then ATMM's LoRA, on a served model's
module shapes, as eager prefills launch them (GPU only).

    python bench/gemm_lora_shapes.py [--tokens 1024 2048 4096 8192] [--rounds 3] [--tag gemm_lora_shapes_h200]

``bench/kernels.py`` times entry points on its own cells; this asks the question the server's
``--vlora-lora-gemm`` setting depends on, for Qwen2-VL-7B's four LoRA module shapes (q/k/v
with bias, o, gate/up, down), one rank-64 adapter over the whole batch:

* ``off``: ``F.linear`` (cuBLAS) then ``ops.lora_apply`` (ATMM's shrink and expand), what an
  eager batch runs with ``--vlora-lora-gemm off``;
* ``gemm[BMxBNxBKxWxS]``: ``ops.lora_apply_gemm`` with that tile config (block M, N, K, warps,
  stages): the shrink, then the GEMM with the LoRA in its accumulator. The first is the op's own
  config, called as the server calls it; its host time is the op's (the others' are not).

Each timing launches ``--calls`` calls back to back behind queued GPU work, so the host never
holds the GPU up: the CUDA events' span over the calls is their GPU time, the wall clock over
the launches their host time. Weights rotate over copies of the layer that pass twice the L2
size. The methods of a cell take turns, ``--rounds`` times; a figure is the median over rounds,
``spread`` the max / min. Prints a table, writes ``<out>/<tag>.json`` and ``.png``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import math
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "bench"))

import provenance  # noqa: E402

from bench.mode_cost import parse_positive  # noqa: E402

RANK = 64
SCALE = 2.0
# Qwen2-VL-7B: (input width, output slices, bias)
MODULES = {"qkv": (3584, (3584, 512, 512), True), "o": (3584, (3584,), False),
           "gate_up": (3584, (18944, 18944), False), "down": (18944, (3584,), False)}
CONFIGS = ((128, 256, 64, 8, 3), (128, 128, 64, 4, 4), (256, 128, 64, 8, 3))


def config_name(cfg: tuple[int, ...]) -> str:
    return "gemm[" + "x".join(map(str, cfg)) + "]"


def time_calls(fn, calls: int) -> tuple[float, float]:
    """(GPU us, host us) per call of ``fn``, launched behind queued GPU work."""
    import torch

    busy = torch.empty(8192, 8192, device="cuda", dtype=torch.bfloat16)
    for _ in range(20 + calls // 2):
        busy @ busy
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    began = time.perf_counter()
    for _ in range(calls):
        fn()
    host = (time.perf_counter() - began) / calls * 1e6
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / calls * 1e3, host


def measure_module(name: str, tokens: list[int], rounds: int, calls: int) -> list[dict]:
    import torch


    k, widths, has_bias = MODULES[name]
    offsets = [0, *itertools.accumulate(widths)]
    n, s = offsets[-1], len(widths)
    bf = torch.bfloat16
    g = torch.Generator(device="cuda").manual_seed(0)
    per_layer = 2 * (n * k + 2 * s * RANK * k + 2 * n * RANK)
    l2 = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 50 << 20)
    layers = [{"w": torch.randn(n, k, device="cuda", dtype=bf, generator=g) / k**0.5,
               "bias": torch.randn(n, device="cuda", dtype=bf, generator=g) if has_bias else None,
               "a": torch.randn(2, s * RANK, k, device="cuda", dtype=bf, generator=g) / k**0.5,
               "b": torch.randn(2, n, RANK, device="cuda", dtype=bf, generator=g) / RANK**0.5}
              for _ in range(max(2, math.ceil(2 * l2 / per_layer)))]
    rows = []
    for m in tokens:
        xs = [torch.randn(m, k, device="cuda", dtype=bf, generator=g) for _ in range(2)]
        row = {"module": name, "tokens": m, **measure_cell(xs, layers, offsets, rounds, calls)}
        rows.append(row)
        print(f"{name:8} {m:5d} " + " ".join(f"{key} {v['gpu_us']:8.1f}" for key, v in list(row.items())[2:]),
              flush=True)
    return rows


def measure_cell(xs: list, layers: list[dict], offsets: list[int], rounds: int, calls: int) -> dict:
    """Every method over these activations (taking turns) and rotated layers, ``rounds`` times."""
    import torch

    from sglang_vlora.atmm import gemm_lora, ops
    from sglang_vlora.atmm.work_items import build_work_items

    m = xs[0].shape[0]
    turn = itertools.count()

    def operands():
        i = next(turn)
        return xs[i % 2], layers[i % len(layers)]

    usual = build_work_items([0], [m], [1], [SCALE], [0, RANK], device="cuda")
    own = build_work_items([0], [m], [1], [SCALE], [0, RANK], device="cuda")

    def off():
        x, layer = operands()
        out = torch.nn.functional.linear(x, layer["w"], layer["bias"])
        ops.lora_apply(x, layer["a"], layer["b"], usual, offsets, out)

    def gemm():  # the op as the server calls it: its plan, its own tile config
        x, layer = operands()
        ops.lora_apply_gemm(x, layer["w"], layer["bias"], layer["a"], layer["b"], own, offsets)

    methods = {"off": off, config_name(CONFIGS[0]): gemm}
    for cfg in CONFIGS[1:]:
        config = gemm_lora.GemmConfig(block_m=cfg[0], block_n=cfg[1], block_k=cfg[2], num_warps=cfg[3],
                                      num_stages=cfg[4])
        if gemm_lora.unsupported(xs[0], layers[0]["w"], layers[0]["b"], offsets, config=config) is None:
            methods[config_name(cfg)] = _gemm_call(operands, xs[0], layers[0]["a"], offsets, config)
    for fn in methods.values():  # compile and warm up
        for _ in range(3):
            fn()
    torch.cuda.synchronize()
    timings: dict[str, list[tuple[float, float]]] = {key: [] for key in methods}
    for _ in range(rounds):
        for key, fn in methods.items():
            timings[key].append(time_calls(fn, calls))
    cell = {}
    for key, values in timings.items():
        gpu = [v[0] for v in values]
        cell[key] = {"gpu_us": round(statistics.median(gpu), 1), "spread": round(max(gpu) / min(gpu), 3),
                     "host_us": round(statistics.median(v[1] for v in values), 1)}
    return cell


def _gemm_call(operands, x, a_buffer, offsets: list[int], config):
    """``lora_apply_gemm``'s shrink and GEMM with tile ``config`` (its GPU time; the host time of
    the op itself is the first config's)."""
    from sglang_vlora.atmm import gemm_lora, ops
    from sglang_vlora.atmm.work_items import build_work_items

    m = x.shape[0]
    items = build_work_items([0], [m], [1], [SCALE], [0, RANK], device=x.device)
    maps = gemm_lora.token_maps(items, m, x.device)
    shrink = ops._shrink_plan(x, a_buffer, items, len(offsets) - 1, False, "triton", at_positions=True)

    def call():
        x, layer = operands()
        out = x.new_empty((m, offsets[-1]))
        return gemm_lora.launch(x, layer["w"], layer["bias"], shrink(x, layer["a"]), layer["b"], *maps, items.ranks,
                                offsets, out, config)

    return call


def plot(rows: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    modules = list(dict.fromkeys(r["module"] for r in rows))
    fig, axes = plt.subplots(1, len(modules), figsize=(4 * len(modules), 3.4), squeeze=False)
    for ax, name in zip(axes[0], modules, strict=True):
        mine = [r for r in rows if r["module"] == name]
        keys = [key for key in mine[0] if key not in ("module", "tokens") and key != "off"]
        for key in keys:
            ax.plot([r["tokens"] for r in mine], [r[key]["gpu_us"] / r["off"]["gpu_us"] for r in mine], "o-",
                    label=key)
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_xscale("log", base=2)
        ax.set_title(name)
        ax.set_xlabel("tokens")
    axes[0][0].set_ylabel("GPU time / off")
    axes[0][-1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--modules", nargs="+", default=list(MODULES), choices=list(MODULES))
    ap.add_argument("--tokens", nargs="+", type=parse_positive, default=[1024, 2048, 4096, 8192])
    ap.add_argument("--rounds", type=parse_positive, default=3)
    ap.add_argument("--calls", type=parse_positive, default=20)
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    ap.add_argument("--tag", default="gemm_lora_shapes_h200")
    args = ap.parse_args()
    import torch

    if not torch.cuda.is_available():
        print("bench/gemm_lora_shapes.py: no CUDA device, nothing measured")
        return
    rows = [row for name in args.modules for row in measure_module(name, args.tokens, args.rounds, args.calls)]
    doc = {"what": "GPU and host microseconds per call of one Qwen2-VL-7B LoRA module (rank 64, one adapter), "
                   "eager: off = cuBLAS base GEMM then ops.lora_apply; gemm[cfg] = ops.lora_apply_gemm's shrink "
                   "then its GEMM with that tile config; median over rounds, spread = max / min",
           "device": torch.cuda.get_device_name(0),
           "command": " ".join(["python", "bench/gemm_lora_shapes.py", *sys.argv[1:]]),
           "provenance": provenance.record(), "rows": rows}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.tag}.json").write_text(json.dumps(doc, indent=1) + "\n")
    plot(rows, args.out / f"{args.tag}.png")
    print(f"wrote {args.out / (args.tag + '.json')}")


if __name__ == "__main__":
    main()
