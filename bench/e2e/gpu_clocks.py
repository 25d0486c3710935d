"""The GPU's clocks, power, temperature and clock-event reasons while a measurement runs.

Read only: ``nvidia-smi --query-gpu`` every half second, started before the measurement's
client and stopped after it (never a setting of the card). A round in which a server ran slow
is then told apart from one in which the GPU itself ran at lower clocks. On a machine without
``nvidia-smi`` nothing is recorded.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
from collections import Counter
from functools import cache
from typing import Any

from bench.e2e.side_process import SideProcess

FIELDS = ("clocks.sm", "clocks.mem", "power.draw", "temperature.gpu", "utilization.gpu")
# a bit mask, 0x0 or 0x1 (idle) when nothing holds the clocks down; older drivers know the
# field by its former name
REASONS = ("clocks_event_reasons.active", "clocks_throttle_reasons.active")
INTERVAL_MS = 500


def gpu_index() -> str:
    """The GPU the call's servers see: the first of ``CUDA_VISIBLE_DEVICES``, an index or a GPU
    UUID (nvidia-smi itself ignores that variable), else 0."""
    first = os.environ.get("CUDA_VISIBLE_DEVICES", "0").split(",")[0].strip()
    return first if first.isdigit() or first.startswith("GPU-") else "0"


@cache
def query_fields(command: str) -> tuple[str, ...]:
    """The fields to ask this nvidia-smi for: :data:`FIELDS` and the reasons' mask under the
    first name it accepts (none if it accepts neither)."""
    for reasons in REASONS:
        fields = (*FIELDS, reasons)
        try:
            done = subprocess.run([command, f"--query-gpu={','.join(fields)}", "--format=csv,noheader",
                                   "-i", gpu_index()], capture_output=True, text=True, timeout=30)
        except (OSError, subprocess.TimeoutExpired):
            return FIELDS  # the sampler's own error is then what the measurement records
        if done.returncode == 0:
            return fields
    return FIELDS


class GpuClocks(SideProcess):
    """``with GpuClocks() as clocks: ...`` then ``clocks.summary()``."""

    def __init__(self, command: str = "nvidia-smi") -> None:
        super().__init__()
        self.command = shutil.which(command)
        self.fields: tuple[str, ...] = ()

    def __enter__(self) -> GpuClocks:
        if self.command:
            self.fields = query_fields(self.command)
            self.start([self.command, f"--query-gpu={','.join(self.fields)}", "--format=csv,noheader,nounits",
                        "-lms", str(INTERVAL_MS), "-i", gpu_index()], "nvidia-smi")
        return self

    def summary(self) -> dict[str, Any] | None:
        """Mean, min and max of each field over the samples, and how many samples showed each
        clock-event reason mask; None without nvidia-smi, ``{"error": ...}`` if it printed none."""
        if self.command is None:
            return None
        rows = [[x.strip() for x in line.split(",")] for line in self.output.splitlines() if line.strip()]
        rows = [r for r in rows if len(r) == len(self.fields)]
        if not rows:
            return {"error": (self.error or self.output).strip()[-500:] or "no samples"}
        out: dict[str, Any] = {"samples": len(rows)}
        for i, field in enumerate(self.fields):
            if field in REASONS:
                out[field] = dict(Counter(r[i] for r in rows))
                continue
            values = [float(r[i]) for r in rows if _number(r[i])]
            if values:
                out[field] = {"mean": round(statistics.fmean(values), 1), "min": min(values), "max": max(values)}
        return out


def _number(text: str) -> bool:
    try:
        float(text)
    except ValueError:
        return False
    return True
