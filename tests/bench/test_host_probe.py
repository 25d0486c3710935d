"""bench/e2e/host_probe.py: a real probe process timing its loop on this machine's CPUs."""

from __future__ import annotations

import multiprocessing as mp
import os
import sys
import time

import pytest

from bench.e2e import host_probe
from bench.e2e.cpu_counters import CpuCounters


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


@pytest.mark.skipif(len(os.sched_getaffinity(0)) < 2, reason="needs two CPUs")
def test_the_probe_runs_on_the_servers_cpus_while_its_caller_is_pinned_elsewhere():
    """A pinned call restricts its own process to the client's CPUs; the probe it starts for a
    server must still run on that server's, not inherit the caller's."""
    own = os.sched_getaffinity(0)
    client, server = sorted(own)[:2]
    os.sched_setaffinity(0, {client})
    try:
        with host_probe.HostProbe([server], interval_s=0.1, iterations=20_000) as speed:
            time.sleep(1.0)
    finally:
        os.sched_setaffinity(0, own)
    got = speed.summary()
    assert "error" not in got, got
    assert list(got["by_cpu_ms"]) == [str(server)], got


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


def test_cpus_it_cannot_use_and_other_bad_arguments_are_refused_with_a_clear_error():
    missing = max(os.sched_getaffinity(0)) + 1
    with host_probe.HostProbe([missing]) as speed:
        time.sleep(0.3)
    error = speed.summary()["error"]
    assert error.startswith(f"the probe did not start: it could not be pinned to CPUs [{missing}]"), error
    direct = host_probe.HostProbe()
    direct.command += ["--cpus", str(missing)]
    with direct:
        time.sleep(0.3)
    error = direct.summary()["error"]
    assert f"CPUs [{missing}] are not among this process's" in error, error
    bad = host_probe.HostProbe()
    bad.command = [sys.executable, "-m", "bench.e2e.host_probe", "--cpus", "0,x"]
    with bad:
        time.sleep(0.3)
    assert "not a comma-separated list of CPU numbers: '0,x'" in bad.summary()["error"]
    for flag, value, kind in (("--interval-s", "-1", "float"), ("--iterations", "0", "int"), ("--iterations", "x", "int")):
        bad = host_probe.HostProbe()
        bad.command = [sys.executable, "-m", "bench.e2e.host_probe", flag, value]
        with bad:
            time.sleep(0.3)
        assert f"argument {flag}: not a positive {kind}: '{value}'" in bad.summary()["error"]


def test_the_probe_says_whether_it_counts_cycles_and_counts_them_where_it_can():
    """Without hardware counters (a guest without a virtual PMU) the summary gives the kernel's
    reason and no clock; with them, each CPU's clock and instructions a cycle, in the range
    any CPU of today runs at."""
    cpu = sorted(os.sched_getaffinity(0))[-1]
    with host_probe.HostProbe([cpu], interval_s=0.1, iterations=20_000) as speed:
        time.sleep(1.0)
    got = speed.summary()
    error = CpuCounters().error
    if error:
        assert got["counters"] == error and error.startswith("no hardware counters: "), got
        assert "ghz" not in got and "by_cpu_ghz" not in got
    else:
        assert got["counters"] == "cycles, instructions"
        assert 0.3 < got["ghz"]["median"] < 7.0, got
        assert 0.1 < got["ipc"]["median"] < 8.0, got
        assert list(got["by_cpu_ghz"]) == [str(cpu)]


def test_clock_and_instructions_a_cycle_come_from_the_samples_kept():
    """A stand-in probe prints known counts: 5e6 cycles in 2 ms is 2.5 GHz; a preempted sample
    and one without counts add no clock."""
    lines = ["# counters: cycles, instructions", "2.000 3 0 5000000 10000000", "1.000 3 0 3000000 3000000",
             "4.000 5 1 1 1", "1.000 5 0 - -"]
    fake = host_probe.HostProbe()
    fake.command = [sys.executable, "-c", f"print({chr(10).join(lines)!r})"]
    with fake:
        time.sleep(0.5)
    got = fake.summary()
    assert (got["samples"], got["kept"], got["counters"]) == (4, 3, "cycles, instructions")
    assert got["by_cpu_ms"] == {"3": 1.5, "5": 1.0}
    assert got["by_cpu_ghz"] == {"3": 2.75} and got["by_cpu_ipc"] == {"3": 1.5}
    assert got["ghz"]["p10"] == 2.5 and got["ghz"]["max"] == 3.0


def test_counts_over_a_span_in_which_a_counter_was_shared_are_dropped():
    before = [(100, 1000, 1000), (300, 1000, 1000)]
    assert CpuCounters.between(before, [(600, 2000, 2000), (1300, 2000, 2000)]) == (500, 1000)
    # the kernel ran the instructions counter for only part of the span: an estimate, dropped
    assert CpuCounters.between(before, [(600, 2000, 2000), (1300, 2000, 1500)]) is None
    assert CpuCounters.between(None, before) is None
