"""bench/e2e/gpu_clocks.py. This machine has no GPU: a stand-in ``nvidia-smi`` on PATH prints
what the real one prints for the query (and, like an older driver, refuses the new name of the
clock-event field), so the sampling process, its fallback and its parsing run for real."""

from __future__ import annotations

import os
import stat
import time

import pytest

from bench.e2e import gpu_clocks

STAND_IN = """#!/bin/sh
case "$*" in
  *clocks_event_reasons*) echo 'Field "clocks_event_reasons.active" is not a valid field to query.' >&2; exit 2;;
esac
echo "$@" >> "$(dirname "$0")/calls"
case "$*" in *-lms*) ;; *) echo "1980, 4800, 300.1, 40, 50, 0x0000000000000000"; exit 0;; esac
echo "1980, 4800, 310.5, 41, 97, 0x0000000000000000"
echo "1755, 4800, 650.0, 44, 100, 0x0000000000000004"
echo "1980, 4800, [N/A], 45, 99, 0x0000000000000000"
exec sleep 30
"""


@pytest.fixture
def stand_in(tmp_path, monkeypatch):
    tool = tmp_path / "nvidia-smi"
    tool.write_text(STAND_IN)
    tool.chmod(tool.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,1")
    gpu_clocks.query_fields.cache_clear()
    yield tmp_path / "calls"
    gpu_clocks.query_fields.cache_clear()


def test_without_nvidia_smi_nothing_is_recorded(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))
    with gpu_clocks.GpuClocks() as clocks:
        pass
    assert clocks.summary() is None


def test_the_samples_of_a_measurement_summarised(stand_in):
    with gpu_clocks.GpuClocks() as clocks:
        time.sleep(0.5)
    got = clocks.summary()
    assert got["samples"] == 3
    assert got["clocks.sm"] == {"mean": 1905.0, "min": 1755.0, "max": 1980.0}
    assert got["power.draw"]["max"] == 650.0 and got["power.draw"]["mean"] == 480.2  # [N/A] left out
    # the older field name, after the newer one was refused; one sample held the clocks down
    assert got["clocks_throttle_reasons.active"] == {"0x0000000000000000": 2, "0x0000000000000004": 1}
    calls = stand_in.read_text().splitlines()
    assert all("-i 3" in c for c in calls) and any("-lms 500" in c for c in calls)
    assert clocks.process.poll() is not None  # stopped with the measurement


FAILING = """#!/bin/sh
echo "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver." >&2
exit 9
"""


def test_an_nvidia_smi_that_fails_is_recorded_as_an_error_and_the_measurement_goes_on(tmp_path, monkeypatch):
    tool = tmp_path / "nvidia-smi"
    tool.write_text(FAILING)
    tool.chmod(tool.stat().st_mode | stat.S_IEXEC)
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}{os.environ['PATH']}")
    gpu_clocks.query_fields.cache_clear()
    with gpu_clocks.GpuClocks() as clocks:
        time.sleep(0.2)
    gpu_clocks.query_fields.cache_clear()
    assert clocks.fields == gpu_clocks.FIELDS  # neither name of the reasons' field was taken
    assert clocks.summary() == {"error": "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA "
                                         "driver."}


@pytest.mark.parametrize("visible, index", [("2,3", "2"), ("GPU-4a1b-77", "GPU-4a1b-77"), ("", "0"),
                                            ("MIG-1/2/3", "0")])
def test_the_gpu_asked_for_is_the_first_the_servers_see(monkeypatch, visible, index):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    assert gpu_clocks.gpu_index() == index
