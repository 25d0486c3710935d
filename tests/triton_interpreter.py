"""Running the Triton kernels on CPU tensors, through Triton's interpreter.

Triton reads ``TRITON_INTERPRET`` when it defines a kernel (at import), the plugin when it
picks a path (at each call). A test that sets it to 1 in a process whose kernels were defined
for a GPU (``TRITON_INTERPRET=0``, as ``make test-gpu`` runs) would hand CPU tensors to
compiled kernels, so such a test skips there; ``make test`` runs it."""

from __future__ import annotations

import pytest
from triton.runtime.interpreter import InterpretedFunction


def use_triton_interpreter(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make the plugin take its Triton kernels on CPU tensors; skip where they cannot run there."""
    from sglang_vlora.atmm import triton_kernels

    if not isinstance(triton_kernels._shrink_kernel, InterpretedFunction):
        pytest.skip("Triton's kernels were defined for a GPU in this process (TRITON_INTERPRET was not 1 at import)")
    monkeypatch.setenv("TRITON_INTERPRET", "1")
