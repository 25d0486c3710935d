"""Kernel tests run the Triton kernels on CPU through Triton's interpreter."""

import os

os.environ.setdefault("TRITON_INTERPRET", "1")
