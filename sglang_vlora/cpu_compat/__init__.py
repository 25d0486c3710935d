"""Run SGLang 0.5.23 on a machine without a GPU, with no environment set by hand.

Active only when no CUDA device is present (:func:`gpu_present` is False); on a GPU
machine nothing here runs. Three gaps are bridged:

1. ``import sgl_kernel`` fails (PyPI's sglang-kernel has no CPU ops, or is not
   installed). The folder ``sgl_kernel_stub/`` holds an import-only stand-in whose
   ops raise a clear error if called. It is put first on ``sys.path`` here and on
   ``PYTHONPATH`` for the processes SGLang spawns, which import
   ``sglang.srt.managers.scheduler`` (and through it ``sgl_kernel``) before they
   load plugins.
2. SGLang picks its CPU platform from ``SGLANG_USE_CPU_ENGINE=1``; we set it (and
   reset SGLang's cached ``is_cpu()``) so child processes see it from their start.
3. SGLang's LoRA code pins host memory unconditionally (``Tensor.pin_memory()``,
   ``torch.tensor(..., pin_memory=True)``), which raises without a GPU driver.
   Pinning only matters for GPU copies, so without a GPU both become no-ops.

Each bridge is declared, with what it replaces, in :mod:`sglang_vlora.sglang_hooks`.
"""

from __future__ import annotations

import functools
import importlib
import logging
import os
import sys
from pathlib import Path

import torch

logger = logging.getLogger(__name__)

STUB_DIR = Path(__file__).resolve().parent / "sgl_kernel_stub"
CPU_ENGINE_ENV = "SGLANG_USE_CPU_ENGINE"


def gpu_present() -> bool:
    """True when torch sees a CUDA (or ROCm) device."""
    return torch.cuda.is_available()


def real_sgl_kernel_importable() -> bool:
    """Whether the real ``sgl_kernel`` imports in this interpreter."""
    if "sgl_kernel" in sys.modules:
        return not getattr(sys.modules["sgl_kernel"], "IS_SGLANG_VLORA_STUB", False)
    try:
        importlib.import_module("sgl_kernel")
    except Exception:  # its loader raises ImportError, OSError, ... on a CPU box
        for name in [m for m in sys.modules if m == "sgl_kernel" or m.startswith("sgl_kernel.")]:
            del sys.modules[name]
        return False
    return True


def install_sgl_kernel_stub() -> None:
    """Put the stand-in first on the import path of this and all child processes."""
    stub = str(STUB_DIR)
    if stub not in sys.path:
        sys.path.insert(0, stub)
    paths = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    if stub not in paths:
        os.environ["PYTHONPATH"] = os.pathsep.join([stub, *paths])


def select_cpu_engine() -> None:
    """Make SGLang choose its CPU platform in this and all child processes."""
    os.environ[CPU_ENGINE_ENV] = "1"
    from sglang.srt.utils import common

    common.is_cpu.cache_clear()


_original_pin_memory = torch.Tensor.pin_memory
_original_tensor = torch.tensor


def _pin_memory_without_gpu(self: torch.Tensor, *args, **kwargs) -> torch.Tensor:
    return self


@functools.wraps(_original_tensor)
def _tensor_without_pinning(*args, **kwargs):
    kwargs.pop("pin_memory", None)
    return _original_tensor(*args, **kwargs)


def disable_pinning() -> None:
    """Make host-memory pinning a no-op (only called when no GPU is present)."""
    torch.Tensor.pin_memory = _pin_memory_without_gpu
    torch.tensor = _tensor_without_pinning


def pinning_disabled() -> bool:
    return torch.Tensor.pin_memory is _pin_memory_without_gpu and torch.tensor is _tensor_without_pinning


def activate() -> bool:
    """Bridge the CPU gaps if no GPU is present. Returns whether it did anything."""
    if gpu_present():
        return False
    if not real_sgl_kernel_importable():
        install_sgl_kernel_stub()
    select_cpu_engine()
    disable_pinning()
    logger.info("sglang-vlora: no GPU found, CPU compatibility layer active")
    return True
