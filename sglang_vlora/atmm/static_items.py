"""Fixed-capacity device buffers of work items, for CUDA-graph capture and replay.

A captured graph keeps the kernel grids and the buffer addresses it saw at capture.
The ``*_static`` ops in :mod:`sglang_vlora.atmm.ops` read only these buffers and size
their grids from the capacity, so the caller captures once and, before each replay,
calls :meth:`StaticWorkItems.fill` with the batch's :class:`WorkItems`: entries past
the batch's item count get ``seg_len = 0`` and do nothing. No host list is read at
replay, so a replay with another number of adapters, segments or items than at
capture is still computed right (the failure mode of a grid sized from a host-side
segment count at capture, which replays the captured count).

All per-item fields, the rank table and the token permutation are views of one int32
buffer (``packed``; ``scales`` is a float32 view of its int32 bits), so :meth:`fill` is
one host-to-device copy, from pinned host memory (no stall of the host thread), into
storage allocated once and never moved.

:func:`shrink_torch` and :func:`expand_torch` are the pure-torch form of the static
kernels: same buffers, same intermediate layout, fixed shapes only (no host read of a
device value), so they are graph-safe too. The ``*_static`` ops take them on CPU
(without Triton's interpreter) and with ``impl="torch"``; through :func:`from_work_items`
they are the eager ops' torch reference as well.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import torch

from sglang_vlora.atmm.work_items import ABSORBED, NO_PARTNER, WorkItems

_ALIGN = 4  # int32 entries: every field starts 16-byte aligned in ``packed``
_INT_FIELDS = 6  # seg_starts, seg_lens, slots, row_starts, layers, partners; then scales, then ranks


@dataclass
class StaticWorkItems:
    seg_starts: torch.Tensor  # int32 [capacity]
    seg_lens: torch.Tensor  # int32 [capacity]
    slots: torch.Tensor  # int32 [capacity]
    scales: torch.Tensor  # float32 [capacity]
    row_starts: torch.Tensor  # int32 [capacity]
    layers: torch.Tensor  # int32 [capacity]
    ranks: torch.Tensor  # int32 [num_slots]
    permutation: torch.Tensor  # int32 [max_tokens]: token of each segment position
    max_layers: int
    partners: torch.Tensor | None = None  # int32 [capacity]: work_items' pairs, NO_PARTNER where none
    # Whether fill adds copy items (slot copy_slot, rank 0) over every position no item covers,
    # up to max_tokens: the shrink-in-GEMM expand writes a separate output and must reach every
    # token (sglang_vlora.atmm.in_gemm).
    covers_tokens: bool = False
    # Whether the Triton expand runs one launch over the items not absorbed (reading partners)
    # instead of one per overlap layer: every filled batch's overlap then comes from pairs.
    paired: bool = False
    packed: torch.Tensor | None = None  # int32; every field above is a view of it
    _stride: int = 0
    # Positions [0, _permuted) of ``permutation`` may hold an earlier batch's permutation; every
    # later position holds the identity (written once, at allocation).
    _permuted: int = 0
    # With covers_tokens: the position the last fill's copy items reach (its cover_to, else
    # max_tokens). An eager in-GEMM launch kept for a token bound writes every row they reach,
    # so it checks that this is its batch's own row count (ops.lora_apply_static_in_gemm).
    covered_to: int = 0

    @classmethod
    def allocate(
        cls,
        capacity: int,
        max_tokens: int,
        num_slots: int,
        device: torch.device | str,
        max_layers: int = 1,
        paired: bool = False,
        covers_tokens: bool = False,
    ) -> StaticWorkItems:
        """Buffers for up to ``capacity`` items over ``max_tokens`` tokens, items in at
        most ``max_layers`` overlap layers (1 for plain unmerge, 2 for mixture mode).
        ``paired``: one expand launch, for batches whose overlapping items are pairs.
        ``covers_tokens``: room for the copy items too (one per gap between items, at most
        one more than the items). The rank table has one entry past the pool's slots,
        always 0: the copy items' slot (:attr:`copy_slot`)."""
        if capacity < 1 or max_layers < 1 or max_tokens < 1:
            raise ValueError("capacity, max_tokens and max_layers must be at least 1")
        if covers_tokens and max_layers > 1 and not paired:
            raise ValueError("copy items need one layer of items (or pairs) to find the gaps between them")
        if covers_tokens:
            capacity = 2 * capacity + 1
        stride = -(-capacity // _ALIGN) * _ALIGN
        perm_at = (_INT_FIELDS + 1) * stride + -(-(num_slots + 1) // _ALIGN) * _ALIGN
        packed = torch.zeros(perm_at + max_tokens, dtype=torch.int32, device=device)
        # Made on the device: a copy from pageable host memory would wait for the GPU's queue
        # (the eager buffers grow in the middle of serving, behind a queued forward).
        packed[perm_at:] = torch.arange(max_tokens, dtype=torch.int32, device=packed.device)

        def view(k: int) -> torch.Tensor:
            return packed[k * stride : k * stride + capacity]

        return cls(
            seg_starts=view(0),
            seg_lens=view(1),
            slots=view(2),
            row_starts=view(3),
            layers=view(4),
            partners=view(5),
            scales=view(6).view(torch.float32),
            ranks=packed[(_INT_FIELDS + 1) * stride : (_INT_FIELDS + 1) * stride + num_slots + 1],
            permutation=packed[perm_at:],
            max_layers=max_layers,
            paired=paired,
            covers_tokens=covers_tokens,
            packed=packed,
            _stride=stride,
        )

    @property
    def capacity(self) -> int:
        return self.seg_lens.numel()

    @property
    def max_tokens(self) -> int:
        return self.permutation.numel()

    @property
    def copy_slot(self) -> int:
        """The slot of the copy items: the rank table's last entry, always rank 0."""
        return self.ranks.numel() - 1

    def max_rows(self, num_tokens: int) -> int:
        """Static bound on shrink rows: each layer covers every token at most once."""
        return self.max_layers * num_tokens

    def fill(self, items: WorkItems, num_tokens: int, permutation: list[int] | None = None,
             cover_to: int | None = None) -> None:
        """Write a batch's items into the buffers in place (one copy, no sync).

        Reads only host lists: the items' and ``permutation`` (the token of each segment
        position; None: the items' own permutation, read back to the host, or the identity). Call outside capture, before running or replaying
        a graph captured for at least ``num_tokens`` tokens (the batch's tokens; the
        graph's padded size may be larger). Entries past the batch's item count are
        zeroed, so stale items of an earlier, larger batch do nothing. ``cover_to``: with
        ``covers_tokens``, the copy items reach up to this position (default: ``max_tokens``,
        a graph's padding rows included); an eager batch, whose output has exactly its own
        rows, passes its token count.

        The identity is written only where an earlier batch left a permutation (the
        buffer holds it from allocation): a prefill graph's buffers cover thousands of
        tokens, and writing them all would cost more host time than the batch's items.
        """
        if cover_to is not None and not num_tokens <= cover_to <= self.max_tokens:
            raise ValueError(f"copy items up to {cover_to} for {num_tokens} tokens in buffers of {self.max_tokens}")
        n = items.num_items
        if permutation is None and items.permutation is not None:
            permutation = items.permutation.tolist()
        seg_starts, seg_lens, slots = items.seg_starts_host, items.seg_lens_host, items.slots_host
        scales, layers, partners = items.scales_host, items.layers_host, items.partners_host
        covered_to = self.max_tokens if cover_to is None else cover_to
        if self.covers_tokens:
            copies = gaps(items, covered_to)
            if copies:
                seg_starts = [*seg_starts, *(start for start, _ in copies)]
                seg_lens = [*seg_lens, *(length for _, length in copies)]
                slots = [*slots, *[self.copy_slot] * len(copies)]
                scales = [*scales, *[0.0] * len(copies)]
                layers = [*(layers if layers is not None else [0] * n), *[0] * len(copies)]
                partners = [*(partners if partners is not None else [NO_PARTNER] * n), *[NO_PARTNER] * len(copies)]
                n += len(copies)
        if n > self.capacity:
            raise ValueError(f"{n} work items exceed capacity {self.capacity}")
        if items.num_layers > self.max_layers:
            raise ValueError(f"{items.num_layers} overlap layers exceed {self.max_layers}")
        if self.paired and items.num_layers > 1 and items.partners_host is None:
            raise ValueError("overlapping items without pairs in buffers whose expand runs one launch")
        if items.total_rows > self.max_rows(num_tokens) or num_tokens > self.max_tokens:
            raise ValueError(f"items need more rows than {num_tokens} tokens allow")
        if len(items.ranks_host) != self.copy_slot:
            raise ValueError("rank table size differs from the allocated number of slots")
        if permutation is not None and len(permutation) > num_tokens:
            raise ValueError(f"a permutation of {len(permutation)} tokens for a batch of {num_tokens}")
        # Copy items never read shrink rows: theirs start at 0.
        row_starts, total = [], 0
        for seg_len in items.seg_lens_host:
            row_starts.append(total)
            total += seg_len
        row_starts += [0] * (n - items.num_items)
        pad = [0] * (self._stride - n)
        scale_bits = list(struct.unpack(f"{n}i", struct.pack(f"{n}f", *scales)))
        ranks = [*items.ranks_host, 0]  # the copy slot's
        slots_pad = [0] * (-len(ranks) % _ALIGN)
        if permutation is None:
            perm, self._permuted = range(self._permuted), 0
        elif self.covers_tokens:
            # The copy items reach past the batch's tokens (a graph's padding rows): those
            # positions must read the identity, not an earlier batch's permutation.
            perm = [*permutation, *range(len(permutation), self._permuted)]
            self._permuted = len(permutation)
        else:
            perm, self._permuted = permutation, max(self._permuted, len(permutation))
        values = [
            *seg_starts, *pad,
            *seg_lens, *pad,
            *slots, *pad,
            *row_starts, *pad,
            *(layers if layers is not None else [0] * n), *pad,
            *(partners if partners is not None else [NO_PARTNER] * n), *pad,
            *scale_bits, *pad,
            *ranks, *slots_pad,
            *perm,
        ]
        staging = torch.tensor(values, dtype=torch.int32, pin_memory=self.packed.is_cuda)
        self.packed[: len(values)].copy_(staging, non_blocking=True)
        self.covered_to = covered_to


def gaps(items: WorkItems, end: int) -> list[tuple[int, int]]:
    """``(start, length)`` of every run of positions in ``[0, end)`` that no item covers (an
    absorbed item's positions are its partners', so only the others count)."""
    partners = items.partners_host
    spans = sorted(
        (start, start + length)
        for i, (start, length) in enumerate(zip(items.seg_starts_host, items.seg_lens_host, strict=True))
        if length > 0 and (partners is None or partners[i] != ABSORBED)
    )
    out, at = [], 0
    for start, stop in spans:
        if start > at:
            out.append((at, start - at))
        at = max(at, stop)
    if at < end:
        out.append((at, end - at))
    return out


# ---- graph-safe torch path ----------------------------------------------------------------


def layer_map(items: StaticWorkItems, m: int, layer: int):
    """For each position ``p < m``: whether an item of ``layer`` covers it, which one
    (valid where covered), and the token row it reads (0 where not covered)."""
    pos = torch.arange(m, device=items.seg_lens.device)
    starts = items.seg_starts.long().unsqueeze(1)
    ends = starts + items.seg_lens.long().unsqueeze(1)
    live = (items.ranks.long()[items.slots.long()] > 0).unsqueeze(1)  # copy items (rank 0) add nothing
    cover = (pos >= starts) & (pos < ends) & (items.layers.unsqueeze(1) == layer) & live  # [capacity, m]
    covered = cover.any(0)
    item = cover.to(torch.int32).argmax(0)  # items of one layer never overlap: at most one
    token = torch.where(covered, items.permutation[:m].long(), 0)
    return pos, covered, item, token


def _compute_dtype(*tensors: torch.Tensor) -> torch.dtype:
    return torch.float64 if any(t.dtype == torch.float64 for t in tensors) else torch.float32


def shrink_torch(x: torch.Tensor, a_buffer: torch.Tensor, items: StaticWorkItems, num_slices: int) -> torch.Tensor:
    """Torch form of ``lora_shrink_static``: ``[items.max_rows(m), S * max_rank]`` with
    the row of (item, position) at ``row_start + position - seg_start``; other rows and
    columns past ``S * r`` are zero. Garbage in the pool beyond a slot's rank is never
    read into a result. One GEMM per pool slot and layer (positions of other slots
    discarded): memory stays ``[m, S * max_rank]`` however many tokens."""
    m, width = x.shape[0], a_buffer.shape[1]
    bound = items.max_rows(m)
    out = torch.zeros((bound + 1, width), dtype=x.dtype, device=x.device)  # last row: sink
    cdtype = _compute_dtype(x, a_buffer)
    cols = torch.arange(width, device=x.device)
    for layer in range(items.max_layers if items.capacity else 0):  # capacity: static, graph-safe
        pos, covered, item, token = layer_map(items, m, layer)
        slot = items.slots.long()[item]
        xt = x[token].to(cdtype)
        rows = torch.zeros((m, width), dtype=cdtype, device=x.device)
        for s in range(a_buffer.shape[0]):
            a = torch.where((cols < num_slices * items.ranks[s]).unsqueeze(1), a_buffer[s].to(cdtype), 0)
            rows = torch.where((slot == s).unsqueeze(1), xt @ a.T, rows)
        row = items.row_starts.long()[item] + pos - items.seg_starts.long()[item]
        out.index_copy_(0, torch.where(covered, row, bound), rows.to(x.dtype))
    return out[:bound]


def expand_torch(
    intermediate: torch.Tensor,
    b_buffer: torch.Tensor,
    items: StaticWorkItems,
    slice_offsets: list[int],
    output: torch.Tensor,
) -> torch.Tensor:
    """Torch form of ``lora_expand_static``: adds every covered position's
    ``scale * inter[row, s*r:(s+1)*r] @ B[slot, slice s, :r].T`` into ``output`` in place;
    rows of no item are never read (they may hold garbage). One GEMM per pool slot,
    slice and layer."""
    m, max_rank = output.shape[0], b_buffer.shape[2]
    cdtype = _compute_dtype(intermediate, b_buffer, output)
    cols = torch.arange(max_rank, device=output.device)
    last_col = intermediate.shape[1] - 1
    for layer in range(items.max_layers if items.capacity else 0):  # capacity: static, graph-safe
        pos, covered, item, token = layer_map(items, m, layer)
        slot = torch.where(covered, items.slots.long()[item], -1)
        row = torch.where(covered, items.row_starts.long()[item] + pos - items.seg_starts.long()[item], 0)
        block = intermediate[row]
        delta = torch.zeros((m, slice_offsets[-1]), dtype=cdtype, device=output.device)
        for s in range(b_buffer.shape[0]):
            rank = items.ranks[s].long()
            live = cols < rank
            mine = (slot == s).unsqueeze(1)
            for sl in range(len(slice_offsets) - 1):
                lo, hi = slice_offsets[sl], slice_offsets[sl + 1]
                xs = block.index_select(1, (sl * rank + cols).clamp(max=last_col)).to(cdtype)
                b = torch.where(live, b_buffer[s, lo:hi].to(cdtype), 0)
                delta[:, lo:hi] = torch.where(mine, torch.where(live, xs, 0) @ b.T, delta[:, lo:hi])
        delta = torch.where(covered.unsqueeze(1), delta * items.scales[item].to(cdtype).unsqueeze(1), 0)
        output.index_add_(0, token, delta.to(output.dtype))
    return output


def from_work_items(items: WorkItems, num_tokens: int) -> StaticWorkItems:
    """A view of eager items as static ones (the same device tensors, no copy), so the
    graph-safe torch forms above are also the eager reference (``ops.lora_shrink`` /
    ``lora_expand`` with ``impl="torch"``)."""
    device = items.seg_lens.device
    permutation = items.permutation
    if permutation is None:
        permutation = torch.arange(num_tokens, dtype=torch.int32, device=device)
    return StaticWorkItems(
        seg_starts=items.seg_starts,
        seg_lens=items.seg_lens,
        slots=items.slots,
        scales=items.scales,
        row_starts=items.row_starts,
        layers=items.layers if items.layers is not None else torch.zeros_like(items.seg_lens),
        ranks=items.ranks,
        permutation=permutation,
        max_layers=max(items.num_layers, 1),
    )
