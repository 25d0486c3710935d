"""Work items for every inference mode given the merged adapter (paper §4.4.2).

With adapter ``k`` merged (``W = W0 + dW_k``), a request for adapter ``x`` needs
``x W0 + x dW_x = x W - x dW_k + x dW_x``: items ``(x, +s_x)`` and ``(k, -s_k)`` over
its tokens (the deLoRA branch is ``k`` itself with a negative scale). Requests for
``k`` need nothing; base-only requests (a slot of rank 0) need ``(k, -s_k)``. With
nothing merged, this is plain unmerged inference: ``(x, +s_x)`` per segment.

The ``(k, -s_k)`` items of consecutive non-``k`` segments are coalesced into one item
over their joint token range, so a mixed batch costs one deLoRA item per run of
other requests rather than one per request.

The same lists serve eager batches (:class:`WorkItems`) and decode CUDA graphs, whose
fixed-capacity buffers (:class:`~sglang_vlora.atmm.static_items.StaticWorkItems`) are
sized by :func:`max_mode_items` and :data:`MAX_MODE_LAYERS` for every mode at once.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from sglang_vlora.atmm.work_items import WorkItems, build_work_items

# Items over one token never exceed two (``+x`` and ``-k``), so overlap layers never do.
MAX_MODE_LAYERS = 2


def max_mode_items(num_requests: int) -> int:
    """The most items :func:`mode_item_lists` gives for ``num_requests`` requests, in
    any mode (unmerged: one per request; merged ``k``: none for ``k``'s requests).

    With ``m`` segments of which ``j`` are ``k``'s, there are at most ``m - j`` ``+x``
    items and at most ``j + 1`` runs of non-``k`` segments (one ``-k`` item each):
    ``m + 1 <= num_requests + 1`` in all.
    """
    return num_requests + 1 if num_requests > 0 else 0


def mode_item_lists(
    seg_starts: Sequence[int],
    seg_lens: Sequence[int],
    seg_slots: Sequence[int],
    ranks: Sequence[int],
    scalings: Sequence[float],
    merged_slot: int | None,
) -> tuple[list[int], list[int], list[int], list[float]]:
    """Host lists ``(starts, lens, slots, scales)`` of the items for one batch.

    ``seg_*`` describe the batch's token segments in token order (one slot each,
    rank 0 = no adapter); ``ranks`` and ``scalings`` are per memory-pool slot;
    ``merged_slot`` is the slot of the adapter folded into the weights, or None.
    """
    if not len(seg_starts) == len(seg_lens) == len(seg_slots):
        raise ValueError("seg_starts, seg_lens and seg_slots must have one entry per segment")
    if merged_slot is not None and not (0 <= merged_slot < len(ranks) and ranks[merged_slot] > 0):
        raise ValueError(f"merged slot {merged_slot} must be a slot with an adapter (rank > 0)")
    starts: list[int] = []
    lens: list[int] = []
    slots: list[int] = []
    scales: list[float] = []

    def add(start: int, length: int, slot: int, scale: float) -> None:
        starts.append(start)
        lens.append(length)
        slots.append(slot)
        scales.append(scale)

    run: list[int] | None = None  # [start, end) of the pending (k, -s_k) item
    for start, length, slot in zip(seg_starts, seg_lens, seg_slots, strict=True):
        if length == 0 or slot == merged_slot:
            continue
        if ranks[slot] > 0:
            add(start, length, slot, float(scalings[slot]))
        if merged_slot is None:
            continue
        if run is not None and run[1] == start:
            run[1] = start + length
        else:
            if run is not None:
                add(run[0], run[1] - run[0], merged_slot, -float(scalings[merged_slot]))
            run = [start, start + length]
    if run is not None:
        add(run[0], run[1] - run[0], merged_slot, -float(scalings[merged_slot]))
    return starts, lens, slots, scales


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
    starts, lens, slots, scales = mode_item_lists(
        seg_starts, seg_lens, seg_slots, ranks, scalings, merged_slot
    )
    return build_work_items(starts, lens, slots, scales, ranks, device=device, permutation=permutation)
