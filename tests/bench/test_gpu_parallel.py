"""bench/gpu_parallel.sh refuses what it cannot run before it starts anything."""

import shutil
import subprocess
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "gpu_parallel.sh"


def _run(*args: str, tmp_path: Path) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=60,
                          env={"PATH": "/usr/bin:/bin", "OUT": str(tmp_path / "out")})


def test_no_call_is_a_usage_error(tmp_path):
    r = _run(tmp_path=tmp_path)
    assert r.returncode == 2
    assert "usage" in r.stderr
    r = _run("mixed-skewed", " ", tmp_path=tmp_path)  # an empty call line, refused before anything starts
    assert r.returncode == 2 and "empty call line" in r.stderr


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="counts GPUs on a machine without one")
def test_more_calls_than_gpus_are_refused_before_anything_starts(tmp_path):
    r = _run("mixed-skewed --seed 1", "vision-skewed", tmp_path=tmp_path)
    assert r.returncode == 2
    assert "2 calls but 0 GPUs" in r.stderr
    assert not list((tmp_path / "out").glob("*.json"))


def test_prepare_builds_the_scale_assets_once_for_every_call():
    from bench import run_e2e
    from bench.e2e import plan

    built = run_e2e.main(["prepare", "--scale", "cpu"])
    assert Path(built["model"], "config.json").is_file()
    assert len(built["adapters"]) == plan.setup_of("cpu").adapters
    for folder in built["adapters"].values():
        assert Path(folder, "adapter_config.json").is_file()
    assert run_e2e.main(["prepare", "--scale", "cpu"]) == built  # built already: the same files


def test_the_host_load_of_a_call_is_vision_when_any_point_sends_images():
    from bench.e2e import plan

    assert plan.host_load(plan.get_call("mixed-skewed-blocks-twin")) == "text"
    assert plan.host_load(plan.get_call("decode")) == "text"
    assert plan.host_load(plan.get_call("vision-skewed-blocks")) == "vision"
    assert plan.host_load(plan.get_call("video")) == "vision"
    short = plan.get_call("short")  # sgl-mixed and vision-skewed
    assert plan.host_load(short) == "vision"
    assert plan.host_load(plan.get_call("short", points=["sgl-mixed"])) == "text"


def test_parallel_check_refuses_a_text_call_beside_a_vision_call_and_bad_lines(capsys):
    from bench import run_e2e

    text, vision = "mixed-skewed-blocks-twin --seed 70 --budget-s 490", "vision-skewed-blocks --seed 71"
    with pytest.raises(SystemExit, match="text and vision calls side by side"):
        run_e2e.main(["parallel-check", "--", text, vision])
    assert run_e2e.main(["parallel-check", "--allow-mixed", "--", text, vision])["host_loads"] == {
        text: "text", vision: "vision"}
    both_text = run_e2e.main(["parallel-check", "--", text, "decode --systems nolora unmerge_only csgmv", "test-gpu",
                              "test-gpu-server"])
    assert set(both_text["host_loads"].values()) == {"text"}
    assert "test-gpu" not in both_text["host_loads"] and "test-gpu-server" not in both_text["host_loads"]
    assert run_e2e.main(["parallel-check", "--", vision, "video --seed 2"])["host_loads"][vision] == "vision"
    with pytest.raises(SystemExit, match="'nope' is not a call"):
        run_e2e.main(["parallel-check", "--", "nope --seed 1"])
    with pytest.raises(SystemExit, match="'short --points sgl-nothing': --points: 'sgl-nothing' is not a gpu point"):
        run_e2e.main(["parallel-check", "--", "short --points sgl-nothing"])
    with pytest.raises(SystemExit):  # a flag run does not know: argparse's usage error
        run_e2e.main(["parallel-check", "--", "decode --sed 3"])
    assert "unrecognized arguments: --sed 3" in capsys.readouterr().err


def test_gpu_parallel_checks_the_call_lines_before_it_builds_or_starts_anything():
    script = SCRIPT.read_text()
    check = script.index('\npython3 bench/run_e2e.py parallel-check ${E2E_ALLOW_MIXED:+--allow-mixed} -- "$@" || exit 2')
    assert check < script.index("\npython3 bench/run_e2e.py prepare") < script.index('bash bench/gpu_e2e.sh "${words')


def test_parallel_check_warns_where_two_lines_would_send_the_same_request_traces(capsys):
    from bench import run_e2e

    a = "mixed-skewed-blocks --systems nolora vlora csgmv triton --repeats 5 --seed 80"
    b = "mixed-skewed-blocks --systems nolora vlora csgmv triton --repeats 5 --seed 81"
    checked = run_e2e.main(["parallel-check", "--", a, b])
    assert checked["shared_traces"] == {f"{a!r} and {b!r}": [81, 82, 83, 84]}
    assert "send the same requests in the rounds of client seeds [81, 82, 83, 84]" in capsys.readouterr().err
    # seeds --repeats apart, or another point (other requests with the same seed): nothing shared
    far = "mixed-skewed-blocks --systems nolora vlora csgmv triton --repeats 5 --seed 85"
    prefill = "prefill --systems nolora unmerge_only csgmv --repeats 3 --seed 81"
    assert run_e2e.main(["parallel-check", "--", a, far, prefill])["shared_traces"] == {}
    # the same point with another number of requests a round is another trace too
    blocks, whole = "mixed-skewed-blocks --repeats 2 --seed 5", "mixed-skewed --repeats 2 --seed 5"
    assert run_e2e.main(["parallel-check", "--", blocks, whole])["shared_traces"] == {}
    assert "warning" not in capsys.readouterr().err


def test_cpu_shares_are_equal_blocks_of_consecutive_cpus_one_per_call():
    from bench.e2e import cpu_pinning

    assert cpu_pinning.shares(list(range(32)), 2) == [list(range(16)), list(range(16, 32))]
    assert cpu_pinning.shares([3, 1, 2, 0, 4], 2) == [[3, 1], [2, 0]]  # in the order given; one left over
    assert cpu_pinning.shares([0, 1], 1) == [[0, 1]]
    with pytest.raises(ValueError, match="3 calls side by side but this process may run on 2 CPUs"):
        cpu_pinning.shares([0, 1], 3)
    with pytest.raises(ValueError, match="at least one call"):
        cpu_pinning.shares([0, 1], 0)


def test_parallel_check_lets_pinned_calls_side_by_side_only_where_their_share_holds_them(monkeypatch):
    from bench import run_e2e
    from bench.e2e import cpu_pinning

    four = "mixed-skewed-blocks --systems nolora vlora csgmv triton --cpus-per-server 3 --seed {}"
    monkeypatch.setattr(cpu_pinning, "ordered_cpus", lambda: list(range(32)))
    checked = run_e2e.main(["parallel-check", "--", four.format(710), four.format(730)])
    assert set(checked["host_loads"].values()) == {"text"}
    # 4 servers x 4 CPUs and the client: 17 CPUs, more than half of 32
    wide = "mixed-skewed-blocks --systems nolora vlora csgmv triton --cpus-per-server 4 --seed 730"
    with pytest.raises(SystemExit, match=r"pins its servers \(--cpus-per-server\) to 16 CPUs and needs one more "
                                         r"for the client, but beside 1 other line\(s\) its share of the host is 16"):
        run_e2e.main(["parallel-check", "--", four.format(710), wide])
    assert run_e2e.main(["parallel-check", "--", wide])["host_loads"] == {wide: "text"}  # alone: the whole host
    monkeypatch.setattr(cpu_pinning, "ordered_cpus", lambda: [0])
    with pytest.raises(SystemExit, match="2 calls side by side but this process may run on 1 CPUs"):
        run_e2e.main(["parallel-check", "--", four.format(710), "test-gpu"])


def test_on_cpus_runs_the_command_on_those_cpus_only_and_refuses_bad_lists():
    import os
    import sys

    cpu = min(os.sched_getaffinity(0))
    run = ["bench/run_e2e.py", "on-cpus"]
    repo = SCRIPT.parents[1]
    ok = subprocess.run([sys.executable, *run, str(cpu), "--", sys.executable, "-c",
                         "import os; print(sorted(os.sched_getaffinity(0)))"],
                        cwd=repo, capture_output=True, text=True, timeout=60)
    assert ok.returncode == 0 and ok.stdout.strip() == f"[{cpu}]"
    bad = subprocess.run([sys.executable, *run, "0,x", "--", "true"], cwd=repo, capture_output=True, text=True,
                         timeout=60)
    assert bad.returncode != 0 and "on-cpus '0,x'" in bad.stderr
    empty = subprocess.run([sys.executable, *run, str(cpu), "--"], cwd=repo, capture_output=True, text=True,
                           timeout=60)
    assert empty.returncode != 0 and "no command after --" in empty.stderr
    missing = subprocess.run([sys.executable, *run, str(cpu), "--", "no-such-command-here"], cwd=repo,
                             capture_output=True, text=True, timeout=60)
    assert missing.returncode != 0 and "on-cpus: cannot run 'no-such-command-here'" in missing.stderr


def test_gpu_parallel_runs_each_call_on_its_share_of_the_cpus_when_there_are_several():
    script = SCRIPT.read_text()
    shares = script.index('mapfile -t SHARES < <(python3 bench/run_e2e.py cpu-shares "$#")')
    assert shares < script.index('"${ON[@]}" bash bench/gpu_e2e.sh "${words[@]}"')
    assert script.count('"${TEST_TIMEOUT:-560}" "${ON[@]}" python3 -m pytest') == 2
