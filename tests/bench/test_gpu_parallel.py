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
