"""LoRA cost of one forward's projections inside a CUDA graph, by where the shrink runs.

    python bench/graph_step.py                  # GPU: Qwen2-VL-7B's 28 layers of q/k/v and o
    python bench/graph_step.py --smoke          # CPU (torch path), tiny shapes: the code path

A LoRA server's graph runs, per layer, the q/k/v projection (base GEMM plus LoRA), then the o
projection. This benchmark captures exactly that for 28 layers (each with its own weights, as
in the model, so the caches see what the server's do) and times its replays against the same
graph without LoRA, for batches of ``TOKENSxREQUESTS`` (decode steps: 1 token a request;
prefill graphs: more) over 4 rank-64 adapters, a share of the requests on one adapter, grouped
by adapter as the server groups them, unmerged or in mixture (that adapter merged):

* ``side``: the shrink on a side stream beside the base GEMM, then the expand
  (``ops.lora_apply_static_with_base`` with a stream: what decode graphs run);
* ``sequence``: the same two launches in sequence (what large prefill graphs run);
* ``in_gemm``: every pool slot's A rows appended to the base weight as extra output columns,
  so the base GEMM computes every slot's shrink, then one expand into a new output
  (``ops.lora_apply_static_in_gemm``: what graph batches run with ``--vlora-shrink-in-gemm``).
  Its cost grows with the pool's slots (``--slots``, SGLang's ``--max-loras-per-batch``), used
  or not.

Every variant's output is checked against the torch path (``*_rel_err``).

The result per batch: milliseconds the LoRA adds over the no-LoRA graph, one median of
``--replays`` replays per trial (``--trials`` independent timings: the spread). Writes
``<out>/<tag>.json`` and ``.png``.
"""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench.mode_cost import (  # noqa: E402
    ADAPTERS,
    MERGED,
    parse_batch,
    parse_positive,
    parse_share,
    save_results,
    segments,
)
from sglang_vlora.atmm import ops, triton_kernels  # noqa: E402
from sglang_vlora.atmm.static_items import StaticWorkItems  # noqa: E402
from sglang_vlora.atmm.tune import graph_replay_us  # noqa: E402
from sglang_vlora.config import pdl_setting  # noqa: E402
from sglang_vlora.modes.delora import MAX_MODE_LAYERS, max_mode_items, mode_work_items  # noqa: E402

SHAPES_7B = {"layers": 28, "hidden": 3584, "qkv": (3584, 512, 512), "o": (3584,)}
SHAPES_SMOKE = {"layers": 2, "hidden": 64, "qkv": (64, 16, 16), "o": (64,)}
VARIANTS = ("side", "sequence", "in_gemm")


class Layer:
    """One decoder layer's two projections: base weights, the base weights with every slot's
    A rows appended (``in_gemm``), and the adapters' pool buffers."""

    def __init__(self, hidden: int, slices: dict[str, tuple[int, ...]], rank: int, slots: int, dtype, device,
                 gen) -> None:
        self.proj = {}
        for name, widths in slices.items():
            out = sum(widths)
            offsets = [0, *itertools.accumulate(widths)]

            def rand(*shape: int, s: float) -> torch.Tensor:
                return (torch.randn(*shape, generator=gen) * s).to(device, dtype)

            w, a = rand(out, hidden, s=hidden**-0.5), rand(slots, len(widths) * rank, hidden, s=hidden**-0.5)
            w_ext = torch.cat([w, a.reshape(-1, hidden)])
            self.proj[name] = (w, w_ext, a, rand(slots, out, rank, s=rank**-0.5), offsets)


def forward(layers: list[Layer], x: torch.Tensor, x_o: torch.Tensor, static, variant, side_stream,
            covering: StaticWorkItems) -> list[torch.Tensor]:
    """One forward's projections; ``variant``: None (no LoRA), one of :data:`VARIANTS`, or
    "reference" (the torch path, in sequence). ``covering``: the batch's items with copy items
    (the in-GEMM expand's)."""
    outs = []
    for layer in layers:
        for name, inp in (("qkv", x), ("o", x_o)):
            w, w_ext, a, b, offsets = layer.proj[name]

            def base(inp=inp, w=w) -> torch.Tensor:
                return inp @ w.T

            if variant is None:
                outs.append(base())
            elif variant == "in_gemm":
                outs.append(ops.lora_apply_static_in_gemm(inp, w_ext, None, w.shape[0], b, covering, offsets))
            else:
                stream = side_stream if variant == "side" else None
                impl = "torch" if variant == "reference" else "auto"
                outs.append(ops.lora_apply_static_with_base(inp, a, b, static, offsets, base, stream, impl))
    return outs


def graph_ms(fn, device: torch.device, replays: int, trials: int) -> list[float]:
    """Per trial (each its own capture) the median ms of ``replays`` replays of ``fn`` in a
    CUDA graph (``tune.graph_replay_us``); on CPU ``fn`` runs once and nothing is timed."""
    fn()  # compile and warm outside any capture
    if device.type != "cuda":
        return [0.0] * trials
    return [graph_replay_us(fn, replays) / 1000 for _ in range(trials)]


def measure(layers, shapes, tokens: int, requests: int, share: float, mode: str, device, dtype, replays: int,
            trials: int, gen, side_stream) -> dict:
    slots, rank = layers[0].proj["o"][2].shape[:2]
    starts, lens, seg_slots = segments(tokens, requests, share)
    merged = MERGED if mode == "mixture" else None
    ranks = [rank] * ADAPTERS + [0] * (slots - ADAPTERS)  # pool slots past the adapters: empty
    items = mode_work_items(starts, lens, seg_slots, ranks, [2.0] * slots, merged, device="cpu")
    m = tokens * requests
    static, covering = (
        StaticWorkItems.allocate(capacity=max_mode_items(min(requests, slots)), max_tokens=m, num_slots=slots,
                                 device=device, max_layers=MAX_MODE_LAYERS, paired=True, covers_tokens=covers)
        for covers in (False, True)
    )
    static.fill(items, m)
    covering.fill(items, m)
    x = (torch.randn(m, shapes["hidden"], generator=gen) * 0.5).to(device, dtype)
    x_o = (torch.randn(m, shapes["hidden"], generator=gen) * 0.5).to(device, dtype)
    row = {"tokens": tokens, "requests": requests, "share": share, "mode": mode, "slots": slots,
           "items": items.num_items}

    def run(variant) -> list[float]:
        return graph_ms(lambda: forward(layers, x, x_o, static, variant, side_stream, covering), device, replays,
                        trials)

    row["base_ms"] = run(None)
    for variant in VARIANTS:
        row[f"{variant}_adds_ms"] = [v - b for v, b in zip(run(variant), row["base_ms"], strict=True)]
    # What is timed computes the LoRA: the kernels' deltas against the torch path's.
    base = forward(layers, x, x_o, static, None, side_stream, covering)
    reference = forward(layers, x, x_o, static, "reference", side_stream, covering)
    for variant in VARIANTS:
        got = forward(layers, x, x_o, static, variant, side_stream, covering)
        row[f"{variant}_rel_err"] = rel_err(got, reference, base)
    return row


def rel_err(got: list[torch.Tensor], ref: list[torch.Tensor], base: list[torch.Tensor]) -> float:
    """Relative error of the LoRA deltas (outputs minus the no-LoRA outputs)."""
    num = den = 0.0
    for g, r, z in zip(got, ref, base, strict=True):
        num += float((g.float() - r.float()).norm() ** 2)
        den += float((r.float() - z.float()).norm() ** 2)
    return (num / max(den, 1e-30)) ** 0.5


def _median(values: list[float]) -> float:
    return sorted(values)[len(values) // 2]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true", help="tiny shapes (CPU: the torch path, nothing timed)")
    ap.add_argument("--batches", nargs="+", type=parse_batch,
                    default=[(1, 1), (1, 8), (1, 32), (1, 64), (64, 1), (128, 1), (256, 1), (512, 1), (1024, 1)],
                    help="TOKENSxREQUESTS: decode steps (1 token each) or prefill chunks")
    ap.add_argument("--share", type=parse_share, default=0.7, help="share of the requests on the merged adapter")
    ap.add_argument("--modes", nargs="+", choices=("unmerged", "mixture"), default=["unmerged", "mixture"])
    ap.add_argument("--replays", type=parse_positive, default=20)
    ap.add_argument("--trials", type=parse_positive, default=3)
    ap.add_argument("--rank", type=parse_positive, default=64)
    ap.add_argument("--slots", type=parse_positive, default=ADAPTERS,
                    help=f"LoRA pool slots (--max-loras-per-batch; at least the {ADAPTERS} adapters)")
    ap.add_argument("--pdl-max-rows", type=parse_positive, default=None,
                    help="launch in-GEMM expands of up to this many rows with PDL (default: the shipped "
                         "triton_kernels.PDL_MAX_ROWS; SGLANG_VLORA_PDL=0 turns PDL off)")
    ap.add_argument("--pdl-max-slices", type=parse_positive, default=None,
                    help="launch in-GEMM expands of up to this many slices with PDL (default: the shipped "
                         "triton_kernels.PDL_MAX_SLICES)")
    ap.add_argument("--out", type=Path, default=None, help="default bench/results (a temp dir with --smoke)")
    ap.add_argument("--tag", default=None)
    args = ap.parse_args()
    if args.pdl_max_rows is not None:
        triton_kernels.PDL_MAX_ROWS = args.pdl_max_rows
    if args.pdl_max_slices is not None:
        triton_kernels.PDL_MAX_SLICES = args.pdl_max_slices
    if not (args.smoke or torch.cuda.is_available()):
        print("bench/graph_step.py: no CUDA device, nothing measured (run it on a GPU; --smoke checks the code)")
        return
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    shapes, rank = (SHAPES_SMOKE, 8) if args.smoke else (SHAPES_7B, args.rank)
    batches = [(min(t, 4), min(r, 4)) for t, r in args.batches[:2]] if args.smoke else args.batches
    gen = torch.Generator().manual_seed(0)
    slices = {"qkv": shapes["qkv"], "o": shapes["o"]}
    if args.slots < ADAPTERS:
        ap.error(f"--slots must be at least the {ADAPTERS} adapters")
    layers = [Layer(shapes["hidden"], slices, rank, args.slots, dtype, device, gen) for _ in range(shapes["layers"])]
    side_stream = torch.cuda.Stream() if device.type == "cuda" else None
    rows = []
    print(f"{'tokens':>6} {'reqs':>4} {'mode':>8} {'base ms':>8} " + " ".join(f"{v + ' +':>10}" for v in VARIANTS))
    for tokens, requests in batches:
        for mode in args.modes:
            row = measure(layers, shapes, tokens, requests, args.share, mode, device, dtype, args.replays,
                          args.trials, gen, side_stream)
            rows.append(row)
            print(f"{tokens:6d} {requests:4d} {mode:>8} {_median(row['base_ms']):8.3f} "
                  + " ".join(f"{_median(row[v + '_adds_ms']):10.3f}" for v in VARIANTS)
                  + f"  err {max(row[v + '_rel_err'] for v in VARIANTS):.1e}", flush=True)
    what = ("ms one forward's 28 layers of q/k/v and o projections add over the same CUDA graph without LoRA: "
            "side (shrink beside the base GEMM on a side stream, then expand), sequence (both in sequence), "
            "in_gemm (one GEMM over the base weight with every pool slot's A rows appended, then the "
            "expand into a new output); lists hold one median per trial")
    setup = {"dtype": str(dtype).removeprefix("torch."), "rank": rank, "adapters": ADAPTERS, "slots": args.slots,
             "shapes": shapes, "pdl": pdl_setting(), "pdl_max_rows": triton_kernels.PDL_MAX_ROWS,
             "pdl_max_slices": triton_kernels.PDL_MAX_SLICES}
    save_results("graph_step", what, setup, rows, args, device, plot)


def plot(rows: list[dict], device: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    modes = sorted({r["mode"] for r in rows}, reverse=True)
    fig, axes = plt.subplots(1, len(modes), figsize=(4.6 * len(modes), 3.6), squeeze=False)
    labels = {"side": "shrink beside the GEMM (side stream)", "sequence": "shrink in sequence",
              "in_gemm": "shrink in the GEMM"}
    for ax, mode in zip(axes[0], modes, strict=True):
        own = [r for r in rows if r["mode"] == mode]
        ticks = list(range(len(own)))
        for variant, marker in zip(VARIANTS, "os^", strict=True):
            values = [r[f"{variant}_adds_ms"] for r in own]
            meds = [_median(v) for v in values]
            ax.errorbar(ticks, meds, yerr=[[m - min(v) for m, v in zip(meds, values, strict=True)],
                                           [max(v) - m for m, v in zip(meds, values, strict=True)]],
                        marker=marker, label=labels[variant], capsize=2)
        ax.set_xticks(ticks, [f"{r['tokens']}x{r['requests']}" for r in own], rotation=45, fontsize=7)
        ax.set_title(f"{mode} batches", fontsize=9)
        ax.set_xlabel("tokens x requests", fontsize=8)
        ax.set_ylabel("ms the LoRA adds (28 layers)", fontsize=8)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(f"LoRA cost of one forward inside a CUDA graph, {device}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
