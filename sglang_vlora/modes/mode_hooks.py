"""Inference modes inside the running SGLang server: the glue between SGLang's scheduler
and :mod:`sglang_vlora.modes` (switcher, mixture items). Declared in
:mod:`sglang_vlora.sglang_hooks`.

Control path: ``POST /vlora/mode`` and ``GET /vlora/status`` (launcher) send an SGLang
``RpcReqInput`` over the scheduler's RPC socket. The scheduler receives RPCs between
forward passes and hands them to every TP rank in the same iteration, so every rank
switches at the same point; the switch updates the base weights in place.

Data path: with adapter ``k`` merged, the ``atmm`` backend builds mixture work items
(:func:`sglang_vlora.modes.delora.mode_work_items`): ``k``'s requests add nothing, other
adapters' requests add their own delta and subtract ``k``'s, base-only requests subtract
``k``'s. ``k`` stays resident in SGLang's LoRA memory pool while merged (its slot is read
by the ``-k`` items), so it takes one of ``--max-loras-per-batch`` slots. Eager batches
and decode CUDA graphs use the same items (the graph's static buffers are sized for
every mode), so every mode works with graphs on.

Weights and CUDA graphs: when the LoRA manager is built (after the model is loaded,
before the KV cache is sized and before any graph is captured), the base weights of each
LoRA-targeted module kind are moved once into one ``[L, out, in]`` stack
(:func:`~sglang_vlora.modes.switcher.stack_in_place`), which gives the switcher its
one-kernel path. Graphs captured later record the stacks' addresses, and every switch
updates the stacks in place, so the graphs stay valid across switches.
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
import time
from typing import Any

import torch
from fastapi import Request
from fastapi.responses import JSONResponse

from sglang_vlora.modes.switcher import (
    LoRADelta,
    SwiftSwitcher,
    deltas_from_pool,
    slice_kinds,
    stack_in_place,
)

logger = logging.getLogger(__name__)

MODES = ("merge", "mixture", "unmerge")
RPC_MODE = "vlora_mode"
RPC_STATUS = "vlora_status"
# POST /vlora/mode may wait this long for a pool slot ("wait_s").
MAX_WAIT_S = 60.0


class SlotBusyError(ValueError):
    """Merging an adapter that is not in the LoRA pool needs a slot, and every slot is held
    by requests that are running. A ``ValueError``: the orchestrator's "could not switch"."""

    status_code = 409


class ModeController:
    """One per scheduler process: the switcher over the LoRA-targeted base weights."""

    def __init__(self, lora_manager) -> None:
        self.lora_manager = lora_manager
        self.switcher: SwiftSwitcher | None = None
        self.mode = "unmerge"
        self.merged_name: str | None = None
        self.merged_uid: str | None = None
        self.last_switch_ms: float | None = None
        self._slices: dict[str, list[int]] = {}
        self.stacks: dict[str, torch.Tensor] = {}
        # The scheduler that owns this controller (bound after it is built): its running
        # requests hold pool slots that a merge must not take.
        self.scheduler = None

    # ------------------------------------------------------------------ weights
    def _modules(self) -> dict[str, list]:
        """LoRA-wrapped modules by short name (qkv_proj, o_proj, gate_up_proj, down_proj:
        the pool's keys), in layer order. ``lora_modules`` holds, per layer, full module
        name -> LoRA layer."""
        by_name: dict[str, list] = {}
        for layer_modules in self.lora_manager.lora_modules:
            for full_name, module in layer_modules.items():
                by_name.setdefault(full_name.rsplit(".", 1)[-1], []).append(module)
        return by_name

    def stack_weights(self) -> list[str]:
        """Move each module kind's base weights (all layers) into one ``[L, out, in]``
        stack, the parameters rebound to their views. Must run before CUDA graphs
        capture the weights' addresses (it runs when the LoRA manager is built). Kinds
        whose weights differ in shape, dtype or device, are not floating point
        (quantized) or are missing (MoE), stay as they are (the switcher's loop path).
        Returns the stacked kinds."""
        for name, modules in self._modules().items():
            weights = [getattr(m.base_layer, "weight", None) for m in modules]  # MoE layers have none
            first = weights[0]
            if name in self.stacks or not all(
                isinstance(w, torch.Tensor) and w.dim() == 2 and w.is_floating_point()
                and w.shape == first.shape and w.dtype == first.dtype and w.device == first.device
                for w in weights
            ):
                continue
            self.stacks[name] = stack_in_place(weights)
        if self.stacks and next(iter(self.stacks.values())).is_cuda:
            torch.cuda.empty_cache()  # the per-layer storages, before SGLang sizes the KV cache
        return sorted(self.stacks)

    def _build(self) -> SwiftSwitcher:
        kinds: dict[str, torch.Tensor | list] = {}
        for name, modules in self._modules().items():
            offsets = _slice_offsets(modules[0])
            self._slices[name] = offsets
            names = [f"{name}.{s}" for s in range(len(offsets) - 1)]
            stack = self.stacks.get(name)
            if stack is not None and all(m.base_layer.weight.data_ptr() == stack[i].data_ptr() for i, m in enumerate(modules)):
                kinds.update(slice_kinds(stack, names, offsets))
                continue
            for module in modules:
                weight = module.base_layer.weight
                for kind, lo, hi in zip(names, offsets, offsets[1:], strict=False):
                    kinds.setdefault(kind, []).append(weight[lo:hi])
        return SwiftSwitcher(kinds, exact=True)

    def _register(self, uid: str) -> None:
        pool = self.lora_manager.memory_pool
        adapter = self.lora_manager.loras[uid]
        slot = pool.get_buffer_id(uid)
        deltas: dict[str, LoRADelta] = {}
        for name, offsets in self._slices.items():
            if name not in pool.A_buffer:
                continue
            for s, delta in enumerate(
                deltas_from_pool(pool.A_buffer[name], pool.B_buffer[name], slot, adapter.config.r, offsets, adapter.scaling)
            ):
                if delta.a.abs().sum() > 0:  # a module this adapter does not target is all zero in the pool
                    deltas[f"{name}.{s}"] = delta
        if not deltas:
            raise ValueError(f"adapter {self.lora_manager.lora_refs[uid].lora_name!r} has no weights on {sorted(self._slices)}")
        self.switcher.add_adapter(uid, deltas)

    def _uid(self, name: str) -> str:
        for uid, ref in self.lora_manager.lora_refs.items():
            if ref.lora_name == name:
                return uid
        raise ValueError(f"unknown adapter {name!r}; loaded: {sorted(r.lora_name for r in self.lora_manager.lora_refs.values())}")

    # --------------------------------------------------------------- operations
    def apply(self, mode: str, adapter: str | None) -> dict[str, Any]:
        if mode not in MODES:
            raise ValueError(f"mode must be one of {list(MODES)}, got {mode!r}")
        if mode == "unmerge" and adapter is not None:
            raise ValueError("mode 'unmerge' takes no adapter")
        if mode != "unmerge" and not adapter:
            raise ValueError(f"mode {mode!r} needs the adapter to merge")
        backend = self.lora_manager.lora_backend
        if getattr(backend, "name", None) != "atmm":
            raise ValueError("merge and mixture modes need --lora-backend atmm (it builds the mixture work items)")
        uid = self._uid(adapter) if adapter else None
        if self.switcher is None:
            self.switcher = self._build()
        started = time.perf_counter()
        if uid is not None:
            if uid not in self.lora_manager.memory_pool.uid_to_buffer_id:
                running = self._claim_slot(uid, adapter)
                self.lora_manager.fetch_new_loras({uid}, running_loras=running)
            if uid not in self.switcher.adapters:
                self._register(uid)
        self.switcher.switch(uid)
        self.last_switch_ms = (time.perf_counter() - started) * 1e3
        self.mode, self.merged_name, self.merged_uid = mode, adapter, uid
        return self.status()

    def busy_uids(self) -> set[str | None]:
        """Adapters (None: the base) of the requests that hold KV and run in the next
        forwards: the running batch, the prefill batch that just ran (SGLang merges it into
        the running batch next) and a chunked request."""
        sched = self.scheduler
        if sched is None:
            return set()
        reqs = list(sched.running_batch.reqs)
        last = sched.last_batch
        if last is not None and last.forward_mode.is_extend():
            reqs.extend(last.reqs)
        if sched.chunked_req is not None:
            reqs.append(sched.chunked_req)
        return {req.lora_id for req in reqs if not req.finished()}

    def _claim_slot(self, uid: str, name: str) -> set[str | None]:
        """Check that ``uid`` can enter the pool without evicting an adapter that running
        requests (or the merged adapter, or a pinned one) hold; raise :class:`SlotBusyError`
        saying why if not. Returns the running adapters (kept resident by the fetch)."""
        manager = self.lora_manager
        pool = manager.memory_pool
        running = self.busy_uids()
        pinned = {u for u in pool.uid_to_buffer_id if u is not None and getattr(manager.lora_refs.get(u), "pinned", False)}
        held = running | pinned | ({self.merged_uid} if self.merged_uid is not None else set())
        slots = int(pool.max_loras_per_batch)
        if len(held | {uid}) > slots:
            names = sorted("base" if u is None else self._name(u) for u in held)
            raise SlotBusyError(
                f"merging {name!r} needs a LoRA pool slot, and all {slots} slots (--max-loras-per-batch) "
                f"are held by running requests and the merged or pinned adapters ({', '.join(names)}); "
                "retry when some finish (POST /vlora/mode accepts \"wait_s\" to wait for a slot), or "
                "start the server with a larger --max-loras-per-batch"
            )
        return running

    def _name(self, uid: str) -> str:
        ref = self.lora_manager.lora_refs.get(uid)
        return ref.lora_name if ref is not None else uid

    def forget(self, uid: str) -> None:
        """An adapter was unloaded: drop its factors (refused while it is merged)."""
        if self.switcher is None or uid not in self.switcher.adapters:
            return
        if uid == self.merged_uid:
            raise ValueError("the adapter is merged: switch to another mode first")
        self.switcher.remove_adapter(uid)

    def status(self) -> dict[str, Any]:
        sw = self.switcher
        return {
            "mode": self.mode,
            "merged_adapter": self.merged_name,
            "switch_count": sw.switch_count if sw is not None else 0,
            "last_switch_ms": self.last_switch_ms,
            "pristine_bytes": sw.pristine_bytes if sw is not None else 0,
            "paths": dict(sw.paths) if sw is not None else {},
        }

    def merged_slot(self, lora_ranks: list[int], scalings: list[float]) -> int | None:
        """The pool slot of the merged adapter, with its rank and scaling written into
        this batch's lists (SGLang fills them only for adapters in the batch)."""
        if self.merged_uid is None:
            return None
        pool = self.lora_manager.memory_pool
        slot = pool.uid_to_buffer_id[self.merged_uid]
        adapter = self.lora_manager.loras[self.merged_uid]
        lora_ranks[slot] = adapter.config.r
        scalings[slot] = adapter.scaling
        return slot


def _slice_offsets(module) -> list[int]:
    offsets = getattr(module, "output_offset_cpu", None)
    if offsets is not None:
        return [int(v) for v in offsets.tolist()]
    return [0, int(module.base_layer.weight.shape[0])]


_controller: ModeController | None = None


def controller() -> ModeController | None:
    """This scheduler process's controller (None before the LoRA manager exists)."""
    return _controller


# ------------------------------------------------------------------ scheduler hooks
def lora_manager_init_after(result, self, *args, **kwargs):
    """AFTER ``LoRAManager.__init__``: one mode controller per scheduler process; with
    the ``atmm`` backend (the only one that runs merge and mixture), the targeted base
    weights go into per-kind stacks now, before SGLang sizes the KV cache and captures
    CUDA graphs (``ModelRunner.initialize`` builds the LoRA manager first)."""
    global _controller
    _controller = ModeController(self)
    if getattr(self.lora_backend, "name", None) == "atmm":
        _controller.stack_weights()
    return result


def keep_merged_resident_before(self, *args, **kwargs):
    """BEFORE ``LoRAMemoryPool.prepare_lora_batch``: the merged adapter counts as in use,
    so the pool never evicts it while its slot feeds the ``-k`` items."""
    ctl = _controller
    if ctl is None or ctl.merged_uid is None:
        return None
    if "cur_uids" in kwargs:
        kwargs["cur_uids"] = set(kwargs["cur_uids"]) | {ctl.merged_uid}
    else:
        args = (set(args[0]) | {ctl.merged_uid}, *args[1:])
    return (self, *args), kwargs


def count_merged_around(original, self, lora_ids, *args, **kwargs):
    """AROUND ``LoRAManager.validate_lora_batch`` (the scheduler's admission check):
    the merged adapter occupies a pool slot, so a batch may hold one adapter fewer."""
    ctl = _controller
    if ctl is not None and ctl.merged_uid is not None:
        lora_ids = set(lora_ids) | {ctl.merged_uid}
    return original(self, lora_ids, *args, **kwargs)


def unload_around(original, self, lora_ref, *args, **kwargs):
    """AROUND ``LoRAManager.unload_lora_adapter``: refuse to unload the merged adapter
    (a failed result, which SGLang turns into a 400), forget the factors of others."""
    ctl = _controller
    if ctl is not None and lora_ref.lora_id is not None:
        try:
            ctl.forget(lora_ref.lora_id)
        except ValueError as exc:
            return self.create_lora_update_result(success=False, error_message=f"{lora_ref.lora_name}: {exc}")
    return original(self, lora_ref, *args, **kwargs)


def bind_scheduler_after(result, self, *args, **kwargs):
    """AFTER ``Scheduler.__init__``: the controller (built inside, with the LoRA manager)
    learns its scheduler, whose running requests decide whether a merge may take a slot."""
    ctl = _controller
    if ctl is not None and getattr(self, "enable_lora", False):
        ctl.scheduler = self
    return result


def _failure(message: str, status: int) -> str:
    return json.dumps({"error": message, "status": status})


def rpc_around(original, self, recv_req):
    """AROUND ``Scheduler.handle_rpc_request``: our two methods answer with JSON. Nothing a
    control call does may stop the scheduler: every error becomes the call's answer."""
    if recv_req.method not in (RPC_MODE, RPC_STATUS):
        return original(self, recv_req)
    from sglang.srt.managers.io_struct import RpcReqOutput

    ctl = _controller
    try:
        if ctl is None:
            raise ValueError("LoRA is not enabled on this server")
        if ctl.scheduler is None:
            ctl.scheduler = self
        from sglang_vlora.orchestrator import scheduler_hooks

        orch = scheduler_hooks.orchestrator()
        params = recv_req.parameters or {}
        if recv_req.method == RPC_STATUS:
            body = {**ctl.status(), "orchestrator": orch.status() if orch is not None else None}
        elif orch is not None:
            raise ValueError(
                f"modes are chosen by --vlora-policy {orch.policy_name}; start the server with "
                "--vlora-policy manual to set them with POST /vlora/mode"
            )
        else:
            body = ctl.apply(params.get("mode"), params.get("adapter"))
        return RpcReqOutput(success=True, message=json.dumps(body))
    except (ValueError, KeyError) as exc:
        return RpcReqOutput(success=False, message=_failure(str(exc), getattr(exc, "status_code", 400)))
    except Exception as exc:  # a bug must not take the running requests with it
        logger.exception("sglang-vlora: %s failed", recv_req.method)
        return RpcReqOutput(success=False, message=_failure(f"{type(exc).__name__}: {exc}", 500))


# ------------------------------------------------------------------ launcher hooks
class SchedulerRPC:
    """The launcher's end of the scheduler's RPC socket (bound here: in HTTP-server
    mode SGLang's Engine, which would bind it, does not exist)."""

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


_rpc: SchedulerRPC | None = None


def launch_subprocesses_after(result, cls, *args, **kwargs):
    """AFTER ``Engine._launch_subprocesses`` (launcher): connect to the scheduler's RPC
    socket and add ``/vlora/mode`` and ``/vlora/status`` to the HTTP app."""
    global _rpc
    from sglang.srt.server_args import PortArgs

    port_args = next((item for item in result if isinstance(item, PortArgs)), None)
    if port_args is None:
        return result
    _rpc = SchedulerRPC(port_args.rpc_ipc_name)
    add_routes(_rpc)
    return result


async def refuse_unloading_merged_around(original, self, obj):
    """AROUND ``TokenizerControlMixin._unload_lora_adapter_locked`` (launcher): refuse,
    before SGLang forgets the name, to unload the adapter merged into the weights."""
    if _rpc is not None:
        try:
            ok, message = await asyncio.to_thread(_rpc.call, RPC_STATUS, None)
        except TimeoutError as exc:
            raise ValueError(f"cannot check the merged adapter: {exc}") from exc
        if ok and json.loads(message).get("merged_adapter") == obj.lora_name:
            raise ValueError(f"adapter {obj.lora_name!r} is merged: POST /vlora/mode another mode first")
    return await original(self, obj)


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
    """``POST /vlora/mode`` carries SGLang's ``ADMIN_OPTIONAL`` auth level, like its own
    ``/load_lora_adapter``: with ``--admin-api-key`` only that key, with only ``--api-key``
    that key, with none open. ``GET /vlora/status`` reads with any configured key (see
    :func:`sglang_vlora.guard_hooks.decide_auth_around`)."""
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

    app.add_api_route("/vlora/mode", set_mode, methods=["POST"])
    app.add_api_route("/vlora/status", get_status, methods=["GET"])
