"""Pinning each benchmark server to CPUs of its own (``run --cpus-per-server``): the blocks,
the refusals, a real child process and what it starts running only on the given CPUs, and a
call that records its pinning and gives the harness its own CPUs back."""

from __future__ import annotations

import json
import os
import sys

import pytest

from bench import provenance, run_e2e
from bench.e2e import cpu_pinning
from sglang_vlora import server_process

OWN_CPUS = sorted(os.sched_getaffinity(0))


def test_blocks_per_server_in_order_and_the_rest_to_the_client():
    pinning = cpu_pinning.assign([0, 1, 2, 3, 4, 5, 6], ["nolora", "vlora", "csgmv"], 2)
    assert pinning == {"cpus_per_server": 2, "servers": {"nolora": [0, 1], "vlora": [2, 3], "csgmv": [4, 5]},
                       "client": [6]}


@pytest.mark.parametrize("cpus, servers, per_server, reason", [
    ([0, 1, 2, 3], ["a", "b"], 2, "plus at least one for the client"),
    ([0, 1], ["a"], 0, "at least 1"),
    ([0, 1], ["a"], -1, "at least 1"),
])
def test_pinning_that_does_not_fit_is_refused(cpus, servers, per_server, reason):
    with pytest.raises(ValueError, match=reason):
        cpu_pinning.assign(cpus, servers, per_server)


def test_ordered_cpus_and_topology_name_this_process_cpus():
    assert sorted(cpu_pinning.ordered_cpus()) == OWN_CPUS
    topo = cpu_pinning.topology()
    assert topo["cpus"] == OWN_CPUS and topo["cpu_count"] >= len(OWN_CPUS)
    assert all(isinstance(v, str) for v in topo["numa_nodes"].values())


def test_a_started_server_and_its_children_run_only_on_its_cpus(tmp_path):
    script = ("import os, subprocess, sys; print('own', sorted(os.sched_getaffinity(0))); "
              "print(subprocess.run([sys.executable, '-c', 'import os; print(sorted(os.sched_getaffinity(0)))'], "
              "capture_output=True, text=True).stdout.strip(), flush=True)")
    command = [sys.executable, "-c", script, "--host", "127.0.0.1", "--port", "1"]
    cpu = OWN_CPUS[-1]
    proc = server_process.start(command, tmp_path / "log", cpus=[cpu])
    assert proc.process.wait(timeout=60) == 0
    lines = (tmp_path / "log").read_text().splitlines()
    assert lines[1:] == [f"own [{cpu}]", f"[{cpu}]"], lines
    unpinned = server_process.start(command, tmp_path / "log2")
    assert unpinned.process.wait(timeout=60) == 0
    assert (tmp_path / "log2").read_text().splitlines()[1] == f"own {OWN_CPUS}"


def test_run_refuses_pinning_that_does_not_fit_before_anything_starts(tmp_path):
    with pytest.raises(SystemExit, match="plus at least one for the client"):
        run_e2e.main(["run", "--call", "cpu-smoke", "--systems", "vlora", "--points", "vision-skewed",
                      "--cpus-per-server", str(len(OWN_CPUS)), "--out", str(tmp_path)])
    assert not list(tmp_path.iterdir())


def test_parallel_check_refuses_a_pinned_call_beside_another_line():
    with pytest.raises(SystemExit, match="pins its servers"):
        run_e2e.main(["parallel-check", "mixed-skewed-blocks --seed 1 --cpus-per-server 3",
                      "mixed-skewed-blocks --seed 20"])
    with pytest.raises(SystemExit, match="pins its servers"):
        run_e2e.main(["parallel-check", "mixed-skewed-blocks --cpus-per-server 3", "test-gpu"])
    assert run_e2e.main(["parallel-check", "mixed-skewed-blocks --cpus-per-server 3"])["host_loads"]


@pytest.mark.skipif(len(OWN_CPUS) < 2, reason="pinning one server needs a second CPU for the client")
def test_a_pinned_call_records_its_cpus_and_gives_the_harness_its_own_back(tmp_path):
    out = tmp_path / "results"
    result = run_e2e.main(["run", "--call", "cpu-smoke", "--systems", "vlora", "--points", "vision-skewed",
                           "--repeats", "1", "--out", str(out), "--tag", "pinned", "--log-dir", str(tmp_path / "logs"),
                           "--cpus-per-server", "1", "--server-args", "--no-such-sglang-flag"])
    assert sorted(os.sched_getaffinity(0)) == OWN_CPUS
    pinning = json.loads((out / "pinned.json").read_text())["setup"]["cpu_pinning"]
    first, *rest = cpu_pinning.ordered_cpus()
    assert pinning == result["setup"]["cpu_pinning"] == {"cpus_per_server": 1, "servers": {"vlora": [first]},
                                                          "client": rest}
    assert result["setup"]["host_cpus"]["cpus"] == OWN_CPUS
    assert result["systems"]["vlora"]["status"] == "failed"  # the flag: the call still ends and is recorded


@pytest.mark.skipif(provenance.gpu_info() is not None, reason="on a GPU machine the plain SGLang systems start")
@pytest.mark.skipif(len(OWN_CPUS) < 2, reason="pinning one server needs a second CPU for the client")
def test_systems_skipped_for_lacking_cuda_get_no_cpus(tmp_path):
    # nolora needs CUDA: on this machine it is skipped, so the one CPU it would take is the client's
    out = tmp_path / "results"
    result = run_e2e.main(["run", "--call", "cpu-smoke", "--systems", "nolora", "vlora", "--points", "vision-skewed",
                           "--repeats", "1", "--out", str(out), "--tag", "pinned", "--log-dir", str(tmp_path / "logs"),
                           "--cpus-per-server", str(len(OWN_CPUS) - 1), "--server-args", "--no-such-sglang-flag"])
    *first, last = cpu_pinning.ordered_cpus()
    assert result["setup"]["cpu_pinning"]["servers"] == {"vlora": first}
    assert result["setup"]["cpu_pinning"]["client"] == [last]
    assert result["systems"]["nolora"]["status"] == "skipped"
