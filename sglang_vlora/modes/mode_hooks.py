"""Hooks that put the inference modes into the running SGLang server: the
:class:`~sglang_vlora.modes.controller.ModeController` in the scheduler process, the control
routes of :mod:`sglang_vlora.http_api` in the HTTP server process. Declared, with their
reasons, in :mod:`sglang_vlora.sglang_hooks`; each takes the process's
:class:`~sglang_vlora.runtime.VLoRARuntime` first.

Control path: ``POST /vlora/mode`` and ``GET /vlora/status`` (HTTP server) send an SGLang
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

import json
import logging
import time

import torch

from sglang_vlora import http_errors, in_gemm_weights
from sglang_vlora.config import NEVER_MERGES
from sglang_vlora.http_api import RPC_MODE, RPC_STATUS, RPC_TIMELINE, SchedulerRPC, add_routes, rpc_failure
from sglang_vlora.modes.controller import ModeController
from sglang_vlora.runtime import VLoRARuntime

logger = logging.getLogger(__name__)


# ------------------------------------------------------------------ scheduler hooks
def lora_manager_init_after(rt: VLoRARuntime, result, self, *args, **kwargs):
    """AFTER ``LoRAManager.__init__``: one mode controller per scheduler process; with
    the ``atmm`` backend (the only one that runs merge and mixture), the targeted base
    weights go into per-kind stacks now, before SGLang sizes the KV cache and captures
    CUDA graphs (``ModelRunner.initialize`` builds the LoRA manager first), with the pool's
    A rows appended where graph batches compute the shrink in the base GEMM
    (:mod:`sglang_vlora.in_gemm_weights`)."""
    rt.controller = ModeController(self)
    if getattr(self.lora_backend, "name", None) == "atmm":
        modules = rt.controller.modules()
        setting = rt.config.shrink_in_gemm if rt.config is not None else "off"
        rt.controller.stack_weights(in_gemm_weights.extra_rows(self, modules, setting))
        attached = in_gemm_weights.attach(self, modules, rt.controller.extended_stacks)
        self.lora_backend.shrink_in_gemm = bool(attached)
        _compile_switch_kernels(rt, switch_ranks(self))
    return result


def compile_switch_after_load(rt: VLoRARuntime, result, self, lora_ref, *args, **kwargs):
    """AFTER ``LoRAManager.load_lora_adapter`` (``/load_lora_adapter``, after start-up): the
    switch kernels of the new adapter's rank are compiled now, in the load (an admin call that
    already takes its time), not at the adapter's first merge while serving. Adapters loaded
    with the server are compiled for by :func:`lora_manager_init_after`."""
    config = getattr(self, "configs", {}).get(getattr(lora_ref, "lora_id", None))
    if getattr(result, "success", False) and config is not None and getattr(config, "r", 0):
        _compile_switch_kernels(rt, {int(config.r)})
    return result


def _compile_switch_kernels(rt: VLoRARuntime, ranks: set[int]) -> None:
    """The controller's switch kernels for ``ranks``, where a controller exists and the policy
    ever merges. A compile ahead that fails is logged: the first merge then compiles them."""
    if rt.controller is None or not ranks or (rt.config is not None and rt.config.policy == NEVER_MERGES):
        return
    start = time.perf_counter()
    try:
        kinds = rt.controller.compile_switch_ahead(ranks)
    except Exception as exc:
        logger.warning("switch kernels not compiled ahead (%s): the first merge compiles them", exc)
        return
    if kinds:
        logger.info("switch kernels compiled ahead for ranks %s of %s in %.2f s", sorted(ranks), ", ".join(kinds),
                    time.perf_counter() - start)


def switch_ranks(lora_manager) -> set[int]:
    """The adapter ranks a switch may fold at start-up: those of the adapters loaded with the
    server, and the pool's largest (an adapter loaded later: :func:`compile_switch_after_load`)."""
    ranks = {int(c.r) for c in getattr(lora_manager, "configs", {}).values() if getattr(c, "r", 0)}
    max_rank = getattr(lora_manager, "max_lora_rank", None)
    if max_rank:
        ranks.add(int(max_rank))
    return ranks


def keep_merged_resident_before(rt: VLoRARuntime, self, *args, **kwargs):
    """BEFORE ``LoRAMemoryPool.prepare_lora_batch``: the merged adapter counts as in use,
    so the pool never evicts it while its slot feeds the ``-k`` items."""
    ctl = rt.controller
    if ctl is None or ctl.merged_uid is None:
        return None
    if "cur_uids" in kwargs:
        kwargs["cur_uids"] = set(kwargs["cur_uids"]) | {ctl.merged_uid}
    else:
        args = (set(args[0]) | {ctl.merged_uid}, *args[1:])
    return (self, *args), kwargs


def count_merged_around(rt: VLoRARuntime, original, self, lora_ids, *args, **kwargs):
    """AROUND ``LoRAManager.validate_lora_batch`` (the scheduler's admission check):
    the merged adapter occupies a pool slot, so a batch may hold one adapter fewer."""
    ctl = rt.controller
    if ctl is not None and ctl.merged_uid is not None:
        lora_ids = set(lora_ids) | {ctl.merged_uid}
    return original(self, lora_ids, *args, **kwargs)


def no_work_no_lora_after(rt: VLoRARuntime, result, self, *args, **kwargs):
    """AFTER ``LoRAManager.prepare_lora_batch``: whether a batch is LoRA-active is whether the
    ``atmm`` backend found work items for it. SGLang's own rule (a request names an adapter of
    rank > 0) is wrong both ways once an adapter ``k`` is merged: ``k``'s requests need no
    LoRA work, and base-model requests need the ``-k`` items. An inactive batch (every token
    ``k``'s, or the base model's with nothing merged) runs the base layers alone (no LoRA call,
    no launch) and replays the base-only decode graph (:func:`lora_graph_if_work_around`):
    merged batches cost what the base model does."""
    backend = self.lora_backend
    info = backend.batch_info
    work = getattr(backend, "has_lora_work", None)
    if info is not None and work is not None:
        info.has_active_lora = work
    return result


def lora_graph_if_work_around(rt: VLoRARuntime, original, self, forward_batch, *args, **kwargs):
    """AROUND ``DecodeCudaGraphRunner._resolve_lora_variant``: with a base-only ("nolora")
    decode graph captured, SGLang replays it when no request names an adapter. Replay it
    when the batch has no LoRA work instead (:func:`no_work_no_lora_after`): a batch of the
    merged adapter's requests skips the LoRA graph's empty launches, and a batch of base-model
    requests with an adapter merged gets the LoRA graph its ``-k`` items need."""
    variant = original(self, forward_batch, *args, **kwargs)
    manager = self.model_runner.lora_manager
    backend = manager.lora_backend if manager is not None else None
    if hasattr(backend, "base_only_decode_graph"):
        # only with a base-only graph may a batch without work skip writing its items
        backend.base_only_decode_graph = variant is not None
    if variant is None:  # a single graph serves every batch
        return variant
    info = backend.batch_info if backend is not None else None
    if info is None:
        return variant
    return "lora" if info.has_active_lora else "nolora"


def unload_around(rt: VLoRARuntime, original, self, lora_ref, *args, **kwargs):
    """AROUND ``LoRAManager.unload_lora_adapter``: refuse to unload the merged adapter
    (a failed result, which SGLang turns into a 400), forget the factors of others."""
    ctl = rt.controller
    if ctl is not None and lora_ref.lora_id is not None:
        try:
            ctl.forget(lora_ref.lora_id)
        except ValueError as exc:
            return self.create_lora_update_result(success=False, error_message=f"{lora_ref.lora_name}: {exc}")
    return original(self, lora_ref, *args, **kwargs)


def bind_scheduler_after(rt: VLoRARuntime, result, self, *args, **kwargs):
    """AFTER ``Scheduler.__init__``: the controller (built inside, with the LoRA manager)
    learns its scheduler, whose running requests decide whether a merge may take a slot."""
    ctl = rt.controller
    if ctl is not None and getattr(self, "enable_lora", False):
        ctl.scheduler = self
    return result


# torch's CUDA caching allocator, in the scheduler's process: an allocation that finds no cached
# block frees the cache and retries, and freeing device memory synchronises the device, so a
# forward that allocates then waits for the GPU. Counters since start-up (benchmarks diff them).
ALLOCATOR_COUNTERS = ("num_alloc_retries", "num_device_alloc", "num_device_free", "num_sync_all_streams",
                      "num_ooms")


def allocator_counters() -> dict[str, int] | None:
    """The caching allocator's counters on the current device (None without CUDA in use)."""
    if not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return None
    stats = torch.cuda.memory_stats()
    return {name: int(stats.get(name, 0)) for name in ALLOCATOR_COUNTERS}


def _answer(rt: VLoRARuntime, scheduler, method: str, params: dict) -> dict:
    """The body of a successful answer to one of our RPCs; ``ValueError`` refuses it."""
    ctl, orch = rt.controller, rt.orchestrator
    if ctl is None:
        raise ValueError("LoRA is not enabled on this server")
    if ctl.scheduler is None:
        ctl.scheduler = scheduler
    if method == RPC_STATUS:
        return {**ctl.status(), "orchestrator": orch.status() if orch is not None else None,
                "cuda_allocator": allocator_counters()}
    if method == RPC_TIMELINE:
        if orch is None:
            raise ValueError("no iteration is timed without an orchestrator (--vlora-policy manual)")
        return orch.timeline.since(float(params["since"]))
    if orch is not None:
        raise ValueError(
            f"modes are chosen by --vlora-policy {orch.policy_name}; start the server with "
            "--vlora-policy manual to set them with POST /vlora/mode"
        )
    return ctl.apply(params.get("mode"), params.get("adapter"))


def rpc_around(rt: VLoRARuntime, original, self, recv_req):
    """AROUND ``Scheduler.handle_rpc_request``: our three methods answer with JSON. Nothing a
    control call does may stop the scheduler: every error becomes the call's answer."""
    if recv_req.method not in (RPC_MODE, RPC_STATUS, RPC_TIMELINE):
        return original(self, recv_req)
    from sglang.srt.managers.io_struct import RpcReqOutput

    try:
        body = _answer(rt, self, recv_req.method, recv_req.parameters or {})
        return RpcReqOutput(success=True, message=json.dumps(body))
    except (ValueError, KeyError) as exc:
        return RpcReqOutput(success=False, message=rpc_failure(str(exc), getattr(exc, "status_code", 400)))
    except Exception as exc:  # a bug must not take the running requests with it
        logger.exception("sglang-vlora: %s failed", recv_req.method)
        return RpcReqOutput(success=False, message=rpc_failure(f"{type(exc).__name__}: {exc}", 500))


# ------------------------------------------------------------------ HTTP server hooks
def launch_subprocesses_after(rt: VLoRARuntime, result, cls, *args, **kwargs):
    """AFTER ``Engine._launch_subprocesses`` (HTTP server): connect to the scheduler's RPC
    socket, add ``/vlora/mode``, ``/vlora/status`` and ``/vlora/timeline`` to the HTTP app, and
    close its gaps in answering bad bodies (:mod:`sglang_vlora.http_errors`) before it serves."""
    from sglang.srt.server_args import PortArgs

    port_args = next((item for item in result if isinstance(item, PortArgs)), None)
    if port_args is None:
        return result
    rt.rpc = SchedulerRPC(port_args.rpc_ipc_name)
    add_routes(rt.rpc)
    from sglang.srt.entrypoints.http_server import app

    http_errors.install(app)
    return result


async def refuse_unloading_merged_around(rt: VLoRARuntime, original, self, obj):
    """AROUND ``TokenizerControlMixin._unload_lora_adapter_locked`` (HTTP server): refuse,
    before SGLang forgets the name, to unload the adapter merged into the weights."""
    if rt.rpc is not None:
        merged = await rt.rpc.merged_adapter()
        if merged is not None and merged == obj.lora_name:
            raise ValueError(f"adapter {obj.lora_name!r} is merged: POST /vlora/mode another mode first")
    return await original(self, obj)
