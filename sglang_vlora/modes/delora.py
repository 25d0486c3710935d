"""Work items for every inference mode given the merged adapter (paper §4.4.2).

With adapter ``k`` merged (``W = W0 + dW_k``), a request for adapter ``x`` needs
``x W0 + x dW_x = x W - x dW_k + x dW_x``: items ``(x, +s_x)`` and ``(k, -s_k)`` over
its tokens (the deLoRA branch is ``k`` itself with a negative scale). Requests for
``k`` need nothing; base-only requests (a slot of rank 0) need ``(k, -s_k)``. With
nothing merged, this is plain unmerged inference: ``(x, +s_x)`` per segment.

The ``(k, -s_k)`` items of consecutive non-``k`` segments are coalesced into one item
over their joint token range (one run for adapter segments, another for base-only
ones), so a mixed batch's shrink costs one deLoRA item per run rather than one per
request. Each ``(x, +s_x)`` item *absorbs* the ``(k, -s_k)`` item of its run
(:mod:`sglang_vlora.atmm.work_items`): the expand adds both over ``x``'s tokens in one
pass, so mixture needs one expand launch per module, as unmerged inference does.
Base-only runs keep their ``(k, -s_k)`` item as it is.

The same lists serve eager batches (:class:`WorkItems`) and decode CUDA graphs, whose
fixed-capacity buffers (:class:`~sglang_vlora.atmm.static_items.StaticWorkItems`) are
sized by :func:`max_mode_items` and :data:`MAX_MODE_LAYERS` for every mode at once.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from sglang_vlora.atmm.work_items import NO_PARTNER, WorkItems, build_work_items

# Items over one token never exceed two (``+x`` and ``-k``), so overlap layers never do.
MAX_MODE_LAYERS = 2


def max_mode_items(num_requests: int) -> int:
    """The most items :func:`mode_item_lists` gives for ``num_requests`` requests, in
    any mode (unmerged: one per request; merged ``k``: none for ``k``'s requests).

    With ``A`` segments of other adapters, ``B`` base-only and ``j`` of ``k`` (``m`` in all),
    there are ``A`` ``+x`` items and at most ``A + B`` runs (one ``-k`` item each); runs of
    one kind are separated by a run of the other kind or a ``k`` segment, so ``A <= (m + 1) / 2``
    when every segment starts a run: ``(3m + 1) // 2`` in all (alternating adapter and base-only
    segments reach it).
    """
    return (3 * num_requests + 1) // 2


def mode_item_lists(
    seg_starts: Sequence[int],
    seg_lens: Sequence[int],
    seg_slots: Sequence[int],
    ranks: Sequence[int],
    scalings: Sequence[float],
    merged_slot: int | None,
) -> tuple[list[int], list[int], list[int], list[float], list[int]]:
    """Host lists ``(starts, lens, slots, scales, partners)`` of the items for one batch.

    ``seg_*`` describe the batch's token segments in token order (one slot each,
    rank 0 = no adapter); ``ranks`` and ``scalings`` are per memory-pool slot;
    ``merged_slot`` is the slot of the adapter folded into the weights, or None.
    ``partners[i]`` is the index of the ``-k`` item that item ``i`` absorbs, or
    ``NO_PARTNER``.
    """
    if not len(seg_starts) == len(seg_lens) == len(seg_slots):
        raise ValueError("seg_starts, seg_lens and seg_slots must have one entry per segment")
    if merged_slot is not None and not (0 <= merged_slot < len(ranks) and ranks[merged_slot] > 0):
        raise ValueError(f"merged slot {merged_slot} must be a slot with an adapter (rank > 0)")
    starts: list[int] = []
    lens: list[int] = []
    slots: list[int] = []
    scales: list[float] = []
    partners: list[int] = []

    def add(start: int, length: int, slot: int, scale: float) -> int:
        starts.append(start)
        lens.append(length)
        slots.append(slot)
        scales.append(scale)
        partners.append(NO_PARTNER)
        return len(slots) - 1

    # The pending (k, -s_k) item: [start, end) of its run, whether the run's segments have
    # an adapter, and the run's +x items (they absorb it).
    run: tuple[list[int], bool, list[int]] | None = None

    def close_run() -> None:
        if run is None:
            return
        (start, end), _, absorbing = run
        delora_item = add(start, end - start, merged_slot, -float(scalings[merged_slot]))
        for i in absorbing:
            partners[i] = delora_item

    for start, length, slot in zip(seg_starts, seg_lens, seg_slots, strict=True):
        if length == 0 or slot == merged_slot:
            continue
        has_adapter = ranks[slot] > 0
        item = add(start, length, slot, float(scalings[slot])) if has_adapter else None
        if merged_slot is None:
            continue
        if run is not None and run[0][1] == start and run[1] == has_adapter:
            run[0][1] = start + length
        else:
            close_run()
            run = ([start, start + length], has_adapter, [])
        if item is not None:
            run[2].append(item)
    close_run()
    return starts, lens, slots, scales, partners


def mode_work_items(
    seg_starts: Sequence[int],
    seg_lens: Sequence[int],
    seg_slots: Sequence[int],
    ranks: Sequence[int],
    scalings: Sequence[float],
    merged_slot: int | None,
    device: torch.device | str = "cpu",
    permutation: torch.Tensor | None = None,
) -> WorkItems:
    """:func:`mode_item_lists` as :class:`WorkItems` on ``device`` (mixture when
    ``merged_slot`` is set, unmerged otherwise; an all-``k`` batch gives no items)."""
    starts, lens, slots, scales, partners = mode_item_lists(
        seg_starts, seg_lens, seg_slots, ranks, scalings, merged_slot
    )
    return build_work_items(
        starts, lens, slots, scales, ranks, device=device, permutation=permutation, partners=partners
    )
