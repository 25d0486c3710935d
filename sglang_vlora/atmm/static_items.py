"""Fixed-capacity device buffers of work items, for CUDA-graph capture and replay.

A captured graph keeps the kernel grids and the buffer addresses it saw at capture.
The ``*_static`` ops in :mod:`sglang_vlora.atmm.ops` read only these buffers and size
their grids from the capacity, so the caller captures once and, before each replay,
calls :meth:`StaticWorkItems.fill` with the batch's :class:`WorkItems`: entries past
the batch's item count get ``seg_len = 0`` and do nothing. No host list is read at
replay, so a replay with another number of adapters or segments than at capture is
still computed right (the failure mode of a grid sized from a host-side segment
count at capture).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sglang_vlora.atmm.work_items import WorkItems


@dataclass
class StaticWorkItems:
    seg_starts: torch.Tensor  # int32 [capacity]
    seg_lens: torch.Tensor  # int32 [capacity]
    slots: torch.Tensor  # int32 [capacity]
    scales: torch.Tensor  # float32 [capacity]
    row_starts: torch.Tensor  # int32 [capacity]
    layers: torch.Tensor  # int32 [capacity]
    ranks: torch.Tensor  # int32 [num_slots]
    permutation: torch.Tensor  # int64 [max_tokens]
    identity: torch.Tensor  # int64 [max_tokens], copied in when a batch has no permutation
    max_layers: int

    @classmethod
    def allocate(
        cls,
        capacity: int,
        max_tokens: int,
        num_slots: int,
        device: torch.device | str,
        max_layers: int = 1,
    ) -> StaticWorkItems:
        """Buffers for up to ``capacity`` items over ``max_tokens`` tokens, items in at
        most ``max_layers`` overlap layers (1 for plain unmerge, 2 for mixture mode)."""

        def zeros(n: int, dtype: torch.dtype = torch.int32) -> torch.Tensor:
            return torch.zeros(n, dtype=dtype, device=device)

        identity = torch.arange(max_tokens, dtype=torch.int64, device=device)
        return cls(
            seg_starts=zeros(capacity),
            seg_lens=zeros(capacity),
            slots=zeros(capacity),
            scales=zeros(capacity, torch.float32),
            row_starts=zeros(capacity),
            layers=zeros(capacity),
            ranks=zeros(num_slots),
            permutation=identity.clone(),
            identity=identity,
            max_layers=max_layers,
        )

    @property
    def capacity(self) -> int:
        return self.seg_lens.numel()

    def max_rows(self, num_tokens: int) -> int:
        """Static bound on shrink rows: each layer covers every token at most once."""
        return self.max_layers * num_tokens

    def fill(self, items: WorkItems, num_tokens: int) -> None:
        """Copy a batch's items into the buffers (device-to-device, no sync).

        Call outside capture, before replaying a graph captured for ``num_tokens``
        tokens (the padded batch size).
        """
        n = items.num_items
        if n > self.capacity:
            raise ValueError(f"{n} work items exceed capacity {self.capacity}")
        if items.num_layers > self.max_layers:
            raise ValueError(f"{items.num_layers} overlap layers exceed {self.max_layers}")
        if items.total_rows > self.max_rows(num_tokens) or num_tokens > self.identity.numel():
            raise ValueError(f"items need more rows than {num_tokens} tokens allow")
        if items.ranks.numel() != self.ranks.numel():
            raise ValueError("rank table size differs from the allocated number of slots")
        for dst, src in (
            (self.seg_starts, items.seg_starts),
            (self.seg_lens, items.seg_lens),
            (self.slots, items.slots),
            (self.scales, items.scales),
            (self.row_starts, items.row_starts),
        ):
            dst[:n].copy_(src, non_blocking=True)
        self.seg_lens[n:].zero_()
        if items.layers is None:
            self.layers[:n].zero_()
        else:
            self.layers[:n].copy_(items.layers, non_blocking=True)
        self.ranks.copy_(items.ranks, non_blocking=True)
        if items.permutation is None:
            self.permutation.copy_(self.identity)
        else:
            self.permutation[: items.permutation.numel()].copy_(items.permutation, non_blocking=True)
