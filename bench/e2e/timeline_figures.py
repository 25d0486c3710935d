"""What one measurement's timeline says in a few figures: its iterations by mode, seconds busy,
its decode steps' median and its prefills by prompt-token band (25th percentile, median, 75th
percentile, ms).

A timeline (``GET /vlora/timeline``) holds every iteration ours timed, 1-2k a round, too many for
a results file, so the runner saves it beside the server logs (:func:`bench.e2e.runner.save_timeline`);
these figures go into the results too, so that rounds of different revisions can be compared from
the results files alone after the logs are gone. ``bench/timeline_summary.py`` reads the saved
files back for the fuller picture (modes compared at one shape, histograms).
"""

from __future__ import annotations

import statistics
from collections import Counter, defaultdict
from typing import Any

PREFILL_BANDS = (1, 256, 1024, 2048, 4096, 8192)
"""Prompt-token bands' lower edges (the last one open): the benchmark's 1024-token prompts
reach the server as 1.3-1.6k tokens, one band."""

Row = tuple[str, int, int, float]
"""One iteration: mode, prefill tokens, decode requests, ms."""


def band_edge(tokens: int) -> int:
    """The lower edge of the prompt-token band a prefill of ``tokens`` falls in."""
    return max(edge for edge in PREFILL_BANDS if edge <= tokens)


def band(tokens: int) -> str:
    """The prompt-token band a prefill of ``tokens`` falls in, e.g. ``1024-2047``."""
    lower = band_edge(tokens)
    index = PREFILL_BANDS.index(lower)
    return f"{lower}-{PREFILL_BANDS[index + 1] - 1}" if index + 1 < len(PREFILL_BANDS) else f"{lower}+"


BAND_NAMES = tuple(band(edge) for edge in PREFILL_BANDS)
"""Every band's name (:func:`band`), in order of prompt length."""


def quartiles(values: list[float]) -> dict[str, float]:
    """The 25th percentile, median and 75th percentile of ``values`` (at least one), rounded."""
    if len(values) == 1:
        return dict.fromkeys(("p25", "median", "p75"), round(values[0], 2))
    p25, median, p75 = statistics.quantiles(values, n=4, method="inclusive")
    return {"p25": round(p25, 2), "median": round(median, 2), "p75": round(p75, 2)}


def rows(timeline: dict[str, Any]) -> list[Row]:
    """Every iteration of ``timeline`` as a :data:`Row`, by the file's own columns."""
    at = [timeline["columns"].index(c) for c in ("mode", "prefill_tokens", "decode_requests", "seconds")]
    return [(row[at[0]], row[at[1]], row[at[2]], row[at[3]] * 1000) for row in timeline["iterations"]]


def prefills_by_band(iterations: list[Row]) -> dict[int, list[float]]:
    """The ms of every iteration that prefilled, by its band's lower edge (any mode)."""
    out: dict[int, list[float]] = defaultdict(list)
    for _, tokens, _, ms in iterations:
        if tokens:
            out[band_edge(tokens)].append(ms)
    return out


def by_band(prefills: dict[int, list[float]]) -> dict[str, dict[str, float]]:
    """Per band, in order: how many prefills and their :func:`quartiles`."""
    return {band(edge): {"prefills": len(v), **quartiles(v)} for edge, v in sorted(prefills.items())}


def figures_of(iterations: list[Row]) -> dict[str, Any]:
    """Iterations per mode, seconds busy, the decode steps' median ms (None without one) and the
    prefills by band (:func:`by_band`)."""
    steps = [ms for _, tokens, _, ms in iterations if not tokens]
    return {
        "iterations": dict(sorted(Counter(mode for mode, *_ in iterations).items())),
        "busy_s": round(sum(ms for *_, ms in iterations) / 1000, 3),
        "decode_step_median_ms": round(statistics.median(steps), 3) if steps else None,
        "prefill_ms_by_band": by_band(prefills_by_band(iterations)),
    }


def figures(timeline: dict[str, Any]) -> dict[str, Any]:
    """:func:`figures_of` ``timeline``'s iterations."""
    return figures_of(rows(timeline))
