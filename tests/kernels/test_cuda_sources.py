"""The CUDA C++ sources without a GPU: they compile with bare nvcc (where nvcc is on
PATH; CI has none), the tile lists in Python mirror the header's, the loader finds the
sources and names what is missing, and ``impl`` is validated."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from sglang_vlora.atmm import cuda_ext, ops, tiling
from sglang_vlora.atmm.work_items import build_work_items

REPO = Path(__file__).resolve().parents[2]
CUDA_DIR = REPO / "cuda"


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not on PATH")
def test_kernels_compile_with_bare_nvcc(tmp_path: Path) -> None:
    """``nvcc -arch=sm_90 -c cuda/atmm_kernels.cu``: no torch headers needed, every
    instantiated kernel free of register spills."""
    cmd = [
        "nvcc",
        "-arch=sm_90",
        "-std=c++17",
        "-O3",
        "-c",
        str(CUDA_DIR / "atmm_kernels.cu"),
        "-o",
        str(tmp_path / "atmm_kernels.o"),
        "-Xptxas",
        "-v",
    ]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert (tmp_path / "atmm_kernels.o").stat().st_size > 0
    spills = re.findall(r"(\d+) bytes spill stores", proc.stderr)
    kernels = len(tiling.CUDA_SHRINK_TILES) + len(tiling.CUDA_EXPAND_TILES)
    assert len(spills) == 2 * kernels  # bf16 and fp16 of every tile
    assert all(s == "0" for s in spills), proc.stderr[-4000:]


def _header_tiles(macro: str) -> tuple[tuple[int, ...], ...]:
    text = (CUDA_DIR / "atmm_kernels.cuh").read_text()
    block = re.search(rf"#define {macro}\(X\)(.*?)\n\n", text, re.S)
    assert block, macro
    return tuple(
        tuple(int(v) for v in row.split(",")) for row in re.findall(r"X\(([\d,\s]+)\)", block.group(1))
    )


def test_python_tile_lists_mirror_the_header() -> None:
    assert _header_tiles("ATMM_SHRINK_TILES") == tiling.CUDA_SHRINK_TILES
    assert _header_tiles("ATMM_EXPAND_TILES") == tiling.CUDA_EXPAND_TILES
    for tiles in (tiling.CUDA_SHRINK_TILES, tiling.CUDA_EXPAND_TILES):
        # one kernel per (block_m, block_n, block_k, num_warps, stages): configs are unambiguous
        keys = {(bm, bn, bk, wm * wn * wk, st) for bm, bn, bk, wm, wn, wk, st in tiles}
        assert len(keys) == len(tiles)


def test_sources_found_and_shipped() -> None:
    src = cuda_ext.source_dir()
    for name in (*cuda_ext.SOURCES, *cuda_ext.HEADERS):
        assert (src / name).read_bytes() == (CUDA_DIR / name).read_bytes()
    # the wheel ships the sources as package data under sglang_vlora/atmm/cuda_src
    text = (REPO / "pyproject.toml").read_text()
    assert "atmm/cuda_src/*.cu" in text and "atmm/cuda_src/*.cuh" in text and "atmm/cuda_src/*.cpp" in text
    for name in ("atmm_kernels.cu", "atmm_kernels.cuh"):  # bare CUDA: no torch headers
        includes = re.findall(r"#include\s*[<\"]([^>\"]+)", (CUDA_DIR / name).read_text())
        assert not [i for i in includes if i.split("/")[0] in ("torch", "ATen", "c10", "pybind11")], includes


def test_build_key_follows_sources(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (*cuda_ext.SOURCES, *cuda_ext.HEADERS):
        shutil.copy(CUDA_DIR / name, tmp_path / name)
    key = cuda_ext.build_key(tmp_path, ["9.0"])
    assert key == cuda_ext.build_key(tmp_path, ["9.0"])
    assert key != cuda_ext.build_key(tmp_path, ["8.0"])
    (tmp_path / "atmm_kernels.cu").write_text((tmp_path / "atmm_kernels.cu").read_text() + "\n// edit\n")
    assert key != cuda_ext.build_key(tmp_path, ["9.0"])
    monkeypatch.setenv(cuda_ext.CACHE_ENV, str(tmp_path / "cache"))
    assert cuda_ext.cache_root() == tmp_path / "cache"


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error without a GPU")
def test_load_without_gpu_names_what_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    from torch.utils import cpp_extension

    monkeypatch.setattr(cpp_extension, "CUDA_HOME", None)
    monkeypatch.setattr(shutil, "which", lambda name: None)
    cuda_ext.reset()
    try:
        with pytest.raises(RuntimeError, match="CUDA GPU") as err:
            cuda_ext.load()
        assert "nvcc" in str(err.value)
        with pytest.raises(RuntimeError, match="CUDA GPU"):  # remembered, not rebuilt
            cuda_ext.load()
        assert not cuda_ext.available()
    finally:
        cuda_ext.reset()


def test_impl_is_validated() -> None:
    x = torch.randn(4, 8)
    a = torch.randn(2, 8, 8)
    b = torch.randn(2, 8, 8)
    items = build_work_items([0], [4], [1], [1.0], [0, 8])
    with pytest.raises(ValueError, match="impl must be"):
        ops.lora_shrink(x, a, items, 1, impl="cutlass")
    with pytest.raises(ValueError, match="CUDA tensors"):
        ops.lora_apply(x, a, b, items, [0, 8], torch.zeros(4, 8), impl="cuda")
    ref = ops.lora_apply(x, a, b, items, [0, 8], torch.zeros(4, 8), impl="torch")
    assert torch.allclose(ops.lora_apply(x, a, b, items, [0, 8], torch.zeros(4, 8)), ref)


def test_auto_falls_back_to_triton_without_the_extension(monkeypatch: pytest.MonkeyPatch) -> None:
    """A table entry won by CUDA is used only where the extension can run."""
    cuda_cfg = tiling.ShrinkConfig(16, 32, 256, 4, 4, 3)
    triton_cfg = tiling.ShrinkConfig(16, 16, 64, 8)
    monkeypatch.setattr(ops, "_device_name", lambda t: "Fake GPU")
    monkeypatch.setattr(tiling, "choose", lambda dev, op, impl, dims: ("cuda", cuda_cfg) if impl == "auto"
                        else ("triton", triton_cfg))
    x = torch.randn(4, 64, dtype=torch.bfloat16)
    monkeypatch.setattr(ops, "_cuda_available", lambda: False)
    assert ops._pick("shrink", x, (64, 16, 4), "auto") == ("triton", triton_cfg)
    monkeypatch.setattr(ops, "_cuda_available", lambda: True)
    assert ops._pick("shrink", x, (64, 16, 4), "auto") == ("cuda", cuda_cfg)
    assert ops._pick("shrink", x.float(), (64, 16, 4), "auto") == ("triton", triton_cfg)  # fp32: Triton only
    assert ops._pick("shrink", x, (64, 16, 4), "triton") == ("triton", triton_cfg)
