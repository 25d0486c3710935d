"""Split-K arrival counters shared by ATMM's Triton and CUDA C++ shrink kernels.

A split-K shrink tile is finished by the last of its splits to arrive: each split bumps the
tile's counter, the last one sums the partials in split order and sets the counter back to
zero for the next launch. One zeroed buffer per device serves every launch.
"""

from __future__ import annotations

import torch

COUNTER_SLOTS = 1 << 20
_COUNTERS: dict[torch.device, torch.Tensor] = {}


def split_counters(device: torch.device) -> torch.Tensor:
    """The device's counters, allocated zeroed on first use and re-armed by the kernels.

    First use must not be inside CUDA-graph capture (warm up first, as every graph user
    does); launches with split-K must not run concurrently on several streams of one device.
    """
    if device not in _COUNTERS:
        _COUNTERS[device] = torch.zeros(COUNTER_SLOTS, dtype=torch.int32, device=device)
    return _COUNTERS[device]
