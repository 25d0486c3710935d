"""The benchmark's start-up wait gives up on a server whose port is taken at once."""

import subprocess
import sys
import time

from bench.e2e import servers
from sglang_vlora.server_process import ServerProcess


def _sleeping(tmp_path, name: str, log: str, port: int) -> ServerProcess:
    """A live process that never answers HTTP, with ``log`` as its server log."""
    log_path = tmp_path / f"{name}.log"
    log_path.write_text(log)
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    return ServerProcess(f"http://127.0.0.1:{port}", log_path, proc, [], name=name)


def test_wait_all_fails_a_server_that_cannot_bind_its_port_without_waiting_the_timeout(tmp_path):
    port = 1  # nothing answers there
    bind_error = (f"ERROR:    [Errno 98] error while attempting to bind on address ('127.0.0.1', {port}): "
                  "address already in use\n")
    taken = _sleeping(tmp_path, "taken", "Application startup complete.\n" + bind_error, port)
    exited = ServerProcess("http://127.0.0.1:1", tmp_path / "x.log",
                           subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"]), [], name="exited")
    try:
        started = time.monotonic()
        failed = servers.wait_all({"taken": taken, "exited": exited}, timeout_s=600)
        assert time.monotonic() - started < 30
    finally:
        taken.process.kill()
        taken.process.wait()
    assert failed["taken"] == f"port {port} is already in use (the server cannot listen on 127.0.0.1:{port})"
    assert failed["exited"] == "server exited with code 3 during start-up"


def test_wait_all_times_out_a_server_that_never_answers(tmp_path):
    quiet = _sleeping(tmp_path, "quiet", "loading\n", 1)
    try:
        failed = servers.wait_all({"quiet": quiet}, timeout_s=1.5)
    finally:
        quiet.process.kill()
        quiet.process.wait()
    assert failed == {"quiet": "no healthy answer within 2 s of its launch"}
