"""GPU check: the first eager call of a shape compiles the Triton kernel of every config
the tiling table may pick for it, both expand variants included (plain items, and a
mixture batch's pairs), so a token count or a mixture batch first seen
while serving launches an already compiled kernel; and the switch kernels compiled at start-up
serve every merge, switch and unmerge (skipped without CUDA or under Triton's interpreter)."""

from __future__ import annotations

import os

import pytest
import torch

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1",
    reason="needs a CUDA GPU and compiled Triton",
)


def _compiled(kernel) -> int:
    return sum(len(cache[0]) for cache in kernel.device_caches.values())


def test_first_call_of_a_shape_compiles_every_table_config() -> None:
    from sglang_vlora.atmm import ops, tiling, triton_kernels
    from sglang_vlora.atmm.work_items import build_work_items
    from sglang_vlora.modes.delora import mode_work_items

    k, rank, widths = 1152, 48, (1152, 256, 256)  # a shape no other test uses
    dev = ops._device_name(torch.empty(1, device="cuda"))
    shrink_cfgs = tiling.triton_configs(dev, "shrink", {"k": k, "n": 3 * rank})
    expand_cfgs = tiling.triton_configs(dev, "expand", {"n": sum(widths), "s": 3, "r": rank})
    a = torch.randn(2, 3 * rank, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(2, sum(widths), rank, device="cuda", dtype=torch.bfloat16)
    offsets = [0, widths[0], widths[0] + widths[1], sum(widths)]
    x = torch.randn(40, k, device="cuda", dtype=torch.bfloat16)
    items = build_work_items([0], [40], [1], [1.0], [0, rank], device="cuda")
    ops.lora_apply(x, a, b, items, offsets, torch.zeros(40, sum(widths), device="cuda", dtype=x.dtype))
    after = _compiled(triton_kernels._shrink_kernel), _compiled(triton_kernels._expand_kernel)
    # A variant compiled for another shape with the same configs, dtypes and alignments serves
    # this one too (the expand kernel specialises no size), so an earlier test may have compiled
    # some: the first call compiles what is missing, and no launch below compiles anything.
    assert after[0] >= len(shrink_cfgs) and after[1] >= 2 * len(expand_cfgs)  # plain and paired expand
    # another token count of the same shape compiles nothing new
    x = torch.randn(3000, k, device="cuda", dtype=torch.bfloat16)
    items = build_work_items([0], [3000], [1], [1.0], [0, rank], device="cuda")
    ops.lora_apply(x, a, b, items, offsets, torch.zeros(3000, sum(widths), device="cuda", dtype=x.dtype))
    torch.cuda.synchronize()
    assert (_compiled(triton_kernels._shrink_kernel), _compiled(triton_kernels._expand_kernel)) == after
    # nor does a mixture batch (+x items absorbing their -k item: the expand's pairs variant)
    a3 = torch.randn(3, 3 * rank, k, device="cuda", dtype=torch.bfloat16)
    b3 = torch.randn(3, sum(widths), rank, device="cuda", dtype=torch.bfloat16)
    items = mode_work_items([0, 500], [500, 700], [1, 0], [0, rank, rank], [0.0, 1.0, 0.5], 2, device="cuda")
    assert items.num_layers == 2
    x = torch.randn(1200, k, device="cuda", dtype=torch.bfloat16)
    ops.lora_apply(x, a3, b3, items, offsets, torch.zeros(1200, sum(widths), device="cuda", dtype=x.dtype))
    torch.cuda.synchronize()
    assert (_compiled(triton_kernels._shrink_kernel), _compiled(triton_kernels._expand_kernel)) == after


def test_prefill_token_counts_compile_nothing_at_launch() -> None:
    """The benchmark model's q/k/v shape at rank 64, whose prefill configs split K on the
    H200 and H100 tables: no launch of any token count, plain or mixture, compiles (the
    compile-ahead compiles exactly the variants launches use; tests/kernels/test_compile_ahead_keys.py)."""
    from sglang_vlora.atmm import ops
    from sglang_vlora.atmm.launch_compiles import LAUNCH_COMPILES
    from sglang_vlora.atmm.work_items import build_work_items
    from sglang_vlora.modes.delora import mode_work_items

    k, rank, widths = 3584, 64, (3584, 512, 512)
    offsets = [0, widths[0], widths[0] + widths[1], sum(widths)]
    a = torch.randn(3, 3 * rank, k, device="cuda", dtype=torch.bfloat16) * 0.02
    b = torch.randn(3, sum(widths), rank, device="cuda", dtype=torch.bfloat16) * 0.02
    before = LAUNCH_COMPILES.count
    for tokens in (40, 273, 601, 1001, 2500):
        x = torch.randn(tokens, k, device="cuda", dtype=torch.bfloat16)
        items = build_work_items([0], [tokens], [1], [1.0], [0, rank, rank], device="cuda")
        ops.lora_apply(x, a, b, items, offsets, torch.zeros(tokens, sum(widths), device="cuda", dtype=x.dtype))
        half = tokens // 2
        mixture = mode_work_items([0, half], [half, tokens - half], [1, 0], [0, rank, rank], [0.0, 1.0, 0.5], 2,
                                  device="cuda")
        ops.lora_apply(x, a, b, mixture, offsets, torch.zeros(tokens, sum(widths), device="cuda", dtype=x.dtype))
    torch.cuda.synchronize()
    assert LAUNCH_COMPILES.count == before, LAUNCH_COMPILES.snapshot()


def test_lora_in_gemm_compiled_ahead_serves_every_token_count() -> None:
    """``gemm_lora.compile_ahead`` (what the backend runs for a captured module shape) compiles
    the one variant that eager batches of any token count then launch."""
    from sglang_vlora.atmm import gemm_lora, ops
    from sglang_vlora.atmm.work_items import build_work_items

    k, rank, offsets = 896, 32, [0, 768, 1024, 1280]  # a shape no other test uses
    a = torch.randn(2, 3 * rank, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(2, offsets[-1], rank, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(offsets[-1], k, device="cuda", dtype=torch.bfloat16)
    bias = torch.randn(offsets[-1], device="cuda", dtype=torch.bfloat16)
    assert gemm_lora.compile_ahead(torch.empty(16, k, device="cuda", dtype=torch.bfloat16), a, b, offsets, True)
    before = _compiled(gemm_lora._gemm_lora_kernel)
    assert before >= 1
    for m in (1000, 1536, 4097):
        x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        items = build_work_items([0], [m], [1], [1.0], [0, rank], device="cuda")
        ops.lora_apply_gemm(x, w, bias, a, b, items, offsets)
    torch.cuda.synchronize()
    assert _compiled(gemm_lora._gemm_lora_kernel) == before


@pytest.mark.parametrize("offsets", [[0, 1024, 1280, 1536], [0, 1152]])
def test_eager_in_gemm_compiled_ahead_serves_every_token_count(offsets: list[int]) -> None:
    """``ops.compile_in_gemm`` (what the backend runs for a captured module shape with the pool's
    rows appended, over its one-layer buffers and then its paired ones) compiles every in-GEMM
    expand config the table may pick for both buffer sets, so eager in-GEMM batches of any token
    count up to the limit, unmerged or mixture, compile nothing at launch. Three slices (no
    PDL) and one (PDL up to 48 rows, so batches of 40 and of more rows launch both variants)."""
    from sglang_vlora.atmm import ops
    from sglang_vlora.atmm.launch_compiles import LAUNCH_COMPILES
    from sglang_vlora.atmm.static_items import StaticWorkItems
    from sglang_vlora.modes.delora import mode_work_items

    k, rank, slots = 1024, 48, 3  # shapes no other test uses
    extra = slots * (len(offsets) - 1) * rank
    weight = torch.randn(offsets[-1] + extra, k, device="cuda", dtype=torch.bfloat16) * k**-0.5
    b = torch.randn(slots, offsets[-1], rank, device="cuda", dtype=torch.bfloat16) * rank**-0.5
    buffers = {paired: StaticWorkItems.allocate(capacity=8, max_tokens=1024, num_slots=slots, device="cuda",
                                                max_layers=2 if paired else 1, paired=paired, covers_tokens=True)
               for paired in (False, True)}
    for paired in (False, True):  # the backend's order
        ops.compile_in_gemm(torch.empty(16, k, device="cuda", dtype=torch.bfloat16), weight.shape[0], offsets[-1], b,
                            buffers[paired], offsets)
    before, plans = LAUNCH_COMPILES.count, {}
    for tokens in (40, 273, 601, 1024):
        half = tokens // 2
        for paired, merged in ((False, None), (True, 2)):  # unmerged, then mixture (pairs)
            work = mode_work_items([0, half], [half, tokens - half], [1, 0], [0, rank, rank], [0.0, 1.0, 0.5],
                                   merged, device="cuda")
            items = buffers[paired]
            items.fill(work, tokens, cover_to=tokens)  # an eager batch's output has its own rows
            x = torch.randn(tokens, k, device="cuda", dtype=torch.bfloat16)
            ops.lora_apply_static_in_gemm(x, weight, None, offsets[-1], b, items, offsets, plans=plans)
    torch.cuda.synchronize()
    assert LAUNCH_COMPILES.count == before, LAUNCH_COMPILES.snapshot()


def test_switches_compile_nothing_after_the_compile_ahead() -> None:
    """After ``fold_kernel.compile_ahead`` (what the mode controller runs at start-up for the
    loaded adapters' ranks) the switcher's merges, switches and unmerges compile nothing (the
    CPU test of the same by launch keys is tests/modes/test_fold_compile_ahead.py)."""
    from sglang_vlora.atmm.launch_compiles import LAUNCH_COMPILES
    from sglang_vlora.modes import fold_kernel
    from sglang_vlora.modes.switcher import LoRADelta, SwiftSwitcher, slice_kinds

    hidden, kv, layers = 3584, 512, 2
    qkv = torch.randn(layers, hidden + 2 * kv, hidden, device="cuda", dtype=torch.bfloat16) * 0.02
    kinds = {**slice_kinds(qkv, ["q", "k", "v"], [0, hidden, hidden + kv, hidden + 2 * kv]),
             "o": torch.randn(layers, hidden, hidden, device="cuda", dtype=torch.bfloat16) * 0.02}
    ranks = (8, 64)
    for weights in kinds.values():
        fold_kernel.compile_ahead(weights, ranks)
    before, counted = _compiled(fold_kernel._fold_kernel), LAUNCH_COMPILES.count
    pristine_o = kinds["o"].clone()
    switcher = SwiftSwitcher(kinds, exact=True)
    deltas = {rank: {name: LoRADelta(
        a=torch.randn(layers, rank, w.shape[2], device="cuda", dtype=w.dtype) * 0.1,
        b=torch.randn(layers, w.shape[1], rank, device="cuda", dtype=w.dtype) * 0.1, scaling=0.5)
        for name, w in kinds.items()} for rank in (*ranks, 32)}
    for rank, delta in deltas.items():
        switcher.add_adapter(f"r{rank}", delta)
    for target in ("r8", "r64", None, "r64", None):
        switcher.switch(target)
    torch.cuda.synchronize()
    assert _compiled(fold_kernel._fold_kernel) == before and LAUNCH_COMPILES.count == counted
    assert torch.equal(kinds["o"], pristine_o)  # unmerged: the base weights bit for bit
    switcher.switch("r32")  # a rank not compiled ahead compiles now, and shows in kernel_compiles
    torch.cuda.synchronize()
    o = deltas[32]["o"]
    expected = pristine_o.float() + 0.5 * torch.bmm(o.b.float(), o.a.float())
    # the delta (about 0.03 an element) is there, rounded once to bf16
    torch.testing.assert_close(kinds["o"].float(), expected, atol=1e-3, rtol=1e-2)
    compiled = LAUNCH_COMPILES.snapshot()["by_variant"]
    assert LAUNCH_COMPILES.count > counted and any(v.startswith("_fold_kernel") and "BLOCK_R=32" in v for v in compiled)


def test_variants_compiled_ahead_are_loaded_with_their_launchers() -> None:
    """Triton's warmup compiles a variant but loads it (module and C launcher) at its first launch,
    which with a cold Triton cache runs the C compiler in a request's time: compiled ahead, a
    variant is loaded too (``launch_compiles.compile_and_load``)."""
    from sglang_vlora.atmm import ops, small_gemm, triton_kernels
    from sglang_vlora.atmm.static_items import StaticWorkItems

    k, rank, out = 1216, 24, (1216, 192, 192)  # a shape no other test uses
    offsets = [0, out[0], out[0] + out[1], sum(out)]
    a = torch.randn(3, 3 * rank, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(3, sum(out), rank, device="cuda", dtype=torch.bfloat16)
    static = StaticWorkItems.allocate(capacity=5, max_tokens=512, num_slots=3, device="cuda", covers_tokens=True)
    x = torch.empty(16, k, device="cuda", dtype=torch.bfloat16)
    ops.compile_small_gemm(x, sum(out) + 3 * 3 * rank, False, a, b, static, offsets)
    ops.compile_in_gemm(x, sum(out) + 3 * 3 * rank, sum(out), b, static, offsets)
    kernels = (small_gemm._small_gemm_lora_kernel, triton_kernels._expand_kernel, triton_kernels._shrink_kernel)
    variants = [kernel for fn in kernels for cache in fn.device_caches.values() for kernel in cache[0].values()]
    assert variants and all(kernel.module is not None for kernel in variants), [
        kernel.name for kernel in variants if kernel.module is None]
