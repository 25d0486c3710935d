"""Work items: the one description of "which LoRA math to do on which tokens".

A work item says: take the token rows ``[seg_start, seg_start + seg_len)`` of the
(optionally permuted) input, run them through the adapter in memory-pool slot
``slot``, multiply by ``scale`` and add the result to the output rows of the same
tokens. Every inference mode is a set of items over one batch:

* unmerge: one item per adapter segment, ``scale = +scaling``;
* merge: no item for the merged adapter's tokens;
* mixture (deLoRA): for a token of adapter ``x`` while ``k`` is merged, two items
  ``(x, +s_x)`` and ``(k, -s_k)``; base-only tokens get ``(k, -s_k)``;
* composition: several items over the same tokens with user weights.

Items may overlap in tokens, so the shrink output has one row per (item, token):
``row_start[i]`` is the first such row of item ``i`` (the running sum of
``seg_len``). Overlapping items are put in different *layers* (``layers[i]``, a
greedy interval colouring of the segments): items of one layer touch disjoint
output rows, so a kernel may update the output of one layer without atomics and
run the layers one after another. Overlap is judged on segment positions, which is
exact when ``permutation`` is a bijection (as it must be).

*Pairs* let the expand of overlapping items run in one pass instead of one per layer.
An item may *absorb* another whose segment contains its own (``partners[i] = j``): the
expand of item ``i`` then also adds ``j``'s contribution over ``i``'s tokens, reading
``j``'s shrink rows at the same offset, and ``j`` is expanded only through the items
that absorb it (``partners[j] = ABSORBED``), which must cover its segment exactly. The
items left (those not absorbed) must not overlap, so one expand launch serves them all.
Mixture mode pairs each ``(x, +s_x)`` item with the ``(k, -s_k)`` item of its run
(:mod:`sglang_vlora.modes.delora`). The shrink is unchanged: every item keeps its rows.
Kernels that do not read pairs (the torch reference, cuBLAS, the CUDA kernel) run the
same items by layers and get the same sums.

The memory-pool layout is SGLang's: ``A[slot, S * max_rank, d_in]`` with the rows of
slice ``s`` at ``[s * r, (s + 1) * r)`` for the slot's rank ``r``, and
``B[slot, d_out_total, max_rank]`` with slice ``s`` at output rows
``[slice_offsets[s], slice_offsets[s + 1])`` and columns ``[:r]``. A slot of rank 0
is the no-adapter slot and contributes nothing.

This module imports only torch so that kernels, benchmarks and the trainer can use
it without SGLang.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

NO_PARTNER = -1  # partners[i]: item i absorbs no other item
ABSORBED = -2  # partners[i]: item i is expanded only through the items that absorb it


@dataclass
class WorkItems:
    """Device tensors plus host copies of one batch's work items.

    The host copies (``*_host`` lists and the integer totals) let the pure-torch
    path and grid sizing run without reading device memory (no GPU sync).
    """

    seg_starts: torch.Tensor  # int32 [n_items]
    seg_lens: torch.Tensor  # int32 [n_items]
    slots: torch.Tensor  # int32 [n_items]
    scales: torch.Tensor  # float32 [n_items]
    row_starts: torch.Tensor  # int32 [n_items]
    ranks: torch.Tensor  # int32 [n_slots]
    permutation: torch.Tensor | None  # int32 (as the backend gives it) or int64 [n_tokens], or None
    seg_starts_host: list[int]
    seg_lens_host: list[int]
    slots_host: list[int]
    scales_host: list[float]
    ranks_host: list[int]
    total_rows: int
    max_seg_len: int
    layers: torch.Tensor | None = None  # int32 [n_items]; None means one layer
    layers_host: list[int] | None = None
    num_layers: int = 1
    # Pairs (see the module docstring): the index of the item each one absorbs, NO_PARTNER or
    # ABSORBED; None when no item absorbs another.
    partners: torch.Tensor | None = None  # int32 [n_items]
    partners_host: list[int] | None = None
    # Per-batch launch plans of the ops (sglang_vlora.atmm.ops._plan), keyed by op and shapes.
    plans: dict = field(default_factory=dict, repr=False, compare=False)

    @property
    def num_items(self) -> int:
        return len(self.slots_host)

    @property
    def row_starts_host(self) -> list[int]:
        """Host copy of ``row_starts``: the running sum of the segment lengths."""
        starts, total = [], 0
        for seg_len in self.seg_lens_host:
            starts.append(total)
            total += seg_len
        return starts


def build_work_items(
    seg_starts: Sequence[int],
    seg_lens: Sequence[int],
    slots: Sequence[int],
    scales: Sequence[float],
    ranks: Sequence[int],
    device: torch.device | str = "cpu",
    permutation: torch.Tensor | None = None,
    partners: Sequence[int] | None = None,
) -> WorkItems:
    """Validate host lists and build :class:`WorkItems` on ``device``.

    Items whose slot has rank 0 or whose segment is empty are dropped here, so
    kernels never see them. ``partners[i]``: the index (in these lists) of the item
    that item ``i`` absorbs, or ``NO_PARTNER`` (see the module docstring).
    """
    n = len(slots)
    if not (len(seg_starts) == len(seg_lens) == len(scales) == n):
        raise ValueError("seg_starts, seg_lens, slots and scales must have one entry per item")
    keep = []
    for i in range(n):
        if seg_lens[i] < 0 or seg_starts[i] < 0:
            raise ValueError(f"work item {i}: negative segment ({seg_starts[i]}, {seg_lens[i]})")
        if not 0 <= slots[i] < len(ranks):
            raise ValueError(f"work item {i}: slot {slots[i]} outside 0..{len(ranks) - 1}")
        if seg_lens[i] > 0 and ranks[slots[i]] > 0 and scales[i] != 0.0:
            keep.append(i)
    starts = [int(seg_starts[i]) for i in keep]
    lens = [int(seg_lens[i]) for i in keep]
    item_slots = [int(slots[i]) for i in keep]
    item_scales = [float(scales[i]) for i in keep]
    row_starts, total = [], 0
    for seg_len in lens:
        row_starts.append(total)
        total += seg_len
    layers = assign_layers(starts, lens)
    kept_partners = None if partners is None else _pair_items(partners, keep, starts, lens, n)

    int_ranks = [int(r) for r in ranks]
    int_fields = [starts, lens, item_slots, row_starts, layers, int_ranks]
    if kept_partners is not None:
        int_fields.append(kept_partners)
    fields = packed_to_device(int_fields, item_scales, device)
    return WorkItems(
        seg_starts=fields[0],
        seg_lens=fields[1],
        slots=fields[2],
        scales=fields[-1],
        row_starts=fields[3],
        ranks=fields[5],
        permutation=permutation,
        seg_starts_host=starts,
        seg_lens_host=lens,
        slots_host=item_slots,
        scales_host=item_scales,
        ranks_host=int_ranks,
        total_rows=total,
        max_seg_len=max(lens, default=0),
        layers=fields[4],
        layers_host=layers,
        num_layers=max(layers, default=0) + 1,
        partners=None if kept_partners is None else fields[6],
        partners_host=kept_partners,
    )


def _pair_items(
    partners: Sequence[int], keep: list[int], starts: list[int], lens: list[int], n: int
) -> list[int] | None:
    """``partners`` (indices into the caller's lists) for the kept items: the index among
    them of the item each absorbs, ``NO_PARTNER`` or ``ABSORBED``; None when no pair is
    left. Raises unless every absorbed item is covered exactly by the items absorbing it
    and the items not absorbed are disjoint."""
    if len(partners) != n:
        raise ValueError("partners must have one entry per item")
    index = {old: new for new, old in enumerate(keep)}
    result = [NO_PARTNER] * len(keep)
    covers: dict[int, list[int]] = {}
    for new, old in enumerate(keep):
        j = partners[old]
        if j == NO_PARTNER:
            continue
        if not 0 <= j < n or j == old or partners[j] != NO_PARTNER:
            raise ValueError(f"work item {old}: partner {j} must be another item that absorbs none")
        if j in index:  # a dropped partner (rank 0, empty, scale 0) adds nothing
            result[new] = index[j]
            covers.setdefault(index[j], []).append(new)
    if not covers:
        return None
    for j, items in covers.items():
        result[j] = ABSORBED
        pos = starts[j]  # the absorbing segments, in order, must tile j's segment
        for i in sorted(items, key=lambda i: starts[i]):
            if starts[i] != pos:
                raise ValueError(f"the items absorbing item {keep[j]} must cover its segment exactly")
            pos += lens[i]
        if pos != starts[j] + lens[j]:
            raise ValueError(f"the items absorbing item {keep[j]} must cover its segment exactly")
    free = [i for i in range(len(keep)) if result[i] != ABSORBED]
    if max(assign_layers([starts[i] for i in free], [lens[i] for i in free]), default=0) > 0:
        raise ValueError("the items not absorbed by a partner overlap: pairs need them disjoint")
    return result


_ALIGN = 4  # int32 entries: every field starts 16-byte aligned


def packed_to_device(int_fields: list[list[int]], floats: list[float], device: torch.device | str) -> list[torch.Tensor]:
    """``int_fields`` as int32 and ``floats`` as float32 tensors on ``device``: views of one
    buffer filled by one copy from pinned host memory (a batch's items are a dozen small
    lists; a copy each cost more host time than the kernels they feed)."""
    spans, values = [], []
    for values_of_field in [*int_fields, struct.unpack(f"{len(floats)}i", struct.pack(f"{len(floats)}f", *floats))]:
        spans.append((len(values), len(values_of_field)))
        values.extend(values_of_field)
        values.extend([0] * (-len(values) % _ALIGN))
    pinned = torch.device(device).type == "cuda"  # the copy never stalls the host
    packed = torch.tensor(values, dtype=torch.int32, pin_memory=pinned).to(device, non_blocking=True)
    views = [packed[start : start + n] for start, n in spans]
    views[-1] = views[-1].view(torch.float32)
    return views


def assign_layers(seg_starts: Sequence[int], seg_lens: Sequence[int]) -> list[int]:
    """Greedy interval colouring: the lowest layer whose segments all end before
    this one starts. Non-overlapping items (plain unmerge) all get layer 0."""
    order = sorted(range(len(seg_starts)), key=lambda i: (seg_starts[i], seg_lens[i]))
    layer_ends: list[int] = []
    layers = [0] * len(seg_starts)
    for i in order:
        start, end = seg_starts[i], seg_starts[i] + seg_lens[i]
        for layer, layer_end in enumerate(layer_ends):
            if layer_end <= start:
                layers[i] = layer
                layer_ends[layer] = end
                break
        else:
            layers[i] = len(layer_ends)
            layer_ends.append(end)
    return layers
