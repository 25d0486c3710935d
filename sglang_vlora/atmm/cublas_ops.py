"""ATMM's cuBLAS-backed implementation: one GEMM per work item (and slice), through torch.

Semantics are those of :mod:`sglang_vlora.atmm.ops` (same work items, same intermediate
layout, so a cuBLAS shrink can feed a Triton expand and the reverse):

* shrink: ``inter[rows of item i, :S*r_i] = x[tokens of item i] @ A[slot_i, :S*r_i].T``
* expand: ``out[tokens of item i, slice s] += scale_i * inter[rows of item i, s*r_i:(s+1)*r_i]
  @ B[slot_i, slice s, :r_i].T`` (cuBLAS adds into the output in its epilogue: one fp32
  accumulation, one rounding, no separate read-modify-write pass).

Launches grow with the items (1 shrink GEMM, ``S`` expand GEMMs per item) and the host
reads the items' host lists, so this path suits few long segments (prefill) and is never
graph-captured for changing batches; the tiling table picks it per shape where the tuner
measured it fastest (``"impl": "cublas"``).
"""

from __future__ import annotations

import torch

from sglang_vlora.atmm.work_items import WorkItems


def _rows(items: WorkItems, i: int) -> slice | torch.Tensor:
    start, length = items.seg_starts_host[i], items.seg_lens_host[i]
    if items.permutation is None:
        return slice(start, start + length)
    return items.permutation[start : start + length]


def shrink(x: torch.Tensor, a_buffer: torch.Tensor, out: torch.Tensor, items: WorkItems, num_slices: int) -> None:
    """Write every item's ``x_i @ A_i.T`` into its rows of ``out`` (``[rows, S * max_rank]``)."""
    width_max = out.shape[1]
    for i in range(items.num_items):
        slot = items.slots_host[i]
        width = num_slices * items.ranks_host[slot]
        row = items.row_starts_host[i]
        block = out[row : row + items.seg_lens_host[i]]
        a = a_buffer[slot, :width]
        if width == width_max:
            torch.mm(x[_rows(items, i)], a.T, out=block)
        else:
            block[:, :width] = x[_rows(items, i)] @ a.T


def expand(
    inter: torch.Tensor,
    b_buffer: torch.Tensor,
    output: torch.Tensor,
    items: WorkItems,
    slice_offsets: list[int],
) -> None:
    """Add every item's ``scale_i * inter_i @ B_i.T`` into ``output``, slice by slice."""
    num_slices = len(slice_offsets) - 1
    for i in range(items.num_items):
        slot, scale = items.slots_host[i], items.scales_host[i]
        rank = items.ranks_host[slot]
        row = items.row_starts_host[i]
        block = inter[row : row + items.seg_lens_host[i]]
        rows = _rows(items, i)
        if isinstance(rows, slice):
            for s in range(num_slices):
                lo, hi = slice_offsets[s], slice_offsets[s + 1]
                output[rows, lo:hi].addmm_(block[:, s * rank : (s + 1) * rank], b_buffer[slot, lo:hi, :rank].T,
                                           alpha=scale)
            continue
        delta = torch.empty((block.shape[0], slice_offsets[-1]), dtype=torch.float32, device=output.device)
        for s in range(num_slices):
            lo, hi = slice_offsets[s], slice_offsets[s + 1]
            delta[:, lo:hi] = block[:, s * rank : (s + 1) * rank] @ b_buffer[slot, lo:hi, :rank].T
        output.index_add_(0, rows, delta.mul_(scale).to(output.dtype))
