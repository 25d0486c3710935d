"""Registers, spills and load widths of the ATMM Triton expand kernel, compiled ahead for sm_90.

    python bench/expand_registers.py [--table PATH] [--slices 1 3] [--in-gemm both|on|off]
        [--paired] [--config 64x128x16w4s1 ...] [--max-rank 64] [--json PATH]

Needs no GPU: for every distinct expand tile config of a tiling table (default the H200's; every
entry, whatever its ``impl``: the graph-safe entry points run Triton with any entry's config)
and every variant asked for, it builds the launch the launcher makes
(``triton_kernels._expand_calls``, on meta tensors of a module of the table's shape: its
``runs`` give the slice widths, bf16, ``--slots`` pool slots of ``--max-rank``), specialises the
arguments with Triton's own binder, compiles for ``GPUTarget("cuda", 90, 32)`` and reads back:

* ``regs``, ``spill_st``, ``spill_ld``: registers per thread and spill bytes, from the
  ``ptxas -v`` log of Triton's own ptxas call (the ptxas bundled with Triton);
* load counts in the PTX: ``ld_b16`` 2-byte global loads (bf16 element by element),
  ``ld_vec`` vector global loads (``.v2``/``.v4``), ``cp16`` 16-byte ``cp.async`` copies.

Variants: the slice counts of ``--slices``, the shrink apart or inside the GEMM (``IN_GEMM``),
and with ``--paired`` each also with mixture's pairs (``PAIRED``). ``--json PATH`` writes the
rows, with every global load and store opcode's count, and the Triton version.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import re
import sys
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from sglang_vlora.atmm import in_gemm, tiling, triton_kernels  # noqa: E402
from sglang_vlora.atmm.tiling import ExpandConfig  # noqa: E402

DEFAULT_TABLE = tiling.TABLE_DIR / "NVIDIA_H200.json"
TARGET = ("cuda", 90, 32)
TOKENS = 256  # rows of the module's call: no compiled variant depends on it
ITEMS = 16


def config_name(cfg: ExpandConfig) -> str:
    return f"{cfg.block_m}x{cfg.block_n}x{cfg.block_k}w{cfg.num_warps}s{cfg.num_stages}"


def table_configs(table: dict) -> list[ExpandConfig]:
    """The distinct expand configs of a table, sorted by name."""
    configs = {ExpandConfig(**entry["config"]) for entry in table["expand"]}
    return sorted(configs, key=lambda c: (c.block_m, c.block_n, c.block_k, c.num_warps, c.num_stages))


def slice_widths(table: dict, num_slices: int) -> list[int]:
    """Output widths of a layer of ``num_slices`` slices among the shapes the table was tuned on."""
    for run in table.get("runs", []):
        for _, widths in run.get("layers", []):
            if len(widths) == num_slices:
                return list(widths)
    raise ValueError(f"the table's runs tuned no layer of {num_slices} slices")


def expand_launch(cfg: ExpandConfig, widths: list[int], max_rank: int, slots: int, use_in_gemm: bool,
                  paired: bool) -> tuple[tuple, dict]:
    """``(args, constexprs)`` of the launcher's first expand launch for this module, on meta tensors."""
    meta = {"device": "meta"}
    num_slices = len(widths)
    offsets = [0]
    for width in widths:
        offsets.append(offsets[-1] + width)
    n = offsets[-1]
    ints = {"dtype": torch.int32, **meta}
    seg_starts, seg_lens, item_slots, row_starts, layers, partners = (torch.empty(ITEMS, **ints) for _ in range(6))
    scales = torch.empty(ITEMS, dtype=torch.float32, **meta)
    ranks = torch.empty(slots + 1, **ints)
    permutation = torch.empty(TOKENS, **ints)
    b_buffer = torch.empty(slots, n, max_rank, dtype=torch.bfloat16, **meta)
    output = torch.empty(TOKENS, n, dtype=torch.bfloat16, **meta)
    layout = None
    if use_in_gemm:
        y = torch.empty(TOKENS, n + slots * num_slices * max_rank, dtype=torch.bfloat16, **meta)
        inter, layout = in_gemm.split_output(y, n, slots)
    else:
        inter = torch.empty(TOKENS, num_slices * max_rank, dtype=torch.bfloat16, **meta)
    calls = triton_kernels._expand_calls(
        inter, b_buffer, output, seg_starts, seg_lens, item_slots, scales, row_starts, layers, 1, ranks,
        permutation, offsets, TOKENS, cfg, partners if paired else None, layout,
    )
    _, args, constexprs = calls[0]
    return args, constexprs


def bundled_ptxas() -> str | None:
    """The ptxas Triton compiles with (its Linux x86-64 wheels bundle one), or None."""
    try:
        path = triton.knobs.nvidia.ptxas.path
    except (AttributeError, RuntimeError, FileNotFoundError):
        return None
    return path if path and os.path.isfile(path) else None


def compile_sm90(fn, args: tuple, constexprs: dict, num_warps: int, num_stages: int) -> tuple[str, str]:
    """Compile ``fn`` for sm_90 as a launch with these arguments would; returns ``(ptx, ptxas log)``."""
    kernel, log = compile_for(fn, args, constexprs, num_warps, num_stages, TARGET)
    return kernel.asm["ptx"], log


def compile_for(fn, args: tuple, constexprs: dict, num_warps: int, num_stages: int,
                target: tuple[str, int, int]) -> tuple[object, str]:
    """Compile ``fn`` for ``target`` (backend, compute capability, warp size) as a launch with
    these arguments would (Triton's binder makes the specialisation); returns ``(compiled
    kernel, ptxas log)``."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, make_backend
    from triton.runtime.jit import create_function_from_signature

    target = GPUTarget(*target)
    backend = make_backend(target)
    binder = create_function_from_signature(fn.signature, fn.params, backend)
    kwargs = {**constexprs, "num_warps": num_warps, "num_stages": num_stages}
    bound_args, specialization, options = binder(*args, **kwargs)
    options, signature, consts, attrs = fn._pack_args(backend, kwargs, bound_args, specialization, options)
    log = io.StringIO()
    # Triton prints the log of its own ptxas call (same flags as at run time) when asked, and
    # runs ptxas only on a compile, not on a cache hit.
    with contextlib.redirect_stdout(log):
        triton.knobs.nvidia.dump_ptxas_log = True
        triton.knobs.compilation.always_compile = True
        kernel = triton.compile(ASTSource(fn, signature, consts, attrs), target=target, options=options.__dict__)
    return kernel, log.getvalue()


def ptxas_counts(log: str) -> dict[str, int]:
    """Registers and spill bytes from a ``ptxas -v`` log."""
    regs = re.search(r"Used (\d+) registers", log)
    spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", log)
    if regs is None or spills is None:
        raise RuntimeError(f"no register or spill counts in the ptxas log:\n{log}")
    return {"regs": int(regs.group(1)), "spill_st": int(spills.group(1)), "spill_ld": int(spills.group(2))}


def ptx_memory_ops(ptx: str) -> dict[str, int]:
    """Count of each global load and store opcode, and of ``cp.async`` copies by size."""
    ops: dict[str, int] = {}
    for m in re.finditer(r"^\s*(?:@!?%p\d+\s+)?((?:ld|st)\.global[\w.:]*)", ptx, re.M):
        ops[m.group(1)] = ops.get(m.group(1), 0) + 1
    for m in re.finditer(r"cp\.async\.c[ag]\.shared\.global[^;]*?,\s*(0x\w+|\d+)\s*(?:,|;)", ptx):
        key = f"cp.async.{int(m.group(1), 0)}B"
        ops[key] = ops.get(key, 0) + 1
    return ops


def survey_one(job: tuple) -> dict:
    """One row: compile one config and variant, count registers, spills and loads."""
    cfg, widths, max_rank, slots, use_in_gemm, paired = job
    args, constexprs = expand_launch(cfg, widths, max_rank, slots, use_in_gemm, paired)
    ptx, log = compile_sm90(triton_kernels._expand_kernel, args, constexprs, cfg.num_warps, cfg.num_stages)
    ops = ptx_memory_ops(ptx)
    loads = {k: v for k, v in ops.items() if k.startswith("ld.global")}
    return {
        "config": config_name(cfg),
        "tile": asdict(cfg),
        "slices": len(widths),
        "in_gemm": use_in_gemm,
        "paired": paired,
        "max_rank": max_rank,
        "constexprs": {k: v for k, v in constexprs.items() if k != "CAP"},
        **ptxas_counts(log),
        "ld_b16": sum(v for k, v in loads.items() if k.endswith(".b16")),
        "ld_vec": sum(v for k, v in loads.items() if ".v2." in k or ".v4." in k),
        "cp16": ops.get("cp.async.16B", 0),
        "ops": ops,
    }


def format_row(row: dict) -> str:
    variant = f"S{row['slices']} {'in_gemm' if row['in_gemm'] else 'separate'}{' paired' if row['paired'] else ''}"
    return (f"{row['config']:<16} {variant:<22} {row['regs']:>4} {row['spill_st']:>8} {row['spill_ld']:>8} "
            f"{row['ld_b16']:>6} {row['ld_vec']:>6} {row['cp16']:>5}")


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--table", type=Path, default=DEFAULT_TABLE, help="tiling table JSON (default: the H200's)")
    ap.add_argument("--slices", type=int, nargs="+", default=[1, 3], help="slice counts (default: 1 3)")
    ap.add_argument("--in-gemm", choices=("both", "on", "off"), default="both",
                    help="the shrink apart (off), inside the GEMM (on) or both (default)")
    ap.add_argument("--paired", action="store_true", help="also each variant with mixture's pairs")
    ap.add_argument("--config", action="append", default=None,
                    help="only this config, as BMxBNxBKwWARPSsSTAGES (repeatable; default: all of the table)")
    ap.add_argument("--max-rank", type=int, default=64, help="the pool's max rank (default: 64)")
    ap.add_argument("--slots", type=int, default=4, help="pool slots (default: 4)")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 1, help="compiles in parallel")
    ap.add_argument("--json", type=Path, default=None, help="also write the rows here")
    args = ap.parse_args(argv)

    for name in ("max_rank", "slots", "jobs"):
        if getattr(args, name) < 1:
            ap.error(f"--{name.replace('_', '-')} must be at least 1, got {getattr(args, name)}")
    try:
        table = json.loads(args.table.read_text())
        configs = table_configs(table)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        ap.error(f"cannot read a tiling table from {args.table}: {exc}")
    widths = {}
    for num_slices in args.slices:
        try:
            widths[num_slices] = slice_widths(table, num_slices)
        except ValueError as exc:
            ap.error(str(exc))
    if args.config:
        configs = [c for c in configs if config_name(c) in args.config]
        missing = set(args.config) - {config_name(c) for c in configs}
        if missing:
            ap.error(f"not expand configs of {args.table.name}: {', '.join(sorted(missing))}")
    if not isinstance(triton_kernels._expand_kernel, triton.runtime.JITFunction):
        ap.error("the kernel is Triton's interpreter's here: unset TRITON_INTERPRET")
    modes = {"both": (False, True), "on": (True,), "off": (False,)}[args.in_gemm]
    jobs = [
        (cfg, widths[s], args.max_rank, args.slots, use_in_gemm, paired)
        for cfg in configs
        for s in args.slices
        for use_in_gemm in modes
        for paired in ((False, True) if args.paired else (False,))
    ]
    with ProcessPoolExecutor(max(1, min(args.jobs, len(jobs)))) as pool:
        rows = list(pool.map(survey_one, jobs))

    print(f"Triton {triton.__version__}, sm_90, {args.table.name}, max rank {args.max_rank}")
    print(f"{'config':<16} {'variant':<22} {'regs':>4} {'spill_st':>8} {'spill_ld':>8} {'ld_b16':>6} {'ld_vec':>6} "
          f"{'cp16':>5}")
    for row in rows:
        print(format_row(row))
    if args.json is not None:
        args.json.write_text(json.dumps({"triton": triton.__version__, "target": list(TARGET),
                                         "table": args.table.name, "rows": rows}, indent=1) + "\n")
    return rows


if __name__ == "__main__":
    main()
