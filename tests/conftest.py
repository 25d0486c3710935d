"""Session fixtures: the tiny Qwen2-VL and its adapters, built once from their seed, and
one real SGLang server (``--plugin vlora``, CPU, three PEFT adapters) shared by every test
that asks for it. The server's log is printed when such a test fails."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from sglang_vlora.tiny_model import build_tiny_adapters, build_tiny_model

REPO = Path(__file__).resolve().parents[1]
TINY = REPO / ".cache" / "tiny"
START_TIMEOUT_S = 600
MAX_LORA_RANK = 32


@dataclass
class Server:
    url: str
    log_path: Path
    model_dir: Path
    adapters: dict[str, Path]
    process: subprocess.Popen

    def log_tail(self, lines: int = 80) -> str:
        text = self.log_path.read_text(errors="replace").splitlines()
        return "\n".join(text[-lines:])

    def alive(self) -> bool:
        return self.process.poll() is None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="session")
def tiny_assets() -> tuple[Path, dict[str, Path]]:
    model = build_tiny_model(TINY / "model")
    adapters = build_tiny_adapters(model, TINY / "adapters")
    return model, adapters


def launch(model: Path, adapters: dict[str, Path], log_path: Path, extra: list[str]) -> Server:
    port = free_port()
    cmd = [
        sys.executable, "-m", "sglang.launch_server",
        "--plugin", "vlora",
        "--model-path", str(model),
        "--dtype", "float32",
        "--lora-paths", *[f"{name}={path}" for name, path in sorted(adapters.items())],
        "--max-lora-rank", str(MAX_LORA_RANK),
        "--max-loras-per-batch", "4",
        "--port", str(port),
        *extra,
    ]
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SGLANG_VLORA", "SGLANG_USE_CPU"))}
    env.update(HF_HUB_OFFLINE="1", PYTHONUNBUFFERED="1")
    log = open(log_path, "w")
    process = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    server = Server(f"http://127.0.0.1:{port}", log_path, model, adapters, process)
    deadline = time.time() + START_TIMEOUT_S
    while time.time() < deadline:
        if not server.alive():
            raise RuntimeError(f"server exited with {process.returncode}:\n{server.log_tail()}")
        try:
            if httpx.get(server.url + "/health", timeout=5).status_code == 200:
                return server
        except httpx.HTTPError:
            pass
        time.sleep(2)
    stop(server)
    raise RuntimeError(f"server did not start in {START_TIMEOUT_S}s:\n{server.log_tail()}")


def stop(server: Server) -> None:
    import signal

    if server.alive():
        os.killpg(server.process.pid, signal.SIGTERM)
        try:
            server.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(server.process.pid, signal.SIGKILL)


@pytest.fixture(scope="session")
def server(tiny_assets, tmp_path_factory) -> Server:
    model, adapters = tiny_assets
    # Modes set by hand (POST /vlora/mode): the orchestrator has its own server in
    # tests/server/test_orchestrator.py.
    srv = launch(model, adapters, tmp_path_factory.mktemp("server") / "server.log", ["--vlora-policy", "manual"])
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
