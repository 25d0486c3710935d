"""The trainer's tests use the session's tiny Qwen2-VL (tests/conftest.py), the same model
the test server serves, so the server can check the trainer's adapters."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def tiny_model(tiny_assets: tuple[Path, dict[str, Path]]) -> Path:
    return tiny_assets[0]
