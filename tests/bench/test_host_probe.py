"""bench/e2e/host_probe.py: a real probe process timing its loop on this machine's CPUs."""

from __future__ import annotations

import multiprocessing as mp
import os
import sys
import time

import pytest

from bench.e2e import host_probe


def test_the_probe_times_its_loop_on_the_cpus_it_is_given():
    cpu = sorted(os.sched_getaffinity(0))[-1]
    with host_probe.HostProbe([cpu], interval_s=0.1, iterations=20_000) as speed:
        time.sleep(1.0)
    got = speed.summary()
    assert got["samples"] >= 3, got
    assert 0 < got["kept"] <= got["samples"]
    assert list(got["by_cpu_ms"]) == [str(cpu)]
    loop = got["loop_ms"]
    assert 0 < loop["p10"] <= loop["median"] <= loop["p90"] <= loop["max"]


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs")
def test_the_probe_takes_the_cpus_it_is_given_in_turn():
    cpus = sorted(os.sched_getaffinity(0))[:2]
    with host_probe.HostProbe(cpus, interval_s=0.05, iterations=20_000) as speed:
        time.sleep(1.0)
    got = speed.summary()
    assert sorted(got["by_cpu_ms"]) == sorted(str(c) for c in cpus), got


def _spin(cpu: int, seconds: float) -> None:
    os.sched_setaffinity(0, {cpu})
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        pass


def test_a_sample_in_which_the_probe_waited_for_its_cpu_is_not_kept():
    cpu = sorted(os.sched_getaffinity(0))[0]
    spinner = mp.get_context("spawn").Process(target=_spin, args=(cpu, 4.0))
    spinner.start()
    try:
        time.sleep(0.3)
        # a loop of a few hundred ms on a CPU another process keeps busy: the kernel preempts it
        with host_probe.HostProbe([cpu], interval_s=0.05, iterations=2_000_000) as speed:
            time.sleep(2.5)
    finally:
        spinner.join()
    got = speed.summary()
    assert got["samples"] >= 1, got
    assert got["kept"] < got["samples"], got


def test_a_probe_that_prints_nothing_or_cannot_start_is_an_error_record():
    silent = host_probe.HostProbe()
    silent.command = [sys.executable, "-c", "import sys; sys.exit('the probe broke')"]
    with silent:
        time.sleep(0.3)
    assert silent.summary() == {"error": "the probe broke"}
    missing = host_probe.HostProbe()
    missing.command = ["/nonexistent/python"]
    with missing:
        pass
    assert missing.summary()["error"].startswith("the probe did not start")


def test_cpus_the_probe_cannot_use_are_refused_with_a_clear_error():
    missing = max(os.sched_getaffinity(0)) + 1
    with host_probe.HostProbe([missing]) as speed:
        time.sleep(0.3)
    error = speed.summary()["error"]
    assert f"CPUs [{missing}] are not among this process's" in error, error
    bad = host_probe.HostProbe()
    bad.command = [sys.executable, "-m", "bench.e2e.host_probe", "--cpus", "0,x"]
    with bad:
        time.sleep(0.3)
    assert "not a comma-separated list of CPU numbers: '0,x'" in bad.summary()["error"]
