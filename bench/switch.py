"""Mode-switch benchmark on one GPU: merge, fused switch and unmerge for 7B shapes.

    python bench/switch.py                       # qkvo and all, ranks 16 64 128
    python bench/switch.py --layouts qkvo --ranks 64 --host
    python bench/switch.py --smoke               # CPU, tiny shapes: checks the code path

Layouts (32 layers, bf16, fused projections as SGLang holds them): ``qkvo`` = a fused
``qkv`` stack [L, 3*4096, 4096] (kinds q, k, v as slice views) and ``o``
[L, 4096, 4096]; ``all`` adds ``gate_up`` [L, 2*11008, 4096] and ``down``
[L, 4096, 11008]. Two adapters per rank target every kind.

Methods, each timed over the cycle merge a -> switch a->b -> unmerge b:

* ``loop_addmm`` (baseline, dLoRA-like): one in-place ``addmm_`` per layer and kind;
  a switch is unmerge a + merge b.
* ``baddbmm`` (baseline): one in-place ``baddbmm_`` per kind over the stack; a
  switch is unmerge a + merge b.
* ``exact_fold`` (ours, default on CUDA): pristine copy on the device, merge and
  switch = one Triton pass ``W <- W0 + s B A``, unmerge = copy ``W <- W0``.
* ``exact_torch``: same scheme with torch ops (switch = ``copy_`` + ``baddbmm_``).
* ``inplace_fold`` / ``inplace_torch``: no pristine copy, fused switch ``W += [s_b B_b,
  -s_a B_a][A_b; A_a]`` in one pass (not exact: ``changed`` reports the drift).
* ``exact_host`` (``--host``): pristine copy in pinned host memory (PCIe-bound).
* ``copy_floor``: ``W.copy_(W0)`` over all targeted weights, the HBM floor of any
  switch (every weight read and written once).

Times are medians of CUDA-event intervals per operation. Each method starts from
the original weights; after its cycles the weights are compared bit for bit with a
device copy of the originals (``exact`` column, ``changed`` = fraction of elements
that differ), and the merged weights of layer 0 and L-1 against an fp32
computation (``err``, relative Frobenius). ``extra_gib`` is the peak device memory
a method allocated beyond the weights and adapters (the exact scheme's cost).
Writes ``<out>/<tag>.json`` and ``.png`` (if matplotlib is installed).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import provenance
from bench.plotting import pyplot
from sglang_vlora.modes.fold_kernel import FoldConfig, fold
from sglang_vlora.modes.switcher import LoRADelta, SwiftSwitcher, slice_kinds

HIDDEN, INTER = 4096, 11008
# fused projection -> (d_in, [(kind, rows)])
LAYOUTS = {
    "qkvo": {
        "qkv": (HIDDEN, [("q", HIDDEN), ("k", HIDDEN), ("v", HIDDEN)]),
        "o": (HIDDEN, [("o", HIDDEN)]),
    },
    "all": {
        "qkv": (HIDDEN, [("q", HIDDEN), ("k", HIDDEN), ("v", HIDDEN)]),
        "o": (HIDDEN, [("o", HIDDEN)]),
        "gate_up": (HIDDEN, [("gate", INTER), ("up", INTER)]),
        "down": (INTER, [("down", HIDDEN)]),
    },
}
METHODS = ["loop_addmm", "baddbmm", "exact_fold", "exact_torch", "inplace_fold", "inplace_torch"]
FOLD_CONFIGS = [
    FoldConfig(64, 128, 4),
    FoldConfig(128, 128, 8),
    FoldConfig(64, 256, 8),
    FoldConfig(128, 64, 4),
]
OPS = ["merge", "switch", "unmerge"]


class Timer:
    """Per-operation wall time: CUDA events on a GPU, perf_counter on the CPU."""

    def __init__(self, device: torch.device, warmup: int):
        self.cuda = device.type == "cuda"
        self.warmup = warmup

    def run(self, ops: list[Callable[[], None]], iters: int) -> list[float]:
        """Median ms of each op over ``iters`` cycles of ``ops`` run in order, after
        ``warmup`` untimed cycles."""
        for _ in range(self.warmup):
            for op in ops:
                op()
        samples: list[list[float]] = [[] for _ in ops]
        for _ in range(iters):
            if self.cuda:
                events = [torch.cuda.Event(enable_timing=True) for _ in range(len(ops) + 1)]
                events[0].record()
                for i, op in enumerate(ops):
                    op()
                    events[i + 1].record()
                torch.cuda.synchronize()
                for i in range(len(ops)):
                    samples[i].append(events[i].elapsed_time(events[i + 1]))
            else:
                for i, op in enumerate(ops):
                    t0 = time.perf_counter()
                    op()
                    samples[i].append((time.perf_counter() - t0) * 1e3)
        return [statistics.median(s) for s in samples]


class Bench:
    """The weights of one layout, two adapters per rank, and each method's cycle."""

    def __init__(self, layout: str, layers: int, div: int, device: torch.device, dtype: torch.dtype):
        self.layout, self.layers, self.device, self.dtype = layout, layers, device, dtype
        self.stacks: dict[str, torch.Tensor] = {}
        self.kinds: dict[str, torch.Tensor] = {}
        self.shapes: dict[str, tuple[int, int]] = {}
        self.rows_of: dict[str, tuple[str, int, int]] = {}  # kind -> (projection, lo, hi)
        gen = torch.Generator(device=device).manual_seed(0)
        for proj, (d_in, slices) in LAYOUTS[layout].items():
            d_in //= div
            rows = [(kind, n // div) for kind, n in slices]
            offsets = [0]
            for _, n in rows:
                offsets.append(offsets[-1] + n)
            stack = torch.empty((layers, offsets[-1], d_in), dtype=dtype, device=device)
            for layer in range(layers):  # layer by layer: no fp32 temporary of the whole stack
                stack[layer] = torch.randn(stack.shape[1:], generator=gen, device=device) * 0.02
            self.stacks[proj] = stack
            self.kinds.update(slice_kinds(stack, [k for k, _ in rows], offsets))
            self.shapes.update({k: (n, d_in) for k, n in rows})
            self.rows_of.update({k: (proj, offsets[i], offsets[i + 1]) for i, (k, _) in enumerate(rows)})
        self.original = {p: s.clone() for p, s in self.stacks.items()}  # the reference bits
        self.weight_bytes = sum(s.numel() * s.element_size() for s in self.stacks.values())

    def adapters(self, rank: int) -> dict[str, dict[str, LoRADelta]]:
        gen = torch.Generator(device=self.device).manual_seed(rank)
        out = {}
        for name in ("a", "b"):
            deltas = {}
            for kind, (rows, d_in) in self.shapes.items():
                # delta entries ~ 10% of the weights' (std 0.02), as for a trained adapter
                a = torch.randn((self.layers, rank, d_in), generator=gen, device=self.device) / d_in**0.5
                b = torch.randn((self.layers, rows, rank), generator=gen, device=self.device)
                b *= 0.001 * (d_in / rank) ** 0.5
                deltas[kind] = LoRADelta(a=a.to(self.dtype), b=b.to(self.dtype), scaling=2.0)
            out[name] = deltas
        return out

    def reset(self) -> None:
        for proj, stack in self.stacks.items():
            stack.copy_(self.original[proj])

    def compare_to_original(self) -> tuple[bool, float]:
        """(bit-identical, fraction of elements that differ)."""
        changed = total = 0
        for proj, stack in self.stacks.items():
            for layer in range(self.layers):
                changed += int(
                    (stack[layer].view(torch.int16) != self.original[proj][layer].view(torch.int16)).sum()
                )
                total += stack[layer].numel()
        return changed == 0, changed / total

    def merged_error(self, delta: dict[str, LoRADelta]) -> float:
        """Worst relative error of the merged weights of the first and last layer."""
        worst = 0.0
        for kind, view in self.kinds.items():
            proj, lo, hi = self.rows_of[kind]
            d = delta[kind]
            for layer in {0, self.layers - 1}:
                w0 = self.original[proj][layer, lo:hi].float()
                ref = w0 + d.scaling * d.b[layer].float() @ d.a[layer].float()
                err = (view[layer].float() - ref).norm() / ref.norm()
                worst = max(worst, err.item())
        return worst

    # ---- baselines: in place, switch = unmerge a + merge b --------------------------
    def baseline_ops(
        self, method: str, adapters: dict[str, dict[str, LoRADelta]]
    ) -> list[Callable[[], None]]:
        def add(name: str, sign: float) -> Callable[[], None]:
            def op() -> None:
                for kind, view in self.kinds.items():
                    d = adapters[name][kind]
                    if method == "baddbmm":
                        view.baddbmm_(d.b, d.a, alpha=sign * d.scaling)
                    else:
                        for layer in range(self.layers):
                            view[layer].addmm_(d.b[layer], d.a[layer], alpha=sign * d.scaling)

            return op

        merge_a, unmerge_a, merge_b, unmerge_b = add("a", 1.0), add("a", -1.0), add("b", 1.0), add("b", -1.0)

        def switch() -> None:
            unmerge_a()
            merge_b()

        return [merge_a, switch, unmerge_b]

    def switcher(self, method: str, adapters: dict[str, dict[str, LoRADelta]]) -> SwiftSwitcher:
        exact = method.startswith("exact")
        sw = SwiftSwitcher(
            self.kinds,
            exact=exact,
            pristine_device="cpu" if method == "exact_host" else None,
            kernel="triton" if method.endswith("fold") else "torch",
        )
        for name, deltas in adapters.items():
            sw.add_adapter(name, deltas)
        return sw


def run_method(bench: Bench, method: str, rank: int, adapters, timer: Timer, iters: int) -> dict:
    bench.reset()
    sync(bench.device)
    base_mem = memory(bench.device, reset=True)
    sw = None if method in ("loop_addmm", "baddbmm") else bench.switcher(method, adapters)
    if sw is None:
        ops = bench.baseline_ops(method, adapters)
    else:
        ops = [lambda: sw.merge("a"), lambda: sw.merge("b"), sw.unmerge]
    ops[0]()
    err = bench.merged_error(adapters["a"])
    ops[1]()
    ops[2]()
    ms = timer.run(ops, iters)
    exact, changed = bench.compare_to_original()
    row = {
        "layout": bench.layout,
        "rank": rank,
        "method": method,
        **{f"{op}_ms": round(t, 4) for op, t in zip(OPS, ms, strict=True)},
        "err": round(err, 6),
        "exact": exact,
        "changed": round(changed, 5),
        "pristine_gib": round((sw.pristine_bytes if sw else 0) / 2**30, 3),
        "extra_gib": round((memory(bench.device) - base_mem) / 2**30, 3),
        "paths": sorted(set(sw.paths.values())) if sw else [method],
    }
    return row


def copy_floor(bench: Bench, timer: Timer, iters: int) -> float:
    """Median ms to read and write every targeted weight once (``copy_``)."""
    src = {p: s.clone() for p, s in bench.stacks.items()}

    def op() -> None:
        for p, s in bench.stacks.items():
            s.copy_(src[p])

    (ms,) = timer.run([op], iters)
    return ms


def sweep_fold(
    bench: Bench, adapters, timer: Timer, iters: int, configs: list[FoldConfig]
) -> dict[str, float]:
    """ms of one fold over every kind, per tile config (tiles are data, chosen here)."""
    pristine = {k: v.clone() for k, v in bench.kinds.items()}
    out = {}
    for cfg in configs:

        def op(cfg: FoldConfig = cfg) -> None:
            for kind, view in bench.kinds.items():
                d = adapters["a"][kind]
                fold(view, pristine[kind], d.b, d.a, d.scaling, cfg)

        (ms,) = timer.run([op], iters)
        out[f"{cfg.block_m}x{cfg.block_n}w{cfg.num_warps}"] = round(ms, 4)
    return out


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def memory(device: torch.device, reset: bool = False) -> int:
    """Device bytes allocated now (``reset``: also restart peak tracking), else the peak
    since the last reset; 0 on the CPU."""
    if device.type != "cuda":
        return 0
    if reset:
        torch.cuda.reset_peak_memory_stats()
        return torch.cuda.memory_allocated()
    return torch.cuda.max_memory_allocated()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layouts", nargs="+", default=list(LAYOUTS), choices=list(LAYOUTS))
    ap.add_argument("--ranks", nargs="+", type=int, default=[16, 64, 128])
    ap.add_argument("--methods", nargs="+", default=METHODS, choices=[*METHODS, "exact_host"])
    ap.add_argument("--host", action="store_true", help="also time exact_host (pristine copy in host memory)")
    ap.add_argument("--layers", type=int, default=32)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--no-sweep", action="store_true", help="skip the fold tile-config sweep")
    ap.add_argument(
        "--smoke",
        action="store_true",
        help="CPU, 2 layers, dims / 64, fp16, 1 iteration: exercise every code path",
    )
    ap.add_argument("--out", type=Path, default=None, help="default bench/results (a temp dir with --smoke)")
    ap.add_argument("--tag", default=None, help="file name stem; default switch (switch-smoke with --smoke)")
    args = ap.parse_args()
    methods = list(args.methods) + (["exact_host"] if args.host and "exact_host" not in args.methods else [])
    if args.smoke:
        # fp16: Triton's interpreter computes bf16 tl.dot wrongly (fp16 takes the same code path)
        device, dtype, div, layers, iters, configs = (
            torch.device("cpu"),
            torch.float16,
            64,
            2,
            1,
            FOLD_CONFIGS[:1],
        )
        torch.set_num_threads(1)  # tiny shapes: threads only add contention
        if os.environ.get("TRITON_INTERPRET") != "1":
            print("--smoke without TRITON_INTERPRET=1: skipping the Triton fold methods")
            methods = [m for m in methods if not m.endswith("fold")]
    elif not torch.cuda.is_available():
        print(
            "bench/switch.py: no CUDA device, nothing measured (run it on a GPU; --smoke checks the code on CPU)"
        )
        return
    else:
        device, dtype, div, layers, iters, configs = (
            torch.device("cuda"),
            torch.bfloat16,
            1,
            args.layers,
            args.iters,
            FOLD_CONFIGS,
        )
    timer = Timer(device, warmup=0 if args.smoke else 2)
    rows, floors, sweeps, weights_gib = [], {}, {}, {}
    for layout in args.layouts:
        bench = Bench(layout, layers, div, device, dtype)
        floors[layout] = round(copy_floor(bench, timer, iters), 4)
        weights_gib[layout] = round(bench.weight_bytes / 2**30, 3)
        print(
            f"{layout}: {bench.weight_bytes / 2**30:.2f} GiB of weights, copy floor {floors[layout]} ms",
            flush=True,
        )
        for rank in args.ranks:
            adapters = bench.adapters(rank)
            if not args.no_sweep and any(m.endswith("fold") for m in methods):
                sweeps[f"{layout}/r{rank}"] = sweep_fold(bench, adapters, timer, iters, configs)
            for method in methods:
                row = run_method(bench, method, rank, adapters, timer, iters)
                rows.append(row)
                print(json.dumps(row), flush=True)
            del adapters
        del bench
        if device.type == "cuda":
            torch.cuda.empty_cache()
    meta = {
        "device": torch.cuda.get_device_name(0) if device.type == "cuda" else platform.processor() or "cpu",
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "torch": torch.__version__,
        "triton": _version("triton"),
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "command": " ".join(["python", "bench/switch.py", *sys.argv[1:]]),
        "layers": layers,
        "dtype": str(dtype).removeprefix("torch."),
        "dim_divisor": div,
        "copy_floor_ms": floors,
        "weights_gib": weights_gib,
        "fold_sweep_ms": sweeps,
        "provenance": provenance.record(),
    }
    out = args.out or (
        Path(tempfile.mkdtemp(prefix="switch-smoke-")) if args.smoke else Path(__file__).parent / "results"
    )
    tag = args.tag or ("switch-smoke" if args.smoke else "switch")
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{tag}.json").write_text(json.dumps({**meta, "rows": rows}, indent=1) + "\n")
    plot(rows, meta, out / f"{tag}.png")
    print(json.dumps({k: v for k, v in meta.items() if k != "fold_sweep_ms"}))
    print_table(rows, floors)
    print(f"wrote {out / tag}.json")


def _version(module: str) -> str | None:
    try:
        return __import__(module).__version__
    except ImportError:
        return None


def print_table(rows: list[dict], floors: dict[str, float]) -> None:
    print(
        "| layout | rank | method | merge ms | switch ms | unmerge ms | exact | changed | pristine GiB | extra GiB | err |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(
            f"| {r['layout']} | {r['rank']} | {r['method']} | {r['merge_ms']:.3f} | {r['switch_ms']:.3f} | "
            f"{r['unmerge_ms']:.3f} | {'yes' if r['exact'] else 'no'} | {r['changed']:.4f} | "
            f"{r['pristine_gib']:.2f} | {r['extra_gib']:.2f} | {r['err']:.1e} |"
        )
    for layout, ms in floors.items():
        print(f"copy floor {layout}: {ms:.3f} ms")


def plot(rows: list[dict], meta: dict, path: Path) -> None:
    plt = pyplot()
    if plt is None:
        return
    cells = sorted({(r["layout"], r["rank"]) for r in rows}, key=lambda c: (list(LAYOUTS).index(c[0]), c[1]))
    methods = list(dict.fromkeys(r["method"] for r in rows))
    fig, axes = plt.subplots(1, len(OPS), figsize=(max(9, 1.2 * len(cells) * len(OPS)), 4), squeeze=False)
    width = 0.8 / len(methods)
    for ax, op in zip(axes[0], OPS, strict=True):
        for i, m in enumerate(methods):
            ys = [
                next((r[f"{op}_ms"] for r in rows if (r["layout"], r["rank"]) == c and r["method"] == m), 0)
                for c in cells
            ]
            ax.bar([j + i * width for j in range(len(cells))], ys, width, label=m)
        for j, (layout, _) in enumerate(cells):
            floor = meta["copy_floor_ms"][layout]
            ax.hlines(
                floor,
                j - 0.1,
                j + 0.9,
                colors="k",
                linestyles="dashed",
                label="copy floor" if j == 0 else None,
            )
        ax.set_xticks(
            [j + 0.4 - width / 2 for j in range(len(cells))], [f"{lay}\nr{rank}" for lay, rank in cells]
        )
        ax.set_yscale("log")
        ax.set_ylabel("ms")
        ax.set_title(op)
    axes[0][0].legend(fontsize=7)
    fig.suptitle(
        f"mode switch, {meta['layers']} layers: {meta['device']}, torch {meta['torch']}, {meta['date']}",
        fontsize=9,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
