"""bench/base_linear_host.py refuses what it cannot run (its measurement needs a GPU: make bench)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _run(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "bench/base_linear_host.py", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=120)


def test_no_rounds_is_refused() -> None:
    proc = _run("--rounds", "0")
    assert proc.returncode == 2 and "--rounds must be at least 1" in proc.stderr


def test_without_a_gpu_it_says_so() -> None:
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("a GPU is present")
    proc = _run("--rounds", "1")
    assert proc.returncode != 0 and "needs a CUDA GPU" in proc.stderr


def test_no_tokens_is_refused() -> None:
    proc = _run("--tokens", "0")
    assert proc.returncode == 2 and "--tokens must be at least 1" in proc.stderr


@pytest.mark.parametrize("option", ["--sync-before", "--warm-before"])
def test_an_unknown_module_to_sync_or_warm_before_is_refused(option: str) -> None:
    proc = _run(option, "gate")
    assert proc.returncode == 2 and "invalid choice: 'gate'" in proc.stderr


@pytest.mark.parametrize("args", [["--warm-rows", "64"], ["--warm-before", "gate_up", "--warm-rows", "0"]])
def test_warm_rows_without_a_warm_call_or_below_one_is_refused(args: list[str]) -> None:
    proc = _run(*args)
    assert proc.returncode == 2 and "--warm-rows must be at least 1 and needs --warm-before" in proc.stderr


@pytest.mark.parametrize("args", [["--warm-tiny"], ["--warm-before", "gate_up", "--warm-rows", "64", "--warm-tiny"]])
def test_a_tiny_warm_call_without_a_warm_call_or_with_rows_is_refused(args: list[str]) -> None:
    proc = _run(*args)
    assert proc.returncode == 2 and "--warm-tiny needs --warm-before and takes no --warm-rows" in proc.stderr


def test_the_every_module_way_is_measured_only_with_mlp_lora_and_carries_the_adapter_on_every_module() -> None:
    sys.path.insert(0, str(REPO / "bench"))
    try:
        import base_linear_host as blh
    finally:
        sys.path.remove(str(REPO / "bench"))
    assert blh.ways_of(False) == blh.WAYS and blh.ALL_MODULES_WAY not in blh.WAYS
    assert blh.ways_of(True) == (*blh.WAYS, blh.ALL_MODULES_WAY)
    assert blh.lora_modules_of(blh.ALL_MODULES_WAY) == ("qkv", "o", "gate_up", "down")
    assert all(blh.lora_modules_of(way) == ("qkv", "o") for way in blh.WAYS)


def test_the_cublas_expand_ways_compute_every_slice_of_the_slots_lora() -> None:
    """``in_gemm_cublas_expand`` (a block-diagonal B, one addmm) and ``in_gemm_cublas_slices`` (one
    addmm a slice) against each slice's LoRA in fp64: the ways emulate designs, so they must compute
    what the in-GEMM call does."""
    torch = pytest.importorskip("torch")
    sys.path.insert(0, str(REPO / "bench"))
    try:
        import base_linear_host as blh
    finally:
        sys.path.remove(str(REPO / "bench"))
    g = torch.Generator().manual_seed(0)
    tokens, inputs, rank, slots, offsets = 5, 12, 4, 2, (0, 8, 11, 14)
    width = 3 * rank
    x = torch.randn(tokens, inputs, generator=g, dtype=torch.float64)
    w = torch.randn(offsets[-1], inputs, generator=g, dtype=torch.float64)
    a = torch.randn(slots, width, inputs, generator=g, dtype=torch.float64)
    b = torch.randn(slots, offsets[-1], rank + 2, generator=g, dtype=torch.float64)  # pool max rank above the slot's
    y = x @ torch.cat([w, a.reshape(-1, inputs)]).t()  # the in-GEMM output: base, then each slot's x A^T
    block = blh.block_diagonal_b(b[1], offsets, rank)
    got = blh.cublas_expand(y, offsets[-1], 1, width, block, 2.0)
    want = x @ w.t()
    for s in range(3):
        lo, hi = offsets[s], offsets[s + 1]
        want[:, lo:hi] += 2.0 * (x @ a[1, s * rank : (s + 1) * rank].t()) @ b[1, lo:hi, :rank].t()
    assert got.is_contiguous() and got.shape == (tokens, offsets[-1])
    assert torch.allclose(got, want, rtol=1e-12, atol=1e-12)
    sliced = blh.cublas_expand_slices(y.clone(), offsets[-1], 1, offsets, rank, b[1], 2.0)
    assert sliced.shape == (tokens, offsets[-1]) and torch.allclose(sliced, want, rtol=1e-12, atol=1e-12)
    # one slice (o): a new contiguous output, the GEMM's output left as it was
    w1, a1 = w[:8], a[:, :rank]
    y1 = x @ torch.cat([w1, a1.reshape(-1, inputs)]).t()
    before = y1.clone()
    one = blh.cublas_expand_slices(y1, 8, 1, (0, 8), rank, b[1, :8], 2.0)
    assert one.is_contiguous() and torch.equal(y1, before)
    assert torch.allclose(one, x @ w1.t() + 2.0 * (x @ a1[1].t()) @ b[1, :8, :rank].t(), rtol=1e-12, atol=1e-12)
    assert {"in_gemm_cublas_expand", "in_gemm_cublas_slices"} <= set(blh.WAYS)


def test_ways_select_what_runs_and_the_floor_always_does() -> None:
    sys.path.insert(0, str(REPO / "bench"))
    try:
        import base_linear_host as blh
    finally:
        sys.path.remove(str(REPO / "bench"))
    assert blh.ways_of(False, ("in_gemm_cublas_slices", "atmm_in_gemm")) == ("base", "atmm_in_gemm",
                                                                            "in_gemm_cublas_slices")
    assert blh.ways_of(False, ()) == blh.WAYS
    assert blh.ways_of(True, (blh.ALL_MODULES_WAY,)) == ("base", blh.ALL_MODULES_WAY)


@pytest.mark.parametrize("args, message", [(["--ways", "bogus"], "invalid choice: 'bogus'"),
                                           (["--ways", "atmm_small_gemm_all"], "needs --mlp-lora")])
def test_an_unknown_way_or_the_every_module_way_without_mlp_lora_is_refused(args: list[str], message: str) -> None:
    proc = _run(*args)
    assert proc.returncode == 2 and message in proc.stderr
