"""Pairs of work items (an item absorbing another in the expand): what ``build_work_items``
accepts, how it renumbers pairs when it drops items, and what it refuses."""

from __future__ import annotations

import pytest

from sglang_vlora.atmm.work_items import ABSORBED, NO_PARTNER, build_work_items

RANKS = [0, 8, 16]


def test_pairs_are_renumbered_after_dropped_items() -> None:
    # item 0 is empty and item 2 has the rank-0 slot: both dropped; 1 and 3 absorb 4
    items = build_work_items(
        [0, 0, 4, 4, 0], [0, 4, 3, 3, 7], [1, 1, 0, 1, 2], [1.0, 1.0, 1.0, 1.0, -0.5], RANKS,
        partners=[NO_PARTNER, 4, NO_PARTNER, 4, NO_PARTNER],
    )  # fmt: skip
    assert items.seg_starts_host == [0, 4, 0]
    assert items.partners_host == [2, 2, ABSORBED]
    assert items.partners.tolist() == [2, 2, ABSORBED]
    assert items.num_layers == 2  # the shrink rows still overlap


def test_a_dropped_partner_leaves_no_pair() -> None:
    items = build_work_items([0, 0], [4, 4], [1, 2], [1.0, 0.0], RANKS, partners=[1, NO_PARTNER])
    assert items.num_items == 1 and items.partners is None


@pytest.mark.parametrize(
    ("starts", "lens", "partners", "message"),
    [
        ([0, 0], [4, 6], [1, NO_PARTNER], "cover its segment exactly"),  # 4 of 6 tokens covered
        ([0, 5, 0], [4, 2, 7], [2, 2, NO_PARTNER], "cover its segment exactly"),  # a gap at 4
        ([0, 3, 0], [4, 4, 7], [2, 2, NO_PARTNER], "cover its segment exactly"),  # overlapping absorbers
        ([0, 0], [4, 4], [1, 0], "absorbs none"),  # a chain: the absorbed item absorbs
        ([0, 0], [4, 4], [0, NO_PARTNER], "absorbs none"),  # itself
        ([0, 0], [4, 4], [5, NO_PARTNER], "absorbs none"),  # no such item
        ([0, 0, 0], [4, 4, 4], [1, NO_PARTNER, NO_PARTNER], "overlap"),  # left items overlap
        ([0], [4], [NO_PARTNER, NO_PARTNER], "one entry per item"),
    ],
)
def test_bad_pairs_are_refused(starts, lens, partners, message) -> None:
    slots = [1, 2, 1][: len(starts)]
    scales = [1.0, -1.0, 0.5][: len(starts)]
    with pytest.raises(ValueError, match=message):
        build_work_items(starts, lens, slots, scales, RANKS, partners=partners)
