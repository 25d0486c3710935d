"""The orchestrator inside SGLang's scheduler process (one per TP rank): the glue between
SGLang's scheduling loop and the pure policies of :mod:`sglang_vlora.orchestrator`. Driven by
the hooks of :mod:`sglang_vlora.orchestrator.scheduler_hooks`, which keep it in the process's
:class:`~sglang_vlora.runtime.VLoRARuntime`; active unless ``--vlora-policy manual``.

Every scheduler iteration, before SGLang picks the next batch:

1. the waiting and running requests become a :class:`SchedulerState` (adapter, arrival,
   tokens so far and expected, application and SLO from ``custom_params``, when the
   weights last changed);
2. the policy decides the weights and the waiting requests to admit, with theta and the
   max batch from the flags or derived (:mod:`~sglang_vlora.orchestrator.limits`); with
   tensor parallelism TP rank 0 decides and broadcasts the decision, so every rank
   switches and admits alike (no rank reads another's clock);
3. the weights move to the decision (:class:`sglang_vlora.modes.controller.ModeController`,
   in place, between forward passes, queued behind the batch in flight by a stream wait);
4. SGLang builds the batch as usual (its own priority order, so radix-cache prefix
   matching still orders requests inside the chosen set), but admits only the chosen
   waiting requests (``can_schedule_lora_req``).

Running requests are never paused: they hold KV cache, and whatever the weights, the
``atmm`` backend's work items compute every request exactly (a request of another
adapter than the merged one runs in mixture). The policies know it (every decision runs
all running requests, and its mode is what the batch runs in); the iteration counters
record the mode each batch actually ran in, from the weights and the batch's requests.

Costs come from ``--vlora-cost-model`` or are measured while serving
(:class:`~sglang_vlora.orchestrator.cost_model.MeasuredCosts`): every batch from its
start to the next batch's start and every switch, timed by CUDA events read only once
done (:mod:`~sglang_vlora.orchestrator.timing`: the plugin adds no GPU synchronisation
per iteration), with one merge / (fused) / unmerge cycle timed the first time the
server is idle with adapters loaded. The iterations of the first request the server runs
(SGLang's warm-up, or the first user request) are not samples: they pay one-off costs.
"""

from __future__ import annotations

import logging
import time
from collections import Counter, deque
from typing import TYPE_CHECKING, Any

from sglang_vlora.config import VLoRAConfig
from sglang_vlora.orchestrator.admission_waits import AdmissionWaits
from sglang_vlora.orchestrator.cost_model import SWITCH_KINDS, CostModel, MeasuredCosts, OutputLengths
from sglang_vlora.orchestrator.limits import DerivedLimits
from sglang_vlora.orchestrator.policy import DECISION_REASONS, PolicyConfig, make_policy
from sglang_vlora.orchestrator.request_params import application_and_slo
from sglang_vlora.orchestrator.state import Decision, Mode, Request, SchedulerState
from sglang_vlora.orchestrator.timeline import IterationTimeline
from sglang_vlora.orchestrator.timing import BatchTimer, Clock, Intervals, WallClock

if TYPE_CHECKING:
    from sglang_vlora.modes.controller import ModeController

logger = logging.getLogger(__name__)

BASE_LABEL = "base"  # queue label of requests without an adapter
# The parts of the hooks' host time (``hook_seconds_by_part``): reading the timing marks done and
# feeding the cost model, SGLang's requests and those that finished, the decision (the policy's view
# of each request, the cost snapshot, the policy), applying it (switches issued), and a batch's start
# (its mode counted, its clock started).
HOOK_PARTS = ("timings", "requests", "decide", "apply", "batch")
FIRST_REQUEST_SHOWN = 16  # unrecorded iterations of the first request listed in the status


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

    def __init__(self, scheduler, cfg: VLoRAConfig, controller: ModeController | None) -> None:
        from sglang.srt.runtime_context import get_parallel

        self.lora_manager = scheduler.tp_worker.model_runner.lora_manager
        if controller is None:
            raise RuntimeError("sglang-vlora: the orchestrator needs the mode controller (LoRA on)")
        self.controller = controller
        self.policy_name = cfg.policy
        self.admission = cfg.admission
        self.keep_merged = cfg.keep_merged
        self.popular_share = cfg.popular_share
        # The adapters of the last popular_window arrivals tell the policy which adapter is
        # popular (SchedulerState.recent_arrivals; docs/orchestrator.md, "The popularity gate").
        self.popular_window = cfg.popular_window
        self.adapter_slots = scheduler.server_args.max_loras_per_batch
        self.limits = DerivedLimits(cfg.max_batch, cfg.theta, *_capacity(scheduler))
        layers = len(self.lora_manager.lora_modules)
        self.measured = None if cfg.cost_model else MeasuredCosts(layers)
        self.fixed_cost = CostModel.from_file(cfg.cost_model, layers) if cfg.cost_model else None
        self._policy = None
        self._policy_inputs: tuple[PolicyConfig, CostModel] | None = None
        parallel = get_parallel()
        self.tp_size = parallel.tp_size
        self.tp_group = parallel.tp_group if self.tp_size > 1 else None
        self.is_source = parallel.tp_rank == 0
        self.metrics = OrchestratorMetrics() if scheduler.server_args.enable_metrics and self.is_source else None
        self._streams = _Streams(scheduler)
        self.batch_timer: BatchTimer = BatchTimer(self._streams.clock(forward=True))
        # every timed iteration in order, for GET /vlora/timeline (timed where the cost model is measured)
        self.timeline = IterationTimeline()
        self.switch_timer: Intervals = Intervals(self._streams.clock(forward=False))
        self.admit: frozenset[str] = frozenset()
        self.last_decision: Decision | None = None
        self._arrival: dict[str, float] = {}
        self._labels: dict[str, tuple[str | None, float | None]] = {}  # in flight: application, SLO
        self._recent_arrivals: deque[str | None] = deque(maxlen=cfg.popular_window)  # adapters, oldest first
        self._admitted: set[str] = set()  # requests in flight the policy has admitted (their wait is recorded)
        self.admission_waits = AdmissionWaits()
        self._first_run: dict[str, float] = {}
        self._outputs = OutputLengths()
        self._tracked: dict[str, Any] = {}  # running requests of the last decision, to learn from when they finish
        self._last_switch: float | None = None
        self.iterations: Counter[str] = Counter()
        self.decisions: Counter[str] = Counter()
        self.decision_reasons: Counter[str] = Counter()
        self.switches: Counter[str] = Counter()  # by kind: merge, unmerge, fused
        self.switch_seconds = 0.0
        # host time of the scheduler hooks (deciding, issuing switches, counting batches): what the
        # orchestrator adds to each scheduler iteration on the CPU (scheduler_hooks.py measures it)
        self.hook_calls = 0
        self.hook_seconds = 0.0
        self.hook_seconds_by_part = dict.fromkeys(HOOK_PARTS, 0.0)  # the parts, same iterations
        self._switch_errors: set[str] = set()
        self._in_flight: tuple[Request, ...] = ()  # the last decision's requests: the queue, counted when read
        self._gauged: set[str] = set()  # adapter names the queue gauge last set above 0
        self._calibrated = False
        self._first_request: Any = None  # the first request run, until it has finished
        self._first_request_iterations = 0
        self._first_request_work: list[tuple[Mode, int, int]] = []  # the first FIRST_REQUEST_SHOWN

    # ---------------------------------------------------------------- per iteration
    def before_schedule(self, scheduler) -> bool:
        """Decide for this iteration and apply the decision; False when there was nothing to
        decide (no request waiting or running)."""
        now = time.monotonic()
        started = time.perf_counter()
        self._collect_timings()
        collected = time.perf_counter()
        waiting, running = list(scheduler.waiting_queue), _running_requests(scheduler)
        self._learn_from_finished(running, now)
        if not waiting and not running:
            if self._in_flight:
                self._report_queue(())
                if self.metrics is not None:
                    self.metrics.starving.set(0)
            self.admit = frozenset()
            self._arrival.clear()
            self._labels.clear()
            self._admitted.clear()
            self.limits.idle()
            if self.measured is not None and not self._calibrated and self.lora_manager.loras:
                self._calibrated = True
                self._calibrate_switches()
            return False
        read = time.perf_counter()
        decision = self._decide(now, waiting, running) if self.is_source else None
        if self.tp_group is not None:
            decision = self._broadcast(decision)
        decided = time.perf_counter()
        self._apply(decision, now)
        parts = self.hook_seconds_by_part
        parts["timings"] += collected - started
        parts["requests"] += read - collected
        parts["decide"] += decided - read
        parts["apply"] += time.perf_counter() - decided
        return True

    def after_schedule(self, plan) -> None:
        """No batch this step: the last batch's interval ends here, before the idle time."""
        if plan.batch_to_run is None:
            self.batch_timer.end_at_idle()

    def before_run(self, batch) -> None:
        """The batch about to run: count it under the mode it really runs in, start its clock."""
        merged = self.controller.merged_uid
        if merged is None:
            mode = Mode.UNMERGE
        elif all(req.lora_id == merged for req in batch.reqs):
            mode = Mode.MERGE
        else:
            mode = Mode.MIXTURE
        self.iterations[mode.value] += 1
        if self.measured is not None and self.is_source:
            work = (mode, *_work(batch))
            cold = self._runs_first_request(batch)
            self.batch_timer.start(work, record=not cold)
            if cold:
                self._first_request_iterations += 1
                if len(self._first_request_work) < FIRST_REQUEST_SHOWN:
                    self._first_request_work.append(work)
        if self.metrics is not None:
            self.metrics.iterations.labels(mode=mode.value).inc()
            for m in Mode:
                self.metrics.mode.labels(mode=m.value).set(int(m is mode))

    def _runs_first_request(self, batch) -> bool:
        """Whether ``batch`` holds the first request this server ran, whoever sent it:
        SGLang's warm-up, or with ``--skip-server-warmup`` the first user request. Its
        iterations pay one-off costs (kernels compiling, lazy initialisation: on the H200 a
        54-token prefill of 4.9 s, decode steps of 445 and 163 ms against 7 ms later), so
        they are not cost samples. Once it has finished, nothing is checked any more."""
        first = self._first_request
        if first is None:  # none run yet, or finished
            if self._first_request_iterations or not batch.reqs:
                return False
            self._first_request = batch.reqs[0]
            return True
        if any(req.rid == first.rid for req in batch.reqs):
            return True
        if first.finished():
            self._first_request = None
        return False

    def _collect_timings(self) -> None:
        """Feed the cost model the batches and switches whose timing marks are done (never waits)."""
        for (kind, rank), seconds in self.switch_timer.collect():
            self.switch_seconds += seconds
            if self.measured is not None:
                self.measured.record_switch(kind, rank, seconds)
            if self.metrics is not None:
                self.metrics.switch_seconds.inc(seconds)
                self.metrics.last_switch_seconds.set(seconds)
        if self.measured is not None:
            now = time.time()
            for (mode, tokens, requests), seconds in self.batch_timer.collect():
                self.measured.record_iteration(mode, tokens, requests, seconds, at=now)
                self.timeline.record(now, mode, tokens, requests, seconds)

    # ------------------------------------------------------------------- deciding
    def _cost(self) -> CostModel:
        return self.fixed_cost if self.fixed_cost is not None else self.measured.snapshot()

    def policy_config(self) -> PolicyConfig:
        return PolicyConfig(
            theta=self.limits.theta_value(), max_batch=self.limits.max_batch_value(), adapter_slots=self.adapter_slots,
            admission=self.admission, keep_merged=self.keep_merged, popular_share=self.popular_share,
        )

    def _decide(self, now: float, waiting: list, running: list) -> Decision:
        self.limits.observe(now, len(waiting) + len(running))
        inputs = (self.policy_config(), self._cost())
        if inputs != self._policy_inputs:
            self._policy = make_policy(self.policy_name, *inputs)
            self._policy_inputs = inputs
        arrival, labels = {}, {}
        for req in (*running, *waiting):
            if req.rid not in self._arrival:
                self._recent_arrivals.append(req.lora_id)
            arrival[req.rid] = self._arrival.get(req.rid, now)
            labels[req.rid] = self._labels.get(req.rid) or _application_and_slo(req)
        self._arrival, self._labels = arrival, labels
        state = SchedulerState(
            now=now,
            waiting=[self._request(req, arrival[req.rid], labels[req.rid], running=False) for req in waiting],
            running=[self._request(req, arrival[req.rid], labels[req.rid], running=True) for req in running],
            mode=Mode(self.controller.mode),
            merged=self.controller.merged_uid,
            ranks={uid: int(lora.config.r) for uid, lora in self.lora_manager.loras.items()},
            last_switch=self._last_switch,
            recent_arrivals=tuple(self._recent_arrivals),
        )
        decision = self._policy.decide(state)
        self._report_queue(state.requests)
        self._record_waits(state, decision, now)
        return decision

    def _record_waits(self, state: SchedulerState, decision: Decision, now: float) -> None:
        """The wait of every request this decision admits for the first time (a chosen
        request SGLang could not take yet stays waiting and is not counted twice)."""
        self._admitted &= {r.rid for r in state.requests}
        admit = set(decision.admit) - self._admitted
        for request in state.waiting:
            if request.rid in admit:
                self.admission_waits.record(self._name(request.adapter), now - request.arrival)
        self._admitted |= admit

    def _learn_from_finished(self, running: list, now: float) -> None:
        """Output length and execution time of every request that finished since the last call."""
        still = {req.rid for req in running}
        for rid, req in self._tracked.items():
            if rid not in still:
                started = self._first_run.pop(rid, None)
                if req.finished():
                    application, _ = self._labels.get(rid) or _application_and_slo(req)
                    self._outputs.record(_group(application, req.lora_id), len(req.output_ids))
                    if started is not None:
                        self.limits.finished(now - started)
        for req in running:
            self._first_run.setdefault(req.rid, now)
        self._tracked = {req.rid: req for req in running}

    def _request(self, req, arrival: float, labels: tuple[str | None, float | None], running: bool) -> Request:
        """The policy's view of one of SGLang's requests; ``labels``: its application and SLO
        (:func:`_application_and_slo`, parsed once per request, not every iteration)."""
        params = req.sampling_params
        application, slo = labels
        prompt = len(req.origin_input_ids)
        output = len(req.output_ids)
        if running:
            kv = getattr(getattr(req, "kv", None), "kv_committed_len", prompt)
            prefilled = min(prompt, kv) if not output else prompt
        else:
            prefilled = 0
        expected = self._outputs.expected(_group(application, req.lora_id), params.max_new_tokens, output)
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
    def _apply(self, decision: Decision, now: float) -> None:
        ctl = self.controller
        if decision.adapter != ctl.merged_uid:
            self._switch(decision.mode, decision.adapter, now)
        elif decision.mode.value != ctl.mode:
            ctl.mode = decision.mode.value  # merge <-> mixture: same weights, nothing to move
        self.admit = frozenset(decision.admit)
        self.last_decision = decision
        self.decisions[decision.mode.value] += 1
        self.decision_reasons[decision.reason] += 1
        if self.metrics is not None:
            self.metrics.starving.set(len(decision.starving))

    @property
    def queue(self) -> dict[str, int]:
        """Waiting and running requests by adapter name at the last decision."""
        return dict(Counter(self._name(r.adapter) for r in self._in_flight))

    def _report_queue(self, requests: tuple[Request, ...]) -> None:
        """Keep the decision's requests; the count by adapter is made only where it is read
        (``/vlora/status``, the Prometheus gauge), not every iteration."""
        self._in_flight = requests
        if self.metrics is not None:
            queue = self.queue
            for name in {*self._adapter_names(), *self._gauged, *queue}:
                self.metrics.queue.labels(adapter=name).set(queue.get(name, 0))
            self._gauged = set(queue)

    def _switch(self, mode: Mode, uid: str | None, now: float, record: bool = True) -> None:
        """Move the weights in place, timed with marks read later (no host synchronisation).

        The switch is queued behind the batch in flight (with overlap scheduling it may
        still read the weights) by a stream wait; the next batch's forward waits for the
        scheduler's stream, so it sees the new weights. A failed switch leaves the weights
        as they were: results stay right (work items cover every request in any weights),
        only the decision's speed-up is lost, and the log says so.
        """
        old = self.controller.merged_uid
        self._streams.fence()
        start = self.switch_timer.clock.mark()
        try:
            self.controller.apply(mode.value, self._name(uid) if uid is not None else None)
        except ValueError as exc:
            # Logged once per reason: the policy may ask again every iteration.
            log = logger.debug if str(exc) in self._switch_errors else logger.error
            self._switch_errors.add(str(exc))
            log("sglang-vlora: orchestrator could not switch to %s %s: %s", mode, self._name(uid), exc)
            return
        end = self.switch_timer.clock.mark()
        self.batch_timer.interrupt()
        self._last_switch = now
        kind, rank = self._switch_kind(old, uid)
        if not record:
            return
        self.switch_timer.add(start, end, (kind, rank))
        self.switches[kind] += 1
        if self.metrics is not None:
            self.metrics.switches.inc()

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
                self._switch(Mode.MERGE if uid is not None else Mode.UNMERGE, uid, time.monotonic(), record)
        self._last_switch = None  # not a serving decision: the budget starts with the first real switch
        logger.info("sglang-vlora: measuring switch costs on %s", [self._name(u) for u in uids])

    # -------------------------------------------------------------------- reports
    def _name(self, uid: str | None) -> str:
        if uid is None:
            return BASE_LABEL
        ref = self.lora_manager.lora_refs.get(uid)
        return ref.lora_name if ref is not None else uid

    def _arrival_shares(self) -> dict[str, Any]:
        """Each adapter's share of the last ``popular_window`` arrivals (entering a merge
        needs more than ``popular_share``)."""
        counts = Counter(self._name(uid) for uid in self._recent_arrivals)
        total = len(self._recent_arrivals)
        return {
            "window": self.popular_window,
            "arrivals": total,
            "shares": {name: count / total for name, count in sorted(counts.items())},
        }

    def _adapter_names(self) -> list[str]:
        return [ref.lora_name for ref in self.lora_manager.lora_refs.values()]

    def status(self) -> dict[str, Any]:
        """What ``GET /vlora/status`` shows under ``orchestrator`` (benchmarks diff it per point)."""
        cost = self._cost()
        decision = self.last_decision
        theta, theta_source = self.limits.theta()
        max_batch, max_batch_source = self.limits.max_batch()
        return {
            "policy": self.policy_name,
            "admission": self.admission,
            "keep_merged": self.keep_merged,
            "theta_s": theta,
            "theta_source": theta_source,
            "max_batch": max_batch,
            "max_batch_source": max_batch_source,
            "arrival_shares": self._arrival_shares(),
            "iterations": {mode.value: self.iterations.get(mode.value, 0) for mode in Mode},
            "decisions": {mode.value: self.decisions.get(mode.value, 0) for mode in Mode},
            "decision_reasons": {reason: self.decision_reasons.get(reason, 0) for reason in DECISION_REASONS},
            "last_decision": None if decision is None else {
                "mode": decision.mode.value,
                "adapter": self._name(decision.adapter) if decision.adapter else None,
                "starving": len(decision.starving),
                "admitted": len(decision.admit),
                "reason": decision.reason,
            },
            "queue": self.queue,
            "admission_waits": self.admission_waits.report(),
            "switches": sum(self.switches.values()),
            "switches_by_kind": {kind: self.switches.get(kind, 0) for kind in SWITCH_KINDS},
            "switch_seconds_total": self.switch_seconds,
            "hook_calls": self.hook_calls,
            "hook_seconds_total": self.hook_seconds,
            "hook_seconds_by_part": dict(self.hook_seconds_by_part),
            "cost_model": _cost_report(cost, self.measured, self._first_request_iterations, self._first_request_work),
        }


def _cost_report(
    cost: CostModel, measured: MeasuredCosts | None, first_count: int, first_work: list[tuple[Mode, int, int]]
) -> dict[str, Any]:
    """The cost model's figures, its fits and what they are made of, and the iterations of
    the first request, which are not samples (``first_work``: the first of ``first_count``)."""
    report: dict[str, Any] = {
        "source": cost.source,
        "prefill_token_s": {m.value: v for m, v in cost.prefill_token_s.items()},
        "prefill_forward_s": {m.value: v for m, v in cost.prefill_forward_s.items()},
        "decode_step_s": {m.value: v for m, v in cost.decode_step_s.items()},
        "switch_s": {
            kind: {"per_layer_s": fit.per_layer_s, "per_layer_rank_s": fit.per_layer_rank_s}
            for kind, fit in (("merge", cost.merge), ("unmerge", cost.unmerge), ("fused", cost.fused))
            if fit is not None
        },
    }
    if measured is not None:
        report["iteration_fits"] = {
            mode.value: {
                "fixed_s": fit.fixed_s,
                "prefill_forward_s": fit.prefill_forward_s,
                "prefill_token_s": fit.prefill_token_s,
                "decode_request_s": fit.decode_request_s,
                "samples": fit.samples,
            }
            for mode, fit in measured.fits.items()
        }
        report["recent_iterations"] = {
            mode.value: [[tokens, requests, round(seconds, 6)] for tokens, requests, seconds in points]
            for mode, points in measured.recent_iterations().items()
        }
        report["slow_iterations"] = {
            "count": measured.slow_count,
            "excess_s": round(measured.slow_excess_s, 6),
            "last": [[round(it.at, 3), it.mode.value, it.prefill_tokens, it.decode_requests, round(it.seconds, 6),
                      round(it.predicted_s, 6)] for it in measured.slow],
        }
        report["first_request_iterations"] = [[mode.value, tokens, requests] for mode, tokens, requests in first_work]
        report["first_request_iteration_count"] = first_count
    return report


def _capacity(scheduler) -> tuple[int, str]:
    """The largest batch the orchestrator plans for: SGLang's max running requests, and the
    largest captured decode CUDA graph when graphs are on (beyond it decode runs eagerly)."""
    capacity, source = int(scheduler.max_running_requests), "max running requests"
    graphs = getattr(scheduler.tp_worker.model_runner, "decode_cuda_graph_runner", None)  # None: graphs off
    graph_bs = getattr(graphs, "max_bs", None)
    if graph_bs is not None and graph_bs < capacity:
        capacity, source = int(graph_bs), "largest decode CUDA graph"
    return capacity, source


def _work(batch) -> tuple[int, int]:
    """``(prefill tokens, decoding requests)`` of a batch; a mixed batch carries one token
    per decoding request on top of its prefill chunks."""
    if not batch.forward_mode.is_extend():
        return 0, batch.batch_size()
    decoding = len(batch.decoding_reqs or [])
    return max(0, int(batch.extend_num_tokens or 0) - decoding), decoding


class _Streams:
    """Where timing marks go and how a switch waits for the batch in flight, without a
    host synchronisation. CPU: the wall clock, and nothing to wait for."""

    def __init__(self, scheduler) -> None:
        import torch

        self._cuda = torch.cuda.is_available() and scheduler.device != "cpu"
        if self._cuda:
            current = torch.cuda.current_stream()
            self.forward = scheduler.forward_stream if scheduler.enable_overlap else current
            self.schedule = current

    def clock(self, forward: bool) -> Clock:
        if not self._cuda:
            return WallClock()
        return CudaClock(self.forward if forward else self.schedule)

    def fence(self) -> None:
        """Make the scheduler's stream (where the switch runs) wait for the forward stream."""
        if self._cuda and self.forward is not self.schedule:
            self.schedule.wait_stream(self.forward)


class CudaClock:
    """Marks are CUDA events recorded on one stream; read only once done (``query``)."""

    def __init__(self, stream) -> None:
        self.stream = stream

    def mark(self):
        import torch

        event = torch.cuda.Event(enable_timing=True)
        event.record(self.stream)
        return event

    def done(self, mark) -> bool:
        return mark.query()

    def seconds(self, start, end) -> float:
        return start.elapsed_time(end) / 1e3


def _application_and_slo(req) -> tuple[str | None, float | None]:
    try:
        return application_and_slo(req.sampling_params.custom_params)
    except ValueError:  # refused by the launcher; a request from elsewhere just has no SLO
        return None, None


def _group(application: str | None, adapter: str | None) -> str | None:
    """Requests expected to answer alike: same application, else same adapter."""
    return f"app:{application}" if application is not None else adapter


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
