"""One call from start to results JSON: assets, every system's server side by side, a
warm-up each, then the measurements one at a time in :func:`bench.e2e.plan.order`.

The JSON (schema :data:`SCHEMA`) is rewritten after every measurement, so a call cut short
(time budget, a timeout's SIGTERM) keeps what it measured. A round (one repeat of a point,
every system on the same trace) that does not fit in the budget whole is recorded as skipped;
a server that does not start or dies is recorded as failed / crashed with its log tail, and
the call goes on with the others.
"""

from __future__ import annotations

import datetime
import json
import os
import secrets
import signal
import time
import traceback
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np

from bench import provenance
from bench.e2e import cpu_pinning, gpu_clocks, host_probe, host_time, measure, plan, servers, timeline_figures
from bench.e2e.plan import Call, Measurement, Point
from bench.e2e.sglang_client import Worker
from bench.workloads import Request
from sglang_vlora.server_process import ServerProcess

SCHEMA = "sglang-vlora/e2e/v2"
WARMUP_REQUESTS = 8
WARMUP_SPACING_S = 0.1  # between the warm-up's requests: most run alone
WARMUP_STEADY_REQUESTS = 24  # the warm-up's last pass: at most this many of a point's requests at its rate
# Seconds a measurement takes beyond its arrivals: the last requests, status calls, and for
# SGLang's client its start (imports, tokenizer).
OVERHEAD_S = {"sglang": 10.0, "retrieval": 8.0, "video": 8.0}


def new_report(call: Call, argv: Sequence[str], setup_info: dict[str, Any], seed: int,
               extra: Sequence[str], pinning: dict[str, Any] | None = None) -> dict[str, Any]:
    gpu = provenance.gpu_info()
    now = datetime.datetime.now(datetime.UTC)
    setup = plan.setup_of(call.scale)
    points = {pid: plan.scaled(plan.points_of(call.scale)[pid], call.scale_requests) for pid in call.points}
    return {
        "schema": SCHEMA,
        "run_id": f"{call.name}-{now:%Y%m%dT%H%M%S}-{secrets.token_hex(2)}",
        "call": {"name": call.name, "why": call.why, "scale": call.scale, "systems": list(call.systems),
                 "points": list(call.points), "repeats": call.repeats},
        "date": now.isoformat(timespec="seconds"),
        "command": "python bench/run_e2e.py " + " ".join(argv),
        **provenance.environment(gpu),
        "setup": {**setup_info, "common_flags": list(setup.common_flags), "lora_flags": list(setup.lora_flags),
                  "seed": seed,
                  "extra_server_args": list(extra),
                  "cpu_pinning": pinning,
                  "host_cpus": cpu_pinning.topology()},
        "caveats": list(setup.caveats),
        "points": {pid: asdict(p) for pid, p in points.items()},
        "systems": {name: {"about": plan.SYSTEMS[name].about, "flags": plan.SYSTEMS[name].flags(),
                           "status": "pending"} for name in call.systems},
        "measurements": [],
    }


def write_json(path: Path, report: dict[str, Any]) -> None:
    """Write ``report`` compact, through a temporary file.

    Compact because every call's file is kept in ``bench/results/e2e`` and the tree travels to
    the GPU machine with each command, within a size limit (docs/bench.md).
    """
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(report, separators=(",", ":"), default=str))
    tmp.replace(path)


def warm_up(server: ServerProcess, points: Sequence[Point], names: Sequence[str], lora: bool,
            seed: int) -> dict[str, Any]:
    """Untimed bursts shaped like each point (JIT compilation, first adapter loads, the
    orchestrator's first cost measurements), then, once they are answered,
    :func:`cached_prefix_requests` of them, then :func:`steady_requests`."""
    t0 = time.monotonic()
    burst: list[Request] = []
    for point in points:
        if point.client == "sglang":
            burst += measure.text_requests(point, names, WARMUP_REQUESTS, seed + 99, lora)
        else:
            burst += measure.own_requests(plan.scaled(point, 0.0), names, seed + 99, lora)[:WARMUP_REQUESTS]
    for i, r in enumerate(burst):
        r.arrival_s = WARMUP_SPACING_S * i
    requests = completed = 0
    errors: list[str] = []
    # The second pass starts once the first is done: the first compiles, so its requests queue
    # up and run together, and the second's must come one at a time to run alone.
    passes = (burst, cached_prefix_requests(burst, 0.0), steady_requests(points, names, seed + 98, lora))
    for reqs in passes if burst else ():
        out = measure.run_own(server, reqs)
        requests, completed = requests + out["metrics"]["requests"], completed + out["metrics"]["completed"]
        errors += out.get("error_samples", [])
    return {"requests": requests, "completed": completed, "error_samples": errors[:5],
            "seconds": round(time.monotonic() - t0, 1)}


def cached_prefix_requests(burst: Sequence[Request], start_s: float) -> list[Request]:
    """The burst's prompts again from ``start_s``: each in full (every token but the last found in
    the prefix cache, so a one-token prefill) and, where it is token ids, one token shorter (a
    one-token prefill one position earlier), then all of them at once (prefills of several
    requests with cached prefixes). SGLang's eager runner copies each batch's inputs with a
    Triton kernel specialised on those tensors, and the plugin's one kernel runs only for batches
    of a few tokens: a variant first met in a measured round was compiled or loaded there, in a
    request's time (110-190 ms a compile with a cold Triton cache, 200-400 ms more where the C
    compiler builds its launcher), by whichever server met it first (docs/perf.md, "The
    one-token stall")."""
    again: list[Request] = []
    for r in burst:
        again.append(replace(r, payload=dict(r.payload)))
        ids = r.payload.get("input_ids")
        if isinstance(ids, list) and len(ids) > 1:
            again.append(replace(r, payload={**r.payload, "input_ids": ids[:-1]}))
    together = [replace(r, payload=dict(r.payload)) for r in again]
    timed = again + together
    for i, r in enumerate(timed):
        r.arrival_s = start_s + WARMUP_SPACING_S * min(i, len(again))
    return timed


def steady_requests(points: Sequence[Point], names: Sequence[str], seed: int, lora: bool) -> list[Request]:
    """Fresh requests of each point, a quarter of a round's (at least 1, at most
    :data:`WARMUP_STEADY_REQUESTS`), arriving as a measured round's do (Poisson at the point's
    rate; our client's points keep their own arrival times), the points one after another.
    The passes before send one shape at a time; a round also
    prefills while other requests run, and SGLang's eager input copy compiles a Triton variant
    for each set of its input tensors' 16-byte alignments it meets, which depends on where the
    batch's tensors fall: the first server to meet one in a round compiled it there (123-192 ms,
    in round 0 of three of the calls at b594e02; docs/perf.md, "At b594e02")."""
    rng = np.random.default_rng(seed)
    out: list[Request] = []
    start = 0.0
    for point in points:
        count = max(1, min(WARMUP_STEADY_REQUESTS, point.requests // 4))
        if point.client == "sglang":
            reqs = measure.text_requests(point, names, count, seed, lora)
            arrivals = np.cumsum(rng.exponential(1.0 / point.rate, size=len(reqs)))
            for r, at in zip(reqs, arrivals, strict=True):
                r.arrival_s = float(at)
        else:
            reqs = measure.own_requests(replace(point, requests=count), names, seed, lora)
        for r in reqs:
            r.arrival_s += start
        out += reqs
        start = max((r.arrival_s for r in out), default=start) + WARMUP_SPACING_S
    return out


@dataclass
class Clients:
    """The call's clients: SGLang's serving benchmark in a worker process (started with the
    servers, so that its imports overlap theirs) and our own client's requests, made once
    per (point, seed) for every system (hundreds of images take seconds to encode)."""

    work_dir: Path
    worker: Worker | None = None
    cache: dict[tuple[str, int], list[Request]] = field(default_factory=dict)

    def sglang(self) -> Worker:
        if self.worker is None or self.worker.process.poll() is not None:
            self.worker = Worker(self.work_dir / "sglang_client.log", env=servers.server_env())
        return self.worker

    def requests(self, point: Point, names: Sequence[str], seed: int, lora: bool) -> list[Request]:
        key = (point.id, seed)
        if key not in self.cache:
            self.cache.clear()
            self.cache[key] = measure.own_requests(point, names, seed, lora=True)
        return self.cache[key] if lora else [measure.without_lora(r) for r in self.cache[key]]

    def close(self) -> None:
        if self.worker is not None:
            self.worker.close()


def warm_up_all(report: dict[str, Any], call: Call, live: dict[str, ServerProcess], names: Sequence[str],
                seed: int) -> None:
    """Every server's warm-up at once: it is not timed, and Triton's JIT compilation, the
    longest part, runs on the CPU, so the servers compile in parallel."""
    points = [plan.points_of(call.scale)[p] for p in call.points]
    with ThreadPoolExecutor(max_workers=max(1, len(live))) as pool:
        futures = {name: pool.submit(warm_up, srv, [p for p in points if p.runs_on(name)], names,
                                     plan.SYSTEMS[name].lora, seed) for name, srv in live.items()}
    for name, future in futures.items():
        try:
            report["systems"][name]["warmup"] = future.result()
        except Exception as e:  # the measurements will show whether the server works
            report["systems"][name]["warmup"] = {"error": f"{type(e).__name__}: {e}"}
        print(f"[e2e] {name}: warmed up {report['systems'][name]['warmup']}", flush=True)


def measure_one(server: ServerProcess, system: plan.System, point: Point, names: Sequence[str], seed: int,
                clients: Clients, cpus: Sequence[int] | None = None) -> dict[str, Any]:
    """One measurement; besides the client's figures, what the server's processes did on the
    host (:mod:`host_time`, over ``cpus``, the server's own when pinned), how fast the host ran
    a fixed loop on those CPUs (:mod:`host_probe`) and the GPU's clocks (:mod:`gpu_clocks`)
    while it ran."""
    servers.flush_cache(server)  # no measurement reuses another's prefix KV
    before = servers.vlora_status(server) if system.plugin else None
    started_unix = time.time()
    t0 = time.monotonic()
    host_before = host_time.take(server.process.pid, t0)
    with gpu_clocks.GpuClocks() as clocks, host_probe.HostProbe(cpus) as speed:
        if point.client == "sglang":
            result = measure.run_sglang(clients.sglang(), server, point, names, seed, system.lora, clients.work_dir)
        else:
            labelled = clients.requests(point, names, seed, True)  # the floor's requests split like the others'
            sent = labelled if system.lora else clients.requests(point, names, seed, False)
            result = measure.run_own(server, sent, [r.adapter for r in labelled])
    result["host"] = host_time.between(host_before, host_time.take(server.process.pid, time.monotonic()), cpus)
    result["gpu_clocks"] = clocks.summary()
    result["host_probe"] = speed.summary()
    result["seconds"] = round(time.monotonic() - t0, 1)
    if system.plugin:
        after = servers.vlora_status(server)
        result["orchestrator"] = servers.orchestrator_summary(before, after)
        result["vlora_status"] = {"before": before, "after": after}
        result["timeline"] = save_timeline(server, system.name, point.id, started_unix, clients.work_dir.parent)
    return result


def save_timeline(server: ServerProcess, system: str, point: str, since: float, log_dir: Path) -> dict[str, Any] | None:
    """Every iteration ours timed during the measurement (``GET /vlora/timeline``), written to
    ``<log-dir>/timelines/`` beside the server logs (a round's 1-2k iterations would double a
    results file); the results keep the file's name, how many, whether none was dropped, and its
    figures (:func:`bench.e2e.timeline_figures.figures`: prefills by band, decode steps' median),
    which outlive the logs."""
    timeline = servers.vlora_timeline(server, since)
    if timeline is None:
        return None
    path = log_dir / "timelines" / f"{system}_{point}_{since:.0f}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(path, timeline)
    try:
        figures = timeline_figures.figures(timeline)
    except (KeyError, ValueError, TypeError, IndexError) as e:  # the file is kept; its figures never fail a round
        figures = {"error": f"{type(e).__name__}: {e}"}
    return {"file": str(path.relative_to(log_dir)), "iterations": len(timeline.get("iterations", [])),
            "complete": timeline.get("complete"), "figures": figures}


def _expected_s(point: Point) -> float:
    return point.arrivals_s + OVERHEAD_S[point.client]


def run_measurements(report: dict[str, Any], call: Call, live: dict[str, ServerProcess], names: Sequence[str],
                     seed: int, deadline: float, json_path: Path, clients: Clients) -> None:
    """Every measurement of :func:`plan.order`, one at a time. A round (one repeat of one
    point: the same trace for every system) starts only if all of it is expected to end
    before ``deadline``: a round cut short would leave some systems with a trace the others
    never ran, and the report's means over rounds would compare different traces."""
    points = {pid: plan.scaled(plan.points_of(call.scale)[pid], call.scale_requests) for pid in call.points}
    measurements = plan.order(call, list(live))
    pinning = report.get("setup", {}).get("cpu_pinning")
    current_round, round_fits, rounds, cpus_of = None, True, 0, {}
    for i, m in enumerate(measurements):
        point, system, server = points[m.point], plan.SYSTEMS[m.system], live[m.system]
        entry: dict[str, Any] = {**asdict(m), "status": "ok"}
        report["measurements"].append(entry)
        if (m.repeat, m.point) != current_round:
            current_round = (m.repeat, m.point)
            rest = [x for x in measurements[i:] if (x.repeat, x.point) == current_round]
            round_fits = time.monotonic() + sum(_expected_s(points[x.point]) for x in rest) <= deadline
            if pinning and round_fits:
                cpus_of = repin_servers(live, pinning, rounds)
            rounds += 1
        if not server.alive():
            entry.update(status="failed", reason="server died earlier")
            report["systems"][m.system].update(status="crashed", reason="server died during the call",
                                               log_tail=server.log_tail(60))
            continue
        if not round_fits:
            entry.update(status="skipped", reason="time budget of the call (--budget-s): this round would not "
                         "end in time for every system, and a round runs whole or not at all")
            continue
        if time.monotonic() + _expected_s(point) > deadline:
            entry.update(status="skipped", reason="time budget of the call (--budget-s) spent")
            continue
        entry["started_at_s"] = round(time.monotonic() - report["_t0"], 1)
        entry["started_at_unix"] = round(time.time(), 3)  # to read the servers' logs and stall times against
        entry["trace_seed"] = plan.trace_seed(seed, m.repeat)
        cpus = cpus_of.get(m.system)
        if cpus:
            entry["cpus"] = cpus
        try:
            entry.update(measure_one(server, system, point, names, entry["trace_seed"], clients, cpus))
        except Exception as e:  # a client failure is this measurement's, not the call's
            entry.update(status="failed", reason=f"{type(e).__name__}: {e}"[:2000])
        print(_line(m, entry), flush=True)
        write_json(json_path, _public(report))


def repin_servers(live: dict[str, ServerProcess], pinning: dict[str, Any], round_index: int) -> dict[str, list[int]]:
    """Every live server, with the processes it started, on its CPUs of round ``round_index``
    (:func:`cpu_pinning.blocks_for_round`); those CPUs by server. A server that has ended keeps
    none (its measurements fail as "server died")."""
    placed = {}
    for name, cpus in cpu_pinning.blocks_for_round(pinning, round_index).items():
        if name in live and live[name].alive():
            try:
                cpu_pinning.repin(live[name].process.pid, cpus)
            except ProcessLookupError:
                continue
            placed[name] = cpus
    return placed


def _line(m: Measurement, entry: dict[str, Any]) -> str:
    if entry["status"] != "ok":
        return f"[e2e] {m.system} {m.point} #{m.repeat}: {entry['status']}: {entry.get('reason', '')[:300]}"
    met = entry["metrics"]
    e2e = met["e2e_ms"]
    fmt = lambda v: "-" if v is None else f"{v:.1f}"  # noqa: E731
    return (f"[e2e] {m.system} {m.point} #{m.repeat}: {met['completed']}/{met['requests']} done, mean E2E "
            f"{fmt(e2e['mean'])} ms, p99 {fmt(e2e['p99'])} ms, TTFT {fmt(met['ttft_ms']['mean'])} ms, "
            f"{entry['seconds']} s")


def _public(report: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in report.items() if not k.startswith("_")}


def start_servers(report: dict[str, Any], call: Call, model: Path, adapters: dict[str, Path], log_dir: Path,
                  extra: Sequence[str], force: bool,
                  pinning: dict[str, Any] | None = None) -> dict[str, ServerProcess]:
    """Every runnable system's server, started side by side; those that came up. ``pinning``
    (:func:`cpu_pinning.assign`) gives each server its CPUs."""
    setup = plan.setup_of(call.scale)
    startable = plan.startable(call.systems, report["gpu"] is not None, force)
    runnable = [plan.SYSTEMS[name] for name in startable]
    for name in call.systems:
        if name not in startable:
            report["systems"][name].update(status="skipped", reason=plan.NO_CUDA_REASON)
            print(f"[e2e] {name}: skipped (needs a CUDA GPU)", flush=True)
    report["setup"]["memory"] = servers.check_memory(setup, model, len(runnable), report["gpu"], extra)
    print(f"[e2e] starting {len(runnable)} servers side by side: {', '.join(s.name for s in runnable)}", flush=True)
    live = servers.start_all(runnable, setup, model, adapters, log_dir, extra,
                             pinning["servers"] if pinning else None)
    for s in runnable:
        report["systems"][s.name].update(server_command=" ".join(live[s.name].command),
                                         log=str(live[s.name].log_path))
    failed = servers.wait_all(live, setup.start_timeout_s)
    for name, srv in list(live.items()):
        entry = report["systems"][name]
        if name in failed:
            entry.update(status="failed", reason=failed[name], log_tail=srv.log_tail(60))
            print(f"[e2e] {name}: FAILED to start: {failed[name]}\n{entry['log_tail']}", flush=True)
            servers.stop_all({name: live.pop(name)})
        else:
            entry.update(status="running", ready_s=srv.ready_s)
            print(f"[e2e] {name}: up after {srv.ready_s} s", flush=True)
    return live


def run_call(call: Call, argv: Sequence[str], out: Path, log_dir: Path, tag: str, budget_s: float, seed: int = 0,
             extra: Sequence[str] = (), force: bool = False, pinning: dict[str, Any] | None = None) -> dict[str, Any]:
    """One call (module docstring). ``pinning`` (:func:`cpu_pinning.assign`) pins each
    server to its CPUs and this process, with the clients it starts, to the client's for
    the call; None leaves placement to the kernel."""
    t0 = time.monotonic()
    deadline = t0 + budget_s
    setup = plan.setup_of(call.scale)
    cache = servers.REPO / ".cache" / "bench"
    print(f"[e2e] call {call.name}: preparing the {setup.scale} model and {setup.adapters} adapters", flush=True)
    model, adapters, info = servers.prepare_assets(setup, cache)
    report = new_report(call, argv, info, seed, extra, pinning)
    report["_t0"] = t0
    out.mkdir(parents=True, exist_ok=True)
    json_path = out / f"{tag}.json"
    write_json(json_path, _public(report))
    live: dict[str, ServerProcess] = {}
    clients = Clients(log_dir / "client")
    previous = signal.signal(signal.SIGTERM, _raise_on_sigterm)
    own_cpus = os.sched_getaffinity(0)
    try:
        if pinning:
            os.sched_setaffinity(0, pinning["client"])  # before the client worker starts: it inherits them
        if any(plan.points_of(call.scale)[p].client == "sglang" for p in call.points):
            clients.sglang()
        live = start_servers(report, call, model, adapters, log_dir, extra, force, pinning)
        names = list(adapters)
        warm_up_all(report, call, live, names, seed)
        write_json(json_path, _public(report))
        run_measurements(report, call, live, names, seed, deadline, json_path, clients)
    except BaseException as e:  # recorded, then re-raised after the servers are stopped
        report["interrupted"] = f"{type(e).__name__}: {e}"
        report["traceback"] = traceback.format_exc()[-4000:]
        raise
    finally:
        signal.signal(signal.SIGTERM, previous)
        os.sched_setaffinity(0, own_cpus)
        clients.close()
        _finish(report, live, json_path, t0)
    return _public(report)


def _raise_on_sigterm(signum: int, _frame: Any) -> None:
    raise SystemExit(f"signal {signum}")


def _finish(report: dict[str, Any], live: dict[str, ServerProcess], json_path: Path, t0: float) -> None:
    for name, srv in live.items():
        entry = report["systems"][name]
        if entry.get("status") == "running":
            entry["status"] = "ok" if srv.alive() else "crashed"
            if not srv.alive():
                entry["log_tail"] = srv.log_tail(60)
    servers.stop_all(live)
    report["shim_calls"] = _shim_calls()
    report["wall_s"] = round(time.monotonic() - t0, 1)
    write_json(json_path, _public(report))
    print(f"[e2e] wrote {json_path} ({report['wall_s']} s)", flush=True)


def _shim_calls() -> str | None:
    """What the stand-in sgl_kernel refused, if it logged anything (benchmark machine)."""
    path = os.environ.get("SGL_SHIM_LOG")
    if not path or not Path(path).exists():
        return None
    return Path(path).read_text(errors="replace")[-2000:] or None

