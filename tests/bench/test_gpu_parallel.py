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


@pytest.mark.skipif(shutil.which("nvidia-smi") is not None, reason="counts GPUs on a machine without one")
def test_more_calls_than_gpus_are_refused_before_anything_starts(tmp_path):
    r = _run("mixed-skewed --seed 1", "vision-skewed", tmp_path=tmp_path)
    assert r.returncode == 2
    assert "2 calls but 0 GPUs" in r.stderr
    assert not list((tmp_path / "out").glob("*.json"))
