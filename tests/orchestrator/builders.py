"""Test data for the orchestrator: a cost model from made-up measurements, requests, states."""

from __future__ import annotations

import copy
from typing import Any

from sglang_vlora.orchestrator import CostModel, Mode, Request, SchedulerState
from sglang_vlora.orchestrator.cost_model import SCHEMA

LAYERS = 32
RANKS = {"a": 16, "b": 16, "c": 32, "d": 64, "e": 8, "f": 8}

# Stand-in measurements (seconds), shaped like the paper's: merge is the fastest mode,
# unmerge the slowest, mixture in between; a switch costs a few milliseconds.
MEASURED: dict[str, Any] = {
    "schema": SCHEMA,
    "measured_on": "test data",
    "token_latency_s": {
        "merge": {"prefill_token": 1.0e-4, "decode_step": 0.010},
        "mixture": {"prefill_token": 1.2e-4, "decode_step": 0.012},
        "unmerge": {"prefill_token": 1.5e-4, "decode_step": 0.015},
    },
    "switch_s": {
        "merge": [
            {"rank": 16, "layers": 32, "seconds": 0.0040},
            {"rank": 64, "layers": 32, "seconds": 0.0052},
        ],
        "unmerge": [
            {"rank": 16, "layers": 32, "seconds": 0.0040},
            {"rank": 64, "layers": 32, "seconds": 0.0052},
        ],
        "fused": [
            {"rank": 32, "layers": 32, "seconds": 0.0043},
            {"rank": 128, "layers": 32, "seconds": 0.0067},
        ],
    },
}


def measured(**changes: Any) -> dict[str, Any]:
    """A deep copy of :data:`MEASURED` with top-level fields replaced."""
    data = copy.deepcopy(MEASURED)
    data.update(changes)
    return data


def cost_model(data: dict[str, Any] | None = None, layers: int = LAYERS) -> CostModel:
    return CostModel.from_dict(MEASURED if data is None else data, layers)


def req(
    rid: str,
    adapter: str | None,
    arrival: float = 0.0,
    *,
    prompt: int = 256,
    out: int = 16,
    prefilled: int = 0,
    done: int = 0,
    slo: float | None = None,
) -> Request:
    return Request(rid, adapter, arrival, prompt, out, prefilled, done, slo=slo)


def running(
    rid: str,
    adapter: str | None,
    arrival: float = 0.0,
    *,
    prompt: int = 256,
    out: int = 16,
    done: int = 1,
    slo: float | None = None,
) -> Request:
    """A request past its prefill, ``done`` tokens generated."""
    return Request(rid, adapter, arrival, prompt, out, prompt, done, slo=slo)


def state(
    now: float,
    waiting: list[Request] | tuple[Request, ...] = (),
    running: list[Request] | tuple[Request, ...] = (),
    mode: Mode = Mode.UNMERGE,
    merged: str | None = None,
) -> SchedulerState:
    return SchedulerState(now, tuple(waiting), tuple(running), mode, merged, RANKS)
