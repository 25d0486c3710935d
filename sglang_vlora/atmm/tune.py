"""Offline profile-based tiling search (paper §4.3.2, Appendix B, Algorithm 2).

For every shape of the grid (each layer's dims and slice count, each rank, each token
count) it times every candidate tile config of the shrink and the expand kernel on
the current GPU, and of the expand of the shrink inside the base GEMM (``expand_in_gemm``:
the same kernel over the GEMM output's layout, what graph batches run where the pool's A rows
are appended; its best tiles differ), and writes the best of each to a table::

    python -m sglang_vlora.atmm.tune --model qwen2-vl-7b llava-1.5-7b \\
        --ranks 8 16 32 64 128 --max-tokens 8192

Search in two stages per shape: stage 1 times the tile shapes (and split-K) at
default warps/stages, stage 2 times warps x stages for stage 1's three best tiles.
Candidates compile in worker processes first (Triton's disk cache is shared), so the
timing loop in this process measures only. Timing: CUDA-graph replays of ``--reps``
launches, median of ``--iters`` replays.

With ``--impls triton cuda cublas`` (the default) every shape the Triton search reached
is also timed with the CUDA C++ implementation (its compiled tiles x split-K, one stage:
warps and stages are part of a compiled tile) and with cuBLAS (one GEMM per item and
slice, :mod:`sglang_vlora.atmm.cublas_ops`), and the entry records each best and the
winner (``"impl"``, see :mod:`sglang_vlora.atmm.tiling`). If the CUDA extension cannot
be built, the run says why and leaves it out.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import multiprocessing as mp
import os
import statistics
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from sglang_vlora.atmm import cublas_ops, cuda_ext, in_gemm, tiling, triton_kernels
from sglang_vlora.atmm.tiling import ExpandConfig, ShrinkConfig

# Layer shapes as (d_in, output widths of the stacked slices).
MODELS: dict[str, list[tuple[int, tuple[int, ...]]]] = {
    "qwen2-vl-7b": [
        (3584, (3584, 512, 512)),  # qkv_proj
        (3584, (3584,)),  # o_proj
        (3584, (18944, 18944)),  # gate_up_proj
        (18944, (3584,)),  # down_proj
    ],
    "llava-1.5-7b": [
        (4096, (4096, 4096, 4096)),
        (4096, (4096,)),
        (4096, (11008, 11008)),
        (11008, (4096,)),
    ],
}
DEFAULT_TOKENS = tiling.TOKEN_GRID

Shape = tuple  # ("shrink", k, n, m) or ("expand" | "expand_in_gemm", n, s, r, m, widths)
EXPAND_OPS = ("expand", "expand_in_gemm")


def parse_layer(spec: str) -> tuple[int, tuple[int, ...]]:
    """``D_IN:OUT[,OUT[,OUT]]``, e.g. ``4096:4096,1024,1024`` for a GQA qkv_proj."""
    d_in, outs = spec.split(":")
    return int(d_in), tuple(int(o) for o in outs.split(","))


def build_shapes(
    layers: list[tuple[int, tuple[int, ...]]], ranks: list[int], tokens: list[int]
) -> list[Shape]:
    """Distinct kernel shapes in the order of ``layers`` (a budget cuts the last)."""
    shapes: dict[Shape, None] = {}
    for d_in, widths in layers:
        s = len(widths)
        for r in ranks:
            for m in tokens:
                shapes[("shrink", d_in, s * r, m)] = None
                for op in EXPAND_OPS:
                    shapes[(op, sum(widths), s, r, m, widths)] = None
    return list(shapes)


class Problem:
    """Random inputs of one shape: ``min(4, m)`` items of rank ``r`` over ``m`` tokens. An
    ``expand_in_gemm`` shape reads its intermediate and base from one GEMM output laid out as
    :mod:`sglang_vlora.atmm.in_gemm`'s (every slot's ``S * r`` columns after the base's) and
    writes a new output; it runs Triton only."""

    def __init__(self, shape: Shape, dtype: torch.dtype = torch.bfloat16, device: str = "cuda"):
        self.shape = shape
        op = shape[0]
        if op == "shrink":
            _, k, n, m = shape
            s, r = 1, n
        else:
            _, _, s, r, m, widths = shape
        n_items = min(4, m)
        lens = [m // n_items + (i < m % n_items) for i in range(n_items)]
        starts = [sum(lens[:i]) for i in range(n_items)]
        slots = list(range(1, n_items + 1))
        self.items = _device_items(starts, lens, slots, [1.0] * n_items, [0] + [r] * n_items, device)
        self.m = m
        if op == "shrink":
            self.x = torch.randn(m, k, dtype=dtype, device=device)
            self.a = torch.randn(n_items + 1, n, k, dtype=dtype, device=device) / k**0.5
            self.inter = torch.empty(m, n, dtype=dtype, device=device)
        else:
            offsets = [0]
            for w in widths:
                offsets.append(offsets[-1] + w)
            self.offsets = offsets
            self.b = torch.randn(n_items + 1, offsets[-1], r, dtype=dtype, device=device) / r**0.5
            self.out = torch.randn(m, offsets[-1], dtype=dtype, device=device)
            self.layout = None
            if op == "expand_in_gemm":
                gemm_out = torch.randn(m, offsets[-1] + (n_items + 1) * s * r, dtype=dtype, device=device)
                self.inter, self.layout = in_gemm.split_output(gemm_out, offsets[-1], n_items + 1)
            else:
                self.inter = torch.randn(m, s * r, dtype=dtype, device=device)

    def launcher(self, cfg: ShrinkConfig | ExpandConfig, impl: str = "triton") -> Callable[[], None]:
        """A no-argument launch of this problem with ``cfg`` on ``impl``. The two
        implementations take the same arguments except the grid's rows: Triton a row
        bound, CUDA the exact row tiles of the items."""
        it = self.items
        if self.shape[0] == "expand_in_gemm" and impl != "triton":
            raise ValueError("the in-GEMM expand runs Triton only")
        if impl == "cublas":
            if self.shape[0] == "shrink":
                return lambda: cublas_ops.shrink(self.x, self.a, self.inter, it, 1)
            return lambda: cublas_ops.expand(self.inter, self.b, self.out, it, self.offsets)
        if impl == "cuda":
            module, rows = cuda_ext, cuda_ext.exact_row_tiles(it.seg_lens_host, cfg.block_m)
        else:
            module, rows = triton_kernels, it.total_rows
        if self.shape[0] == "shrink":
            args = (self.x, self.a, self.inter, it.seg_starts, it.seg_lens, it.slots, it.row_starts, it.ranks,
                    None, 1, rows, cfg)
            return lambda: module.launch_shrink(*args)
        args = (self.inter, self.b, self.out, it.seg_starts, it.seg_lens, it.slots, it.scales, it.row_starts,
                None, 1, it.ranks, None, self.offsets, rows, cfg)
        if self.layout is not None:
            return lambda: module.launch_expand(*args, in_gemm=self.layout)
        return lambda: module.launch_expand(*args)


def _device_items(starts, lens, slots, scales, ranks, device):
    from sglang_vlora.atmm.work_items import build_work_items

    return build_work_items(starts, lens, slots, scales, ranks, device=device)


def time_candidate(problem: Problem, cfg: Any, reps: int, iters: int, impl: str = "triton") -> float:
    """``time_launch`` of one candidate; infinity if it does not compile or run."""
    try:
        return time_launch(problem.launcher(cfg, impl), reps, iters)
    except Exception:  # triton's OutOfResources and compile errors have no common base
        torch.cuda.synchronize()
        return math.inf


def time_launch(fn: Callable[[], None], reps: int, iters: int) -> float:
    """Median microseconds of one launch, from CUDA-graph replays of ``reps`` launches."""
    fn()

    def launches() -> None:
        for _ in range(reps):
            fn()

    return graph_replay_us(launches, iters) / reps


def graph_replay_us(capture: Callable[[], None], iters: int) -> float:
    """Capture ``capture()`` into one CUDA graph and return the median microseconds of
    a replay over ``iters`` timed replays (after one untimed warm-up replay)."""
    return replay_median_us(capture_graph(capture), iters)


def capture_graph(capture: Callable[[], None]) -> torch.cuda.CUDAGraph:
    """``capture()`` captured into one CUDA graph on a side stream, replayed once (warm-up)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        capture()
    graph.replay()
    return graph


def replay_median_us(graph: torch.cuda.CUDAGraph, iters: int) -> float:
    """The median microseconds of ``iters`` timed replays of ``graph``."""
    times = []
    for _ in range(iters):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1000.0)
    return statistics.median(times)


def _hw_limits() -> tuple[int, int]:
    props = torch.cuda.get_device_properties(0)
    smem = getattr(props, "shared_memory_per_block_optin", 227 * 1024)
    return props.multi_processor_count, smem


def default_config(shape: Shape) -> ShrinkConfig | ExpandConfig:
    if shape[0] == "shrink":
        return tiling.default_shrink(*shape[1:])
    return tiling.default_expand(*shape[1:5])


def stage1_candidates(shape: Shape, sm_count: int, smem: int) -> list:
    """The shape's search space, plus the untuned default (to report the gain)."""
    if shape[0] == "shrink":
        _, k, n, m = shape
        cands = list(tiling.shrink_candidates(k, n, m, sm_count, smem))
    else:
        _, n, s, r, m, _ = shape
        cands = list(tiling.expand_candidates(n, s, r, m, smem))
    default = default_config(shape)
    return cands if default in cands else [*cands, default]


def _precompile_worker(jobs: list[tuple[Shape, list[dict]]]) -> int:
    """Launch every job's candidates once so that Triton compiles them into its cache."""
    done = 0
    for shape, cfgs in jobs:
        problem = Problem(shape)
        cls = ShrinkConfig if shape[0] == "shrink" else ExpandConfig
        for cfg in cfgs:
            try:
                problem.launcher(cls(**cfg))()
                done += 1
            except Exception:  # e.g. out of shared memory: timing skips it too
                pass
        torch.cuda.synchronize()
        del problem
    return done


def precompile(work: dict[Shape, list], workers: int) -> None:
    jobs = [(shape, [asdict(c) for c in cfgs]) for shape, cfgs in work.items() if cfgs]
    if workers <= 1 or not jobs:
        _precompile_worker(jobs)
        return
    chunks = [jobs[i::workers] for i in range(workers)]
    with mp.get_context("spawn").Pool(workers) as pool:
        pool.map(_precompile_worker, chunks)


def _progress(total: int, desc: str):
    try:
        from tqdm import tqdm

        return tqdm(total=total, desc=desc, mininterval=2.0)
    except ImportError:  # tqdm is optional: a silent stand-in

        class _Quiet:
            def update(self, n: int = 1) -> None: ...
            def close(self) -> None: ...

        return _Quiet()


class Budget:
    """Seconds of timing from now on (``None``: no limit)."""

    def __init__(self, seconds: float | None):
        self.seconds, self.start = seconds, time.monotonic()

    def spent(self, fraction: float = 1.0) -> bool:
        """Whether ``fraction`` of the budget has passed."""
        return self.seconds is not None and time.monotonic() - self.start > fraction * self.seconds


def within_budget(shapes: list[Shape], budget_s: float | None, log: Callable[[str], None], impl: str) -> Iterator[Shape]:
    """``shapes`` in order until ``budget_s`` seconds have passed since the first (``None``: all of
    them); logs where ``impl``'s timing stopped."""
    budget = Budget(budget_s)
    for taken, shape in enumerate(shapes):
        if budget.spent():
            log(f"budget: {impl} stopped after {taken} of {len(shapes)} shapes")
            return
        yield shape


def time_shape(shape: Shape, cfgs: list, reps: int, iters: int, impl: str = "triton") -> list[tuple[float, Any]]:
    """``(microseconds, config)`` of every config of ``cfgs`` on one shape, fastest first."""
    problem = Problem(shape)
    timed = [(time_candidate(problem, cfg, reps, iters, impl), cfg) for cfg in cfgs]
    del problem
    return sorted(timed, key=lambda t: t[0])


def search(
    shapes: list[Shape],
    workers: int,
    reps: int,
    iters: int,
    log: Callable[[str], None],
    budget_s: float | None = None,
) -> dict[Shape, tuple[Any, float]]:
    """Two-stage search of the shrink shapes, then of each expand op's: the best config and
    its microseconds per shape. With ``budget_s`` each op gets an equal share of it (timing
    time, counted after stage 1's compilation): stage 1 stops taking new shapes at 70% of the
    share (later shapes are left out of the table: the nearest-shape rule covers them) and
    stage 2 stops at 100% (later shapes keep their stage-1 best)."""
    sm_count, smem = _hw_limits()
    ops = sorted({sh[0] for sh in shapes}, reverse=True)  # shrink first
    share = None if budget_s is None else budget_s / len(ops)
    best: dict[Shape, tuple[Any, float]] = {}
    for op in ops:
        stage1 = {sh: stage1_candidates(sh, sm_count, smem) for sh in shapes if sh[0] == op}
        log(f"{op} stage 1: {sum(map(len, stage1.values()))} timings over {len(stage1)} shapes")
        precompile(stage1, workers)
        budget = Budget(share)
        results: dict[Shape, list[tuple[float, Any]]] = {}
        bar = _progress(sum(map(len, stage1.values())), f"{op} stage 1")
        for shape, cfgs in stage1.items():
            if budget.spent(0.7):
                log(f"budget: {op} stage 1 stopped after {len(results)} of {len(stage1)} shapes")
                break
            results[shape] = time_shape(shape, cfgs, reps, iters)
            bar.update(len(cfgs))
        bar.close()
        stage2 = {shape: stage2_candidates(timed, smem) for shape, timed in results.items()}
        log(f"{op} stage 2: {sum(map(len, stage2.values()))} timings")
        precompile(stage2, workers)
        bar = _progress(sum(map(len, stage2.values())), f"{op} stage 2")
        for shape, cfgs in stage2.items():
            timed = results[shape] + ([] if budget.spent(1.0) else time_shape(shape, cfgs, reps, iters))
            bar.update(len(cfgs))
            us, cfg = min(timed, key=lambda t: t[0])
            best[shape] = (cfg, us)
            default_us = next(t for t, c in timed if c == default_config(shape))
            log(f"{shape[:5]} best {us:.2f} us {cfg} default {default_us:.2f} us")
        bar.close()
    return best


def stage2_candidates(timed: list[tuple[float, Any]], smem: int) -> list:
    """Warps x stages of stage 1's three best tiles (``timed`` fastest first), less the
    configs stage 1 timed already."""
    seen = {cfg for _, cfg in timed}
    variants = {v for _, cfg in timed[:3] for v in tiling.launch_variants(cfg, smem)}
    return sorted(variants - seen, key=str)


def search_cuda(
    shapes: list[Shape],
    reps: int,
    iters: int,
    log: Callable[[str], None],
    budget_s: float | None = None,
) -> dict[Shape, tuple[Any, float]]:
    """Time every CUDA candidate of each shape (the extension is compiled already);
    with ``budget_s`` later shapes are left out once it is spent."""
    sm_count, _ = _hw_limits()
    best: dict[Shape, tuple[Any, float]] = {}
    bar = _progress(len(shapes), "cuda")
    for shape in within_budget(shapes, budget_s, log, "cuda"):
        if shape[0] == "shrink":
            cands = list(tiling.cuda_shrink_candidates(*shape[1:4], sm_count))
        else:
            cands = list(tiling.cuda_expand_candidates(*shape[1:5]))
        timed = time_shape(shape, cands, reps, iters, "cuda")
        bar.update(1)
        if timed and math.isfinite(timed[0][0]):
            us, cfg = timed[0]
            best[shape] = (cfg, us)
            log(f"{shape[:5]} cuda best {us:.2f} us {cfg}")
    bar.close()
    return best


def search_cublas(
    shapes: list[Shape],
    reps: int,
    iters: int,
    log: Callable[[str], None],
    budget_s: float | None = None,
) -> dict[Shape, float]:
    """Time the cuBLAS implementation (no configuration to search) on each shape; with
    ``budget_s`` later shapes are left out once it is spent (they keep Triton's result)."""
    best: dict[Shape, float] = {}
    for shape in within_budget(shapes, budget_s, log, "cublas"):
        problem = Problem(shape)
        us = time_candidate(problem, None, reps, iters, "cublas")
        del problem
        if math.isfinite(us):
            best[shape] = us
            log(f"{shape[:5]} cublas {us:.2f} us")
    return best


def table_entry(
    shape: Shape, cfg: Any, us: float, cuda: tuple[Any, float] | None = None, cublas_us: float | None = None
) -> dict:
    """One table entry: the key, Triton's best ``config`` / ``us``, with a CUDA result
    ``"cuda": {"config", "us"}``, with a cuBLAS one ``"cublas": {"us"}``, and then
    ``"impl"``, the fastest implementation."""
    fields = tiling.KEY_FIELDS[shape[0]]
    entry = {**dict(zip(fields, shape[1 : 1 + len(fields)], strict=True)), "config": asdict(cfg)}
    entry["us"] = round(us, 3)
    timed = {"triton": us}
    if cuda is not None:
        cuda_cfg, cuda_us = cuda
        entry["cuda"] = {"config": asdict(cuda_cfg), "us": round(cuda_us, 3)}
        timed["cuda"] = cuda_us
    if cublas_us is not None:
        entry["cublas"] = {"us": round(cublas_us, 3)}
        timed["cublas"] = cublas_us
    if len(timed) > 1:
        entry["impl"] = min(timed, key=timed.get)
    return entry


def write_table(
    best: dict[Shape, tuple[Any, float]],
    path: Path,
    meta: dict,
    merge: bool = False,
    cuda_best: dict[Shape, tuple[Any, float]] | None = None,
    cublas_best: dict[Shape, float] | None = None,
) -> int:
    """Write the table, one entry per line; with ``merge`` keep the entries of an
    existing table at ``path`` whose keys this run did not tune. ``cuda_best`` adds
    the CUDA implementation's results (entries of shapes in ``best`` only). Returns
    the count."""
    cuda_best, cublas_best = cuda_best or {}, cublas_best or {}
    entries: dict[str, dict[tuple, dict]] = {op: {} for op in tiling.KEY_FIELDS}
    if merge and path.is_file():
        old = json.loads(path.read_text())
        meta = {**meta, "runs": old.get("runs", []) + meta["runs"]}
        for op, fields in tiling.KEY_FIELDS.items():
            for e in old.get(op, []):
                entries[op][tuple(e[f] for f in fields)] = e
    for shape, (cfg, us) in best.items():
        entry = table_entry(shape, cfg, us, cuda_best.get(shape), cublas_best.get(shape))
        entries[shape[0]][tuple(entry[f] for f in tiling.KEY_FIELDS[shape[0]])] = entry
    entries = {op: by_key for op, by_key in entries.items() if by_key or op != "expand_in_gemm"}
    text = json.dumps({**meta, **{op: f"@{op}" for op in entries}}, indent=1)
    for op, by_key in entries.items():
        rows = ",\n  ".join(json.dumps(by_key[k]) for k in sorted(by_key))
        text = text.replace(f'"@{op}"', f"[\n  {rows}\n ]")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text + "\n")
    return sum(map(len, entries.values()))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument(
        "--model",
        nargs="*",
        default=[],
        choices=sorted(MODELS),
        help="preset layer dims",
    )
    ap.add_argument(
        "--dims",
        nargs="*",
        default=[],
        type=parse_layer,
        metavar="D_IN:OUT[,OUT..]",
        help="extra layers, slices comma-separated",
    )
    ap.add_argument("--ranks", nargs="+", type=int, default=[8, 16, 32, 64, 128])
    ap.add_argument(
        "--tokens",
        nargs="+",
        type=int,
        default=list(DEFAULT_TOKENS),
        help="token counts of the grid (cut at --max-tokens)",
    )
    ap.add_argument("--max-tokens", type=int, default=8192)
    ap.add_argument(
        "--workers",
        type=int,
        default=max(1, min(16, (os.cpu_count() or 2) - 1)),
        help="processes that compile candidates before timing",
    )
    ap.add_argument("--reps", type=int, default=10, help="launches per graph replay")
    ap.add_argument("--iters", type=int, default=5, help="timed replays per candidate")
    ap.add_argument(
        "--out",
        type=Path,
        default=None,
        help="table path (default: tables/<device>.json)",
    )
    ap.add_argument("--merge", action="store_true", help="keep other shapes of an existing table")
    ap.add_argument("--ops", nargs="+", default=list(tiling.KEY_FIELDS), choices=list(tiling.KEY_FIELDS))
    ap.add_argument(
        "--impls",
        nargs="+",
        default=["triton", "cuda", "cublas"],
        choices=["triton", "cuda", "cublas"],
        help="implementations to time (Triton always: its config is every entry's fallback)",
    )
    ap.add_argument(
        "--cuda-budget-s", type=float, default=None, help="stop timing the CUDA implementation after this long"
    )
    ap.add_argument(
        "--cublas-budget-s", type=float, default=None, help="stop timing the cuBLAS implementation after this long"
    )
    ap.add_argument("--budget-s", type=float, default=None, help="stop timing after this long")
    ap.add_argument("--log", type=Path, default=None, help="per-shape results, one line each")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        raise SystemExit("tune needs a CUDA GPU")
    layers = [layer for name in args.model for layer in MODELS[name]] + args.dims
    if not layers:
        raise SystemExit("give --model and/or --dims")
    tokens = sorted({t for t in args.tokens if t <= args.max_tokens})
    shapes = [sh for sh in build_shapes(layers, args.ranks, tokens) if sh[0] in args.ops]
    name = torch.cuda.get_device_name(0)
    start = datetime.datetime.now(datetime.UTC)
    log_file = args.log.open("w") if args.log else None

    def log(line: str) -> None:
        if log_file:
            print(line, file=log_file, flush=True)
        elif not line.startswith("("):
            print(line)

    best = search(shapes, args.workers, args.reps, args.iters, log, args.budget_s)
    cuda_best: dict[Shape, tuple[Any, float]] = {}
    if "cuda" in args.impls:
        if cuda_ext.available():
            cuda_best = search_cuda([sh for sh in shapes if sh in best and sh[0] != "expand_in_gemm"], args.reps,
                                    args.iters, log, args.cuda_budget_s)
            wins = sum(1 for sh, (_, us) in cuda_best.items() if us < best[sh][1])
            print(f"cuda: tuned {len(cuda_best)} shapes, faster than Triton on {wins}")
        else:
            print("cuda: the extension is unavailable (see the warning above); not timed")
    cublas_best: dict[Shape, float] = {}
    if "cublas" in args.impls:
        cublas_best = search_cublas([sh for sh in shapes if sh in best and sh[0] != "expand_in_gemm"], args.reps,
                                    args.iters, log, args.cublas_budget_s)
        wins = sum(1 for sh, us in cublas_best.items() if us < best[sh][1])
        print(f"cublas: timed {len(cublas_best)} shapes, faster than Triton on {wins}")
    import triton

    run = {
        "created": start.isoformat(timespec="seconds"),
        "seconds": round((datetime.datetime.now(datetime.UTC) - start).total_seconds()),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "dtype": "bfloat16",
        "ops": args.ops,
        "impls": ["triton", *(["cuda"] if cuda_best else []), *(["cublas"] if cublas_best else [])],
        "layers": [[d, list(w)] for d, w in layers],
        "ranks": args.ranks,
        "tokens": tokens,
        "budget_s": args.budget_s,
    }
    meta = {"device": name, "capability": list(torch.cuda.get_device_capability(0)), "runs": [run]}
    path = args.out or tiling.TABLE_DIR / tiling.table_filename(name)
    count = write_table(best, path, meta, args.merge, cuda_best, cublas_best)
    print(f"tuned {len(best)} shapes in {run['seconds']} s; {count} entries in {path}")


if __name__ == "__main__":
    main()
