"""LoRA cost of a decode step's projections inside a CUDA graph: two launches a module, or one.

    python bench/decode_step.py                 # GPU: Qwen2-VL-7B's 28 layers of q/k/v and o
    python bench/decode_step.py --smoke         # CPU (Triton interpreter), tiny shapes: the code path

A decode graph of a LoRA server runs, per layer, the q/k/v projection (base GEMM plus LoRA),
then the o projection. This benchmark captures exactly that for 28 layers (each with its own
weights, as in the model, so the caches see what the server's do) and times its replays
against the same graph without LoRA:

* ``split``: what decode graphs ran before the fused kernel: the shrink on a side stream beside
  the base GEMM, then the expand (``ops.lora_apply_static_with_base``), tile configs from the
  device's table;
* ``split_seq``: the same two launches in sequence (the prefill graphs' layout);
* ``fused``: the base GEMM, then one launch that computes the shrink on chip and the expand
  (``ops.lora_apply_fused_static``), for each candidate tile config.

Batches of ``bs`` requests (one token each) over 4 rank-64 adapters, a share of them on one
adapter, grouped by adapter as the server groups them; ``unmerged`` (one item per adapter) and
``mixture`` (that adapter merged: the others' items paired with its ``-k`` term). The result
per batch: milliseconds a step adds over the no-LoRA graph (median of the replays; the spread
over ``--trials`` independent timings), and each candidate's error against the ``split``
output. Writes ``<out>/<tag>.json`` and ``.png``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import platform
import sys
import tempfile
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench import provenance  # noqa: E402
from bench.mode_cost import segments  # noqa: E402
from sglang_vlora.atmm import ops  # noqa: E402
from sglang_vlora.atmm.static_items import StaticWorkItems  # noqa: E402
from sglang_vlora.atmm.tiling import FusedConfig  # noqa: E402
from sglang_vlora.modes.delora import MAX_MODE_LAYERS, max_mode_items, mode_work_items  # noqa: E402

ADAPTERS = 4
MERGED = 0
SHAPES_7B = {"layers": 28, "hidden": 3584, "qkv": (3584, 512, 512), "o": (3584,)}
SHAPES_SMOKE = {"layers": 2, "hidden": 64, "qkv": (64, 16, 16), "o": (64,)}


def tile_candidates(bs: int, smoke: bool) -> list[FusedConfig]:
    """Stage 1 of the search: fused tiles worth timing for ``bs`` rows (row tiles up to
    the batch, output tiles 64-256 wide, K steps 64-256), 4 warps, 3 stages."""
    if smoke:
        return [FusedConfig(16, 16, 16, 4, 2)]
    block_ms = [m for m in (16, 32, 64) if m == 16 or m <= bs]
    return [FusedConfig(bm, bn, bk, 4, 3) for bm, bn, bk in itertools.product(block_ms, (64, 128, 256), (64, 128, 256))]


def launch_candidates(best: list[FusedConfig], smoke: bool) -> list[FusedConfig]:
    """Stage 2: the two best tiles with 4 or 8 warps and 2-4 stages (within shared memory)."""
    if smoke:
        return []
    out = []
    for cfg, warps, stages in itertools.product(best[:2], (4, 8), (2, 3, 4)):
        if stages * (cfg.block_m + 128) * cfg.block_k * 2 <= 200 * 1024 and (warps, stages) != (4, 3):
            out.append(FusedConfig(cfg.block_m, cfg.block_n, cfg.block_k, warps, stages))
    return out


class Layer:
    """One decoder layer's two projections: base weights and the adapters' pool buffers."""

    def __init__(self, hidden: int, slices: dict[str, tuple[int, ...]], rank: int, dtype, device, gen) -> None:
        self.proj = {}
        for name, widths in slices.items():
            out = sum(widths)
            offsets = [0, *itertools.accumulate(widths)]

            def rand(*shape: int, s: float) -> torch.Tensor:
                return (torch.randn(*shape, generator=gen) * s).to(device, dtype)

            self.proj[name] = (
                rand(out, hidden, s=hidden**-0.5),
                rand(ADAPTERS, len(widths) * rank, hidden, s=hidden**-0.5),
                rand(ADAPTERS, out, rank, s=rank**-0.5),
                offsets,
            )


def step(layers: list[Layer], x: torch.Tensor, x_o: torch.Tensor, static, variant, side_stream) -> list[torch.Tensor]:
    """One decode step's projections; ``variant``: None (no LoRA), "split", "split_seq" or a
    FusedConfig."""
    outs = []
    for layer in layers:
        for name, inp in (("qkv", x), ("o", x_o)):
            w, a, b, offsets = layer.proj[name]

            def base(inp=inp, w=w) -> torch.Tensor:
                return inp @ w.T

            if variant is None:
                outs.append(base())
            elif variant in ("split", "split_seq"):
                stream = side_stream if variant == "split" else None
                outs.append(ops.lora_apply_static_with_base(inp, a, b, static, offsets, base, stream))
            else:
                outs.append(ops.lora_apply_fused_static(inp, a, b, static, offsets, base(), variant))
    return outs


def graph_ms(fn, device: torch.device, replays: int, trials: int) -> tuple[list[float], list[torch.Tensor]]:
    """Per trial the median ms of ``replays`` replays of ``fn`` captured in a CUDA graph (on
    CPU: of ``fn`` called); and the outputs of the last replay."""
    if device.type != "cuda":
        out = fn()
        return [0.0] * trials, out
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        fn()  # compile and warm outside the capture
    torch.cuda.current_stream().wait_stream(stream)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    medians = []
    for _ in range(trials):
        samples = []
        for _ in range(replays):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end))
        medians.append(sorted(samples)[len(samples) // 2])
    return medians, out


def rel_err(got: list[torch.Tensor], ref: list[torch.Tensor], base: list[torch.Tensor]) -> float:
    """Relative error of the LoRA deltas (output minus the no-LoRA output)."""
    num = den = 0.0
    for g, r, z in zip(got, ref, base, strict=True):
        num += float(((g.float() - z.float()) - (r.float() - z.float())).norm() ** 2)
        den += float((r.float() - z.float()).norm() ** 2)
    return (num / max(den, 1e-30)) ** 0.5


def measure(layers, shapes, bs: int, share: float, mode: str, configs: list[FusedConfig], device, dtype,
            replays: int, trials: int, gen, side_stream) -> dict:
    rank = layers[0].proj["o"][1].shape[1]
    starts, lens, slots = segments(1, bs, share)
    merged = MERGED if mode == "mixture" else None
    items = mode_work_items(starts, lens, slots, [rank] * ADAPTERS, [2.0] * ADAPTERS, merged, device="cpu")
    static = StaticWorkItems.allocate(capacity=max_mode_items(min(bs, ADAPTERS)), max_tokens=bs,
                                      num_slots=ADAPTERS, device=device, max_layers=MAX_MODE_LAYERS, paired=True)
    static.fill(items, bs)
    x = (torch.randn(bs, shapes["hidden"], generator=gen) * 0.5).to(device, dtype)
    x_o = (torch.randn(bs, shapes["hidden"], generator=gen) * 0.5).to(device, dtype)
    row = {"bs": bs, "share": share, "mode": mode, "items": items.num_items}

    def run(variant):
        return graph_ms(lambda: step(layers, x, x_o, static, variant, side_stream), device, replays, trials)

    base_ms, base_out = run(None)
    row["base_ms"] = base_ms
    split_ms, split_out = run("split")
    seq_ms, _ = run("split_seq")
    row["split_adds_ms"] = [s - b for s, b in zip(split_ms, base_ms, strict=True)]
    row["split_seq_adds_ms"] = [s - b for s, b in zip(seq_ms, base_ms, strict=True)]
    fused = []
    for cfg in configs:
        ms, out = run(cfg)
        fused.append({"config": vars(cfg), "adds_ms": [m - b for m, b in zip(ms, base_ms, strict=True)],
                      "rel_err": rel_err(out, split_out, base_out)})
    fused.sort(key=lambda f: _median(f["adds_ms"]))
    row["fused"] = fused
    return row


def _median(values: list[float]) -> float:
    return sorted(values)[len(values) // 2]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true", help="tiny shapes (CPU: Triton interpreter)")
    ap.add_argument("--batch-sizes", nargs="+", type=int, default=[1, 4, 8, 16, 32, 64])
    ap.add_argument("--share", type=float, default=0.7, help="share of the requests on the merged adapter")
    ap.add_argument("--modes", nargs="+", choices=("unmerged", "mixture"), default=["unmerged", "mixture"])
    ap.add_argument("--configs", type=int, default=3,
                    help="the later modes of a batch size time the N best fused configs of the first mode's search")
    ap.add_argument("--replays", type=int, default=20)
    ap.add_argument("--trials", type=int, default=3)
    ap.add_argument("--rank", type=int, default=64)
    ap.add_argument("--out", type=Path, default=None, help="default bench/results (a temp dir with --smoke)")
    ap.add_argument("--tag", default=None)
    args = ap.parse_args()
    if not (args.smoke or torch.cuda.is_available()):
        print("bench/decode_step.py: no CUDA device, nothing measured (run it on a GPU; --smoke checks the code)")
        return
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    shapes, rank = (SHAPES_SMOKE, 8) if args.smoke else (SHAPES_7B, args.rank)
    batch_sizes = [min(b, 4) for b in args.batch_sizes[:2]] if args.smoke else args.batch_sizes
    gen = torch.Generator().manual_seed(0)
    slices = {"qkv": shapes["qkv"], "o": shapes["o"]}
    layers = [Layer(shapes["hidden"], slices, rank, dtype, device, gen) for _ in range(shapes["layers"])]
    side_stream = torch.cuda.Stream() if device.type == "cuda" else None
    rows = []
    print(f"{'bs':>4} {'mode':>8} {'base ms':>8} {'split +':>8} {'seq +':>8} {'fused +':>8}  best fused config")
    for bs in batch_sizes:
        best: list[FusedConfig] = []
        for mode in args.modes:
            if best:
                configs = best[: args.configs]
            else:
                first = measure(layers, shapes, bs, args.share, mode, tile_candidates(bs, args.smoke), device, dtype,
                                args.replays, args.trials, gen, side_stream)
                tiles = [FusedConfig(**f["config"]) for f in first["fused"]]
                configs = tiles[:2] + launch_candidates(tiles, args.smoke)
            row = measure(layers, shapes, bs, args.share, mode, configs, device, dtype, args.replays, args.trials,
                          gen, side_stream)
            if not best:
                row["stage1"] = first["fused"]
                best = [FusedConfig(**f["config"]) for f in row["fused"]]
            rows.append(row)
            top = row["fused"][0]
            print(f"{bs:4d} {mode:>8} {_median(row['base_ms']):8.3f} {_median(row['split_adds_ms']):8.3f} "
                  f"{_median(row['split_seq_adds_ms']):8.3f} {_median(top['adds_ms']):8.3f}  {top['config']} "
                  f"err {top['rel_err']:.1e}", flush=True)
    env = provenance.environment(provenance.gpu_info())
    doc = {
        "what": "ms a decode step's 28 layers of q/k/v and o projections add over the same CUDA graph without "
                "LoRA: split (shrink beside the base GEMM, then expand), split_seq (in sequence), fused (one "
                "launch a module) per tile config; lists hold one median per trial",
        "device": torch.cuda.get_device_name(0) if device.type == "cuda" else platform.processor() or "cpu",
        "dtype": str(dtype).removeprefix("torch."), "rank": rank, "adapters": ADAPTERS, "shapes": shapes,
        "command": " ".join(["python", "bench/decode_step.py", *sys.argv[1:]]),
        "provenance": provenance.record(env),
        "rows": rows,
    }
    out = args.out or (Path(tempfile.mkdtemp(prefix="decode-step-")) if args.smoke else REPO / "bench" / "results")
    tag = args.tag or ("decode_step_smoke" if args.smoke else "decode_step")
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{tag}.json").write_text(json.dumps(doc, indent=1) + "\n")
    plot(rows, doc["device"], out / f"{tag}.png")
    print(f"wrote {out / (tag + '.json')}")


def plot(rows: list[dict], device: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    modes = sorted({r["mode"] for r in rows}, reverse=True)
    fig, axes = plt.subplots(1, len(modes), figsize=(4.2 * len(modes), 3.4), squeeze=False)
    for ax, mode in zip(axes[0], modes, strict=True):
        own = [r for r in rows if r["mode"] == mode]
        bss = [r["bs"] for r in own]
        for key, label, marker in (("split_adds_ms", "two launches, shrink beside the GEMM", "o"),
                                   ("split_seq_adds_ms", "two launches in sequence", "s")):
            meds = [_median(r[key]) for r in own]
            ax.errorbar(bss, meds, yerr=[[m - min(r[key]) for m, r in zip(meds, own, strict=True)],
                                         [max(r[key]) - m for m, r in zip(meds, own, strict=True)]],
                        marker=marker, label=label, capsize=2)
        meds = [_median(r["fused"][0]["adds_ms"]) for r in own]
        ax.errorbar(bss, meds, yerr=[[m - min(r["fused"][0]["adds_ms"]) for m, r in zip(meds, own, strict=True)],
                                     [max(r["fused"][0]["adds_ms"]) - m for m, r in zip(meds, own, strict=True)]],
                    marker="^", label="fused, best config", capsize=2)
        ax.set_xscale("log", base=2)
        ax.set_xticks(bss, [str(b) for b in bss])
        ax.set_title(f"{mode} batches", fontsize=9)
        ax.set_xlabel("requests in the decode batch", fontsize=8)
        ax.set_ylabel("ms a step adds over no LoRA (28 layers)", fontsize=8)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(f"Decode-step LoRA cost inside a CUDA graph, {device}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
