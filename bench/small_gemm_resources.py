"""Shared memory, registers and spills of the one-launch small-batch kernel, compiled ahead.

    python bench/small_gemm_resources.py [--archs 80 86 89 90] [--ranks 16 32 64 128] [--out DIR --tag TAG]

Needs no GPU. For Qwen2-VL-7B's q/k/v (three slices, bias) and o (one slice) modules with the
pool's A rows appended, and each pool max rank of ``--ranks``, it builds the launch
``sglang_vlora.atmm.small_gemm`` makes (its ``CONFIG``, on meta tensors, bf16, four pool slots),
compiles it for each compute capability of ``--archs`` with Triton's own binder and the ptxas
bundled with Triton, and reads back the shared memory the compiled kernel asks for
(``metadata.shared``: what the driver checks against the GPU's limit at load) and the
registers and spill bytes from ptxas's log.

Why: the kernel holds an A tile of the pool's max rank in every pipeline stage, so its shared
memory grows with the rank; ``small_gemm.MAX_RANK`` caps what the server runs through it. A rank
above that cap is compiled as the kernel would be with the cap raised (``small_gemm.launch_args``,
which does not apply the cap: what it would need, not what the server runs).
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import asdict
from pathlib import Path

import torch
import triton

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.expand_registers import compile_for, ptxas_counts  # noqa: E402
from sglang_vlora.atmm import small_gemm  # noqa: E402
from sglang_vlora.atmm.static_items import StaticWorkItems  # noqa: E402

HIDDEN, KV = 3584, 512  # Qwen2-VL-7B
MODULES = {"qkv": ((HIDDEN, KV, KV), True), "o": ((HIDDEN,), False)}  # slice widths, bias
SLOTS = 4
TOKENS = 64  # the default limit of --vlora-eager-small-gemm-max-tokens; no compiled variant depends on it


def small_gemm_launch(widths: tuple[int, ...], has_bias: bool, max_rank: int) -> tuple[tuple, dict]:
    """``(args, constexprs)`` of the kernel's launch for this module, on meta tensors."""
    meta = {"dtype": torch.bfloat16, "device": "meta"}
    offsets = [0]
    for width in widths:
        offsets.append(offsets[-1] + width)
    n = offsets[-1]
    x = torch.empty(TOKENS, HIDDEN, **meta)
    weight = torch.empty(n + SLOTS * len(widths) * max_rank, HIDDEN, **meta)
    bias = torch.empty(weight.shape[0], **meta) if has_bias else None
    a_buffer = torch.empty(SLOTS, len(widths) * max_rank, HIDDEN, **meta)
    b_buffer = torch.empty(SLOTS, n, max_rank, **meta)
    output = torch.empty(TOKENS, n, **meta)
    items = StaticWorkItems.allocate(capacity=8, max_tokens=TOKENS, num_slots=SLOTS, device="cpu", covers_tokens=True)
    _, args, constexprs = small_gemm.launch_args(x, weight, bias, a_buffer, b_buffer, output, items, offsets, TOKENS,
                                                 small_gemm.CONFIG)
    return tuple(a.to("meta") if isinstance(a, torch.Tensor) else a for a in args), constexprs


def survey_one(arch: int, module: str, max_rank: int) -> dict:
    widths, has_bias = MODULES[module]
    args, constexprs = small_gemm_launch(widths, has_bias, max_rank)
    config = small_gemm.CONFIG
    kernel, log = compile_for(small_gemm._small_gemm_lora_kernel, args, constexprs, config.num_warps,
                              config.num_stages, ("cuda", arch, 32))
    return {"arch": arch, "module": module, "max_rank": max_rank, "above_cap": max_rank > small_gemm.MAX_RANK,
            "shared_bytes": kernel.metadata.shared, **ptxas_counts(log)}


def main(argv: list[str] | None = None) -> list[dict]:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--archs", type=int, nargs="+", default=[80, 86, 89, 90],
                    help="compute capabilities, as 90 for sm_90 (default: 80 86 89 90)")
    ap.add_argument("--ranks", type=int, nargs="+", default=[16, 32, 64, 128], help="pool max ranks")
    ap.add_argument("--modules", nargs="+", choices=sorted(MODULES), default=sorted(MODULES))
    ap.add_argument("--out", type=Path, default=None, help="write OUT/TAG.json")
    ap.add_argument("--tag", default="small_gemm_resources")
    args = ap.parse_args(argv)
    if any(arch < 80 for arch in args.archs):
        ap.error("the kernel runs bf16 dots: compute capability 80 or more")
    if any(rank < 1 for rank in args.ranks):
        ap.error("--ranks must be at least 1")
    if not isinstance(small_gemm._small_gemm_lora_kernel, triton.runtime.JITFunction):
        ap.error("the kernel is Triton's interpreter's here: unset TRITON_INTERPRET")

    rows = [survey_one(arch, module, rank) for arch in args.archs for module in args.modules for rank in args.ranks]
    config = small_gemm.CONFIG
    print(f"Triton {triton.__version__}; config {config}; cap small_gemm.MAX_RANK = {small_gemm.MAX_RANK}")
    print(f"{'arch':>5} {'module':<6} {'rank':>4} {'shared KB':>9} {'regs':>4} {'spill_st':>8} {'spill_ld':>8}")
    for r in rows:
        mark = " (above the cap)" if r["above_cap"] else ""
        print(f"sm_{r['arch']:<2} {r['module']:<6} {r['max_rank']:>4} {r['shared_bytes'] / 1024:>9.1f} {r['regs']:>4} "
              f"{r['spill_st']:>8} {r['spill_ld']:>8}{mark}")
    if args.out is not None:
        from bench import provenance

        doc = {"what": "shared memory (metadata.shared, bytes), registers and spill bytes of the one-launch "
                       "small-batch kernel (sglang_vlora/atmm/small_gemm.py) compiled ahead per compute "
                       "capability, Qwen2-VL-7B q/k/v and o modules with the pool's A rows appended, bf16",
               "triton": triton.__version__, "config": asdict(config), "max_rank_cap": small_gemm.MAX_RANK,
               "slots": SLOTS, "rows": rows}
        path = provenance.write_results(args.out, args.tag, doc, "bench/small_gemm_resources.py",
                                        sys.argv[1:] if argv is None else list(argv))
        print(f"wrote {path}")
    return rows


if __name__ == "__main__":
    main()
