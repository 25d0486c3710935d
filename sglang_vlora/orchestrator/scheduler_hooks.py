"""Hooks on SGLang's scheduler that drive the :class:`~sglang_vlora.orchestrator.runtime.Orchestrator`
(declared, with their reasons, in :mod:`sglang_vlora.sglang_hooks`). Scheduler process; each
takes the process's :class:`~sglang_vlora.runtime.VLoRARuntime` first."""

from __future__ import annotations

import time

from sglang_vlora.orchestrator.runtime import Orchestrator
from sglang_vlora.runtime import VLoRARuntime


def _orchestrator(rt: VLoRARuntime, scheduler) -> Orchestrator | None:
    """The scheduler's orchestrator, created on first use (None with ``--vlora-policy manual``)."""
    if rt.orchestrator is None and rt.config.policy != "manual" and scheduler.enable_lora:
        rt.orchestrator = Orchestrator(scheduler, rt.config, rt.controller)
    return rt.orchestrator


def get_next_batch_around(rt: VLoRARuntime, original, self, *args, **kwargs):
    """AROUND ``Scheduler.get_next_batch_to_run``: decide and switch before SGLang picks.
    The host time of both calls counts as the orchestrator's (``hook_calls``,
    ``hook_seconds_total``, its parts in ``hook_seconds_by_part``; what the parts leave is this
    wrapper's and ``after_schedule``'s) in the iterations that had requests to decide for:
    SGLang's idle loop runs this too, and its calls cost next to nothing."""
    orch = _orchestrator(rt, self)
    if orch is None:
        return original(self, *args, **kwargs)
    started = time.perf_counter()
    busy = orch.before_schedule(self)
    decided = time.perf_counter()
    plan = original(self, *args, **kwargs)
    picked = time.perf_counter()
    orch.after_schedule(plan)
    if busy:
        orch.hook_calls += 1
        orch.hook_seconds += (decided - started) + (time.perf_counter() - picked)
    return plan


def can_schedule_around(rt: VLoRARuntime, original, self, req, running_loras):
    """AROUND ``Scheduler.can_schedule_lora_req``: admit only the requests the policy chose."""
    orch = rt.orchestrator
    if orch is not None and req.rid not in orch.admit:
        return False
    return original(self, req, running_loras)


def run_batch_before(rt: VLoRARuntime, self, batch, *args, **kwargs):
    """BEFORE ``Scheduler.run_batch``: count the batch's mode and time it."""
    orch = rt.orchestrator
    if orch is not None and batch is not None:
        started = time.perf_counter()
        orch.before_run(batch)
        seconds = time.perf_counter() - started
        orch.hook_seconds += seconds
        orch.hook_seconds_by_part["batch"] += seconds
