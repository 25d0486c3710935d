"""Triton ATMM kernels (interpreter on CPU) against an fp64 computation and the torch path.

Tolerances, as relative Frobenius error ||out - ref|| / ||ref|| of the LoRA delta:
fp32 1e-5, fp16 5e-3. Triton 3.8's interpreter computes bf16 ``tl.dot`` wrongly (it
multiplies the bit patterns): bf16 is checked in tests/kernels/test_static_bf16.py with the
interpreter's dot corrected, and on the GPU by bench/kernels.py --check.
"""

from __future__ import annotations

import pytest
import torch

from sglang_vlora.atmm import ops, split_k, triton_kernels
from sglang_vlora.atmm.static_items import StaticWorkItems
from sglang_vlora.atmm.tiling import ExpandConfig, ShrinkConfig
from sglang_vlora.atmm.work_items import WorkItems, build_work_items
from tests.kernels.lora_reference import launch_apply, ref_delta, rel_err

TOL = {torch.float32: 1e-5, torch.float16: 5e-3}
D_IN = 48
SLICES = {1: [0, 40], 2: [0, 24, 48], 3: [0, 32, 40, 48]}
RANKS = [0, 8, 16, 24]  # slot 0 has rank 0: the no-adapter slot
SHRINK_CFGS = [
    ShrinkConfig(16, 16, 16, 1),
    ShrinkConfig(32, 32, 32, 2),
    ShrinkConfig(16, 64, 16, 3),
]
EXPAND_CFGS = [
    ExpandConfig(16, 16, 16),
    ExpandConfig(32, 32, 16),
    ExpandConfig(16, 64, 32),
]


def make_pool(num_slices: int, dtype: torch.dtype, gen: torch.Generator):
    offsets = SLICES[num_slices]
    max_rank = max(RANKS)
    a = torch.randn(len(RANKS), num_slices * max_rank, D_IN, generator=gen) / D_IN**0.5
    b = torch.randn(len(RANKS), offsets[-1], max_rank, generator=gen) / max_rank**0.5
    return a.to(dtype), b.to(dtype), offsets


def fp64_delta(x, a, b, offsets, seg_starts, seg_lens, slots, scales, perm=None):
    """The fp64 reference over this module's :data:`RANKS`."""
    return ref_delta(x, a, b, offsets, RANKS, seg_starts, seg_lens, slots, scales, perm)


def kernel_apply(x, a, b, items: WorkItems, offsets, out, scfg, ecfg):
    """The CUDA path of ops.lora_apply with explicit tile configs."""
    rows = (items.total_rows, min(items.total_rows, out.shape[0]))
    return launch_apply(triton_kernels, x, a, b, items, offsets, out, (scfg, ecfg), rows, paired=True)[1]


CASES = {
    # name: (n_tokens, seg_starts, seg_lens, slots, scales, permute)
    "ragged_mixed_ranks": (
        37,
        [0, 5, 5, 22],
        [5, 0, 17, 15],
        [1, 2, 3, 2],
        [0.5, 1.0, 2.0, -1.0],
        False,
    ),
    "one_token": (1, [0], [1], [3], [1.0], False),
    "overlap_signed": (
        20,
        [0, 0, 12, 3],
        [12, 12, 8, 14],
        [1, 3, 2, 2],
        [1.0, -0.7, 0.3, -1.5],
        False,
    ),
    "permuted": (29, [0, 10, 21], [10, 11, 8], [2, 1, 3], [1.0, 0.25, -2.0], True),
    "rank0_slot": (18, [0, 9], [9, 9], [0, 2], [1.0, 1.0], True),
    # 20 items (more than one 16-wide tile-search vector), ragged, some empty
    "many_items": (
        41,
        [0, 3, 3, 4, 9, 11, 15, 15, 16, 17, 19, 25, 26, 29, 31, 32, 33, 35, 38, 39],
        [3, 0, 1, 5, 2, 4, 0, 1, 1, 2, 6, 1, 3, 2, 1, 1, 2, 3, 1, 2],
        [1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2, 3, 1, 2],
        [0.5, -0.5] * 10,
        True,
    ),
}


@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("num_slices", [1, 2, 3])
def test_kernel_apply_matches_fp64(case: str, num_slices: int) -> None:
    gen = torch.Generator().manual_seed(hash((case, num_slices)) % 2**31)
    dtype = torch.float32 if num_slices != 2 else torch.float16
    n_tokens, starts, lens, slots, scales, permute = CASES[case]
    a, b, offsets = make_pool(num_slices, dtype, gen)
    x = torch.randn(n_tokens, D_IN, generator=gen).to(dtype)
    perm = torch.randperm(n_tokens, generator=gen) if permute else None
    items = build_work_items(starts, lens, slots, scales, RANKS, permutation=perm)
    ref = fp64_delta(x, a, b, offsets, starts, lens, slots, scales, perm)
    for scfg, ecfg in zip(SHRINK_CFGS, EXPAND_CFGS, strict=True):
        base = torch.randn(n_tokens, offsets[-1], generator=gen).to(dtype)
        out = kernel_apply(x, a, b, items, offsets, base.clone(), scfg, ecfg)
        assert rel_err(out.double() - base.double(), ref) < TOL[dtype], (scfg, ecfg)
        assert not split_k.split_counters(x.device).any()  # re-armed for the next launch
        torch_out = ops.lora_apply(x, a, b, items, offsets, base.clone())
        assert rel_err(torch_out.double() - base.double(), ref) < TOL[dtype]


# Mixture's pairs (sglang_vlora.modes.delora): +x items each absorbing the -k item of their
# run (coalesced over several requests, so partners start at an offset into it), a base-only
# run whose -k item stands alone, and the merged slot's own request (no item).
PAIRED_SEGMENTS = ([0, 5, 9, 16, 20, 27], [5, 4, 7, 4, 7, 3], [1, 2, 0, 3, 1, 2])


@pytest.mark.parametrize("permute", [False, True])
@pytest.mark.parametrize("num_slices", [1, 3])
def test_paired_expand_one_launch_matches_fp64(num_slices: int, permute: bool) -> None:
    from sglang_vlora.modes.delora import mode_item_lists

    gen = torch.Generator().manual_seed(17 + num_slices + 2 * permute)
    starts, lens, slots = PAIRED_SEGMENTS
    n_tokens = starts[-1] + lens[-1]
    scalings = [0.0, 2.0, 0.5, 1.5]
    lists = mode_item_lists(starts, lens, slots, RANKS, scalings, merged_slot=3)
    a, b, offsets = make_pool(num_slices, torch.float32, gen)
    x = torch.randn(n_tokens, D_IN, generator=gen)
    perm = torch.randperm(n_tokens, generator=gen) if permute else None
    items = build_work_items(*lists[:4], RANKS, permutation=perm, partners=lists[4])
    assert items.partners_host is not None and items.num_layers == 2
    ref = fp64_delta(x, a, b, offsets, *lists[:4], perm)
    for scfg, ecfg in zip(SHRINK_CFGS, EXPAND_CFGS, strict=True):
        base = torch.randn(n_tokens, offsets[-1], generator=gen)
        out = kernel_apply(x, a, b, items, offsets, base.clone(), scfg, ecfg)
        assert rel_err(out.double() - base.double(), ref) < 1e-5, (scfg, ecfg)
        unpaired = launch_apply(triton_kernels, x, a, b, items, offsets, base.clone(), (scfg, ecfg),
                                (items.total_rows, n_tokens))[1]  # fmt: skip
        assert rel_err(unpaired.double() - base.double(), ref) < 1e-5, (scfg, ecfg)


def test_paired_static_one_launch_any_batch() -> None:
    """Buffers with ``paired`` (one expand launch, as a graph of a merging server captures it)
    stay right for mixture, unmerged and empty batches filled one after another."""
    from sglang_vlora.modes.delora import mode_item_lists

    gen = torch.Generator().manual_seed(21)
    a, b, offsets = make_pool(3, torch.float32, gen)
    starts, lens, slots = PAIRED_SEGMENTS
    n_tokens = starts[-1] + lens[-1]
    scalings = [0.0, 2.0, 0.5, 1.5]
    static = StaticWorkItems.allocate(capacity=12, max_tokens=n_tokens, num_slots=len(RANKS), device="cpu",
                                      max_layers=2, paired=True)  # fmt: skip
    x = torch.randn(n_tokens, D_IN, generator=gen)
    for merged in (3, None, 1, 2, None):
        lists = mode_item_lists(starts, lens, slots, RANKS, scalings, merged)
        items = build_work_items(*lists[:4], RANKS, partners=lists[4])
        static.fill(items, n_tokens)
        base = torch.randn(n_tokens, offsets[-1], generator=gen)
        out = ops.lora_apply_static(x, a, b, static, offsets, base.clone())
        ref = fp64_delta(x, a, b, offsets, *lists[:4])
        assert rel_err(out.double() - base.double(), ref) < 1e-5, merged
    overlapping = build_work_items([0, 0], [8, 8], [1, 2], [1.0, 1.0], RANKS)  # overlap that is no pair
    with pytest.raises(ValueError, match="without pairs"):
        static.fill(overlapping, n_tokens)


def test_public_shrink_writes_whole_output() -> None:
    """Kernel shrink output equals the reference's, zero columns past S*r included."""
    gen = torch.Generator().manual_seed(3)
    a, _, _ = make_pool(3, torch.float32, gen)
    x = torch.randn(21, D_IN, generator=gen)
    items = build_work_items([0, 4, 4], [4, 17, 9], [1, 3, 2], [1.0, 1.0, -1.0], RANKS)
    ref = ops.lora_shrink(x, a, items, 3)
    got = ops._shrink_kernel(x, a, items, 3)
    assert got.shape == ref.shape
    assert rel_err(got, ref.double()) < 1e-5


def test_public_expand_kernel_matches_torch() -> None:
    gen = torch.Generator().manual_seed(4)
    a, b, offsets = make_pool(2, torch.float32, gen)
    x = torch.randn(16, D_IN, generator=gen)
    items = build_work_items([0, 6], [6, 10], [3, 1], [1.0, -0.5], RANKS)
    inter = ops.lora_shrink(x, a, items, 2)
    base = torch.randn(16, offsets[-1], generator=gen)
    ref = ops.lora_expand(inter, b, items, offsets, base.clone())
    got = ops._expand_kernel(inter, b, items, offsets, base.clone())
    assert rel_err(got - base, (ref - base).double()) < 1e-5


def test_static_refill_any_item_count() -> None:
    """One fixed grid (as a captured graph has) stays right for 0..3 items and overlap."""
    gen = torch.Generator().manual_seed(5)
    a, b, offsets = make_pool(3, torch.float32, gen)
    n_tokens = 24
    static = StaticWorkItems.allocate(
        capacity=6,
        max_tokens=n_tokens,
        num_slots=len(RANKS),
        device="cpu",
        max_layers=2,
    )
    x = torch.randn(n_tokens, D_IN, generator=gen)
    batches = [
        ([], [], [], []),
        ([0], [24], [2], [1.0]),
        ([0, 10, 20], [10, 10, 4], [3, 1, 0], [1.0, 2.0, 1.0]),
        ([0, 0, 16], [16, 16, 8], [1, 2, 3], [1.0, -1.0, 0.5]),
        ([0], [7], [3], [1.0]),  # stale entries from the batch before must be ignored
    ]
    for starts, lens, slots, scales in batches:
        perm = torch.randperm(n_tokens, generator=gen)
        items = build_work_items(starts, lens, slots, scales, RANKS, permutation=perm)
        static.fill(items, n_tokens)
        base = torch.randn(n_tokens, offsets[-1], generator=gen)
        out = ops.lora_apply_static(x, a, b, static, offsets, base.clone())
        ref = fp64_delta(x, a, b, offsets, starts, lens, slots, scales, perm)
        if not starts:
            assert torch.equal(out, base)
        else:
            assert rel_err(out.double() - base.double(), ref) < 1e-5


def test_static_separate_shrink_expand() -> None:
    gen = torch.Generator().manual_seed(6)
    a, b, offsets = make_pool(1, torch.float32, gen)
    static = StaticWorkItems.allocate(capacity=4, max_tokens=12, num_slots=len(RANKS), device="cpu")
    x = torch.randn(12, D_IN, generator=gen)
    items = build_work_items([0, 5], [5, 7], [1, 3], [1.0, 1.0], RANKS)
    static.fill(items, 12)
    inter = ops.lora_shrink_static(x, a, static, 1)
    assert inter.shape == (12, a.shape[1])
    base = torch.randn(12, offsets[-1], generator=gen)
    out = ops.lora_expand_static(inter, b, static, offsets, base.clone())
    ref = fp64_delta(x, a, b, offsets, [0, 5], [5, 7], [1, 3], [1.0, 1.0])
    assert rel_err(out.double() - base.double(), ref) < 1e-5


def test_static_fill_rejects_overflow() -> None:
    static = StaticWorkItems.allocate(capacity=1, max_tokens=8, num_slots=len(RANKS), device="cpu")
    items = build_work_items([0, 4], [4, 4], [1, 2], [1.0, 1.0], RANKS)
    with pytest.raises(ValueError):
        static.fill(items, 8)


def test_static_with_base_matches() -> None:
    """Without CUDA the overlapped entry point runs shrink, base, expand in sequence."""
    gen = torch.Generator().manual_seed(8)
    a, b, offsets = make_pool(2, torch.float32, gen)
    static = StaticWorkItems.allocate(capacity=4, max_tokens=10, num_slots=len(RANKS), device="cpu")
    x = torch.randn(10, D_IN, generator=gen)
    items = build_work_items([0, 3], [3, 7], [2, 3], [1.0, -1.0], RANKS)
    static.fill(items, 10)
    base = torch.randn(10, offsets[-1], generator=gen)
    out = ops.lora_apply_static_with_base(x, a, b, static, offsets, base.clone)
    ref = fp64_delta(x, a, b, offsets, [0, 3], [3, 7], [2, 3], [1.0, -1.0])
    assert rel_err(out.double() - base.double(), ref) < 1e-5
