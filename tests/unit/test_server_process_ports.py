"""A server launched on a port that is already taken fails at once, with a reason that names
the port, instead of waiting out its start-up timeout.

Left alone, SGLang's HTTP server logs ``[Errno 98] ... address already in use`` some 20 s
after the launch (once the model is loaded) and then hangs in its shutdown with the scheduler
and detokenizer still running, so the process never exits and :func:`wait_healthy` used to
wait the whole 600 s. The pure tests need no server; the last one starts a real tiny CPU
server (30-90 s)."""

from __future__ import annotations

import os
import signal
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from sglang_vlora import server_process
from sglang_vlora.server_process import ServerProcess

TIMEOUT_S = 600
# A real line of a CPU server's log whose port was taken (the port is filled in).
BIND_ERROR = ("[2026-11-24 20:16:33] ERROR:    [Errno 98] error while attempting to bind on address "
              "('127.0.0.1', {port}): address already in use\n")


@pytest.fixture
def taken_port() -> Iterator[int]:
    """A port of 127.0.0.1 with a listening socket on it, as another server would have."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen(1)
        yield sock.getsockname()[1]


def test_a_listening_port_is_in_use_on_every_address_the_server_would_bind(taken_port):
    assert server_process.port_in_use("127.0.0.1", taken_port)
    assert server_process.port_in_use("localhost", taken_port)
    assert server_process.port_in_use("0.0.0.0", taken_port)


def test_a_free_port_and_one_left_in_time_wait_are_not_in_use():
    """The check binds with SO_REUSEADDR, as the server does: a port whose last connection
    is still in TIME_WAIT (a server stopped a moment ago, whose listener had SO_REUSEADDR
    too, as asyncio's has) is free to it."""
    with socket.socket() as listener:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        port = listener.getsockname()[1]
        with socket.create_connection(("127.0.0.1", port)) as client:
            accepted, _ = listener.accept()
            accepted.close()  # the listening side closes first: its end waits in TIME_WAIT
            client.recv(1)
    assert not server_process.port_in_use("127.0.0.1", port)


def test_a_free_port_lies_under_the_ephemeral_range_and_is_handed_out_once():
    """The server binds its port only after start-up; a port from the ephemeral range
    (where bind(0) and outgoing connections draw) could be taken by then. This is the race
    that once made a CI server fail with "address already in use"."""
    low, high = server_process.FREE_PORT_RANGE
    ports = [server_process.free_port() for _ in range(50)]
    assert len(set(ports)) == len(ports)
    for port in ports:
        assert low <= port <= high < server_process.ephemeral_port_low()
        assert not server_process.port_in_use("127.0.0.1", port)


def test_free_port_skips_a_port_in_use(monkeypatch, taken_port):
    """With only one candidate left and it taken, the error says what to do."""
    monkeypatch.setattr(server_process, "FREE_PORT_RANGE", (taken_port, taken_port))
    monkeypatch.setattr(server_process, "ephemeral_port_low", lambda: 65536)
    with pytest.raises(RuntimeError, match=rf"no free port on 127.0.0.1 in {taken_port}-{taken_port}.*--port"):
        server_process.free_port()


def test_bind_failed_matches_only_this_ports_bind_error():
    line = BIND_ERROR.format(port=30000)
    assert server_process.bind_failed(line, 30000)
    assert server_process.bind_failed(line.replace("('127.0.0.1', 30000)", "('::1', 30000, 0, 0)"), 30000)
    assert not server_process.bind_failed(line, 3000)
    assert not server_process.bind_failed(line, 300001)
    # other errors naming the port, or the same words elsewhere, are not the bind error
    assert not server_process.bind_failed("ERROR:    [Errno 111] Connect call failed ('127.0.0.1', 30000)", 30000)
    assert not server_process.bind_failed("nccl port 30000: address already in use", 30000)


def test_host_port_reads_the_last_flags_as_the_servers_parser_does():
    command = server_process.server_command(Path("m"), port=1234, extra=["--port", "4321"])
    assert server_process.host_port(command) == ("127.0.0.1", 4321)
    assert server_process.url_of(command) == "http://127.0.0.1:4321"


class _Running:
    """A stand-in for a Popen that is still running."""

    returncode = None

    def poll(self) -> None:
        return None


def test_start_failure_reads_each_log_line_once_and_waits_for_whole_lines(tmp_path):
    log = tmp_path / "server.log"
    command = server_process.server_command(Path("m"), port=30000)
    log.write_text("$ " + " ".join(command) + "\n")
    srv = ServerProcess(server_process.url_of(command), log, _Running(), command)
    assert server_process.start_failure(srv) is None
    line = BIND_ERROR.format(port=30000)
    with open(log, "a") as f:
        f.write(line[:60])  # a line still being written
    assert server_process.start_failure(srv) is None
    with open(log, "a") as f:
        f.write(line[60:])
    reason = server_process.start_failure(srv)
    assert reason is not None and "port 30000 is already in use" in reason


def test_wait_healthy_returns_at_once_on_the_bind_error(tmp_path):
    log = tmp_path / "server.log"
    port = server_process.free_port()  # nothing answers /health there
    command = server_process.server_command(Path("m"), port=port)
    log.write_text(BIND_ERROR.format(port=port))
    srv = ServerProcess(server_process.url_of(command), log, _Running(), command)
    began = time.monotonic()
    reason = server_process.wait_healthy(srv, TIMEOUT_S, poll_s=0.1)
    assert reason is not None and f"port {port} is already in use" in reason
    assert time.monotonic() - began < 10


def test_launch_refuses_a_taken_port_before_starting_anything(taken_port, tmp_path, monkeypatch):
    def no_start(*args, **kwargs):
        raise AssertionError("a server was started on a taken port")

    monkeypatch.setattr(server_process, "start", no_start)
    command = server_process.server_command(Path("m"), port=taken_port)
    with pytest.raises(RuntimeError, match=f"port {taken_port} is already in use"):
        server_process.launch(command, tmp_path / "server.log", TIMEOUT_S, name="taken")


def _group(pgid: int) -> list[int]:
    """Live (not zombie) processes of process group ``pgid``."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        state, _ppid, group = stat.rsplit(")", 1)[1].split()[:3]
        if int(group) == pgid and state != "Z":
            pids.append(int(entry.name))
    return pids


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="process groups are read from /proc")
def test_a_real_server_whose_port_is_taken_fails_fast_and_leaves_nothing(taken_port, tiny_assets, tmp_path,
                                                                            monkeypatch):
    """The port is taken after launch's own check passed (a race, here forced by skipping
    the check): the real server's bind error in its log ends the wait; launch stops the
    whole process group and raises with the reason and the log tail."""
    model, adapters = tiny_assets
    started: list[ServerProcess] = []
    real_start = server_process.start

    def recording_start(*args, **kwargs) -> ServerProcess:
        started.append(real_start(*args, **kwargs))
        return started[-1]

    monkeypatch.setattr(server_process, "port_in_use", lambda host, port: False)
    monkeypatch.setattr(server_process, "start", recording_start)
    flags = ["--device", "cpu", "--plugin", "vlora", "--dtype", "float32", "--max-lora-rank", "32",
             "--max-loras-per-batch", "4"]  # as tests/conftest.py's CPU servers
    command = server_process.server_command(model, dict(sorted(adapters.items())), flags, port=taken_port)
    began = time.monotonic()
    try:
        with pytest.raises(RuntimeError) as failure:
            server_process.launch(command, tmp_path / "server.log", TIMEOUT_S, name="taken")
        elapsed = time.monotonic() - began
        assert f"port {taken_port} is already in use" in str(failure.value)
        assert "[Errno 98]" in str(failure.value)  # the log tail came along
        assert elapsed < 120, f"took {elapsed:.0f} s to notice the taken port"
        (srv,) = started
        assert not srv.alive()
        deadline = time.monotonic() + 30
        while _group(srv.process.pid) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert _group(srv.process.pid) == [], "server processes were left behind"
    finally:
        for srv in started:
            server_process.stop(srv)
            for pid in _group(srv.process.pid):
                os.kill(pid, signal.SIGKILL)
