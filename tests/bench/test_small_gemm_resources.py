"""The small-batch kernel's resource survey (bench/small_gemm_resources.py): the kernel compiled
ahead on the CPU for GPUs it is meant for, and what its shared memory says about the rank cap."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench import expand_registers, small_gemm_resources

REPO = Path(__file__).resolve().parents[2]
SM86_SHARED_LIMIT = 99 * 1024  # the most shared memory a block may opt into on sm_86 and sm_89


def test_up_to_the_rank_cap_the_kernel_fits_the_smallest_shared_memory_it_is_meant_for(tmp_path) -> None:
    """Compiled for sm_86 (the smallest per-block shared memory of the GPUs with bf16 dots), the
    kernel at the cap (``small_gemm.MAX_RANK``) asks for less than the limit, and its shared
    memory grows with the rank: what the cap's reason in ``small_gemm`` rests on."""
    if expand_registers.bundled_ptxas() is None:
        pytest.skip("no ptxas for this Triton (it bundles one in its Linux x86-64 wheels): nothing to compile with")
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # compile, not interpret
    env["TRITON_CACHE_DIR"] = str(tmp_path / "cache")
    from sglang_vlora.atmm.small_gemm import MAX_RANK

    subprocess.run([sys.executable, "bench/small_gemm_resources.py", "--archs", "86", "--modules", "qkv", "--ranks",
                    "16", str(MAX_RANK), "--out", str(tmp_path), "--tag", "resources"], cwd=REPO, env=env,
                   check=True, timeout=600)  # fmt: skip
    doc = json.loads((tmp_path / "resources.json").read_text())
    rows = {row["max_rank"]: row for row in doc["rows"]}
    assert sorted(rows) == sorted({16, MAX_RANK}) and doc["max_rank_cap"] == MAX_RANK
    assert 0 < rows[16]["shared_bytes"] <= rows[MAX_RANK]["shared_bytes"] < SM86_SHARED_LIMIT
    assert all(row["regs"] > 0 and not row["above_cap"] for row in rows.values())
    assert doc["command"].startswith("python bench/small_gemm_resources.py") and "provenance" in doc


@pytest.mark.parametrize(("argv", "message"), [(["--archs", "75"], "compute capability 80 or more"),
                                               (["--ranks", "0"], "--ranks must be at least 1")])
def test_bad_arguments_exit_2_with_a_message(argv, message, capsys) -> None:
    with pytest.raises(SystemExit) as exit_info:
        small_gemm_resources.main(argv)
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err
