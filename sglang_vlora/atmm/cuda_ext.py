"""The CUDA C++ ATMM implementation: build on first use, load, launch.

Sources: ``cuda/atmm_kernels.cu`` (kernels and raw-pointer launchers, plain CUDA),
``cuda/atmm_kernels.cuh`` and ``cuda/atmm_binding.cpp`` (pybind11 over torch tensors).
A wheel ships them as ``sglang_vlora/atmm/cuda_src/`` (in the repository that path
is a symlink to ``cuda/``); :func:`source_dir` finds either. Nothing is compiled at
``pip install``: the first call of :func:`load` builds the extension with
``torch.utils.cpp_extension.load`` (nvcc + ninja) into

    $SGLANG_VLORA_CACHE/cuda-<key>       (default ~/.cache/sglang_vlora/cuda-<key>)

where ``<key>`` hashes the sources, the torch and CUDA versions, the Python version and
the target architectures (``TORCH_CUDA_ARCH_LIST`` if set, else the visible GPUs'), so
a changed source or toolchain gets a fresh build and an unchanged one loads in well
under a second. torch's file lock in that directory serializes concurrent builds (TP
ranks). Without a CUDA torch, a GPU, nvcc, the CUDA headers or ninja, :func:`load`
raises a RuntimeError that names what is missing; ``ops`` with ``impl="auto"`` then
stays on Triton (:func:`available` is False, logged once).

Prebuild (e.g. in a container image): ``python -m sglang_vlora.atmm.cuda_ext``.
"""

from __future__ import annotations

import argparse
import hashlib
import logging
import os
import shutil
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from types import ModuleType

import torch

from sglang_vlora.atmm.split_k import split_counters
from sglang_vlora.atmm.tiling import ExpandConfig, ShrinkConfig

logger = logging.getLogger(__name__)

SOURCES = ("atmm_kernels.cu", "atmm_binding.cpp")
HEADERS = ("atmm_kernels.cuh",)
MODULE_NAME = "sglang_vlora_atmm_cuda"
CACHE_ENV = "SGLANG_VLORA_CACHE"
VERBOSE_ENV = "SGLANG_VLORA_CUDA_VERBOSE"

_lock = threading.Lock()
_module: ModuleType | None = None
_error: str | None = None
_warned = False


def source_dir() -> Path:
    """The directory holding the CUDA sources: the packaged ``atmm/cuda_src`` (wheel,
    or the repository's symlink), else the repository's ``cuda/``."""
    here = Path(__file__).resolve().parent
    for candidate in (Path(__file__).parent / "cuda_src", here.parents[1] / "cuda"):
        if all((candidate / f).is_file() for f in (*SOURCES, *HEADERS)):
            return candidate
    raise RuntimeError(
        f"ATMM CUDA sources ({', '.join(SOURCES + HEADERS)}) not found in "
        f"{Path(__file__).parent / 'cuda_src'} or {here.parents[1] / 'cuda'}"
    )


def cache_root() -> Path:
    return Path(os.environ.get(CACHE_ENV) or Path.home() / ".cache" / "sglang_vlora")


def target_archs() -> list[str]:
    """Compute capabilities the build targets, as ``TORCH_CUDA_ARCH_LIST`` spells them."""
    env = os.environ.get("TORCH_CUDA_ARCH_LIST", "").replace(";", " ").split()
    if env:
        return sorted(env)
    if torch.cuda.is_available():
        caps = {torch.cuda.get_device_capability(i) for i in range(torch.cuda.device_count())}
        return [f"{major}.{minor}" for major, minor in sorted(caps)]
    return []


def build_key(src: Path | None = None, archs: Sequence[str] | None = None) -> str:
    digest = hashlib.sha256()
    src = src or source_dir()
    for name in (*SOURCES, *HEADERS):
        digest.update(name.encode() + b"\0" + (src / name).read_bytes() + b"\0")
    archs = target_archs() if archs is None else archs
    parts = [torch.__version__, str(torch.version.cuda), sys.version.split()[0], ",".join(archs)]
    digest.update("|".join(parts).encode())
    return digest.hexdigest()[:16]


def build_dir() -> Path:
    return cache_root() / f"cuda-{build_key()}"


def missing_requirements(require_device: bool = True) -> list[str]:
    """What the build (and, with ``require_device``, running) lacks; empty if nothing."""
    from torch.utils import cpp_extension

    missing = []
    if torch.version.cuda is None:
        missing.append(f"a CUDA build of torch (torch {torch.__version__} is CPU-only)")
    if require_device and not torch.cuda.is_available():
        missing.append("a CUDA GPU (torch.cuda.is_available() is False)")
    if not require_device and not os.environ.get("TORCH_CUDA_ARCH_LIST") and not torch.cuda.is_available():
        missing.append("a target architecture (no GPU visible: set TORCH_CUDA_ARCH_LIST, e.g. 9.0)")
    home = cpp_extension.CUDA_HOME
    nvcc = Path(home) / "bin" / "nvcc" if home else None
    if nvcc is None or not nvcc.is_file():
        found = shutil.which("nvcc")
        missing.append(
            "nvcc (the CUDA toolkit: set CUDA_HOME to its root or put nvcc on PATH"
            + (f"; torch's CUDA_HOME is {home}, nvcc on PATH is {found}" if home or found else "")
            + ")"
        )
    elif not any(Path(home).glob("include/cuda_runtime_api.h")) and not any(
        Path(home).glob("targets/*/include/cuda_runtime_api.h")
    ):
        missing.append(f"the CUDA headers (no cuda_runtime_api.h under CUDA_HOME={home})")
    if not cpp_extension.is_ninja_available():
        missing.append("ninja (pip install ninja)")
    return missing


def load(verbose: bool | None = None, require_device: bool = True) -> ModuleType:
    """The compiled extension, built on the first call (see the module docstring).

    Raises RuntimeError naming what is missing, or with the build error; a failure is
    remembered, so later calls raise at once instead of rebuilding.
    """
    global _module, _error
    if _module is not None:
        return _module
    with _lock:
        if _module is not None:
            return _module
        if _error is not None:
            raise RuntimeError(_error)
        missing = missing_requirements(require_device)
        if missing:
            _error = "the ATMM CUDA extension cannot be built or run here; missing: " + "; ".join(missing)
            raise RuntimeError(_error)
        if verbose is None:
            verbose = os.environ.get(VERBOSE_ENV, "") not in ("", "0")
        src = source_dir()
        out = cache_root() / f"cuda-{build_key(src)}"
        out.mkdir(parents=True, exist_ok=True)
        from torch.utils.cpp_extension import load as cpp_load

        try:
            _module = cpp_load(
                name=MODULE_NAME,
                sources=[str(src / f) for f in SOURCES],
                extra_cflags=["-O3"],
                extra_cuda_cflags=["-O3", "-lineinfo"],
                build_directory=str(out),
                verbose=verbose,
            )
        except Exception as exc:  # compiler errors come as RuntimeError, toolchain ones as OSError & co
            _error = (
                f"building the ATMM CUDA extension in {out} failed (set {VERBOSE_ENV}=1 for the full "
                f"build log): {type(exc).__name__}: {exc}"
            )
            raise RuntimeError(_error) from exc
        return _module


def available() -> bool:
    """Whether :func:`load` succeeds; the first failure is logged once as a warning."""
    global _warned
    try:
        load()
        return True
    except RuntimeError as exc:
        if not _warned:
            _warned = True
            logger.warning("ATMM: CUDA implementation unavailable, using Triton: %s", exc)
        return False


def reset() -> None:
    """Forget a remembered build failure (after installing what was missing)."""
    global _error, _warned
    with _lock:
        _error, _warned = None, False


def tiles(op: str) -> list[tuple[int, ...]]:
    """The compiled tiles of ``op`` as the extension reports them (needs the build)."""
    return [tuple(t) for t in load().tiles(op)]


# ---- launchers --------------------------------------------------------------------------

def exact_row_tiles(seg_lens: Sequence[int], block_m: int) -> int:
    """Row tiles of the items (host lengths): the smallest grid that covers them."""
    return sum(-(-n // block_m) for n in seg_lens if n > 0)


def bound_row_tiles(row_bound: int, n_items: int, block_m: int) -> int:
    """Row tiles for any items whose lengths sum to at most ``row_bound``."""
    return -(-row_bound // block_m) + n_items if row_bound > 0 and n_items > 0 else 0


def launch_shrink(
    x: torch.Tensor,
    a_buffer: torch.Tensor,
    out: torch.Tensor,
    seg_starts: torch.Tensor,
    seg_lens: torch.Tensor,
    slots: torch.Tensor,
    row_starts: torch.Tensor,
    ranks: torch.Tensor,
    permutation: torch.Tensor | None,
    num_slices: int,
    row_tiles: int,
    config: ShrinkConfig,
) -> None:
    """``out[rows of item, :S*r] = x[tokens of item] @ A[slot, :S*r].T`` (the Triton
    ``launch_shrink`` contract, with the grid's row tiles given instead of a row bound).

    Columns ``[S*r, S*max_rank)`` of a row get zeros where a column tile straddles
    ``S*r`` and are untouched past it; rows of no item are untouched.
    """
    if row_tiles <= 0 or seg_lens.numel() == 0:
        return
    mod = load()
    partials = counters = None
    if config.split_k > 1:
        partials = torch.empty((config.split_k, *out.shape), dtype=torch.float32, device=out.device)
        counters = split_counters(out.device)
    cfg = [
        config.block_m,
        config.block_n,
        config.block_k,
        config.split_k,
        config.num_warps,
        config.num_stages,
    ]
    mod.shrink(
        x,
        a_buffer,
        out,
        seg_starts,
        seg_lens,
        slots,
        row_starts,
        ranks,
        permutation,
        num_slices,
        row_tiles,
        cfg,
        partials,
        counters,
    )


def launch_expand(
    inter: torch.Tensor,
    b_buffer: torch.Tensor,
    output: torch.Tensor,
    seg_starts: torch.Tensor,
    seg_lens: torch.Tensor,
    slots: torch.Tensor,
    scales: torch.Tensor,
    row_starts: torch.Tensor,
    layers: torch.Tensor | None,
    num_layers: int,
    ranks: torch.Tensor,
    permutation: torch.Tensor | None,
    slice_offsets: Sequence[int],
    row_tiles: int,
    config: ExpandConfig,
) -> None:
    """``output[tokens, slice s] += scale * inter[rows, s*r:(s+1)*r] @ B[slot, slice s, :r].T``,
    one launch per overlap layer (as the Triton ``launch_expand``)."""
    if not 2 <= len(slice_offsets) <= 4:
        raise ValueError(f"1 to 3 slices are supported, got {len(slice_offsets) - 1}")
    if row_tiles <= 0 or seg_lens.numel() == 0:
        return
    mod = load()
    cfg = [config.block_m, config.block_n, config.block_k, config.num_warps, config.num_stages]
    mod.expand(
        inter,
        b_buffer,
        output,
        seg_starts,
        seg_lens,
        slots,
        scales,
        row_starts,
        layers if num_layers > 1 else None,
        num_layers,
        ranks,
        permutation,
        [int(o) for o in slice_offsets],
        row_tiles,
        cfg,
    )


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description="Build (or find in the cache) the ATMM CUDA extension.")
    ap.add_argument("--no-device", action="store_true", help="build without a GPU (set TORCH_CUDA_ARCH_LIST)")
    ap.add_argument("--verbose", action="store_true")
    args = ap.parse_args(argv)
    mod = load(verbose=args.verbose, require_device=not args.no_device)
    print(f"ATMM CUDA extension: {mod.__file__}")
    for op in ("shrink", "expand"):
        print(f"{op} tiles: {len(mod.tiles(op))}")


if __name__ == "__main__":
    main()
