"""The orchestrator inside SGLang's scheduler: the glue between SGLang's scheduling loop
and the pure policies of :mod:`sglang_vlora.orchestrator`. Declared in
:mod:`sglang_vlora.sglang_hooks`; active unless ``--vlora-policy manual``.

Every scheduler iteration, before SGLang picks the next batch:

1. the waiting and running requests become a :class:`SchedulerState` (adapter, arrival,
   tokens so far and expected, application and SLO from ``custom_params``);
2. the policy decides mode, merged adapter and the waiting requests to admit; with
   tensor parallelism TP rank 0 decides and broadcasts the decision, so every rank
   switches and admits alike (no rank reads another's clock);
3. the weights move to the decision (:class:`sglang_vlora.modes.mode_hooks.ModeController`,
   in place, between forward passes, after the GPU has finished the previous batch);
4. SGLang builds the batch as usual (its own priority order, so radix-cache prefix
   matching still orders requests inside the chosen set), but admits only the chosen
   waiting requests (``can_schedule_lora_req``).

Running requests are never paused: they hold KV cache, and whatever the weights, the
``atmm`` backend's work items compute every request exactly (a request of another
adapter than the merged one runs in mixture). So a "merge" decision with other
adapters' requests still decoding runs as mixture until they finish; the iteration
counters record the mode each batch actually ran in.

Costs come from ``--vlora-cost-model`` or are measured while serving
(:class:`~sglang_vlora.orchestrator.cost_model.MeasuredCosts`): the wall time of every
iteration by mode, and every switch, with one merge / (fused) / unmerge cycle timed the
first time the server is idle with adapters loaded.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from typing import Any

from sglang_vlora.config import VLoRAConfig
from sglang_vlora.orchestrator.cost_model import CostModel, MeasuredCosts, OutputLengths
from sglang_vlora.orchestrator.policy import PolicyConfig, make_policy
from sglang_vlora.orchestrator.request_params import application_and_slo
from sglang_vlora.orchestrator.state import Decision, Mode, Request, SchedulerState

logger = logging.getLogger(__name__)

BASE_LABEL = "base"  # queue label of requests without an adapter


class OrchestratorMetrics:
    """Prometheus series on SGLang's ``/metrics`` (only with ``--enable-metrics``)."""

    def __init__(self) -> None:
        from prometheus_client import Counter as PromCounter
        from prometheus_client import Gauge

        self.mode = Gauge(
            "sglang:vlora_mode", "1 for the inference mode of the last batch, else 0.", ["mode"],
            multiprocess_mode="mostrecent",
        )
        self.iterations = PromCounter("sglang:vlora_iterations", "Batches run, by inference mode.", ["mode"])
        self.switches = PromCounter("sglang:vlora_switches", "Weight switches made by the orchestrator.")
        self.switch_seconds = PromCounter("sglang:vlora_switch_seconds", "Time spent switching weights.")
        self.last_switch_seconds = Gauge(
            "sglang:vlora_last_switch_seconds", "Duration of the last weight switch.", multiprocess_mode="mostrecent"
        )
        self.starving = Gauge(
            "sglang:vlora_starving_requests", "Requests whose credit exceeds theta.", multiprocess_mode="mostrecent"
        )
        self.queue = Gauge(
            "sglang:vlora_queue_requests", "Waiting and running requests, by adapter.", ["adapter"],
            multiprocess_mode="mostrecent",
        )


class Orchestrator:
    """One per scheduler process."""

    def __init__(self, scheduler, cfg: VLoRAConfig) -> None:
        from sglang.srt.runtime_context import get_parallel

        from sglang_vlora.modes import mode_hooks

        self.lora_manager = scheduler.tp_worker.model_runner.lora_manager
        self.controller = mode_hooks.controller()
        if self.controller is None:
            raise RuntimeError("sglang-vlora: the orchestrator needs the mode controller (LoRA on)")
        self.policy_name = cfg.policy
        self.config = PolicyConfig(
            theta=cfg.theta,
            max_batch=cfg.max_batch or scheduler.max_running_requests,
            adapter_slots=scheduler.server_args.max_loras_per_batch,
        )
        layers = len(self.lora_manager.lora_modules)
        self.measured = None if cfg.cost_model else MeasuredCosts(layers)
        self.fixed_cost = CostModel.from_file(cfg.cost_model, layers) if cfg.cost_model else None
        self._policy_cost: CostModel | None = None
        self._policy = None
        parallel = get_parallel()
        self.tp_size = parallel.tp_size
        self.tp_group = parallel.tp_group if self.tp_size > 1 else None
        self.is_source = parallel.tp_rank == 0
        self.metrics = OrchestratorMetrics() if scheduler.server_args.enable_metrics and self.is_source else None
        self.admit: frozenset[str] = frozenset()
        self.last_decision: Decision | None = None
        self._arrival: dict[str, float] = {}
        self._outputs = OutputLengths()
        self._tracked: dict[str, Any] = {}  # running requests of the last decision, to learn output lengths
        self._pending: tuple[Mode, int, float] | None = None  # the batch in flight: mode, prefill tokens, start
        self.iterations: Counter[str] = Counter()
        self.decisions: Counter[str] = Counter()
        self.switches = 0
        self.switch_seconds = 0.0
        self.queue: dict[str, int] = {}
        self._calibrated = False

    # ---------------------------------------------------------------- per iteration
    def before_schedule(self, scheduler) -> None:
        now = time.monotonic()
        if self._pending is not None:
            mode, tokens, started = self._pending
            self._pending = None
            if self.measured is not None:
                self.measured.record_iteration(mode, tokens, now - started)
        waiting, running = list(scheduler.waiting_queue), _running_requests(scheduler)
        self._learn_output_lengths(running)
        if not waiting and not running:
            if self.queue:
                self._report_queue({})
                if self.metrics is not None:
                    self.metrics.starving.set(0)
            self.admit = frozenset()
            self._arrival.clear()
            if self.measured is not None and not self._calibrated and self.lora_manager.loras:
                self._calibrated = True
                self._calibrate_switches()
            return
        decision = self._decide(now, waiting, running) if self.is_source else None
        if self.tp_group is not None:
            decision = self._broadcast(decision)
        self._apply(decision)

    def before_run(self, batch) -> None:
        """The batch about to run: count it under the mode it really runs in, start its clock."""
        merged = self.controller.merged_uid
        if merged is None:
            mode = Mode.UNMERGE
        elif all(req.lora_id == merged for req in batch.reqs):
            mode = Mode.MERGE
        else:
            mode = Mode.MIXTURE
        tokens = int(batch.extend_num_tokens or 0) if batch.forward_mode.is_extend() else 0
        self.iterations[mode.value] += 1
        self._pending = (mode, tokens, time.monotonic())
        if self.metrics is not None:
            self.metrics.iterations.labels(mode=mode.value).inc()
            for m in Mode:
                self.metrics.mode.labels(mode=m.value).set(int(m is mode))

    # ------------------------------------------------------------------- deciding
    def _cost(self) -> CostModel:
        return self.fixed_cost if self.fixed_cost is not None else self.measured.snapshot()

    def _decide(self, now: float, waiting: list, running: list) -> Decision:
        cost = self._cost()
        if cost is not self._policy_cost:
            self._policy = make_policy(self.policy_name, self.config, cost)
            self._policy_cost = cost
        arrival = {}
        for req in (*running, *waiting):
            arrival[req.rid] = self._arrival.get(req.rid, now)
        self._arrival = arrival
        state = SchedulerState(
            now=now,
            waiting=[self._request(req, arrival[req.rid], running=False) for req in waiting],
            running=[self._request(req, arrival[req.rid], running=True) for req in running],
            mode=Mode(self.controller.mode),
            merged=self.controller.merged_uid,
            ranks={uid: int(lora.config.r) for uid, lora in self.lora_manager.loras.items()},
        )
        decision = self._policy.decide(state)
        self._report_queue(dict(Counter(self._name(r.adapter) for r in state.requests)))
        return decision

    def _learn_output_lengths(self, running: list) -> None:
        """Record the output length of every request that finished since the last call."""
        still = {req.rid for req in running}
        for rid, req in self._tracked.items():
            if rid not in still and req.finished():
                self._outputs.record(_group(req), len(req.output_ids))
        self._tracked = {req.rid: req for req in running}

    def _request(self, req, arrival: float, running: bool) -> Request:
        params = req.sampling_params
        application, slo = _application_and_slo(req)
        prompt = len(req.origin_input_ids)
        output = len(req.output_ids)
        if running:
            kv = getattr(getattr(req, "kv", None), "kv_committed_len", prompt)
            prefilled = min(prompt, kv) if not output else prompt
        else:
            prefilled = 0
        expected = self._outputs.expected(_group(req), params.max_new_tokens, output)
        return Request(
            rid=req.rid,
            adapter=req.lora_id,
            arrival=arrival,
            prompt_tokens=prompt,
            expected_output_tokens=expected,
            prefilled_tokens=prefilled,
            output_tokens=output,
            application=application,
            slo=slo,
        )

    def _broadcast(self, decision: Decision | None) -> Decision:
        from sglang.srt.utils import broadcast_pyobj

        group = self.tp_group
        return broadcast_pyobj(
            [decision], group.ranks[group.rank_in_group], group.cpu_group, src=group.ranks[0]
        )[0]

    # ------------------------------------------------------------------- applying
    def _apply(self, decision: Decision) -> None:
        ctl = self.controller
        if decision.adapter != ctl.merged_uid:
            self._switch(decision.mode, decision.adapter)
        elif decision.mode.value != ctl.mode:
            ctl.mode = decision.mode.value  # merge <-> mixture: same weights, nothing to move
        self.admit = frozenset(decision.admit)
        self.last_decision = decision
        self.decisions[decision.mode.value] += 1
        if self.metrics is not None:
            self.metrics.starving.set(len(decision.starving))

    def _report_queue(self, queue: dict[str, int]) -> None:
        if self.metrics is not None:
            for name in {*self._adapter_names(), *self.queue, *queue}:
                self.metrics.queue.labels(adapter=name).set(queue.get(name, 0))
        self.queue = queue

    def _switch(self, mode: Mode, uid: str | None, record: bool = True) -> None:
        ctl = self.controller
        old = ctl.merged_uid
        seconds = self._timed_apply(mode.value, uid)
        if seconds is None or not record:
            return
        self.switches += 1
        self.switch_seconds += seconds
        if self.measured is not None:
            kind, rank = self._switch_kind(old, uid)
            self.measured.record_switch(kind, rank, seconds)
        if self.metrics is not None:
            self.metrics.switches.inc()
            self.metrics.switch_seconds.inc(seconds)
            self.metrics.last_switch_seconds.set(seconds)

    def _timed_apply(self, mode: str, uid: str | None) -> float | None:
        """Move the weights; wall seconds including the GPU work, None if it failed.

        The GPU finishes the previous batch first (with overlap scheduling it may still
        be running and reads the weights being changed)."""
        import torch

        sync = torch.cuda.synchronize if torch.cuda.is_available() else (lambda: None)
        sync()
        started = time.perf_counter()
        try:
            self.controller.apply(mode, self._name(uid) if uid is not None else None)
        except ValueError as exc:
            # Results stay right in the current weights (work items cover every
            # request); only the speed-up of the decision is lost. Say so.
            logger.error("sglang-vlora: orchestrator could not switch to %s %s: %s", mode, uid, exc)
            return None
        sync()
        return time.perf_counter() - started

    def _switch_kind(self, old: str | None, new: str | None) -> tuple[str, int]:
        rank = self._rank
        if old is None:
            return "merge", rank(new)
        if new is None:
            return "unmerge", rank(old)
        return "fused", rank(old) + rank(new)

    def _rank(self, uid: str) -> int:
        return int(self.lora_manager.loras[uid].config.r)

    def _calibrate_switches(self) -> None:
        """Idle with adapters loaded and no switch measured yet: time one merge, (one fused
        switch,) one unmerge, so credits charge switches from the first request on. A first,
        unrecorded cycle takes the one-time costs (kernel compilation, the pristine copy)."""
        uids = sorted(self.lora_manager.loras, key=self._name)[:2]
        for record in (False, True):
            for uid in [*uids, None]:
                self._switch(Mode.MERGE if uid is not None else Mode.UNMERGE, uid, record=record)
        logger.info("sglang-vlora: measured switch costs on %s", [self._name(u) for u in uids])

    # -------------------------------------------------------------------- reports
    def _name(self, uid: str | None) -> str:
        if uid is None:
            return BASE_LABEL
        ref = self.lora_manager.lora_refs.get(uid)
        return ref.lora_name if ref is not None else uid

    def _adapter_names(self) -> list[str]:
        return [ref.lora_name for ref in self.lora_manager.lora_refs.values()]

    def status(self) -> dict[str, Any]:
        cost = self._cost()
        decision = self.last_decision
        return {
            "policy": self.policy_name,
            "theta_s": self.config.theta,
            "max_batch": self.config.max_batch,
            "iterations": {mode.value: self.iterations.get(mode.value, 0) for mode in Mode},
            "decisions": {mode.value: self.decisions.get(mode.value, 0) for mode in Mode},
            "last_decision": None if decision is None else {
                "mode": decision.mode.value,
                "adapter": self._name(decision.adapter) if decision.adapter else None,
                "starving": len(decision.starving),
                "admitted": len(decision.admit),
            },
            "queue": self.queue,
            "switches": self.switches,
            "switch_seconds_total": self.switch_seconds,
            "cost_model": {
                "source": cost.source,
                "prefill_token_s": {m.value: v for m, v in cost.prefill_token_s.items()},
                "decode_step_s": {m.value: v for m, v in cost.decode_step_s.items()},
            },
        }


def _application_and_slo(req) -> tuple[str | None, float | None]:
    try:
        return application_and_slo(req.sampling_params.custom_params)
    except ValueError:  # refused by the launcher; a request from elsewhere just has no SLO
        return None, None


def _group(req) -> str | None:
    """Requests expected to answer alike: same application, else same adapter."""
    application, _ = _application_and_slo(req)
    return f"app:{application}" if application is not None else req.lora_id


def _running_requests(scheduler) -> list:
    """Requests that hold KV: the running batch, the prefill batch that just ran (SGLang
    merges it into the running batch later in this iteration) and a chunked request."""
    seen: dict[str, Any] = {}
    last = scheduler.last_batch
    groups = [scheduler.running_batch.reqs]
    if last is not None and last.forward_mode.is_extend():
        groups.append(last.reqs)
    if scheduler.chunked_req is not None:
        groups.append([scheduler.chunked_req])
    for group in groups:
        for req in group:
            if not req.finished():
                seen.setdefault(req.rid, req)
    return list(seen.values())


# ------------------------------------------------------------------ hooks
_orchestrator: Orchestrator | None = None


def orchestrator(scheduler=None) -> Orchestrator | None:
    """This scheduler's orchestrator, created on first use (None with ``--vlora-policy manual``)."""
    global _orchestrator
    if _orchestrator is None and scheduler is not None:
        from sglang_vlora import plugin

        cfg = plugin.active_config()
        if cfg is not None and cfg.policy != "manual" and scheduler.enable_lora:
            _orchestrator = Orchestrator(scheduler, cfg)
    return _orchestrator


def get_next_batch_around(original, self, *args, **kwargs):
    """AROUND ``Scheduler.get_next_batch_to_run``: decide and switch before SGLang picks."""
    orch = orchestrator(self)
    if orch is not None:
        orch.before_schedule(self)
    return original(self, *args, **kwargs)


def can_schedule_around(original, self, req, running_loras):
    """AROUND ``Scheduler.can_schedule_lora_req``: admit only the requests the policy chose."""
    orch = _orchestrator
    if orch is not None and req.rid not in orch.admit:
        return False
    return original(self, req, running_loras)


def run_batch_before(self, batch, *args, **kwargs):
    """BEFORE ``Scheduler.run_batch``: count the batch's mode and time it."""
    orch = _orchestrator
    if orch is not None and batch is not None:
        orch.before_run(batch)


def validate_application_and_slo(obj) -> None:
    """Launcher, per request of a ``GenerateReqInput``: a malformed application or SLO in
    ``custom_params`` raises ``ValueError`` with the reason (SGLang answers 400)."""
    params = obj.sampling_params
    for entry in params if isinstance(params, list) else [params]:
        if isinstance(entry, dict):
            application_and_slo(entry.get("custom_params"))
