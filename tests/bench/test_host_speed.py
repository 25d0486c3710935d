"""bench/host_speed.py: the summaries, and a short real run that writes its results file."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.host_speed import slowing_cpus, summarise_series

REPO = Path(__file__).resolve().parents[2]


def test_a_series_summary_counts_the_slowed_samples() -> None:
    got = summarise_series([10.0] * 6 + [11.0, 13.0, 20.0, 30.0])
    assert got["median_ms"] == 10.0 and got["max_ms"] == 30.0
    assert got["slow_fraction"] == pytest.approx(0.3)  # 13, 20 and 30 are at least 1.25x the median
    with pytest.raises(ValueError):
        summarise_series([])


def test_only_cpus_that_slow_the_loop_down_are_named() -> None:
    assert slowing_cpus({"alone": 10.0, "1": 10.4, "5": 17.0, "6": 12.5}) == {"5": 1.7, "6": 1.25}


def test_a_short_run_writes_pairs_and_drift(tmp_path) -> None:
    proc = subprocess.run([sys.executable, "bench/host_speed.py", "--seconds", "0.3", "--out", str(tmp_path),
                           "--tag", "t"], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    doc = json.loads((tmp_path / "t.json").read_text())
    others = sorted(os.sched_getaffinity(0) - {0})
    assert set(doc["pairs"]["0"]["ms"]) == {"alone", *map(str, others)}
    assert doc["drift"]["samples"] == len(doc["drift"]["series_ms"]) > 0
    assert doc["provenance"]["versions"]["python"]


@pytest.mark.parametrize("args, message", [(["--seconds", "0"], "--seconds must be positive"),
                                           (["--cpus", "4096"], "CPU 4096 is not available")])
def test_bad_arguments_are_refused(args, message) -> None:
    proc = subprocess.run([sys.executable, "bench/host_speed.py", *args], cwd=REPO, capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2 and message in proc.stderr
