"""Session fixtures: the tiny Qwen2-VL and its adapters, built once from their seed, and
one real SGLang server (``--plugin vlora``, CPU, three PEFT adapters) shared by every test
that asks for it. The server's log is printed when such a test fails.

Servers are started by :mod:`sglang_vlora.server_process`, the launcher the end-to-end
benchmark uses too; :func:`launch` adds the flags every test server shares. On a GPU
machine, ``VLORA_TEST_SERVER_FLAGS`` adds the flags that machine's servers need (``make
test-gpu-server`` runs the reliability corpus so: the same requests and answers against a GPU
server with CUDA graphs)."""

from __future__ import annotations

import os
import shlex
from pathlib import Path

import pytest

from sglang_vlora import server_process
from sglang_vlora.server_process import ServerProcess as Server
from sglang_vlora.server_process import free_port, stop
from sglang_vlora.tiny_model import build_tiny_adapters, build_tiny_model

__all__ = ["Server", "free_port", "launch", "stop"]

REPO = Path(__file__).resolve().parents[1]
TINY = REPO / ".cache" / "tiny"
START_TIMEOUT_S = 600
MAX_LORA_RANK = 32
SERVER_FLAGS_ENV = "VLORA_TEST_SERVER_FLAGS"


@pytest.fixture(scope="session")
def tiny_assets() -> tuple[Path, dict[str, Path]]:
    model = build_tiny_model(TINY / "model")
    adapters = build_tiny_adapters(model, TINY / "adapters")
    return model, adapters


def launch(model: Path, adapters: dict[str, Path], log_path: Path, extra: list[str]) -> Server:
    """A ``--plugin vlora`` float32 server on this machine's device (CPU in CI; SGLang takes a
    GPU where there is one) with ``adapters`` (sorted by name), ``VLORA_TEST_SERVER_FLAGS``'s
    flags, and the ``extra`` flags last; raises RuntimeError with the log tail if it does not
    come up."""
    adapters = dict(sorted(adapters.items()))
    flags = ["--plugin", "vlora", "--dtype", "float32", "--max-lora-rank", str(MAX_LORA_RANK),
             "--max-loras-per-batch", "4", *shlex.split(os.environ.get(SERVER_FLAGS_ENV, "")), *extra]
    command = server_process.server_command(model, adapters, flags)
    return server_process.launch(command, log_path, START_TIMEOUT_S, model_dir=model, adapters=adapters)


@pytest.fixture(scope="session")
def server(tiny_assets, tmp_path_factory) -> Server:
    model, adapters = tiny_assets
    # Modes set by hand (POST /vlora/mode): the orchestrator has its own server in
    # tests/server/test_orchestrator.py. The pool's A rows are appended to the base weights
    # (--vlora-shrink-in-gemm on; "auto" leaves them apart on a CPU), so every test of this
    # server runs adapter loads, merges and the eager path over that layout.
    srv = launch(model, adapters, tmp_path_factory.mktemp("server") / "server.log",
                 ["--vlora-policy", "manual", "--vlora-shrink-in-gemm", "on"])
    yield srv
    stop(srv)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.when == "call" and report.failed:
        srv = item.funcargs.get("server")
        if isinstance(srv, Server):
            report.sections.append(("sglang server log (tail)", srv.log_tail()))
