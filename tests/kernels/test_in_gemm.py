"""The shrink inside the base GEMM (``ops.lora_apply_static_in_gemm``): the Triton expand (the
interpreter on CPU) and its torch form against an fp64 ``x W^T + b + LoRA``, for unmerged and
mixture batches, base-only tokens, permuted and padded batches, and buffers refilled with
smaller batches after larger ones. Tolerance: relative Frobenius error 1e-5 (fp32)."""

from __future__ import annotations

import pytest
import torch

from sglang_vlora.atmm import ops
from sglang_vlora.atmm.static_items import StaticWorkItems, gaps
from sglang_vlora.atmm.work_items import ABSORBED, NO_PARTNER, build_work_items
from sglang_vlora.modes.delora import mode_item_lists
from tests.kernels.lora_reference import ref_delta, rel_err
from tests.triton_interpreter import use_triton_interpreter

D_IN = 48
OFFSETS = [0, 32, 40, 48]  # three slices, as q/k/v
RANKS = [0, 8, 16, 24]  # slot 0 has rank 0: the no-adapter slot
SCALINGS = [0.0, 2.0, 0.5, 1.5]
MAX_RANK = max(RANKS)


def extended(gen: torch.Generator):
    """Base weight and bias, the pool, and the base weight with every slot's A rows appended."""
    w = torch.randn(OFFSETS[-1], D_IN, generator=gen) / D_IN**0.5
    bias = torch.randn(OFFSETS[-1], generator=gen)
    a = torch.randn(len(RANKS), 3 * MAX_RANK, D_IN, generator=gen) / D_IN**0.5
    b = torch.randn(len(RANKS), OFFSETS[-1], MAX_RANK, generator=gen) / MAX_RANK**0.5
    w_ext = torch.cat([w, a.reshape(-1, D_IN)])
    bias_ext = torch.cat([bias, torch.zeros(a.shape[0] * a.shape[1])])
    return w, bias, a, b, w_ext, bias_ext


def reference(x, w, bias, a, b, lists, perm=None) -> torch.Tensor:
    return x.double() @ w.double().T + bias.double() + ref_delta(x, a, b, OFFSETS, RANKS, *lists[:4], perm)


def allocate(num_tokens: int, paired: bool) -> StaticWorkItems:
    return StaticWorkItems.allocate(capacity=12, max_tokens=num_tokens, num_slots=len(RANKS), device="cpu",
                                    max_layers=2 if paired else 1, paired=paired, covers_tokens=True)


# (segment starts, lengths, slots): adapters, base-only (slot 0) and the merged slot's runs
SEGMENTS = ([0, 5, 9, 16, 20, 27], [5, 4, 7, 4, 7, 3], [1, 2, 0, 3, 1, 2])


@pytest.mark.parametrize("interpret", [False, True], ids=["torch", "triton"])
@pytest.mark.parametrize("merged", [None, 1, 2])
def test_in_gemm_matches_fp64_for_unmerged_and_mixture_batches(interpret, merged, monkeypatch) -> None:
    if interpret:
        use_triton_interpreter(monkeypatch)
    else:
        monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    gen = torch.Generator().manual_seed(31 + (merged or 0))
    w, bias, a, b, w_ext, bias_ext = extended(gen)
    starts, lens, slots = SEGMENTS
    n = starts[-1] + lens[-1]
    static = allocate(n, paired=True)
    lists = mode_item_lists(starts, lens, slots, RANKS, SCALINGS, merged)
    static.fill(build_work_items(*lists[:4], RANKS, partners=lists[4]), n)
    x = torch.randn(n, D_IN, generator=gen)
    out = ops.lora_apply_static_in_gemm(x, w_ext, bias_ext, OFFSETS[-1], b, static, OFFSETS)
    assert out.shape == (n, OFFSETS[-1]) and out.is_contiguous()
    assert rel_err(out, reference(x, w, bias, a, b, lists)) < 1e-5


@pytest.mark.parametrize("interpret", [False, True], ids=["torch", "triton"])
def test_in_gemm_refills_permuted_padded_and_smaller_batches(interpret, monkeypatch) -> None:
    """One fixed set of buffers, as a captured graph has: batches of fewer tokens than the
    graph's rows (the padding rows get the base output), permuted batches followed by smaller
    ones (the positions past the batch must not read the earlier permutation), empty ones."""
    if interpret:
        use_triton_interpreter(monkeypatch)
    else:
        monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    gen = torch.Generator().manual_seed(7)
    w, bias, a, b, w_ext, bias_ext = extended(gen)
    rows = 24  # the graph's rows
    static = allocate(rows, paired=False)
    batches = [  # (tokens in the batch, starts, lens, slots, scales, permuted)
        (24, [0, 10], [10, 14], [3, 1], [1.0, 2.0], True),
        (9, [0, 4], [4, 5], [2, 3], [0.5, -1.0], True),
        (9, [2], [5], [1], [1.0], False),
        (16, [], [], [], [], False),
        (20, [0, 6, 12], [6, 6, 8], [1, 2, 3], [1.0, 1.0, 1.0], True),
    ]
    for tokens, starts, lens, slots, scales, permuted in batches:
        perm = torch.randperm(tokens, generator=gen) if permuted else None
        items = build_work_items(starts, lens, slots, scales, RANKS, permutation=perm)
        static.fill(items, tokens)
        x = torch.randn(rows, D_IN, generator=gen)
        full_perm = None if perm is None else torch.cat([perm, torch.arange(tokens, rows)])
        ref = reference(x, w, bias, a, b, (starts, lens, slots, scales), full_perm)
        out = ops.lora_apply_static_in_gemm(x, w_ext, bias_ext, OFFSETS[-1], b, static, OFFSETS)
        assert rel_err(out, ref) < 1e-5, (tokens, starts)


def test_in_gemm_needs_buffers_that_cover_every_token() -> None:
    gen = torch.Generator().manual_seed(8)
    _, _, _, b, w_ext, bias_ext = extended(gen)
    static = StaticWorkItems.allocate(capacity=4, max_tokens=8, num_slots=len(RANKS), device="cpu")
    with pytest.raises(ValueError, match="cover every token"):
        ops.lora_apply_static_in_gemm(torch.randn(8, D_IN), w_ext, bias_ext, OFFSETS[-1], b, static, OFFSETS)
    with pytest.raises(ValueError, match="cover every token"):
        ops.KeptInGemmCall(w_ext, bias_ext, OFFSETS[-1], b, static, OFFSETS, 8, {})
    with pytest.raises(ValueError, match="do not hold"):
        ops.lora_apply_static_in_gemm(torch.randn(8, D_IN), w_ext[:-1], None, OFFSETS[-1], b, allocate(8, False),
                                      OFFSETS)
    with pytest.raises(ValueError, match="one layer of items"):
        StaticWorkItems.allocate(capacity=4, max_tokens=8, num_slots=4, device="cpu", max_layers=2,
                                 covers_tokens=True)


def test_separate_shrink_ignores_the_copy_items(monkeypatch) -> None:
    """Modules without the appended rows share the buffers: their shrink and expand skip the
    copy items (rank 0), so they get exactly what they get without them."""
    use_triton_interpreter(monkeypatch)
    gen = torch.Generator().manual_seed(9)
    _, _, a, b, _, _ = extended(gen)
    starts, lens, slots = SEGMENTS
    n = starts[-1] + lens[-1]
    lists = mode_item_lists(starts, lens, slots, RANKS, SCALINGS, 3)
    items = build_work_items(*lists[:4], RANKS, partners=lists[4])
    covering, plain = allocate(n, paired=True), allocate(n, paired=True)
    plain.covers_tokens = False
    covering.fill(items, n)
    plain.fill(items, n)
    x = torch.randn(n, D_IN, generator=gen)
    base = torch.randn(n, OFFSETS[-1], generator=gen)
    got = ops.lora_apply_static(x, a, b, covering, OFFSETS, base.clone())
    assert torch.equal(got, ops.lora_apply_static(x, a, b, plain, OFFSETS, base.clone()))
    assert rel_err(got - base, ref_delta(x, a, b, OFFSETS, RANKS, *lists[:4])) < 1e-5


def test_gaps_are_the_positions_no_kept_item_covers() -> None:
    items = build_work_items([2, 2, 9], [4, 4, 3], [1, 2, 3], [1.0, -1.0, 1.0], RANKS,
                             partners=[1, NO_PARTNER, NO_PARTNER])
    assert items.partners_host[1] == ABSORBED
    assert gaps(items, 16) == [(0, 2), (6, 3), (12, 4)]
    assert gaps(build_work_items([], [], [], [], RANKS), 5) == [(0, 5)]
    assert gaps(build_work_items([0], [5], [1], [1.0], RANKS), 5) == []


def test_eager_fill_covers_only_the_batch_tokens() -> None:
    """``fill(cover_to=n)`` (eager batches, whose output has exactly their rows) adds copy items up to
    ``n`` only; a bound below the batch's tokens or past the buffers is refused, nothing written."""
    items = build_work_items([2], [3], [1], [1.0], RANKS)
    static = allocate(16, False)
    static.fill(items, 8, cover_to=8)
    lens = static.seg_lens.tolist()
    assert (static.seg_starts.tolist()[:3], lens[:3], sum(lens)) == ([2, 0, 5], [3, 2, 3], 8)
    before = static.packed.clone()
    for cover_to in (7, 17):
        with pytest.raises(ValueError, match="copy items up to"):
            static.fill(items, 8, cover_to=cover_to)
    assert torch.equal(static.packed, before)


def test_kept_eager_expand_needs_copy_items_up_to_the_batch(monkeypatch) -> None:
    """An eager batch's in-GEMM expand kept for a token bound (``plans``) writes every row the
    copy items reach, and its output has only the batch's rows: buffers filled with copy items
    past the batch (the default ``cover_to``, the buffers' size) are refused before anything
    runs; filled with ``cover_to`` = the batch, two batches of one bound share a plan and match
    fp64."""
    use_triton_interpreter(monkeypatch)
    gen = torch.Generator().manual_seed(10)
    w, bias, a, b, w_ext, bias_ext = extended(gen)
    static, plans = allocate(64, paired=False), {}
    kept = ops.KeptInGemmCall(w_ext, bias_ext, OFFSETS[-1], b, static, OFFSETS, 16, plans)
    for tokens, lists in ((9, ([0, 4], [4, 5], [1, 3], [2.0, 1.5])), (13, ([3], [7], [2], [0.5]))):
        x = torch.randn(tokens, D_IN, generator=gen)
        items = build_work_items(*lists, RANKS)
        static.fill(items, tokens)  # copy items up to 64
        with pytest.raises(ValueError, match=f"fill them with cover_to={tokens}"):
            ops.lora_apply_static_in_gemm(x, w_ext, bias_ext, OFFSETS[-1], b, static, OFFSETS, impl="triton",
                                          plans=plans)
        static.fill(items, tokens, cover_to=tokens)
        out = ops.lora_apply_static_in_gemm(x, w_ext, bias_ext, OFFSETS[-1], b, static, OFFSETS, impl="triton",
                                            plans=plans)
        assert rel_err(out, reference(x, w, bias, a, b, lists)) < 1e-5
        # The call kept for the bound runs the same GEMM and the same kept plan: the same bits.
        assert torch.equal(kept(x), out)
        with pytest.raises(ValueError, match=f"copy items reach position {tokens}"):
            kept(x[:-1])
    assert len(plans) == 1  # 9 and 13 tokens: one bound (16), the kept call's plan among them
