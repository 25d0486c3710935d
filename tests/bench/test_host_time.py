"""bench/e2e/host_time.py: a server's process tree and what it did on the host between two
samples, read from /proc for real processes."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from bench.e2e import host_time

# A child that burns CPU for a while, says so, and sleeps until killed.
CHILD = """
import sys, time
t = time.process_time()
while time.process_time() - t < float(sys.argv[1]):
    pass
print("done", flush=True)
time.sleep(60)
"""
# Its parent, which waits on it (and so reaps it once it is killed), then sleeps until killed.
TREE = f"""
import subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c", {CHILD!r}, sys.argv[1]], stdout=sys.stdout)
print(child.pid, flush=True)
child.wait()
time.sleep(60)
"""


@pytest.fixture
def tree():
    parent = subprocess.Popen([sys.executable, "-c", TREE, "0.6"], stdout=subprocess.PIPE, text=True)
    child = int(parent.stdout.readline())
    yield parent, child
    for pid in (child, parent.pid):
        try:
            os.kill(pid, 9)
        except ProcessLookupError:
            pass
    parent.wait()


def test_the_tree_holds_a_process_and_its_children(tree):
    parent, child = tree
    assert host_time.process_tree(parent.pid) == sorted([parent.pid, child])
    assert host_time.process_tree(child) == [child]


def test_between_two_samples_the_tree_cpu_time_and_the_cpus_shares(tree):
    parent, child = tree
    before = host_time.take(parent.pid, time.monotonic())
    assert parent.stdout.readline().strip() == "done"  # the child burnt its 0.6 s of CPU
    after = host_time.take(parent.pid, time.monotonic())
    got = host_time.between(before, after)
    assert got["processes"] == 2 and got["cpus"] == "all"
    assert 0.3 <= got["cpu_s"] <= got["wall_s"] * os.cpu_count() + 0.1
    assert got["cpu_per_wall_s"] > 0.2
    assert got["voluntary_switches"] >= 0 and got["involuntary_switches"] >= 0
    assert 0 < got["cpus_busy_share"] <= 1 and 0 <= got["cpus_steal_share"] <= 1
    first = sorted(os.sched_getaffinity(0))[0]
    pinned = host_time.between(before, after, [first])
    assert pinned["cpus"] == [first] and 0 <= pinned["cpus_busy_share"] <= 1


def test_a_process_that_ended_between_the_samples_is_left_out(tree):
    parent, child = tree
    before = host_time.take(parent.pid, time.monotonic())
    os.kill(child, 9)
    time.sleep(0.2)
    after = host_time.take(parent.pid, time.monotonic())
    assert host_time.between(before, after)["processes"] == 1
    assert host_time.process_times(child) is None


def test_a_cpu_missing_from_one_sample_gives_no_share_and_no_error(tree):
    parent, _ = tree
    before = host_time.take(parent.pid, time.monotonic())
    after = host_time.take(parent.pid, time.monotonic() + 1)
    gone = host_time.Sample(after.processes, {k: v for k, v in after.cpu_fields.items() if k != "cpu0"},
                            after.monotonic_s)
    got = host_time.between(before, gone, [0])
    assert got["cpus_busy_share"] is None and got["cpus_steal_share"] is None and got["processes"] == 2
