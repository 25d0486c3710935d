"""What each inference mode costs per decoder layer, with ATMM at Qwen2-VL-7B's attention shapes.

    python bench/mode_cost.py                          # GPU: prefill and decode batches, 4 rank-64 adapters
    python bench/mode_cost.py --smoke                  # CPU (Triton interpreter), tiny shapes: the code path

A batch of ``requests`` requests of ``tokens`` tokens each (one prefill chunk, or one decode
token each); a share of them uses adapter ``k``, the rest three others round robin, grouped
by adapter as the server groups them. Per layer the benchmark runs the q/k/v and o
projections, base GEMM plus LoRA, in each mode (paper §4.4.2):

* ``unmerge``: weights ``W0``; every request's own adapter (one ``+x`` item per adapter);
* ``mixture``: weights ``W0 + dW_k``; ``k``'s requests need nothing, the others ``+x`` and
  the deLoRA term ``-k`` over their tokens;
* ``merge``: weights ``W0 + dW_k`` and a batch of ``k``'s requests only: no LoRA at all.

Reported per batch: the time each mode adds over the base GEMMs (the ``base`` row), and
whether the outputs agree with the unmerged ones (relative error; mixture and merge read
merged weights, so they agree up to the rounding of ``W0 + dW_k``). What the orchestrator
needs from this: merging pays when ``k`` holds the batch (merge adds nothing); mixture is
worth it only where it adds no more than unmerge. Writes ``<out>/<tag>.json`` and ``.png``.
"""

from __future__ import annotations

import argparse
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench import provenance  # noqa: E402
from sglang_vlora.atmm.ops import lora_apply  # noqa: E402
from sglang_vlora.modes.delora import mode_work_items  # noqa: E402

ADAPTERS = 4  # pool slots 0..3; k is slot 0
MERGED = 0
# (hidden, output slices) of Qwen2-VL-7B's fused q/k/v and o projections
SHAPES_7B = {"qkv": (3584, (3584, 512, 512)), "o": (3584, (3584,))}
SHAPES_SMOKE = {"qkv": (64, (64, 16, 16)), "o": (64, (64,))}


def segments(tokens: int, requests: int, share: float) -> tuple[list[int], list[int], list[int]]:
    """Token segments grouped by adapter: ``round(share * requests)`` requests of ``k``
    first, the others round robin over slots 1..3 (one segment per slot)."""
    own = round(share * requests)
    counts = [own] + [0] * (ADAPTERS - 1)
    for i in range(requests - own):
        counts[1 + i % (ADAPTERS - 1)] += 1
    starts, lens, slots, at = [], [], [], 0
    for slot, n in enumerate(counts):
        if n:
            starts.append(at)
            lens.append(n * tokens)
            slots.append(slot)
            at += n * tokens
    return starts, lens, slots


class Projection:
    """One projection's base weight, its merged-``k`` copy and the adapters' pool buffers."""

    def __init__(self, hidden: int, slices: tuple[int, ...], rank: int, dtype: torch.dtype,
                 device: torch.device, gen: torch.Generator) -> None:
        out = sum(slices)
        self.offsets = [0]
        for n in slices:
            self.offsets.append(self.offsets[-1] + n)
        def rand(*shape: int, s: float) -> torch.Tensor:
            return (torch.randn(*shape, generator=gen) * s).to(device, dtype)

        self.w0 = rand(out, hidden, s=hidden**-0.5)
        self.a = rand(ADAPTERS, len(slices) * rank, hidden, s=hidden**-0.5)
        self.b = rand(ADAPTERS, out, rank, s=rank**-0.5)
        self.scale = 2.0
        delta = torch.zeros(out, hidden, dtype=torch.float32, device=device)
        for s in range(len(slices)):
            lo, hi = self.offsets[s], self.offsets[s + 1]
            a = self.a[MERGED, s * rank:(s + 1) * rank].float()
            delta[lo:hi] = self.scale * self.b[MERGED, lo:hi].float() @ a
        self.w_merged = (self.w0.float() + delta).to(dtype)
        self.rank = rank

    def forward(self, x: torch.Tensor, merged: bool, items) -> torch.Tensor:
        y = x @ (self.w_merged if merged else self.w0).T
        if items is not None and items.num_items:
            lora_apply(x, self.a, self.b, items, self.offsets, y)
        return y


def layer(projections: dict[str, Projection], x: torch.Tensor, merged: bool, items) -> list[torch.Tensor]:
    return [p.forward(x, merged, items) for p in projections.values()]


def time_ms(fn, device: torch.device, iters: int) -> float:
    """Median milliseconds of ``fn`` (CUDA events on a GPU, the wall clock elsewhere)."""
    for _ in range(3):
        fn()
    samples = []
    for _ in range(iters):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            samples.append(start.elapsed_time(end))
        else:
            t = time.perf_counter()
            fn()
            samples.append(1e3 * (time.perf_counter() - t))
    return sorted(samples)[len(samples) // 2]


def rel_err(got: list[torch.Tensor], ref: list[torch.Tensor]) -> float:
    num = sum(float((g.float() - r.float()).norm() ** 2) for g, r in zip(got, ref, strict=True))
    den = sum(float(r.float().norm() ** 2) for r in ref)
    return (num / max(den, 1e-30)) ** 0.5


def measure(projections: dict[str, Projection], tokens: int, requests: int, share: float,
            device: torch.device, dtype: torch.dtype, iters: int, gen: torch.Generator) -> dict:
    rank = next(iter(projections.values())).rank
    ranks, scalings = [rank] * ADAPTERS, [2.0] * ADAPTERS
    starts, lens, slots = segments(tokens, requests, share)
    hidden = next(iter(projections.values())).w0.shape[1]
    x = (torch.randn(tokens * requests, hidden, generator=gen) * 0.5).to(device, dtype)
    unmerged = mode_work_items(starts, lens, slots, ranks, scalings, None, device=device)
    mixture = mode_work_items(starts, lens, slots, ranks, scalings, MERGED, device=device)
    runs = {"base": (False, None), "unmerge": (False, unmerged), "mixture": (True, mixture)}
    if share == 1.0:
        runs["merge"] = (True, mixture)  # an all-k batch: mixture's items are empty, it is merge
    reference = layer(projections, x, False, unmerged)
    row = {"tokens": tokens, "requests": requests, "share": share, "items": {"unmerge": unmerged.num_items,
                                                                          "mixture": mixture.num_items}}
    for mode, (merged, items) in runs.items():
        row[f"{mode}_ms"] = time_ms(lambda m=merged, i=items: layer(projections, x, m, i), device, iters)
        if mode != "base":
            row[f"{mode}_rel_err"] = rel_err(layer(projections, x, merged, items), reference)
    for mode in ("unmerge", "mixture", "merge"):
        if f"{mode}_ms" in row:
            row[f"{mode}_adds_ms"] = row[f"{mode}_ms"] - row["base_ms"]
    return row


def parse_batch(text: str) -> tuple[int, int]:
    """``TOKENSxREQUESTS``, both >= 1."""
    try:
        tokens, requests = (int(v) for v in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected TOKENSxREQUESTS such as 1024x1, got {text!r}") from None
    if tokens < 1 or requests < 1:
        raise argparse.ArgumentTypeError(f"tokens and requests must be >= 1, got {text!r}")
    return tokens, requests


def parse_share(text: str) -> float:
    value = float(text)
    if not 0.0 <= value <= 1.0:
        raise argparse.ArgumentTypeError(f"a share is between 0 and 1, got {value}")
    return value


def parse_positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be >= 1, got {value}")
    return value


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--smoke", action="store_true", help="tiny shapes, few iterations (CPU: Triton interpreter)")
    ap.add_argument("--rank", type=parse_positive, default=64)
    ap.add_argument("--batches", nargs="+", type=parse_batch, default=[(1024, 1), (256, 4), (1, 8), (1, 32)],
                    help="TOKENSxREQUESTS: prefill chunks (tokens > 1) or decode steps (1 token each)")
    ap.add_argument("--shares", nargs="+", type=parse_share, default=[1.0, 0.75, 0.5, 0.25])
    ap.add_argument("--iters", type=parse_positive, default=50)
    ap.add_argument("--out", type=Path, default=None, help="default bench/results (a temp dir with --smoke)")
    ap.add_argument("--tag", default=None)
    args = ap.parse_args()
    if not (args.smoke or torch.cuda.is_available()):
        print("bench/mode_cost.py: no CUDA device, nothing measured (run it on a GPU; --smoke checks the code on CPU)")
        return
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    shapes, rank, iters = (SHAPES_SMOKE, min(args.rank, 8), 2) if args.smoke else (SHAPES_7B, args.rank, args.iters)
    batches = [(min(t, 16), min(r, 4)) for t, r in args.batches] if args.smoke else args.batches
    gen = torch.Generator().manual_seed(0)
    projections = {name: Projection(h, s, rank, dtype, device, gen) for name, (h, s) in shapes.items()}
    rows = []
    print(f"{'tokens':>6} {'reqs':>4} {'share':>5} {'base ms':>8} {'unmerge +':>9} {'mixture +':>9} {'merge +':>8}"
          f" {'mix err':>8}")
    for tokens, requests in batches:
        for share in args.shares:
            row = measure(projections, tokens, requests, share, device, dtype, iters, gen)
            rows.append(row)
            merge = f"{row['merge_adds_ms']:8.3f}" if "merge_adds_ms" in row else f"{'-':>8}"
            print(f"{tokens:6d} {requests:4d} {share:5.2f} {row['base_ms']:8.3f} {row['unmerge_adds_ms']:9.3f} "
                  f"{row['mixture_adds_ms']:9.3f} {merge} {row['mixture_rel_err']:8.1e}")
    what = ("per decoder layer: q/k/v and o projections (base GEMM + ATMM LoRA) per inference mode; "
            "*_adds_ms = the mode's time minus the base GEMMs' (base_ms)")
    setup = {"dtype": str(dtype).removeprefix("torch."), "rank": rank, "adapters": ADAPTERS,
             "shapes": {k: [h, list(s)] for k, (h, s) in shapes.items()}}
    save_results("mode_cost", what, setup, rows, args, device, plot)


def save_results(script: str, what: str, setup: dict, rows: list[dict], args: argparse.Namespace,
                 device: torch.device, plot_fn) -> None:
    """Write ``<out>/<tag>.json`` (device, ``setup``, command, provenance, rows) and its plot
    ``plot_fn(rows, device name, path)``; ``--out`` defaults to bench/results (a temp dir with
    ``--smoke``), ``--tag`` to the script's name."""
    env = provenance.environment(provenance.gpu_info())
    doc = {
        "what": what,
        "device": torch.cuda.get_device_name(0) if device.type == "cuda" else platform.processor() or "cpu",
        **setup,
        "command": " ".join(["python", f"bench/{script}.py", *sys.argv[1:]]),
        "provenance": provenance.record(env),
        "rows": rows,
    }
    out = args.out or (Path(tempfile.mkdtemp(prefix=f"{script}-")) if args.smoke else REPO / "bench" / "results")
    tag = args.tag or (f"{script}_smoke" if args.smoke else script)
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{tag}.json").write_text(json.dumps(doc, indent=1) + "\n")
    plot_fn(rows, doc["device"], out / f"{tag}.png")
    print(f"wrote {out / (tag + '.json')}")


def plot(rows: list[dict], device: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    batches = sorted({(r["tokens"], r["requests"]) for r in rows}, key=lambda b: (-b[0], b[1]))
    fig, axes = plt.subplots(1, len(batches), figsize=(3.6 * len(batches), 3.4), squeeze=False)
    for ax, (tokens, requests) in zip(axes[0], batches, strict=True):
        own = sorted((r for r in rows if (r["tokens"], r["requests"]) == (tokens, requests)), key=lambda r: r["share"])
        shares = [r["share"] for r in own]
        for mode, marker in (("unmerge", "o"), ("mixture", "s"), ("merge", "^")):
            pts = [(r["share"], r[f"{mode}_adds_ms"]) for r in own if f"{mode}_adds_ms" in r]
            if pts:
                ax.plot(*zip(*pts, strict=True), marker=marker, label=mode)
        ax.set_xticks(shares)
        ax.set_title(f"{tokens} tokens x {requests}", fontsize=9)
        ax.set_xlabel("share of the batch on the merged adapter", fontsize=8)
        ax.set_ylabel("ms over the base GEMMs, per layer", fontsize=8)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(f"Inference modes per layer (q/k/v + o), {device}", fontsize=9)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
