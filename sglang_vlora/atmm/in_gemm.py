"""The shrink inside the base GEMM: every pool slot's A rows appended to the base weight.

For a LoRA-wrapped linear layer with base weight ``W [N, d_in]`` and pool ``A [slots,
S * max_rank, d_in]``, one GEMM over ``[W; A.reshape(-1, d_in)]`` gives ``y [m, N + slots *
S * max_rank]``: the base output in its first ``N`` columns and, for every token and every
slot, ``x A_slot^T`` in slot ``j``'s block of ``S * max_rank`` columns after them (slice ``s``
at ``s * r`` for the slot's rank ``r``, as the pool stores it). The expand then reads each
token's own slot block (and, for a mixture pair, its partner's) and writes ``base + LoRA``
into a separate, contiguous output: the layers after the projection (the residual's fused
norm among them) need one. So every token must be reached by some item:
:meth:`~sglang_vlora.atmm.static_items.StaticWorkItems.fill` adds *copy items* (rank 0) over
the positions no item covers (``covers_tokens``).

Why: in a decode step the separate shrink is a launch per module whose time is mostly
fixed cost (a kernel that reads a few MB), and beside the GEMM it still costs a fork and a
join (docs/perf.md). Appended, the A rows cost their bytes in the GEMM's own weight stream.
The price: the extra columns are paid for every token, whatever its adapter, and grow with
``--max-loras-per-batch`` and the rank.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from sglang_vlora.atmm.static_items import StaticWorkItems, layer_map


@dataclass(frozen=True)
class InGemmLayout:
    """Where the expand finds the base output and the slots' shrink columns."""

    base: torch.Tensor  # [m, N]: the GEMM's own columns (a strided view of its output)
    slot_width: int  # columns per pool slot: S * max_rank


def split_output(y: torch.Tensor, out_features: int, num_slots: int) -> tuple[torch.Tensor, InGemmLayout]:
    """``(inter, layout)`` of a GEMM output ``y [m, N + num_slots * W]``: the slots' columns
    and where the base is."""
    extra = y.shape[1] - out_features
    if extra <= 0 or extra % num_slots:
        raise ValueError(f"{y.shape[1]} GEMM columns do not hold {out_features} base columns and {num_slots} slots")
    return y[:, out_features:], InGemmLayout(base=y[:, :out_features], slot_width=extra // num_slots)


def shrink_rows_torch(inter: torch.Tensor, layout: InGemmLayout, items: StaticWorkItems) -> torch.Tensor:
    """The GEMM's slot columns laid out as ``ops.lora_shrink_static`` lays out its rows
    (``[items.max_rows(m), W]``, each covered (item, position) at its row), so the separate
    shrink's torch expand is the reference of this layout too. Graph-safe (fixed shapes)."""
    m, width = inter.shape[0], layout.slot_width
    num_slots = inter.shape[1] // width
    bound = items.max_rows(m)
    out = torch.zeros((bound + 1, width), dtype=inter.dtype, device=inter.device)  # last row: sink
    blocks = inter.reshape(m, num_slots, width)
    for layer in range(items.max_layers if items.capacity else 0):
        pos, covered, item, token = layer_map(items, m, layer)
        slot = items.slots.long()[item].clamp(0, num_slots - 1)
        row = items.row_starts.long()[item] + pos - items.seg_starts.long()[item]
        out.index_copy_(0, torch.where(covered, row, bound), blocks[token, slot])
    return out[:bound]
