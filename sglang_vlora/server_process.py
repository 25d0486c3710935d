"""A real SGLang server in a child process: start, wait until it answers, stop.

One launcher for everything that needs a live server (the test fixtures, the end-to-end
benchmark): ``python -m sglang.launch_server ...`` in its own session (so that stopping it
stops its scheduler and detokenizer too), its output in a log file whose tail goes into
error messages. Only the standard library: nothing here imports SGLang or torch.

    server = start(server_command(model, adapters={"a8": path}, extra=["--plugin", "vlora"]),
                   log_path)
    reason = wait_healthy(server, timeout_s=600)   # None once GET /health answers 200
    ...
    stop(server)

A port that is already taken is caught early: :func:`launch` checks it before starting, and
:func:`wait_healthy` watches the log for the HTTP server's bind error. Without that a server
that cannot bind its port waits out the whole start-up timeout: uvicorn logs the error and
then hangs in the application's shutdown, while the scheduler and detokenizer keep running.

Where the package is not installed (its source only on ``PYTHONPATH``, as on a benchmark
machine), SGLang cannot find the plugin, which it looks up by entry point:
:func:`entry_point_dir` writes a small ``dist-info`` that declares it, and :func:`server_env`
puts that folder on the server's ``PYTHONPATH``.
"""

from __future__ import annotations

import errno
import importlib.metadata
import os
import random
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

PLUGIN_NAME = "vlora"
PLUGIN_ENTRY_POINT = "sglang_vlora.plugin:register"
# Variables of the calling process that would change a server's behaviour behind its flags.
_DROPPED_ENV_PREFIXES = ("SGLANG_VLORA", "SGLANG_USE_CPU")
# Requests to the local server never go through a proxy.
_OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


@dataclass
class ServerProcess:
    """A launched server. ``ready_s`` is set by :func:`wait_healthy` (seconds from launch)."""

    url: str
    log_path: Path
    process: subprocess.Popen
    command: list[str]
    model_dir: Path | None = None
    adapters: dict[str, Path] = field(default_factory=dict)
    name: str = "server"
    launched: float = field(default_factory=time.monotonic)
    ready_s: float | None = None
    # bytes of the log already searched by :func:`start_failure` (each start-up line once)
    _log_scanned: int = field(default=0, init=False, repr=False, compare=False)

    def alive(self) -> bool:
        return self.process.poll() is None

    def log_tail(self, lines: int = 80) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


# Where :func:`free_port` looks: under SGLang's own pick for its NCCL port (22000-29999) and
# under the kernel's ephemeral range (32768 up by default).
FREE_PORT_RANGE = (12000, 21999)
_ports_handed_out: set[int] = set()


def ephemeral_port_low() -> int:
    """The lowest port the kernel hands to ``bind(0)`` and outgoing connections."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port(host: str = "127.0.0.1") -> int:
    """A port free on ``host`` now, for a server that binds it only after its start-up.

    Picked at random under the kernel's ephemeral range, never from ``bind(0)``: the HTTP
    server binds its port seconds after the launch, once the model is loaded, and in that
    window every outgoing connection and every ``bind(0)`` of any process (the server's own
    included) draws from the ephemeral range and may take a port found free there. A port
    this process handed out before is not handed out again, so servers started together
    get different ports."""
    low, high = FREE_PORT_RANGE
    high = min(high, ephemeral_port_low() - 1)
    candidates = [p for p in range(low, high + 1) if p not in _ports_handed_out]
    for port in random.SystemRandom().sample(candidates, min(len(candidates), 256)):
        if not port_in_use(host, port):
            _ports_handed_out.add(port)
            return port
    raise RuntimeError(f"no free port on {host} in {low}-{high} (under the ephemeral range); "
                       "give the server a port with --port")


def server_command(
    model: Path,
    adapters: Mapping[str, Path] | None = None,
    extra: Sequence[str] = (),
    port: int | None = None,
    host: str = "127.0.0.1",
    python: str = sys.executable,
) -> list[str]:
    """``python -m sglang.launch_server`` for ``model`` with ``adapters`` (name -> PEFT folder,
    in the given order) and ``extra`` flags last, so they override what comes before."""
    cmd = [python, "-m", "sglang.launch_server", "--model-path", str(model), "--host", host,
           "--port", str(port or free_port(host))]
    if adapters:
        cmd += ["--lora-paths", *[f"{name}={path}" for name, path in adapters.items()]]
    return cmd + list(extra)


def _last_value(args: Sequence[str], flag: str) -> str:
    """The value of the last ``flag`` in ``args``: SGLang's parser keeps the last one, so
    ``extra`` flags given after the defaults win."""
    return args[len(args) - 1 - list(reversed(args)).index(flag) + 1]


def host_port(command: Sequence[str]) -> tuple[str, int]:
    """The host and port a :func:`server_command` binds."""
    return _last_value(command, "--host"), int(_last_value(command, "--port"))


def url_of(command: Sequence[str]) -> str:
    """The base URL a :func:`server_command` listens on."""
    host, port = host_port(command)
    return f"http://{host}:{port}"


def port_in_use(host: str, port: int) -> bool:
    """Whether binding ``host:port`` fails with "address already in use", tried the way the
    server's HTTP listener (asyncio under uvicorn) binds: every address of ``host``, with
    ``SO_REUSEADDR``, so a port left in TIME_WAIT by an earlier server counts as free."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except OSError:
        return False  # an unknown host is for the server to report
    for family, kind, proto, _, address in infos:
        with socket.socket(family, kind, proto) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if family == socket.AF_INET6:
                sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
            try:
                sock.bind(address)
            except OSError as e:
                if e.errno == errno.EADDRINUSE:
                    return True
    return False


def port_in_use_reason(host: str, port: int) -> str:
    return f"port {port} is already in use (the server cannot listen on {host}:{port})"


def bind_failed(log_text: str, port: int) -> bool:
    """Whether ``log_text`` holds the HTTP server's "address already in use" error for
    ``port``, as asyncio words it under uvicorn: ``[Errno 98] error while attempting to bind
    on address ('127.0.0.1', 30000): address already in use``. Only this exact error of
    this port counts, so no other line of the log (or another port's error) misfires."""
    pattern = (rf"\[Errno {errno.EADDRINUSE}\] error while attempting to bind on address "
               rf"\('[^']*', {port}[,)]")
    return re.search(pattern, log_text) is not None


def plugin_installed() -> bool:
    return any(e.name == PLUGIN_NAME for e in importlib.metadata.entry_points(group="sglang.srt.plugins"))


def entry_point_dir(root: Path) -> Path:
    """A ``dist-info`` under ``root`` that declares the plugin's entry point (for a machine
    where the package is not installed); returns ``root``, the folder for ``PYTHONPATH``."""
    info = Path(root) / "sglang_vlora-0.0.0.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: sglang-vlora\nVersion: 0.0.0\n")
    (info / "entry_points.txt").write_text(f"[sglang.srt.plugins]\n{PLUGIN_NAME} = {PLUGIN_ENTRY_POINT}\n")
    return Path(root)


def server_env(pythonpath: Sequence[Path] = (), extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """This process's environment without the plugin's own variables (the server's flags
    decide), offline, unbuffered, with ``pythonpath`` put first on ``PYTHONPATH``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(_DROPPED_ENV_PREFIXES)}
    env.update(HF_HUB_OFFLINE="1", TRANSFORMERS_OFFLINE="1", PYTHONUNBUFFERED="1")
    if pythonpath:
        rest = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
        env["PYTHONPATH"] = os.pathsep.join([str(p) for p in pythonpath] + rest)
    env.update(extra or {})
    return env


def start(
    command: Sequence[str],
    log_path: Path,
    env: Mapping[str, str] | None = None,
    cwd: Path | None = None,
    name: str = "server",
    model_dir: Path | None = None,
    adapters: Mapping[str, Path] | None = None,
    cpus: Sequence[int] | None = None,
) -> ServerProcess:
    """Launch ``command`` (a :func:`server_command`) without waiting; its output goes to
    ``log_path``, which starts with the command line. ``cpus``: the only CPUs the server and
    every process it starts may run on (set in the child before it runs the command)."""
    log_path = Path(log_path)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "w") as log:
        log.write("$ " + shlex.join(command) + "\n")
        log.flush()
        pin = None if cpus is None else (lambda: os.sched_setaffinity(0, cpus))
        process = subprocess.Popen(list(command), stdout=log, stderr=subprocess.STDOUT,
                                   env=dict(env) if env is not None else server_env(), cwd=cwd,
                                   start_new_session=True, preexec_fn=pin)
    return ServerProcess(url_of(command), log_path, process, list(command), model_dir, dict(adapters or {}), name)


def get_json(url: str, timeout_s: float = 10.0) -> tuple[int, bytes]:
    """GET ``url`` without a proxy: (status, body); status 0 when nothing answered."""
    try:
        with _OPENER.open(url, timeout=timeout_s) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except (urllib.error.URLError, OSError):
        return 0, b""


def healthy(server: ServerProcess) -> bool:
    return get_json(server.url + "/health", timeout_s=5)[0] == 200


def _new_log_lines(server: ServerProcess) -> str:
    """The complete lines the log gained since the last call (a line still being written
    waits for the next one)."""
    try:
        with open(server.log_path, "rb") as log:
            log.seek(server._log_scanned)
            chunk = log.read()
    except OSError:
        return ""
    end = chunk.rfind(b"\n") + 1
    server._log_scanned += end
    return chunk[:end].decode(errors="replace")


def start_failure(server: ServerProcess) -> str | None:
    """Why a starting server will never answer, as soon as that is known: its process
    exited, or its HTTP server could not bind the port (the process then stays up, so
    without this the caller would wait out its whole timeout); None while it may still
    come up."""
    if not server.alive():
        return f"server exited with code {server.process.returncode} during start-up"
    url = urllib.parse.urlsplit(server.url)
    if url.port is not None and bind_failed(_new_log_lines(server), url.port):
        return port_in_use_reason(url.hostname or "", url.port)
    return None


def wait_healthy(server: ServerProcess, timeout_s: float, poll_s: float = 1.0) -> str | None:
    """None once ``/health`` answers 200 within ``timeout_s`` of the launch; else why not
    (the process exited, its port was already in use, or the time ran out)."""
    deadline = server.launched + timeout_s
    while True:
        reason = start_failure(server)
        if reason is not None:
            return reason
        if healthy(server):
            server.ready_s = round(time.monotonic() - server.launched, 1)
            return None
        if time.monotonic() >= deadline:
            return f"no healthy answer within {timeout_s:.0f} s of its launch"
        time.sleep(poll_s)


def launch(command: Sequence[str], log_path: Path, timeout_s: float, **kwargs) -> ServerProcess:
    """:func:`start` then :func:`wait_healthy`; a server that does not come up is stopped and
    a RuntimeError carries the reason and its log tail. A port already in use now is refused
    before anything starts: the server would only find out once its model is loaded (the
    log watch of :func:`wait_healthy` still catches a port taken after this check)."""
    host, port = host_port(command)
    if port_in_use(host, port):
        raise RuntimeError(f"{kwargs.get('name', 'server')}: {port_in_use_reason(host, port)}; not started")
    server = start(command, log_path, **kwargs)
    reason = wait_healthy(server, timeout_s)
    if reason is not None:
        stop(server)
        raise RuntimeError(f"{server.name}: {reason}:\n{server.log_tail()}")
    return server


def terminate(server: ServerProcess) -> None:
    """SIGTERM to the server's process group, without waiting."""
    if server.alive():
        try:
            os.killpg(server.process.pid, signal.SIGTERM)
        except ProcessLookupError:
            pass


def stop(server: ServerProcess, grace_s: float = 30.0) -> None:
    """SIGTERM to the server's process group, SIGKILL after ``grace_s``."""
    if not server.alive():
        return
    try:
        os.killpg(server.process.pid, signal.SIGTERM)
        server.process.wait(timeout=grace_s)
    except subprocess.TimeoutExpired:
        os.killpg(server.process.pid, signal.SIGKILL)
        server.process.wait(timeout=grace_s)
    except ProcessLookupError:
        pass
