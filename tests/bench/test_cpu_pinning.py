"""Pinning each benchmark server to CPUs of its own (``run --cpus-per-server``): the blocks,
the refusals, a real child process and what it starts running only on the given CPUs, and a
call that records its pinning and gives the harness its own CPUs back."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import httpx
import pytest

from bench import provenance, run_e2e
from bench.e2e import cpu_pinning, runner
from bench.e2e.host_time import process_tree
from sglang_vlora import server_process

OWN_CPUS = sorted(os.sched_getaffinity(0))
ROTATION = "by round: in round r the server i runs on the block of server i + r"


def test_blocks_per_server_in_order_and_the_rest_to_the_client():
    pinning = cpu_pinning.assign([0, 1, 2, 3, 4, 5, 6], ["nolora", "vlora", "csgmv"], 2)
    assert pinning == {"cpus_per_server": 2, "servers": {"nolora": [0, 1], "vlora": [2, 3], "csgmv": [4, 5]},
                       "client": [6], "rotation": ROTATION}


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
                                                          "client": rest, "rotation": ROTATION}
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


def test_the_blocks_move_one_server_along_each_round():
    pinning = cpu_pinning.assign([0, 1, 2, 3, 4, 5, 6], ["nolora", "vlora", "csgmv"], 2)
    rounds = [cpu_pinning.blocks_for_round(pinning, r) for r in range(4)]
    assert rounds[0] == pinning["servers"]
    assert rounds[1] == {"nolora": [2, 3], "vlora": [4, 5], "csgmv": [0, 1]}
    assert rounds[3] == rounds[0]
    for blocks in rounds:  # no two servers share a CPU, and the client's stays the client's
        cpus = [c for block in blocks.values() for c in block]
        assert len(set(cpus)) == len(cpus) and not set(cpus) & set(pinning["client"])
    for name in pinning["servers"]:  # over as many rounds as servers, each runs once on every block
        assert sorted(map(tuple, (rounds[r][name] for r in range(3)))) == [(0, 1), (2, 3), (4, 5)]


def _threads_cpus(pid: int) -> dict[int, list[int]]:
    """Each thread's CPUs, over ``pid`` and the processes below it."""
    return {int(t.name): sorted(os.sched_getaffinity(int(t.name)))
            for p in process_tree(pid) for t in (cpu_pinning.PROC / str(p) / "task").iterdir()}


# a stand-in server: a second thread and a child process, like SGLang's scheduler and detokenizer
TREE = ("import subprocess, sys, threading, time; "
        "child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)']); "
        "threading.Thread(target=time.sleep, args=(60,), daemon=True).start(); "
        "print('tree ' + 'ready', flush=True); time.sleep(60)")


def _start_tree(log: Path, cpus: list[int]) -> server_process.ServerProcess:
    proc = server_process.start([sys.executable, "-c", TREE, "--host", "127.0.0.1", "--port", "1"], log, cpus=cpus)
    deadline = time.monotonic() + 30
    while "tree ready" not in log.read_text():
        assert proc.process.poll() is None and time.monotonic() < deadline, log.read_text()
        time.sleep(0.05)
    return proc


@pytest.mark.skipif(len(OWN_CPUS) < 2, reason="moving a server needs a second CPU")
def test_repin_moves_every_thread_of_a_server_and_of_the_processes_it_started(tmp_path):
    first, second = OWN_CPUS[:2]
    proc = _start_tree(tmp_path / "log", [first])
    try:
        before = _threads_cpus(proc.process.pid)
        assert len(before) >= 3 and set(map(tuple, before.values())) == {(first,)}, before
        moved = cpu_pinning.repin(proc.process.pid, [second])
        after = _threads_cpus(proc.process.pid)
        assert moved == len(after) and set(map(tuple, after.values())) == {(second,)}, after
    finally:
        server_process.stop(proc, grace_s=5)
    with pytest.raises(ProcessLookupError, match="no process"):
        cpu_pinning.repin(proc.process.pid, [second])


@pytest.mark.skipif(len(OWN_CPUS) < 2, reason="two servers of a CPU each")
def test_each_round_the_harness_moves_the_live_servers_to_that_rounds_blocks(tmp_path):
    first, second = OWN_CPUS[:2]
    pinning = {"cpus_per_server": 1, "servers": {"a": [first], "b": [second]}, "client": []}
    live = {"a": _start_tree(tmp_path / "a.log", [first]), "b": _start_tree(tmp_path / "b.log", [second])}
    try:
        assert runner.repin_servers(live, pinning, 1) == {"a": [second], "b": [first]}
        assert set(map(tuple, _threads_cpus(live["a"].process.pid).values())) == {(second,)}
        assert set(map(tuple, _threads_cpus(live["b"].process.pid).values())) == {(first,)}
        server_process.stop(live["b"], grace_s=5)  # a server that died keeps no CPUs
        assert runner.repin_servers(live, pinning, 2) == {"a": [first]}
        assert set(map(tuple, _threads_cpus(live["a"].process.pid).values())) == {(first,)}
    finally:
        for proc in live.values():
            server_process.stop(proc, grace_s=5)


@pytest.mark.skipif(len(OWN_CPUS) < 2, reason="moving a server needs a second CPU")
def test_repin_moves_a_real_sglang_server_which_goes_on_serving_from_its_new_cpus(server):
    """The shared test server (SGLang with the plugin: HTTP and tokenizer, scheduler and
    detokenizer processes, dozens of threads) moved to one CPU and back."""
    own = _threads_cpus(server.process.pid)
    try:
        moved = cpu_pinning.repin(server.process.pid, [OWN_CPUS[1]])
        assert moved >= 3 and len(process_tree(server.process.pid)) >= 3
        assert set(map(tuple, _threads_cpus(server.process.pid).values())) == {(OWN_CPUS[1],)}
        response = httpx.post(server.url + "/generate", json={"text": "Count the cars.", "lora_path": "a8",
                                                              "sampling_params": {"max_new_tokens": 2}}, timeout=120)
        assert response.status_code == 200, response.text
        # threads started for the request run where their process was moved
        assert set(map(tuple, _threads_cpus(server.process.pid).values())) == {(OWN_CPUS[1],)}
    finally:  # back where it was for the tests after this one, threads started meanwhile too
        cpu_pinning.repin(server.process.pid, sorted({cpu for cpus in own.values() for cpu in cpus}))
