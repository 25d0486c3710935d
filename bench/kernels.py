"""LoRA kernel benchmark on one GPU: base GEMM plus batched LoRA, per method and cell.

    python bench/kernels.py --check            # all shapes, ranks 8 16 64 128
    python bench/kernels.py --shapes proj --ranks 64 --quick

Methods: ``merged`` (the base GEMM alone: adapter folded into W), ``atmm`` (ours:
graph-safe ``lora_apply_static`` in decode, ``lora_apply`` in prefill),
``atmm_overlap`` (``lora_apply_static_with_base``: the shrink on a side stream next to
the base GEMM, then the expand), ``atmm_in_gemm`` (``lora_apply_static_in_gemm``: one GEMM
over the base weight with the cell's adapters' A rows appended as extra output rows, so it
gives the base output and every adapter's shrink, then one expand writing base + LoRA into a
new output: what graph batches run with ``--vlora-shrink-in-gemm``; here the appended rows
are the cell's adapters only, where a server appends all ``--max-loras-per-batch`` slots),
``atmm_gemm`` (``lora_apply_gemm``, prefill cells only: the shrink, then ATMM's own Triton GEMM
over the base weight adding each token's delta in its accumulator; eager items),
``atmm_cuda`` (the CUDA C++ implementation:
``lora_apply(..., impl="cuda")``, eager items, in decode and prefill; its tile configs
from the table's CUDA results, else the CUDA defaults; skipped with the reason if the
extension cannot be built), SGLang's
``triton`` and ``csgmv`` LoRA backend kernels (imported from the installed sglang;
skipped if it is missing), ``bmm`` (tokens padded per adapter, cuBLAS batched GEMM,
the dLoRA way). Each method's time includes the base GEMM; the table reports the
extra over ``merged`` in % of ``merged``.

Timing: each cell captures one CUDA graph that runs the method over enough
independent copies of every tensor (weights, adapters, inputs, outputs: one "layer"
each) to pass 5x the L2 size, so nothing is served from L2 that a model would not;
time = median replay / copies. ``--check`` compares every method's LoRA delta in
bf16 with an fp32 computation and reports the relative error.

One run times the methods of a cell one after another, the base GEMM first. In long prefill
cells the GPU's state moves between them (the base GEMM, timed after the cell's set-up has
left the GPU idle, read up to 12% faster in its first round than in later ones on the H200):
``--rounds N`` times every method N times in turns and reports each method's median, with
every round's time in ``rounds_us``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import statistics
import sys
from pathlib import Path

import torch

# SGLang's csgmv kernels cache compiled kernels by (K, slices, chunk) only, not by rank:
# fine in a server (one max rank), wrong here where ranks change between cells. This
# switches that cache off, back to Triton's own (keyed by every constexpr).
os.environ.setdefault("SGLANG_USE_CUSTOM_TRITON_KERNEL_CACHE", "0")

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench import provenance
from bench.mode_cost import parse_positive
from bench.plotting import pyplot
from sglang_vlora.atmm import ops
from sglang_vlora.atmm.static_items import StaticWorkItems
from sglang_vlora.atmm.tune import graph_replay_us
from sglang_vlora.atmm.work_items import build_work_items

SHAPES = {
    "proj": (4096, (4096,)),
    "qkv": (4096, (4096, 4096, 4096)),
    "gate_up": (4096, (11008, 11008)),
    # Qwen2-VL-7B's attention projections (28 q heads, 4 kv heads of 128).
    "q2_qkv": (3584, (3584, 512, 512)),
    "q2_o": (3584, (3584,)),
}
METHODS = ["merged", "atmm", "atmm_overlap", "atmm_in_gemm", "atmm_gemm", "atmm_cuda", "sglang_triton",
           "sglang_csgmv", "bmm"]
DECODE = [(n, 1) for n in (1, 8, 32, 128)]  # (requests, tokens per request)
PREFILL = [(4, 256), (4, 1024), (1, 8192)]
SCALE = 0.5


class Cell:
    """One benchmark cell's tensors, ``copies`` times, and each method's call."""

    def __init__(
        self,
        shape: str,
        mode: str,
        requests: int,
        per_req: int,
        adapters: int,
        rank: int,
    ):
        self.shape, self.mode, self.rank = shape, mode, rank
        self.requests, self.per_req = requests, per_req
        self.d_in, widths = SHAPES[shape]
        self.offsets = [0]
        for w in widths:
            self.offsets.append(self.offsets[-1] + w)
        self.s = len(widths)
        self.adapters = min(adapters, requests)
        self.tokens = requests * per_req
        # requests round-robin over adapters, tokens grouped by adapter
        reqs_of = [len(range(a, requests, self.adapters)) for a in range(self.adapters)]
        self.seg_lens = [n * per_req for n in reqs_of]
        self.seg_starts = [sum(self.seg_lens[:a]) for a in range(self.adapters)]
        self.slots = list(range(self.adapters))
        self.ranks = [rank] * self.adapters
        d_out = self.offsets[-1]
        dev = "cuda"
        per_copy = 2 * (
            d_out * self.d_in
            + 2 * self.adapters * rank * (self.d_in + d_out)
            + (self.tokens + 1) * (self.d_in + d_out)
        )
        l2 = getattr(torch.cuda.get_device_properties(0), "L2_cache_size", 50 << 20)
        self.copies = max(2, math.ceil(5 * l2 / per_copy))
        bf = torch.bfloat16
        self.sets = []
        for _ in range(self.copies):
            x = torch.randn(self.tokens + 1, self.d_in, device=dev, dtype=bf)
            x[-1].zero_()  # padding row for bmm's gather
            a = torch.randn(self.adapters, self.s * rank, self.d_in, device=dev)
            b = torch.randn(self.adapters, d_out, rank, device=dev)
            self.sets.append(
                {
                    "x": x,
                    "w": (torch.randn(d_out, self.d_in, device=dev) / self.d_in**0.5).to(bf),
                    "a": (a / self.d_in**0.5).to(bf),
                    "b": (b / rank**0.5).to(bf),
                    "out": torch.empty(self.tokens + 1, d_out, device=dev, dtype=bf),
                }
            )
        self.items = build_work_items(
            self.seg_starts,
            self.seg_lens,
            self.slots,
            [SCALE] * self.adapters,
            self.ranks,
            device=dev,
        )
        self.static = StaticWorkItems.allocate(max(8, self.adapters), self.tokens, self.adapters, dev)
        self.static.fill(self.items, self.tokens)
        # atmm_in_gemm's items: the same, plus copy items over every token no adapter covers
        self.covering = StaticWorkItems.allocate(max(8, self.adapters), self.tokens, self.adapters, dev,
                                                 covers_tokens=True)
        self.covering.fill(self.items, self.tokens)
        self.side = torch.cuda.Stream()
        self._bmm_index()

    # ---- methods: the LoRA part of each, on one copy; run() adds the base GEMM -------
    def run(self, method: str, t: dict) -> None:
        x, out = t["x"][: self.tokens], t["out"][: self.tokens]
        if method == "atmm_overlap":  # the base GEMM runs inside, next to the shrink
            ops.lora_apply_static_with_base(
                x,
                t["a"],
                t["b"],
                self.static,
                self.offsets,
                lambda: torch.mm(x, t["w"].t(), out=out),
                self.side,
            )
            return
        if method == "atmm_in_gemm":  # the base GEMM is the op's own, into a new output
            self.in_gemm(t)
            return
        if method == "atmm_gemm":  # the base GEMM is the op's own, the delta in its accumulator
            self.gemm(t)
            return
        torch.mm(x, t["w"].t(), out=out)
        if method != "merged":
            getattr(self, "lora_" + method)(t)

    def w_ext(self, t: dict) -> torch.Tensor:
        """The base weight with the adapters' A rows appended (made on first use, before any
        capture: ``time_us`` runs the method on every set first)."""
        if "w_ext" not in t:
            t["w_ext"] = torch.cat([t["w"], t["a"].reshape(-1, self.d_in)])
        return t["w_ext"]

    def in_gemm(self, t: dict) -> torch.Tensor:
        return ops.lora_apply_static_in_gemm(
            t["x"][: self.tokens], self.w_ext(t), None, self.offsets[-1], t["b"], self.covering, self.offsets
        )

    def gemm(self, t: dict) -> torch.Tensor:
        if self.mode == "decode":
            raise ValueError("an eager prefill entry point: not run in decode cells")
        return ops.lora_apply_gemm(t["x"][: self.tokens], t["w"], None, t["a"], t["b"], self.items, self.offsets)

    def lora_atmm_gemm(self, t: dict) -> None:
        """For :meth:`rel_error`: adds the op's output minus cuBLAS's base GEMM to ``out`` (so the
        two GEMMs' bf16 roundings of the base count in its error)."""
        x, out = t["x"][: self.tokens], t["out"][: self.tokens]
        out += self.gemm(t) - x @ t["w"].t()

    def lora_atmm_in_gemm(self, t: dict) -> None:
        """For :meth:`rel_error`: adds the op's LoRA delta (its output minus its own GEMM's base
        columns) to ``out``."""
        x, out = t["x"][: self.tokens], t["out"][: self.tokens]
        base = torch.nn.functional.linear(x, self.w_ext(t))[:, : self.offsets[-1]]
        out += self.in_gemm(t) - base

    def lora_atmm_overlap(self, t: dict) -> None:
        out = t["out"][: self.tokens]
        ops.lora_apply_static_with_base(
            t["x"][: self.tokens], t["a"], t["b"], self.static, self.offsets, lambda: out, self.side
        )

    def lora_atmm(self, t: dict) -> None:
        x, out = t["x"][: self.tokens], t["out"][: self.tokens]
        if self.mode == "decode":
            ops.lora_apply_static(x, t["a"], t["b"], self.static, self.offsets, out)
        else:
            ops.lora_apply(x, t["a"], t["b"], self.items, self.offsets, out)

    def lora_atmm_cuda(self, t: dict) -> None:
        x, out = t["x"][: self.tokens], t["out"][: self.tokens]
        ops.lora_apply(x, t["a"], t["b"], self.items, self.offsets, out, impl="cuda")

    def _batch_info(self, chunk: int | None):
        from sglang.srt.lora.utils import LoRABatchInfo

        dev = "cuda"
        if chunk is None:  # triton backend: one segment per adapter group
            lens = self.seg_lens
            weights = self.slots
        else:  # csgmv: adapter groups cut into chunks
            lens, weights = [], []
            for slot, n in zip(self.slots, self.seg_lens, strict=True):
                k = math.ceil(n / chunk)
                lens += [chunk] * (k - 1) + [n - chunk * (k - 1)]
                weights += [slot] * k
        indptr = [0]
        for n in lens:
            indptr.append(indptr[-1] + n)
        i32 = {"dtype": torch.int32, "device": dev}
        return LoRABatchInfo(
            use_cuda_graph=False,
            bs=len(lens),
            num_segments=len(lens),
            seg_indptr=torch.tensor(indptr, **i32),
            weight_indices=torch.tensor(weights, **i32),
            lora_ranks=torch.tensor(self.ranks, **i32),
            scalings=torch.tensor([SCALE] * self.adapters, dtype=torch.float32, device=dev),
            max_len=chunk or max(lens),
            seg_lens=torch.tensor(lens, **i32),
            permutation=None if chunk is None else torch.arange(self.tokens, **i32),
        )

    def lora_sglang_triton(self, t: dict) -> None:
        from sglang.kernels.ops.lora.dense import (
            gate_up_lora_b,
            qkv_lora_b,
            sgemm_lora_a,
            sgemm_lora_b,
        )

        if not hasattr(self, "_tri_info"):
            self._tri_info = self._batch_info(None)
            self._off_dev = torch.tensor(self.offsets, dtype=torch.int32, device="cuda")
        x, out, info = t["x"][: self.tokens], t["out"][: self.tokens], self._tri_info
        inter = sgemm_lora_a.sgemm_lora_a_fwd(x, t["a"], info, stack_num=self.s)
        if self.s == 1:
            sgemm_lora_b.sgemm_lora_b_fwd(inter, t["b"], info, base_output=out)
        elif self.s == 2:
            gate_up_lora_b.gate_up_lora_b_fwd(inter, t["b"], info, self.offsets[1], base_output=out)
        else:
            width = max(b - a for a, b in zip(self.offsets, self.offsets[1:], strict=False))
            qkv_lora_b.qkv_lora_b_fwd(inter, t["b"], info, self._off_dev, width, base_output=out)

    def lora_sglang_csgmv(self, t: dict) -> None:
        from sglang.kernels.ops.lora.dense.chunked_sgmv_expand import (
            chunked_sgmv_lora_expand_forward,
        )
        from sglang.kernels.ops.lora.dense.chunked_sgmv_shrink import (
            chunked_sgmv_lora_shrink_forward,
        )

        if not hasattr(self, "_cs_info"):
            chunk = 128 if self.tokens >= 256 else 32 if self.tokens >= 64 else 16
            self._cs_info = self._batch_info(chunk)
            self._off_dev = torch.tensor(self.offsets, dtype=torch.int32, device="cuda")
            self._off_cpu = torch.tensor(self.offsets, dtype=torch.int32)
        x, out, info = t["x"][: self.tokens], t["out"][: self.tokens], self._cs_info
        inter = chunked_sgmv_lora_shrink_forward(x, t["a"], info, num_slices=self.s)
        width = max(b - a for a, b in zip(self.offsets, self.offsets[1:], strict=False))
        chunked_sgmv_lora_expand_forward(
            inter,
            t["b"],
            info,
            self._off_dev,
            width,
            out,
            slice_offsets_cpu=self._off_cpu,
        )

    def _bmm_index(self) -> None:
        longest = max(self.seg_lens)
        idx = torch.full((self.adapters, longest), self.tokens, dtype=torch.long)
        for a, (start, n) in enumerate(zip(self.seg_starts, self.seg_lens, strict=True)):
            idx[a, :n] = torch.arange(start, start + n)
        self.bmm_idx = idx.cuda()
        self.bmm_slots = torch.tensor(self.slots, device="cuda")

    def lora_bmm(self, t: dict) -> None:
        r, d_out = self.rank, self.offsets[-1]
        xp = t["x"][self.bmm_idx]  # [adapters, longest, d_in], padded with the zero row
        a = t["a"].index_select(0, self.bmm_slots)
        b = t["b"].index_select(0, self.bmm_slots)
        inter = torch.bmm(xp, a.transpose(1, 2))
        delta = torch.empty(self.adapters, xp.shape[1], d_out, device="cuda", dtype=xp.dtype)
        for s in range(self.s):
            lo, hi = self.offsets[s], self.offsets[s + 1]
            torch.bmm(
                inter[:, :, s * r : (s + 1) * r],
                b[:, lo:hi].transpose(1, 2),
                out=delta[:, :, lo:hi],
            )
        t["out"].index_add_(0, self.bmm_idx.flatten(), delta.view(-1, d_out), alpha=SCALE)

    # ---- measurement ----------------------------------------------------------------
    def reference_delta(self, t: dict) -> torch.Tensor:
        d = torch.zeros(self.tokens, self.offsets[-1], device="cuda")
        x = t["x"].float()
        for slot, start, n in zip(self.slots, self.seg_starts, self.seg_lens, strict=True):
            xs = x[start : start + n]
            for s in range(self.s):
                lo, hi = self.offsets[s], self.offsets[s + 1]
                mid = xs @ t["a"][slot, s * self.rank : (s + 1) * self.rank].float().T
                d[start : start + n, lo:hi] = SCALE * mid @ t["b"][slot, lo:hi].float().T
        return d

    def rel_error(self, method: str) -> float:
        """Relative error of the method's LoRA delta (bf16 output minus the bf16 base
        GEMM) against an fp32 computation of the delta."""
        t = self.sets[0]
        t["out"].normal_()
        self.run("merged", t)
        base = t["out"][: self.tokens].float().clone()
        getattr(self, "lora_" + method)(t)
        got = t["out"][: self.tokens].float() - base
        if not torch.isfinite(got).all():
            return float("inf")
        ref = self.reference_delta(t)
        return ((got - ref).norm() / ref.norm()).item()

    def time_us(self, method: str, iters: int) -> float:
        """Median microseconds of one call, from a graph over every rotated input set. Every set
        runs once first, so nothing a method makes on first use (``atmm_in_gemm``'s extended
        weight) is made inside the capture and timed at every replay."""
        for t in self.sets:
            self.run(method, t)
        torch.cuda.synchronize()

        def all_sets() -> None:
            for t in self.sets:
                self.run(method, t)

        return graph_replay_us(all_sets, iters) / self.copies


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--shapes", nargs="+", default=list(SHAPES), choices=list(SHAPES))
    ap.add_argument("--ranks", nargs="+", type=int, default=[8, 16, 64, 128])
    ap.add_argument("--adapters", nargs="+", type=int, default=[1, 4])
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--check", action="store_true", help="bf16 error of every method vs fp32")
    ap.add_argument("--quick", action="store_true", help="decode 8/32 and prefill 4x1024 only")
    ap.add_argument("--modes", nargs="+", default=["decode", "prefill"], choices=["decode", "prefill"])
    ap.add_argument("--methods", nargs="+", default=None, choices=METHODS[1:],
                    help="the methods to time besides merged (default: all)")
    ap.add_argument("--rounds", type=parse_positive, default=1,
                    help="time every method of a cell this many times, taking turns; a cell's figure is the "
                         "median (a drifting GPU moves every method alike within a round)")
    ap.add_argument("--out", type=Path, default=Path(__file__).parent / "results")
    ap.add_argument("--tag", default="kernels")
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("bench/kernels.py: no CUDA device, nothing measured (the ATMM kernel benchmark needs a GPU)")
        return
    try:
        import sglang

        peers = ["sglang_triton", "sglang_csgmv"]
        sglang_version = sglang.__version__
    except ImportError:
        peers, sglang_version = [], None
    chosen = METHODS[1:] if args.methods is None else args.methods
    methods = ["merged", *(m for m in METHODS[1:] if m in chosen and (m in peers or not m.startswith("sglang_")))]
    if missing := [m for m in chosen if m not in methods]:
        print(f"not timed (sglang is not installed): {', '.join(missing)}", flush=True)
    if "atmm_cuda" in methods:
        from sglang_vlora.atmm import cuda_ext

        try:
            cuda_ext.load()  # build before timing; a failure is reported per cell
        except RuntimeError as exc:
            print(f"atmm_cuda: {exc}", flush=True)
    decode = [(8, 1), (32, 1)] if args.quick else DECODE
    prefill = [(4, 1024)] if args.quick else PREFILL
    meta = {
        "device": torch.cuda.get_device_name(0),
        "date": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "torch": torch.__version__,
        "triton": __import__("triton").__version__,
        "sglang": sglang_version,
        "python": platform.python_version(),
        "command": " ".join(["python", "bench/kernels.py", *sys.argv[1:]]),
        "provenance": provenance.record(),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    rows: list[dict] = []
    for shape in args.shapes:
        for rank in args.ranks:
            for mode, cells in (m for m in (("decode", decode), ("prefill", prefill)) if m[0] in args.modes):
                for requests, per_req in cells:
                    for adapters in args.adapters:
                        if adapters > requests:
                            continue
                        cell = Cell(shape, mode, requests, per_req, adapters, rank)
                        row = {
                            "shape": shape,
                            "mode": mode,
                            "rank": rank,
                            "requests": requests,
                            "tokens": cell.tokens,
                            "adapters": cell.adapters,
                            "atmm_entry": "lora_apply_static" if mode == "decode" else "lora_apply",
                            "us": {},
                            "err": {},
                        }
                        times = time_in_turns(cell, methods, args.rounds, args.iters, row["err"])
                        for name in methods:
                            row["us"][name] = None if name in row["err"] else round(statistics.median(times[name]), 2)
                            if args.check and name != "merged" and name not in row["err"]:
                                row["err"][name] = checked_error(cell, name)
                        if args.rounds > 1:
                            row["rounds_us"] = {n: [round(t, 2) for t in ts] for n, ts in times.items() if ts}
                        base = row["us"]["merged"]
                        row["extra_pct"] = {
                            n: None if row["us"][n] is None else round(100 * (row["us"][n] - base) / base, 1)
                            for n in methods
                            if n != "merged"
                        }
                        rows.append(row)
                        write_json(args.out / f"{args.tag}.json", meta, rows)  # kept if cut short
                        print_row(row, methods)
                        del cell
                        torch.cuda.empty_cache()
    plot(rows, methods, meta, args.out / f"{args.tag}.png")
    print(json.dumps(meta))
    print_table(rows, methods)


def time_in_turns(cell: Cell, methods: list[str], rounds: int, iters: int, errors: dict) -> dict[str, list[float]]:
    """Every method's microseconds per round, the methods taking turns within each round; a
    method that raises is recorded in ``errors`` and not timed again (a failing peer must not
    stop the run)."""
    times: dict[str, list[float]] = {name: [] for name in methods}
    for _ in range(rounds):
        for name in methods:
            if name in errors:
                continue
            try:
                times[name].append(cell.time_us(name, iters))
            except Exception as exc:
                errors[name] = f"{type(exc).__name__}: {exc}"[:200]
    return times


def checked_error(cell: Cell, method: str) -> float | str:
    """The method's bf16 error against fp32, or why the check raised (a failing peer must not
    stop the run; its timing stands)."""
    try:
        return round(cell.rel_error(method), 5)
    except Exception as exc:
        return f"{type(exc).__name__}: {exc}"[:200]


def write_json(path: Path, meta: dict, rows: list[dict]) -> None:
    body = ",\n  ".join(json.dumps(r) for r in rows)
    path.write_text(
        json.dumps({**meta, "rows": "@rows"}, indent=1).replace('"@rows"', f"[\n  {body}\n ]") + "\n"
    )


def print_row(row: dict, methods: list[str]) -> None:
    extra = " ".join(f"{n}={row['extra_pct'][n]}%" for n in methods if n != "merged")
    errs = " ".join(f"{k}={v}" for k, v in row["err"].items())
    print(
        f"{row['shape']} {row['mode']} r{row['rank']} tok={row['tokens']} ad={row['adapters']} "
        f"merged={row['us']['merged']}us {extra} {errs}",
        flush=True,
    )


def print_table(rows: list[dict], methods: list[str]) -> None:
    others = [n for n in methods if n != "merged"]
    head = "| shape | mode | rank | tokens | adapters | merged us | " + " | ".join(f"{n} %" for n in others)
    print(head + " | atmm err | atmm_cuda err |")
    print("|" + "---|" * (head.count("|") + 2))
    for r in rows:
        cells = " | ".join("-" if r["extra_pct"][n] is None else f"{r['extra_pct'][n]:.1f}" for n in others)
        err, cuda_err = r["err"].get("atmm", ""), r["err"].get("atmm_cuda", "")
        print(
            f"| {r['shape']} | {r['mode']} | {r['rank']} | {r['tokens']} | {r['adapters']} | "
            f"{r['us']['merged']:.1f} | {cells} | {err} | {cuda_err} |"
        )


def plot(rows: list[dict], methods: list[str], meta: dict, path: Path) -> None:
    plt = pyplot()
    if plt is None:
        return
    shapes = sorted({r["shape"] for r in rows}, key=list(SHAPES).index)
    others = [n for n in methods if n != "merged"]
    fig, axes = plt.subplots(
        len(shapes),
        1,
        figsize=(max(8, len(rows) / len(shapes) * 0.45), 3.2 * len(shapes)),
        squeeze=False,
    )
    for ax, shape in zip(axes[:, 0], shapes, strict=True):
        sub = [r for r in rows if r["shape"] == shape]
        width = 0.8 / len(others)
        for i, n in enumerate(others):
            ys = [max(r["extra_pct"][n] or 0.0, 0.1) for r in sub]
            ax.bar([j + i * width for j in range(len(sub))], ys, width, label=n)
        ax.set_yscale("log")
        ax.set_ylabel("extra over merged, %")
        ax.set_title(f"{shape}: {SHAPES[shape][0]} -> {'+'.join(map(str, SHAPES[shape][1]))}")
        ax.set_xticks([j + 0.4 - width / 2 for j in range(len(sub))])
        ax.set_xticklabels(
            [f"{r['mode'][0]}{r['tokens']}/a{r['adapters']}/r{r['rank']}" for r in sub],
            rotation=90,
            fontsize=6,
        )
        ax.legend(fontsize=7)
    fig.suptitle(
        f"{meta['device']}  torch {meta['torch']}  triton {meta['triton']}  {meta['date']}",
        fontsize=8,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
