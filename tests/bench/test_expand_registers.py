"""The expand register survey (bench/expand_registers.py): one config compiled ahead for sm_90 on
the CPU, and its parsing of ptxas logs and PTX."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench import expand_registers

REPO = Path(__file__).resolve().parents[2]


def test_one_config_compiles_for_sm90_without_a_gpu(tmp_path) -> None:
    if expand_registers.bundled_ptxas() is None:
        pytest.skip("no ptxas for this Triton (it bundles one in its Linux x86-64 wheels): nothing to compile with")
    out = tmp_path / "regs.json"
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # compile, not interpret
    env["TRITON_CACHE_DIR"] = str(tmp_path / "cache")
    subprocess.run([sys.executable, "bench/expand_registers.py", "--config", "16x64x16w4s1", "--slices", "1",
                    "--in-gemm", "off", "--jobs", "1", "--json", str(out)], cwd=REPO, env=env, check=True,
                   timeout=600)  # fmt: skip
    rows = json.loads(out.read_text())["rows"]
    assert [(r["config"], r["slices"], r["in_gemm"], r["paired"]) for r in rows] == [("16x64x16w4s1", 1, False, False)]
    assert rows[0]["regs"] > 0 and rows[0]["spill_st"] >= 0
    assert rows[0]["constexprs"]["BLOCK_K"] == 16


def test_ptxas_log_and_ptx_counts() -> None:
    log = ("ptxas info    : Function properties for _expand_kernel\n"
           "    0 bytes stack frame, 24 bytes spill stores, 32 bytes spill loads\n"
           "ptxas info    : Used 255 registers, used 1 barriers\n")  # fmt: skip
    assert expand_registers.ptxas_counts(log) == {"regs": 255, "spill_st": 24, "spill_ld": 32}
    ptx = ("\t@%p1 ld.global.b16 { %rs1 }, [ %rd1 + 0 ];\n"
           "\tld.global.v4.b32 { %r1, %r2, %r3, %r4 }, [ %rd2 + 0 ];\n"
           "\t@!%p2 st.global.v4.b32 [ %rd3 + 0 ], { %r1, %r2, %r3, %r4 };\n"
           "\tcp.async.cg.shared.global [ %r5 + 0 ], [ %rd4 + 0 ], 0x10, %r6;\n")  # fmt: skip
    assert expand_registers.ptx_memory_ops(ptx) == {"ld.global.b16": 1, "ld.global.v4.b32": 1, "st.global.v4.b32": 1,
                                                    "cp.async.16B": 1}


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--table", "missing.json"], "cannot read a tiling table"),
        (["--table", "README.md"], "cannot read a tiling table"),
        (["--slices", "4"], "tuned no layer of 4 slices"),
        (["--max-rank", "0"], "--max-rank must be at least 1"),
        (["--config", "1x2x3w4s5"], "not expand configs"),
    ],
)
def test_bad_arguments_exit_2_with_a_message(argv, message, capsys) -> None:
    """Checked before anything compiles (and before the interpreter check: these run in CI)."""
    with pytest.raises(SystemExit) as exit_info:
        expand_registers.main([*argv, "--jobs", "1"])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err
