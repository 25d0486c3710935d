"""The expand's partial K tile (``rank % BLOCK_K`` columns), through Triton's interpreter on CPU.

Where the pool's max rank allows it the kernel loads that tile in whole column groups
(``K_GROUP`` > 1; all of the tile where the max rank is a multiple of BLOCK_K) and zeroes the
columns past the rank in registers; with ``K_GROUP`` 1 it loads element by element under a
mask, as it did before groups. Both give the dot the same operands, so the outputs must be
equal bit for bit (``torch.equal``); against an fp64 reference the relative Frobenius error
of ``out - base`` must stay under 1e-5 (fp32). Every column past a slot's rank, in B and in
the intermediate, holds NaN here: memory the groups read but must never sum. Production
never writes NaN there, but it leaves an earlier adapter's weights in B and unwritten
intermediate columns, which may hold anything.
"""

from __future__ import annotations

import math

import pytest
import torch

from sglang_vlora.atmm import in_gemm, static_items, triton_kernels
from sglang_vlora.atmm.static_items import StaticWorkItems
from sglang_vlora.atmm.tiling import ExpandConfig
from sglang_vlora.atmm.work_items import build_work_items
from sglang_vlora.modes.delora import mode_item_lists
from tests.kernels.lora_reference import ref_delta, rel_err

D_IN = 32
RANKS = [0, 8, 16, 20, 24, 40, 64]  # slot 0: no adapter; the pool's max rank is 64
MAX_RANK = max(RANKS)
SCALINGS = [0.0, 2.0, 0.5, -0.25, 1.5, -1.0, 0.75]
SLICES = {1: [0, 48], 3: [0, 32, 48, 64]}
# (segment starts, lengths, slots): every rank, a base-only run (slot 0) and ragged lengths
SEGMENTS = ([0, 5, 9, 16, 20, 27, 30, 36], [5, 4, 7, 4, 7, 3, 6, 5], [1, 2, 0, 4, 5, 6, 4, 3])
MERGED_SLOT = 4  # paired batches: mixture mode with the rank-24 adapter folded into the weights
CONFIGS = [ExpandConfig(16, 32, 16), ExpandConfig(16, 16, 64), ExpandConfig(32, 16, 32)]


def _pool(num_slices: int, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """A and B with NaN in every row of A and column of B past the slot's rank."""
    a = torch.randn(len(RANKS), num_slices * MAX_RANK, D_IN, generator=gen) / D_IN**0.5
    b = torch.randn(len(RANKS), SLICES[num_slices][-1], MAX_RANK, generator=gen) / MAX_RANK**0.5
    for slot, r in enumerate(RANKS):
        a[slot, num_slices * r :] = float("nan")
        b[slot, :, r:] = float("nan")
    return a, b


def _items(n: int, paired: bool, covers_tokens: bool) -> tuple[StaticWorkItems, tuple]:
    starts, lens, slots = SEGMENTS
    if paired:
        lists = mode_item_lists(starts, lens, slots, RANKS, SCALINGS, MERGED_SLOT)
        items = build_work_items(*lists[:4], RANKS, partners=lists[4])
    else:
        lists = (starts, lens, slots, [SCALINGS[s] for s in slots])
        items = build_work_items(*lists, RANKS)
    static = StaticWorkItems.allocate(capacity=16, max_tokens=n, num_slots=len(RANKS), device="cpu",
                                      max_layers=2 if paired else 1, paired=paired, covers_tokens=covers_tokens)
    static.fill(items, n)
    return static, lists[:4]


def _separate_inter(x: torch.Tensor, a: torch.Tensor, static: StaticWorkItems, num_slices: int) -> torch.Tensor:
    """The separate shrink's rows, NaN past each item's S*r columns and in rows of no item."""
    inter = torch.full((static.max_rows(x.shape[0]), a.shape[1]), float("nan"))
    clean = static_items.shrink_torch(x, torch.nan_to_num(a), static, num_slices)
    for length, slot, row in zip(static.seg_lens.tolist(), static.slots.tolist(), static.row_starts.tolist(),
                                 strict=True):
        width = num_slices * RANKS[slot] if slot < len(RANKS) else 0
        inter[row : row + length, :width] = clean[row : row + length, :width]
    return inter


def _expand(num_slices: int, use_in_gemm: bool, paired: bool, config: ExpandConfig, seed: int):
    """``(base, fp64 delta, run)`` of one batch: ``run(k_group)`` runs its expand and returns the
    output, with ``K_GROUP`` forced to ``k_group`` (None: the launcher's choice)."""
    gen = torch.Generator().manual_seed(seed)
    offsets = SLICES[num_slices]
    n = SEGMENTS[0][-1] + SEGMENTS[1][-1]
    a, b = _pool(num_slices, gen)
    x = torch.randn(n, D_IN, generator=gen)
    static, lists = _items(n, paired, covers_tokens=use_in_gemm)
    base = torch.randn(n, offsets[-1], generator=gen)
    if use_in_gemm:  # the GEMM's output: the base columns, then every slot's block of S * max_rank
        blocks = torch.einsum("td,jwd->tjw", x, a).reshape(n, -1)
        inter, layout = in_gemm.split_output(torch.cat([base, blocks], dim=1), offsets[-1], len(RANKS))
    else:
        inter, layout = _separate_inter(x, a, static, num_slices), None
    layers, num_layers, partners = (None, 1, static.partners) if paired else (static.layers, static.max_layers, None)

    def run(k_group: int | None) -> torch.Tensor:
        out = torch.empty_like(base) if use_in_gemm else base.clone()
        with pytest.MonkeyPatch.context() as patch:
            if k_group is not None:
                patch.setattr(triton_kernels, "_k_group", lambda *args: k_group)
            triton_kernels.launch_expand(
                inter, b, out, static.seg_starts, static.seg_lens, static.slots, static.scales, static.row_starts,
                layers, num_layers, static.ranks, static.permutation, offsets, n, config, partners=partners,
                in_gemm=layout,
            )  # fmt: skip
        return out

    delta = ref_delta(x, torch.nan_to_num(a), torch.nan_to_num(b), offsets, RANKS, *lists)
    return base, delta, run


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: f"bk{c.block_k}")
@pytest.mark.parametrize("paired", [False, True], ids=["items", "pairs"])
@pytest.mark.parametrize("use_in_gemm", [False, True], ids=["separate", "in_gemm"])
@pytest.mark.parametrize("num_slices", [1, 3])
def test_grouped_tail_equals_element_loads_and_fp64(num_slices, use_in_gemm, paired, config) -> None:
    base, delta, run = _expand(num_slices, use_in_gemm, paired, config, seed=num_slices + 2 * use_in_gemm + 4 * paired)
    chosen = math.gcd(config.block_k, MAX_RANK)
    assert chosen == config.block_k  # the pool's max rank is a multiple of every BLOCK_K here: whole tiles
    got = run(None)
    assert rel_err(got.double() - base.double(), delta) < 1e-5
    assert torch.equal(got, run(1))  # element loads under a mask: the kernel before groups
    assert torch.equal(got, run(8))  # groups narrower than the tile (a max rank of 8, 24, 40...)
    assert torch.equal(got, run(4))  # rank 20: a group past its last column


def test_group_divides_block_k_and_the_max_rank_and_needs_rows_of_every_slice() -> None:
    def group(block_k: int, max_rank: int, width: int, num_slices: int = 1, layout=None) -> int:
        inter = torch.empty(4, width, dtype=torch.bfloat16)
        b = torch.empty(2, 32, max_rank, dtype=torch.bfloat16)
        return triton_kernels._k_group(inter, b, num_slices, block_k, layout)

    assert group(16, 64, 64) == 16 and group(64, 64, 64) == 64 and group(64, 128, 128) == 64
    assert group(64, 24, 24) == 8 and group(32, 48, 48) == 16 and group(16, 12, 12) == 4
    assert group(16, 64, 3 * 64, num_slices=3) == 16
    assert group(16, 64, 3 * 64 - 8, num_slices=3) == 1  # rows narrower than the slices: element loads
    base = torch.empty(4, 32)
    assert group(16, 64, 8 * 64, num_slices=3, layout=in_gemm.InGemmLayout(base, slot_width=3 * 64)) == 16
    assert group(16, 64, 8 * 64, num_slices=3, layout=in_gemm.InGemmLayout(base, slot_width=2 * 64)) == 1
