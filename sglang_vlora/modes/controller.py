"""The mode controller: one per scheduler process, over the LoRA-targeted base weights of the
model SGLang loaded (paper §4.4). It moves the weights into per-kind stacks once, before CUDA
graphs are captured, and switches them in place between merge, mixture and unmerge with the
:class:`~sglang_vlora.modes.switcher.SwiftSwitcher`. It reads SGLang's LoRA manager, memory
pool and scheduler (the attributes are declared in :mod:`sglang_vlora.sglang_hooks`); the
hooks that build and drive it are in :mod:`sglang_vlora.modes.mode_hooks`.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

import torch

from sglang_vlora.atmm.launch_compiles import LAUNCH_COMPILES
from sglang_vlora.modes.switcher import (
    LoRADelta,
    SwiftSwitcher,
    deltas_from_pool,
    slice_kinds,
    stack_in_place,
)

MODES = ("merge", "mixture", "unmerge")


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
        self.stacks: dict[str, torch.Tensor] = {}  # kind -> [L, out, in] base weights (views)
        # kind -> the whole [L, out + extra, in] stack, for kinds stacked with extra rows
        self.extended_stacks: dict[str, torch.Tensor] = {}
        # The scheduler that owns this controller (bound after it is built): its running
        # requests hold pool slots that a merge must not take.
        self.scheduler = None

    # ------------------------------------------------------------------ weights
    def modules(self) -> dict[str, list]:
        """LoRA-wrapped modules by short name (qkv_proj, o_proj, gate_up_proj, down_proj:
        the pool's keys), in layer order. ``lora_modules`` holds, per layer, full module
        name -> LoRA layer."""
        by_name: dict[str, list] = {}
        for layer_modules in self.lora_manager.lora_modules:
            for full_name, module in layer_modules.items():
                by_name.setdefault(full_name.rsplit(".", 1)[-1], []).append(module)
        return by_name

    def stack_weights(self, extra_rows: dict[str, int] | None = None) -> list[str]:
        """Move each module kind's base weights (all layers) into one ``[L, out, in]``
        stack, the parameters rebound to their views. Must run before CUDA graphs
        capture the weights' addresses (it runs when the LoRA manager is built). Kinds
        whose weights differ in shape, dtype or device, are not floating point
        (quantized) or are missing (MoE), stay as they are (the switcher's loop path).
        ``extra_rows[kind]``: zero rows appended after each layer's weight (the stack is then
        ``[L, out + extra, in]``, kept in :attr:`extended_stacks`). Returns the stacked kinds."""
        extra_rows = extra_rows or {}
        for name, modules in self.modules().items():
            weights = [getattr(m.base_layer, "weight", None) for m in modules]  # MoE layers have none
            first = weights[0]
            if name in self.stacks or not all(
                isinstance(w, torch.Tensor) and w.dim() == 2 and w.is_floating_point()
                and w.shape == first.shape and w.dtype == first.dtype and w.device == first.device
                for w in weights
            ):
                continue
            stack = stack_in_place(weights, extra_rows.get(name, 0))
            self.stacks[name] = stack[:, : first.shape[0]]
            if extra_rows.get(name, 0):
                self.extended_stacks[name] = stack
        if self.stacks and next(iter(self.stacks.values())).is_cuda:
            torch.cuda.empty_cache()  # the per-layer storages, before SGLang sizes the KV cache
        return sorted(self.stacks)

    def compile_switch_ahead(self, ranks: Iterable[int]) -> list[str]:
        """Compile, launching nothing, the switch kernels of the stacked kinds on a GPU: the
        one-pass fold for adapters of each of ``ranks`` and the copy back to the base weights
        (:func:`~sglang_vlora.modes.fold_kernel.compile_ahead`). The first merge or unmerge
        while serving would otherwise compile them, holding the scheduler, and every request in
        flight, for as long. Kinds that are not stacks switch with torch ops (nothing to
        compile). Returns the kinds compiled for."""
        from sglang_vlora.modes import fold_kernel

        compiled = []
        for name, weights in self._kinds().items():
            if isinstance(weights, torch.Tensor) and weights.is_cuda:
                fold_kernel.compile_ahead(weights, ranks)
                compiled.append(name)
        return compiled

    def _build(self) -> SwiftSwitcher:
        return SwiftSwitcher(self._kinds(), exact=True)

    def _kinds(self) -> dict[str, torch.Tensor | list]:
        """The switcher's kinds: per-slice views of each stack, else per-layer slices."""
        kinds: dict[str, torch.Tensor | list] = {}
        for name, modules in self.modules().items():
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
        return kinds

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
            # module kinds whose graph batches compute the shrink inside the base GEMM
            "shrink_in_gemm": sorted(self.extended_stacks),
            "paths": dict(sw.paths) if sw is not None else {},
            # batches that ran the base layers alone (no LoRA work), by layout: "graph" ones
            # replayed the base-only decode graph (modes.mode_hooks.no_work_no_lora_after)
            "batches_without_lora_work": dict(getattr(self.lora_manager.lora_backend, "batches_without_work", {})),
            # batches prepared per layout: eager, decode graph, prefill graph (SGLang's prefill
            # graphs are on where it captures them, e.g. --cuda-graph-backend-prefill breakable)
            "lora_batches": dict(getattr(self.lora_manager.lora_backend, "batches_by_layout", {})),
            # kernel launches that compiled a variant: graph capture's at start, none after warm-up
            "kernel_compiles": LAUNCH_COMPILES.snapshot(),
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
