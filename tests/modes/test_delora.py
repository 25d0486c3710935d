"""Mixture mode (deLoRA): items per request kind, and the algebra end to end.

With adapter ``k`` merged by the switcher, ``x W_merged + ATMM(mixture items)`` must
equal the unmerged computation ``x W0 + ATMM(unmerged items)`` for every request:
mixed ranks, the no-adapter slot, empty segments, 1 / 2 (gate_up) / 3 (qkv) slices.
Tolerances, relative Frobenius error per request against an fp64 computation (and
between the two modes): fp32 1e-5; bf16 1e-2 (bf16 eps 2^-8; the mixture output
carries the base GEMM's rounding plus one per item).
"""

from __future__ import annotations

import pytest
import torch

from sglang_vlora.atmm import ops
from sglang_vlora.atmm.work_items import ABSORBED, NO_PARTNER
from sglang_vlora.modes.delora import mode_item_lists, mode_work_items
from sglang_vlora.modes.switcher import SwiftSwitcher, deltas_from_pool, slice_kinds

D_IN = 24
MAX_RANK = 16
RANKS = [0, 8, 16, 4]  # slot 0 is the no-adapter slot
SCALINGS = [0.0, 2.0, 0.5, 1.5]
SLICES = {1: [0, 20], 2: [0, 16, 32], 3: [0, 16, 24, 32]}
# (tokens, slot) per request, in batch order: runs of other adapters and base-only
# requests between requests of each candidate merged slot, and an empty request
REQUESTS = [(5, 1), (3, 2), (0, 3), (7, 3), (4, 0), (6, 1), (2, 2), (1, 0), (3, 3), (2, 1)]
TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2}


def segments() -> tuple[list[int], list[int], list[int]]:
    starts, lens, slots, offset = [], [], [], 0
    for n, slot in REQUESTS:
        starts.append(offset)
        lens.append(n)
        slots.append(slot)
        offset += n
    return starts, lens, slots


def rel(x: torch.Tensor, ref: torch.Tensor) -> float:
    return ((x.double() - ref.double()).norm() / ref.double().norm()).item()


def test_items_per_request_kind():
    starts, lens, slots = segments()
    got = mode_item_lists(starts, lens, slots, RANKS, SCALINGS, merged_slot=3)
    items = list(zip(*got, strict=True))
    # requests of slot 3 get nothing; others +own; base-only requests only -s_3; each
    # run of adjacent non-3 requests of one kind (adapter / base-only) shares one -s_3
    # item, which the run's +own items absorb (their partner: its index)
    assert items == [
        (0, 5, 1, 2.0, 2),
        (5, 3, 2, 0.5, 2),
        (0, 8, 3, -1.5, NO_PARTNER),
        (19, 6, 1, 2.0, 6),
        (15, 4, 3, -1.5, NO_PARTNER),  # base-only run: expanded on its own
        (25, 2, 2, 0.5, 6),
        (19, 8, 3, -1.5, NO_PARTNER),
        (31, 2, 1, 2.0, 9),
        (27, 1, 3, -1.5, NO_PARTNER),
        (31, 2, 3, -1.5, NO_PARTNER),
    ]
    built = mode_work_items(starts, lens, slots, RANKS, SCALINGS, merged_slot=3)
    assert built.partners_host == [2, 2, ABSORBED, 6, NO_PARTNER, 6, ABSORBED, 9, NO_PARTNER, ABSORBED]
    assert built.num_layers == 2  # the shrink rows and the layer-by-layer kernels still see the overlap


def test_no_merged_adapter_is_plain_unmerged():
    starts, lens, slots = segments()
    got = list(zip(*mode_item_lists(starts, lens, slots, RANKS, SCALINGS, merged_slot=None), strict=True))
    expect = [
        (s, n, slot, SCALINGS[slot], NO_PARTNER)
        for s, n, slot in zip(starts, lens, slots, strict=True)
        if n and RANKS[slot]
    ]
    assert got == expect


def test_all_merged_requests_need_no_items():
    items = mode_work_items([0, 4], [4, 3], [2, 2], RANKS, SCALINGS, merged_slot=2)
    assert items.num_items == 0
    assert mode_work_items([0, 4], [4, 3], [1, 2], RANKS, SCALINGS, merged_slot=None).partners is None


def test_bad_merged_slot():
    with pytest.raises(ValueError, match="rank > 0"):
        mode_item_lists([0], [1], [1], RANKS, SCALINGS, merged_slot=0)
    with pytest.raises(ValueError, match="one entry per segment"):
        mode_item_lists([0], [1, 2], [1], RANKS, SCALINGS, merged_slot=1)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("num_slices", [1, 2, 3])
@pytest.mark.parametrize("merged", [1, 2, 3])
def test_mixture_equals_unmerged(dtype, num_slices, merged):
    g = torch.Generator().manual_seed(10 * num_slices + merged)
    offsets = SLICES[num_slices]
    a_pool = torch.randn(len(RANKS), num_slices * MAX_RANK, D_IN, generator=g) / D_IN**0.5
    b_pool = torch.randn(len(RANKS), offsets[-1], MAX_RANK, generator=g) / MAX_RANK**0.5
    w0 = torch.randn(1, offsets[-1], D_IN, generator=g) / D_IN**0.5
    a_pool, b_pool, w0 = a_pool.to(dtype), b_pool.to(dtype), w0.to(dtype)
    starts, lens, slots = segments()
    x = torch.randn(sum(lens), D_IN, generator=g).to(dtype)

    weight = w0.clone()
    names = [f"s{s}" for s in range(num_slices)]
    switcher = SwiftSwitcher(slice_kinds(weight, names, offsets))
    deltas = deltas_from_pool([a_pool], [b_pool], merged, RANKS[merged], offsets, SCALINGS[merged])
    switcher.add_adapter("k", dict(zip(names, deltas, strict=True)))
    switcher.merge("k")

    mixture = x @ weight[0].T
    ops.lora_apply(
        x, a_pool, b_pool, mode_work_items(starts, lens, slots, RANKS, SCALINGS, merged), offsets, mixture
    )
    unmerged = x @ w0[0].T
    ops.lora_apply(
        x, a_pool, b_pool, mode_work_items(starts, lens, slots, RANKS, SCALINGS, None), offsets, unmerged
    )

    for start, n, slot in zip(starts, lens, slots, strict=True):
        if n == 0:
            continue
        rows = slice(start, start + n)
        xr = x[rows].double()
        ref = xr @ w0[0].double().T
        r = RANKS[slot]
        for s in range(num_slices):
            lo, hi = offsets[s], offsets[s + 1]
            a = a_pool[slot, s * r : (s + 1) * r].double()
            ref[:, lo:hi] += SCALINGS[slot] * (xr @ a.T) @ b_pool[slot, lo:hi, :r].double().T
        assert rel(mixture[rows], ref) <= TOL[dtype], (start, slot)
        assert rel(unmerged[rows], ref) <= TOL[dtype], (start, slot)
        assert rel(mixture[rows], unmerged[rows]) <= TOL[dtype], (start, slot)
