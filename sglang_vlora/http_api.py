"""The plugin's HTTP API, in SGLang's HTTP server process: ``POST /vlora/mode``,
``GET /vlora/status`` and ``GET /vlora/timeline?since=UNIX_TIME``, and the client of the
scheduler's RPC socket they go through.

SGLang's HTTP app has no API for new routes and its RPC socket is bound by SGLang's
``Engine``, which does not exist in HTTP-server mode: the hook
:func:`sglang_vlora.modes.mode_hooks.launch_subprocesses_after` connects a
:class:`SchedulerRPC` once the scheduler runs and calls :func:`add_routes`. The scheduler
receives the RPCs between forward passes and hands them to every TP rank in the same
iteration (:func:`sglang_vlora.modes.mode_hooks.rpc_around` answers them), so every rank
switches at the same point. An answer is JSON: the body on success, else
``{"error": ..., "status": ...}`` (:func:`rpc_failure`).

Auth: ``/vlora/mode`` carries SGLang's ``ADMIN_OPTIONAL`` level, like its own
``/load_lora_adapter``; ``/vlora/status`` and ``/vlora/timeline`` (in :data:`ANY_KEY_ROUTES`) read
with any configured key (:func:`sglang_vlora.guard_hooks.decide_auth_around`).
"""

from __future__ import annotations

import asyncio
import json
import math
import threading
import time
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse

from sglang_vlora.modes.controller import SlotBusyError

RPC_MODE = "vlora_mode"
RPC_STATUS = "vlora_status"
RPC_TIMELINE = "vlora_timeline"
# POST /vlora/mode may wait this long for a pool slot ("wait_s").
MAX_WAIT_S = 60.0
MODE_ROUTE = "/vlora/mode"
STATUS_ROUTE = "/vlora/status"
TIMELINE_ROUTE = "/vlora/timeline"
# Routes readable with the user key or the admin key (when keys are configured).
ANY_KEY_ROUTES = frozenset({STATUS_ROUTE, TIMELINE_ROUTE})


def rpc_failure(message: str, status: int) -> str:
    """The message of a failed RPC answer: the error and the HTTP status it maps to."""
    return json.dumps({"error": message, "status": status})


class SchedulerRPC:
    """The HTTP server's end of the scheduler's RPC socket."""

    TIMEOUT_MS = 60_000

    def __init__(self, rpc_ipc_name: str) -> None:
        self._address = rpc_ipc_name
        self._lock = threading.Lock()
        self._socket = self._open()

    def _open(self):
        import zmq
        from sglang.srt.utils.network import get_zmq_socket

        socket = get_zmq_socket(zmq.Context.instance(), zmq.DEALER, self._address, True)
        socket.setsockopt(zmq.RCVTIMEO, self.TIMEOUT_MS)
        return socket

    def call(self, method: str, parameters: dict | None) -> tuple[bool, str]:
        """Send one RPC and wait for its answer; ``TimeoutError`` if none comes."""
        import zmq
        from sglang.srt.managers.io_struct import RpcReqInput, sock_recv, sock_send

        with self._lock:
            sock_send(self._socket, RpcReqInput(method=method, parameters=parameters))
            try:
                reply = sock_recv(self._socket)
            except zmq.Again:
                # A late answer must not be read as the next call's: start afresh.
                self._socket.close(linger=0)
                self._socket = self._open()
                raise TimeoutError(f"the scheduler did not answer {method} in {self.TIMEOUT_MS // 1000} s") from None
        return reply.success, reply.message

    async def merged_adapter(self) -> str | None:
        """The adapter merged into the weights now (None: unmerged or no answer)."""
        try:
            ok, message = await asyncio.to_thread(self.call, RPC_STATUS, None)
        except TimeoutError as exc:
            raise ValueError(f"cannot check the merged adapter: {exc}") from exc
        return json.loads(message).get("merged_adapter") if ok else None


def _mode_body(body: Any) -> tuple[dict[str, Any] | None, str | None]:
    """The RPC parameters and the wait of a POST /vlora/mode body, or an error message."""
    usage = 'the body must be {"mode": "merge"|"mixture"|"unmerge", "adapter": name or null, "wait_s": seconds}'
    if not isinstance(body, dict):
        return None, usage
    unknown = sorted(set(body) - {"mode", "adapter", "wait_s"})
    if unknown:
        return None, f"unknown field(s) {unknown}: {usage}"
    mode, adapter, wait = body.get("mode"), body.get("adapter"), body.get("wait_s", 0)
    if not isinstance(mode, str) or (adapter is not None and not isinstance(adapter, str)):
        return None, "mode must be a string and adapter a string or null"
    if isinstance(wait, bool) or not isinstance(wait, (int, float)) or not 0 <= wait <= MAX_WAIT_S:
        return None, f"wait_s must be a number of seconds in [0, {MAX_WAIT_S:g}], got {wait!r}"
    return {"mode": mode, "adapter": adapter, "wait_s": float(wait)}, None


def timeline_since(text: str) -> tuple[float | None, str | None]:
    """``GET /vlora/timeline``'s ``since`` (a unix time in seconds, 0 for everything kept), or
    the error that refuses it."""
    try:
        since = float(text)
    except ValueError:
        return None, f"since must be a unix time in seconds, not {text!r}"
    if not math.isfinite(since) or since < 0:
        return None, f"since must be a finite unix time of 0 or more, not {text!r}"
    return since, None


async def _call(rpc: SchedulerRPC, method: str, parameters: dict | None, wait_s: float = 0.0) -> JSONResponse:
    """One RPC as an HTTP answer; a 409 (no pool slot) is retried until ``wait_s`` passes."""
    deadline = time.monotonic() + wait_s
    while True:
        try:
            ok, message = await asyncio.to_thread(rpc.call, method, parameters)
        except TimeoutError as exc:
            return JSONResponse({"error": str(exc)}, status_code=504)
        if ok:
            return JSONResponse(json.loads(message))
        failure = json.loads(message)
        if failure["status"] != SlotBusyError.status_code or time.monotonic() >= deadline:
            return JSONResponse({"error": failure["error"]}, status_code=failure["status"])
        await asyncio.sleep(0.05)


def add_routes(rpc: SchedulerRPC) -> None:
    """Add ``POST /vlora/mode`` (SGLang's ``ADMIN_OPTIONAL`` auth level: with
    ``--admin-api-key`` only that key, with only ``--api-key`` that key, with none open),
    ``GET /vlora/status`` and ``GET /vlora/timeline`` (any configured key) to SGLang's HTTP app."""
    from sglang.srt.entrypoints.http_server import app
    from sglang.srt.utils.auth import AuthLevel, auth_level

    @auth_level(AuthLevel.ADMIN_OPTIONAL)
    async def set_mode(request: Request) -> JSONResponse:
        try:
            body = await request.json()
        except ValueError:
            return JSONResponse({"error": "the body must be JSON"}, status_code=400)
        params, error = _mode_body(body)
        if error is not None:
            return JSONResponse({"error": error}, status_code=400)
        wait = params.pop("wait_s")
        return await _call(rpc, RPC_MODE, params, wait)

    async def get_status() -> JSONResponse:
        return await _call(rpc, RPC_STATUS, None)

    async def get_timeline(request: Request) -> JSONResponse:
        since, error = timeline_since(request.query_params.get("since", "0"))
        if error is not None:
            return JSONResponse({"error": error}, status_code=400)
        return await _call(rpc, RPC_TIMELINE, {"since": since})

    app.add_api_route(MODE_ROUTE, set_mode, methods=["POST"])
    app.add_api_route(STATUS_ROUTE, get_status, methods=["GET"])
    app.add_api_route(TIMELINE_ROUTE, get_timeline, methods=["GET"])
