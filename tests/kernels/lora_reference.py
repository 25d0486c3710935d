"""What the kernel tests share: the fp64 LoRA delta every implementation is checked against,
the relative error, and one shrink + expand launch through either kernel module (Triton's or
the CUDA C++ extension's: the same arguments but the grid's rows)."""

from __future__ import annotations

from collections.abc import Sequence
from types import ModuleType

import torch

from sglang_vlora.atmm import ops
from sglang_vlora.atmm.tiling import ExpandConfig, ShrinkConfig
from sglang_vlora.atmm.work_items import WorkItems


def ref_delta(
    x: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    offsets: Sequence[int],
    ranks: Sequence[int],
    starts: Sequence[int],
    lens: Sequence[int],
    slots: Sequence[int],
    scales: Sequence[float],
    perm: torch.Tensor | None = None,
) -> torch.Tensor:
    """The LoRA delta in float64 on the CPU, computed per item and slice on its token rows
    (``perm`` maps an item's positions to rows); slots of rank 0 and empty items add nothing."""
    x, a, b = x.double().cpu(), a.double().cpu(), b.double().cpu()
    out = torch.zeros(x.shape[0], offsets[-1], dtype=torch.float64)
    for start, n, slot, scale in zip(starts, lens, slots, scales, strict=True):
        r = ranks[slot]
        if n == 0 or r == 0:
            continue
        pos = torch.arange(start, start + n)
        rows = pos if perm is None else perm.cpu()[pos]
        for s in range(len(offsets) - 1):
            lo, hi = offsets[s], offsets[s + 1]
            out[rows, lo:hi] += scale * (x[rows] @ a[slot, s * r : (s + 1) * r].T) @ b[slot, lo:hi, :r].T
    return out


def rel_err(got: torch.Tensor, ref: torch.Tensor) -> float:
    """``||got - ref|| / ||ref||`` (Frobenius, float64 on the CPU); ``got`` must be finite."""
    assert torch.isfinite(got).all()
    return ((got.double().cpu() - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def launch_apply(
    module: ModuleType,
    x: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    items: WorkItems,
    offsets: list[int],
    out: torch.Tensor,
    configs: tuple[ShrinkConfig, ExpandConfig],
    rows: tuple[int, int],
    paired: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Shrink into a NaN-poisoned intermediate, then expand into ``out``, with ``module``'s
    ``launch_shrink`` / ``launch_expand``, the tile ``configs`` and the grids' ``rows`` (shrink,
    expand). The columns past each item's S*r are never written by shrink: expand must never
    read them. ``paired``: the expand runs the items' pairs in one launch (Triton only).
    Returns the intermediate and ``out``."""
    scfg, ecfg = configs
    inter = torch.full((items.total_rows, a.shape[1]), float("nan"), dtype=x.dtype, device=x.device)
    module.launch_shrink(
        x, a, inter, items.seg_starts, items.seg_lens, items.slots, items.row_starts, items.ranks,
        items.permutation, len(offsets) - 1, rows[0], scfg,
    )  # fmt: skip
    if paired:  # the items' pairs in one expand launch (Triton), as ops runs them
        layers, num_layers, partners = ops.expand_layout(items)
        pairs = {"partners": partners}
    else:  # one launch per overlap layer
        layers, num_layers, pairs = items.layers, items.num_layers, {}
    module.launch_expand(
        inter, b, out, items.seg_starts, items.seg_lens, items.slots, items.scales, items.row_starts,
        layers, num_layers, items.ranks, items.permutation, offsets, rows[1], ecfg, **pairs,
    )  # fmt: skip
    return inter, out
