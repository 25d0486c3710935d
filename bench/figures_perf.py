"""Figures blocks of the in-server profile (``bench/profile_server.py``) and its consistency
check (``bench/layer_cost.py``), for docs/perf.md and the README."""

from __future__ import annotations

import statistics
from typing import Any

from bench.report import block

SYSTEMS = (("nolora", "no LoRA"), ("csgmv", "csgmv"), ("triton", "triton"), ("atmm", "atmm"),
           ("vlora", "ours, defaults"))


def _rows(profile: dict[str, Any], scenarios: tuple[str, ...]) -> list[str]:
    rows = []
    systems = profile["systems"]
    for scenario in scenarios:
        floor = systems["nolora"][scenario]["busy_us_per_step"]
        for key, label in SYSTEMS:
            if key not in systems or scenario not in systems[key]:
                continue
            s = systems[key][scenario]
            lora = s["gpu_us_per_step"].get("lora")
            launches = s["kernels_per_step_by_category"].get("lora")
            adds = "-" if key == "nolora" else f"{s['busy_us_per_step'] - floor:+.0f}"
            kernels = "-" if lora is None else f"{lora:.0f} ({launches:.0f})"
            rows.append(f"| {scenario} | {label} | {s['busy_us_per_step']:.0f} | {adds} | {kernels} | "
                        f"{s['gpu_us_per_step'].get('gemm', 0.0):.0f} |")
    return rows


def _table(profile: dict[str, Any]) -> str:
    head = ["| scenario | system | GPU busy us | LoRA adds (busy) | LoRA kernels us (launches) | base GEMMs us |",
            "|---|---|---|---|---|---|"]
    scenarios = tuple(s for s in ("decode8", "decode32", "prefill1", "prefill4") if s in profile["systems"]["nolora"])
    return "\n".join(head + _rows(profile, scenarios)) + "\n\nPer decode step (CUDA-graph replay) or per prefill forward."


@block("perf-before", "profile_h200_before.json")
def perf_before(profile: dict[str, Any]) -> str:
    return _table(profile)


@block("perf-after", "profile_h200.json")
def perf_after(profile: dict[str, Any]) -> str:
    return _table(profile)


@block("perf-prefill-graphs", "profile_prefill_graphs_h200.json")
def perf_prefill_graphs(profile: dict[str, Any]) -> str:
    """Every server with SGLang's breakable prefill CUDA graph: one profiled forward each."""
    return _prefill_graph_table(profile, "ATMM's shrink runs beside the base GEMM on a side stream, so its kernel "
                                         "time overlaps the base's and the busy time is what it adds.")


@block("perf-prefill-graphs-sequential", "profile_prefill_graphs_sequential_h200.json")
def perf_prefill_graphs_sequential(profile: dict[str, Any]) -> str:
    """The same profile after prefill graphs stopped overlapping the shrink on a side stream."""
    return _prefill_graph_table(profile, "ATMM's shrink now runs in sequence with the base GEMM in prefill graphs "
                                         "(decode graphs keep the side stream).")


def _prefill_graph_table(profile: dict[str, Any], note: str) -> str:
    head = ["| scenario | system | forward span ms | over the floor | GPU busy ms | over the floor | "
            "LoRA kernels ms (launches) | of which shrink / expand ms |", "|---|---|---|---|---|---|---|---|"]
    systems, rows = profile["systems"], []
    for scenario in ("prefill1_base", "prefill1", "prefill4"):
        floor = systems["nolora"][scenario]
        for key, label in SYSTEMS:
            s = systems.get(key, {}).get(scenario)
            if s is None:
                continue
            span, busy = s["span_us_per_step"] / 1000, s["busy_us_per_step"] / 1000
            over_span = "-" if key == "nolora" else f"{span - floor['span_us_per_step'] / 1000:+.1f}"
            over_busy = "-" if key == "nolora" else f"{busy - floor['busy_us_per_step'] / 1000:+.1f}"
            lora = s["gpu_us_per_step"].get("lora")
            kernels = "-" if lora is None else f"{lora / 1000:.2f} ({s['kernels_per_step_by_category']['lora']:.0f})"
            top = s["top_kernels_us_per_step"]
            split = (f"{top['_shrink_kernel'] / 1000:.2f} / {top['_expand_kernel'] / 1000:.2f}"
                     if "_shrink_kernel" in top and "_expand_kernel" in top else "-")
            rows.append(f"| {scenario} | {label} | {span:.1f} | {over_span} | {busy:.1f} | {over_busy} | {kernels} "
                        f"| {split} |")
    return "\n".join(head + rows) + (
        "\n\nOne profiled forward per system and scenario (SGLang's torch profiler); span: first kernel's "
        "start to last kernel's end; " + note)


@block("perf-latency", "profile_h200.json")
def perf_latency(profile: dict[str, Any]) -> str:
    """Unprofiled client latency of one batch at a time (``--latency N``): median (p10-p90)
    and the median's LoRA cost over the no-LoRA server."""
    systems = profile["systems"]
    lines = ["| scenario | system | median ms (p10-p90) | LoRA cost ms (median over the floor's) |",
             "|---|---|---|---|"]
    count = 0
    for scenario in (s for s in ("prefill1", "prefill4", "decode8", "decode32") if s in systems["nolora"]):
        floor = systems["nolora"][scenario].get("latency_ms")
        for key, label in SYSTEMS:
            lat = systems.get(key, {}).get(scenario, {}).get("latency_ms")
            if not lat or not floor:
                continue
            count = lat["count"]
            cost = "-" if key == "nolora" else f"{lat['median'] - floor['median']:+.1f}"
            lines.append(f"| {scenario} | {label} | {lat['median']:.1f} ({lat['p10']:.1f}-{lat['p90']:.1f}) | {cost} |")
    return "\n".join(lines) + f"\n\n{count} requests (batches) per system and scenario, sent one after another."


def _interleaved_rows(result: dict[str, Any], labels: tuple[tuple[str, str], ...] = SYSTEMS) -> list[str]:
    rows = []
    for scenario, systems in result["interleaved_latency"].items():
        for key, label in labels:
            lat = systems.get(key)
            if lat is None:
                continue
            over = lat.get("over_floor")
            cost = "-" if over is None else f"{over['median']:+.1f} ({over['p25']:+.1f} to {over['p75']:+.1f})"
            forward = lat.get("server_forward_ms")
            over_forward = lat.get("server_forward_over_floor_ms")
            server = "-" if forward is None else f"{forward['median']:.1f}" + (
                "" if over_forward is None else f" ({over_forward:+.1f})")
            rows.append(f"| {scenario} | {label} | {lat['count']} | {lat['median']:.1f} ({lat['p25']:.1f}-"
                        f"{lat['p75']:.1f}) | {cost} | {server} |")
    return rows


@block("perf-interleaved", "latency_interleaved_h200.json", "latency_interleaved_prefill_h200.json")
def perf_interleaved(first: dict[str, Any], second: dict[str, Any]) -> str:
    """Unqueued client latency with the systems taking turns (``--interleaved N``): median
    (p25-p75) and the per-round excess over the floor's, two calls."""
    lines = ["| scenario | system | rounds | median ms (p25-p75) | over the floor, per round: median (p25 to p75) "
             "| server's forward, median ms (over the floor) |", "|---|---|---|---|---|---|"]
    for result in (first, second):
        lines += _interleaved_rows(result)
    return "\n".join(lines) + ("\n\nFirst call: four systems, 60 rounds; second call (the last rows): three systems, "
                               "100 rounds of prefill1, every server logging its request time stats (the server's forward: SGLang's "
                               "`forward_duration` of those requests, `profile_server.py --reread`).")


@block("perf-eager-in-gemm", "host_cost_eager_in_gemm_h200.json", "latency_eager_in_gemm_h200.json")
def perf_eager_in_gemm(host: dict[str, Any], latency: dict[str, Any]) -> str:
    """Eager batches with the shrink inside the base GEMM: one module call three ways
    (``layer_cost.py --host-only``), then lone prefills with the systems taking turns."""
    lines = ["| module | tokens | in the GEMM: host us / GPU us | separate shrink: host us / GPU us "
             "| `--vlora-lora-gemm on`: host us / GPU us |", "|---|---|---|---|---|"]
    for r in host["eager_module_paths"]:
        cells = [f"{r[way]['host_us']:.1f} / {r[way]['gpu_us']:.1f}" for way in ("in_gemm", "off", "on")]
        lines.append(f"| {r['module']} | {r['tokens']} | {' | '.join(cells)} |")
    lines += ["", "One eager `forward_with_base` of the module (base GEMM included), 8 pool slots of rank 64 "
              "appended, one adapter over the batch; host: the GPU kept busy so no call waits; GPU: CUDA events "
              "around 100 calls.", ""]
    lines += ["| scenario | system | rounds | median ms (p25-p75) | over the floor, per round: median (p25 to p75) "
              "| server's forward, median ms (over the floor) |", "|---|---|---|---|---|---|"]
    labels = (("nolora", "no LoRA"), ("atmm", "atmm (shrink in the GEMM)"),
              ("atmm_separate_shrink", "atmm, separate shrink"), ("csgmv", "csgmv"))
    lines += _interleaved_rows(latency, labels)
    return "\n".join(lines) + ("\n\nLone 1024-token prefills, the four servers taking turns every round "
                               "(`prefill1_base`: no adapter); the server's forward is SGLang's `forward_duration`.")


_HOST_PARTS = (
    # (label, [(function as py-spy names it, inclusive or self)], systems it applies to)
    ("ATMM's LoRA calls (`ops.lora_apply`: plans, shrink and expand launches)",
     [("lora_apply (atmm/ops.py)", "inclusive")], ("atmm",)),
    ("csgmv's LoRA calls (`apply_lora`: shrink and expand through Triton's launcher)",
     [("QKVParallelLinearWithLoRA.apply_lora (layers.py)", "inclusive"),
      ("RowParallelLinearWithLoRA.apply_lora (layers.py)", "inclusive")], ("csgmv",)),
    ("batch preparation (SGLang's `prepare_lora_batch` and the backend's)",
     [("LoRAManager.prepare_lora_batch (lora_manager.py)", "inclusive")], ("atmm", "csgmv")),
    ("the orchestrator's scheduling hook", [("Orchestrator.before_schedule (orchestrator/runtime.py)", "inclusive")],
     ("atmm",)),
    ("base GEMM calls (`UnquantizedLinearMethod.apply`, own time, over the floor's)",
     [("UnquantizedLinearMethod.apply (quantization/unquant.py)", "self-over")], ("atmm", "csgmv")),
)


def _host_part(entry: dict[str, Any], floor: dict[str, Any], functions: list[tuple[str, str]]) -> str:
    """The functions' summed time (``inclusive``: found only in the LoRA server, so its excess
    over the floor is all of it), or "-" where one is not among the recorded functions."""
    total = 0.0
    for name, kind in functions:
        if kind == "inclusive":
            value = entry["over_floor_ms"].get(name)
        else:
            own, base = entry["top_self_ms"].get(name), floor["top_self_ms"].get(name)
            value = None if own is None or base is None else own - base
        if value is None:
            return "-"
        total += value
    return f"{total:.2f}"


@block("perf-host-samples", "latency_host_samples_h200.json")
def perf_host_samples(result: dict[str, Any]) -> str:
    """Lone 1024-token prefills with and without an adapter, the systems taking turns, each
    server's scheduler sampled by py-spy (``profile_server.py --sample-host``): client latency
    and server forward over the floor's, the scheduler's host time per request, and for the
    forwards with an adapter the parts of it that the LoRA backends add."""
    labels = dict(SYSTEMS) | {"nolora2": "no LoRA, second server (control)"}
    lines = ["| scenario | system | over the floor, per round: median (p25 to p75) | server's forward, median ms "
             "(over the floor) | scheduler host time a request, ms (over the floor) |", "|---|---|---|---|---|"]
    for scenario, systems in result["interleaved_latency"].items():
        host = result["host_samples"][scenario]["systems"]
        for key in ("nolora", "nolora2", "csgmv", "atmm"):
            lat = systems[key]
            over = lat.get("over_floor")
            cost = "-" if over is None else f"{over['median']:+.1f} ({over['p25']:+.1f} to {over['p75']:+.1f})"
            forward = lat["server_forward_ms"]["median"]
            over_forward = lat.get("server_forward_over_floor_ms")
            loop = host[key]["event_loop_ms"]
            over_loop = "" if key == "nolora" else f" ({loop - host['nolora']['event_loop_ms']:+.1f})"
            lines.append(f"| {scenario} | {labels[key]} | {cost} | {forward:.1f}"
                         f"{'' if over_forward is None else f' ({over_forward:+.1f})'} | {loop:.1f}{over_loop} |")
    host = result["host_samples"]["prefill1"]["systems"]
    lines += ["", "| prefill1, host time a request, ms | atmm | csgmv |", "|---|---|---|"]
    for label, functions, applies in _HOST_PARTS:
        cells = [_host_part(host[key], host["nolora"], functions) if key in applies else "-"
                 for key in ("atmm", "csgmv")]
        lines.append(f"| {label} | {' | '.join(cells)} |")
    rounds = next(iter(result["interleaved_latency"].values()))["nolora"]["count"]
    return "\n".join(lines) + (f"\n\n{rounds} rounds per scenario; prefill1_base sends no adapter to any server. Host "
                               "time: py-spy samples (500 a second) of each scheduler's main thread in its event loop "
                               "while on the CPU, per request (`bench/host_samples.py`).")


# The functions whose costliest line runs a LoRA module's base GEMM: SGLang's, and ATMM's GEMM over the
# extended weight (before ac61eff inside ops.lora_apply_static_in_gemm, since then ops.KeptInGemmCall).
BASE_GEMM_FUNCTIONS = ("UnquantizedLinearMethod.apply (", "lora_apply_static_in_gemm (", "KeptInGemmCall.__call__ (")


@block("perf-host-modules", "latency_host_samples_prefill16_h200.json")
def perf_host_modules(result: dict[str, Any]) -> str:
    """Lone 16-token prefills on one adapter, the systems taking turns, each scheduler sampled
    by py-spy: client latency, server forward and scheduler host time, and per decoder module
    the host time of its call and of the line that calls its base GEMM (``module_calls``)."""
    return host_modules_table(result)


@block("perf-host-modules-kept", "latency_host_samples_prefill16_ac61eff_h200.json")
def perf_host_modules_kept(result: dict[str, Any]) -> str:
    """The same run with ATMM's eager in-GEMM module calls kept per layer (ac61eff)."""
    return host_modules_table(result)


@block("perf-host-modules-prefill1", "latency_host_samples_prefill1_8bdaca1_h200.json")
def perf_host_modules_prefill1(result: dict[str, Any]) -> str:
    """The same table for lone 1024-token prefills on one adapter (8bdaca1), with ATMM's eager
    path before the one-kernel package beside it."""
    return host_modules_table(result, "prefill1", ("nolora", "nolora2", "atmm", "atmm_no_small_gemm", "csgmv"))


HOST_MODULE_LABELS = {"nolora": "no LoRA", "nolora2": "no LoRA, control", "atmm": "ATMM",
                      "atmm_no_small_gemm": "ATMM, no one kernel", "csgmv": "csgmv"}


def host_modules_table(result: dict[str, Any], scenario: str = "prefill16",
                       systems: tuple[str, ...] = ("nolora", "nolora2", "atmm", "csgmv")) -> str:
    """The table of :func:`perf_host_modules` for one ``profile_server.py --sample-host`` result:
    ``scenario``'s requests, one column per system of ``systems``."""
    labels = HOST_MODULE_LABELS
    latency = result["interleaved_latency"][scenario]
    host = result["host_samples"][scenario]["systems"]

    def cost(key: str) -> str:
        over = latency[key].get("over_floor")
        return "-" if over is None else f"{over['median']:+.1f} ({over['p25']:+.1f} to {over['p75']:+.1f})"

    def base_gemm(key: str, module: str) -> str:
        """The module's time in the line that runs its base GEMM (SGLang's ``F.linear``, or
        ATMM's GEMM over the extended weight): the costliest line of the function that holds it,
        "-" where none of the module's top lines is in one."""
        leaves = host[key]["module_calls"][module]["top_leaves_ms"]
        found = [ms for leaf, ms in leaves.items()
                 if leaf.startswith(BASE_GEMM_FUNCTIONS)]
        return f"{max(found):.2f}" if found else "-"

    lines = ["| | " + " | ".join(labels[k] for k in systems) + " |", "|---" * (len(systems) + 1) + "|",
             "| client latency over the floor's, median a round (p25 to p75) | "
             + " | ".join(cost(k) for k in systems) + " |",
             "| server forward, median | " + " | ".join(f"{latency[k]['server_forward_ms']['median']:.1f}"
                                                      for k in systems) + " |",
             "| scheduler host time (event loop) | " + " | ".join(f"{host[k]['event_loop_ms']:.1f}"
                                                                 for k in systems) + " |"]
    for module, label in (("qkv", "q/k/v"), ("o", "o")):
        lines.append(f"| {label} module call (its base GEMM's line) | " + " | ".join(
            f"{host[k]['module_calls'][module]['ms']:.2f} ({base_gemm(k, module)})" for k in systems) + " |")
    lines.append("| gate/up, down module calls (no LoRA) | " + " | ".join(
        f"{host[k]['module_calls']['gate_up']['ms']:.2f}, {host[k]['module_calls']['down']['ms']:.2f}"
        for k in systems) + " |")
    rounds = latency["nolora"]["count"]
    return "\n".join(lines) + (f"\n\nMilliseconds a request over {rounds} rounds. Host time: py-spy samples (500 a "
                               "second) of each scheduler's main thread in its event loop while on the CPU "
                               "(`bench/host_samples.py --modules`); a module call is the time inside its linear's "
                               "call, its base GEMM's line the part of it spent in the line that runs the base GEMM "
                               "(ATMM's over the weight extended by the adapters' A rows).")


@block("perf-forward-times", "e2e_forward_times_h200.json")
def perf_forward_times(doc: dict[str, Any]) -> str:
    """Forwards under the e2e prefill load (``bench/forward_times.py``): per repeat the median
    forward of a request that ran alone, and its excess over the floor's on the same trace."""
    lines = ["| call | repeat | no LoRA ms | atmm ms (over the floor) | csgmv ms (over the floor) |",
             "|---|---|---|---|---|"]
    for call in doc["calls"]:
        flags = " ".join(f for f in call["extra_server_args"] if f != "--enable-request-time-stats-logging")
        servers = call["servers"]
        for floor in servers["nolora"]:
            base = floor["isolated_forward_ms"].get("median")
            cells = []
            for key in ("unmerge_only", "csgmv"):
                own = next(r for r in servers[key] if r["repeat"] == floor["repeat"])["isolated_forward_ms"]
                median = own.get("median")  # absent with fewer than two lone forwards
                cells.append("-" if median is None or base is None else f"{median:.1f} ({median - base:+.1f})")
            lines.append(f"| {call['results']}{' (' + flags + ')' if flags else ''} | {floor['repeat']} | "
                         f"{'-' if base is None else f'{base:.1f}'} | {' | '.join(cells)} |")
    return "\n".join(lines) + ("\n\nMedian `forward_duration` of the requests that ran alone (their batch held "
                               "only them, nothing ran before or after within 2 ms), 81-169 per server and repeat.")


@block("perf-consistency", "layer_cost_h200.json")
def perf_consistency(check: dict[str, Any]) -> str:
    lines = ["| scenario | tokens | table prediction us | LoRA kernels us | GPU busy LoRA adds us | adds / prediction |",
             "|---|---|---|---|---|---|"]
    for r in check["rows"]:
        lines.append(f"| {r['scenario']} | {r['tokens']} | {r['predicted_us']:.0f} | {r['lora_kernels_us']:.0f} | "
                     f"{r['lora_cost_us']:.0f} | {r['cost_over_prediction']:.2f} |")
    verdict = "within" if check["all_within"] else "not within"
    lines.append(f"\nThe in-server LoRA time is {verdict} {check['agree_factor']}x of the prediction in every scenario.")
    return "\n".join(lines)


@block("perf-e2e-lora-cost", "e2e_h200.json")
def perf_e2e_lora_cost(merged: dict[str, Any]) -> str:
    """LoRA cost over the no-LoRA floor per workload, ATMM alone (`unmerge-only`) against
    SGLang's backends, from the merged end-to-end runs."""
    from bench.e2e import report as e2e_report

    agg = e2e_report.aggregate(merged["runs"])
    lines = ["| workload | csgmv | triton | atmm (`unmerge-only`) | atmm / csgmv | atmm / triton |",
             "|---|---|---|---|---|---|"]
    for point, systems in agg.items():
        label = next(p["label"] for run in merged["runs"] for pid, p in run["points"].items() if pid == point)
        cells = [e2e_report._cell((systems.get(s) or {}).get("lora_cost"), 1) for s in ("csgmv", "triton",
                                                                                       "unmerge_only")]
        ratios = [e2e_report.ratio_cell(e2e_report.paired_lora_costs(merged["runs"], point, "unmerge_only", peer))
                  for peer in ("csgmv", "triton")]
        lines.append(f"| {label} | {' | '.join(cells)} | {' | '.join(ratios)} |")
    return "\n".join(lines) + (
        "\n\nLoRA cost: mean E2E ms minus the no-LoRA server's in the same call, mean (min-max, repeats). "
        "atmm / csgmv, atmm / triton: of the sums over the rounds that ran both and the floor, with a 95% bootstrap "
        "interval over those rounds, drawing whole request traces (where there is none, how many rounds).")


def _adds_ms(profile: dict[str, Any], system: str, scenarios: tuple[str, ...]) -> list[float]:
    """Milliseconds of GPU busy time ``system`` adds over the no-LoRA server, per scenario."""
    systems = profile["systems"]
    return [(systems[system][s]["busy_us_per_step"] - systems["nolora"][s]["busy_us_per_step"]) / 1e3 for s in scenarios]


def _ms_span(values: list[float]) -> str:
    low, high = min(values), max(values)
    return f"{low:.2f}" if f"{low:.2f}" == f"{high:.2f}" else f"{low:.2f}-{high:.2f}"


@block("server-lora-time", "profile_h200.json", "host_cost_h200.json")
def server_lora_time(profile: dict[str, Any], host: dict[str, Any]) -> str:
    """README: what ATMM adds inside the server (GPU per decode step and per prefill, against
    csgmv) and what one LoRA module call costs on the host."""
    decode = tuple(s for s in ("decode8", "decode32") if s in profile["systems"]["nolora"])
    prompt = profile["scenarios"]["prefill1"]["prompt"]
    atmm_decode, csgmv_decode = _adds_ms(profile, "atmm", decode), _adds_ms(profile, "csgmv", decode)
    atmm_prefill, csgmv_prefill = _adds_ms(profile, "atmm", ("prefill1",)), _adds_ms(profile, "csgmv", ("prefill1",))
    launches = {profile["systems"]["atmm"][s]["kernels_per_step_by_category"]["lora"] for s in decode}
    us = host["host_us"]
    return (
        f"ATMM adds {_ms_span(atmm_decode)} ms of GPU busy time per decode step of "
        f"{' and '.join(str(profile['scenarios'][s]['requests']) for s in decode)} requests "
        f"(csgmv {_ms_span(csgmv_decode)} ms) and {_ms_span(atmm_prefill)} ms per {prompt}-token prefill (csgmv "
        f"{_ms_span(csgmv_prefill)} ms), in {'/'.join(f'{n:.0f}' for n in sorted(launches))} LoRA kernel launches "
        f"a decode step. On the host, one LoRA module call (qkv of Qwen2-VL-7B, rank 64, {us['tokens']} tokens) "
        f"takes {us['qkv_module_call_us']:.0f} us with its batch's prepared launches (the same two kernels through "
        f"the unprepared launch path: {us['two_triton_launches_us']:.0f} us), and preparing a batch "
        f"{us['prepare_lora_batch_us']:.0f} us."
    )


def _spread(values: list[float], digits: int) -> str:
    return f"{statistics.median(values):.{digits}f} ({min(values):.{digits}f}-{max(values):.{digits}f})"


@block("perf-host-speed", "host_speed_h200.json", "base_linear_host_h200.json", "profile_host_speed_h200.json")
def perf_host_speed(speed: dict[str, Any], emulation: dict[str, Any], profile: dict[str, Any]) -> str:
    """Whether a module's LoRA work makes its base GEMM's host call slower, three ways: the
    host's own speed (``bench/host_speed.py``), 28 emulated layers without a server
    (``bench/base_linear_host.py``) and the servers' profiled prefill windows
    (``profile_server.py``'s ``linear_host_us`` of every window)."""
    drift = speed["drift"]
    lines = [f"Host: a fixed pure-Python loop on CPU {drift['cpu']}, alone for {len(drift['series_ms'])} samples: "
             f"median {drift['median_ms']:.1f} ms, 90th percentile {drift['p90_ms']:.1f}, maximum "
             f"{drift['max_ms']:.1f}; {100 * drift['slow_fraction']:.0f}% of the samples at least "
             f"{speed['slow_factor']}x the median."]
    for cpu, row in speed["pairs"].items():
        slowed = row["slowed_by"]
        named = ", ".join(f"{other} ({factor:.2f}x)" for other, factor in slowed.items()) or "none"
        lines.append(f"CPU {cpu} alone {row['ms']['alone']:.1f} ms; a busy loop on another CPU slowed it by "
                     f"at least {speed['slow_factor']}x on: {named}.")
    ways = emulation["ways"]
    lines += ["", "| emulated layers (no server) | q/k/v us | o us | gate/up us | down us | forward host ms |",
              "|---|---|---|---|---|---|"]
    for way, label in (("base", "no LoRA"), ("atmm", "ATMM's module call after q/k/v and o"),
                       ("torch_lora", "the same LoRA as two torch matmuls")):
        row = ways[way]
        calls = " | ".join(f"{row['linear_host_us'][m]:.1f}" for m in ("qkv", "o", "gate_up", "down"))
        lines.append(f"| {label} | {calls} | {row['forward_host_ms']:.2f} |")
    lines += ["", "| server, scenario | windows | forward window ms, median (min-max) | base linear host us, "
                  "q/k/v + o | gate/up + down | ratio, median (min-max) |", "|---|---|---|---|---|---|"]
    for system, label in (("nolora", "no LoRA"), ("atmm", "atmm"), ("csgmv", "csgmv")):
        for scenario, summary in profile["systems"][system].items():
            windows = summary["repeat_windows"]
            wrapped = [w["linear_host_us"]["qkv"]["median"] + w["linear_host_us"]["o"]["median"] for w in windows]
            plain = [w["linear_host_us"]["gate_up"]["median"] + w["linear_host_us"]["down"]["median"]
                     for w in windows]
            lines.append(f"| {label}, {scenario} | {len(windows)} | "
                         f"{_spread([w['window_us'] / 1e3 for w in windows], 1)} | {statistics.median(wrapped):.1f} | "
                         f"{statistics.median(plain):.1f} | {_spread([a / b for a, b in zip(wrapped, plain, strict=True)], 2)} |")
    return "\n".join(lines) + ("\n\nEmulated layers: median host time of each `F.linear` call over "
                               f"{emulation['rounds']} rounds, the three ways taking turns. Servers: medians over "
                               "the 28 layers of each profiled window (SGLang's torch profiler, whose per-op "
                               "overhead inflates every call alike); the ratio compares, window by window, the "
                               "base calls of the modules that carry LoRA (q/k/v, o) with those that do not.")


DECODE_TURNS = (("nolora_twin", "the floor's twin"), ("vlora", "ours, defaults"), ("unmerge_only", "ATMM (unmerge-only)"),
                ("csgmv", "csgmv"))


@block("perf-decode-turns", "decode_turns_batch4_0cc8a45_h200.json", "decode_turns_batch16_0cc8a45_h200.json")
def decode_turns(*runs: dict[str, Any]) -> str:
    """docs/perf.md and the README: decode steps alone, the systems taking turns
    (``bench/decode_turns.py``): TPOT over the floor's round by round, the cost against csgmv's
    (sums over the rounds), the modes ours ran and its hooks' host time a decision."""
    lines = ["| requests decoding | scenario | system | TPOT ms | over the floor, ms: median (min to max) | "
             "cost / csgmv's | modes run | hooks us a decision |", "|---|---|---|---|---|---|---|---|"]
    for run in runs:
        for scenario, by_system in run["scenarios"].items():
            floor = [r["tpot_ms"] for r in by_system["nolora"]]
            csgmv = sum(r["tpot_ms"] - f for r, f in zip(by_system["csgmv"], floor, strict=True))
            lines.append(f"| {run['batch']} | {scenario} | no LoRA | "
                         f"{run['summary'][scenario]['nolora']['tpot_ms']['median']:.2f} | - | - | - | - |")
            for key, label in DECODE_TURNS:
                entry, ex = run["summary"][scenario][key], run["tpot_over_floor_ms"][scenario][key]
                cost = sum(r["tpot_ms"] - f for r, f in zip(by_system[key], floor, strict=True))
                modes = ", ".join(f"{m} {n}" for m, n in (entry.get("iterations_by_mode") or {}).items()) or "-"
                hooks = entry.get("hook_us_per_decision")
                ratio = "-" if key == "csgmv" else f"{cost / csgmv:.2f}"
                hook_us = "-" if hooks is None else f"{hooks['median']:.0f}"
                lines.append(f"| {run['batch']} | {scenario} | {label} | {entry['tpot_ms']['median']:.2f} | "
                             f"{ex['median']:+.2f} ({ex['min']:+.2f} to {ex['max']:+.2f}) | "
                             f"{ratio} | {modes} | {hook_us} |")
    run = runs[0]
    pinned = (f"each on {run['pinning']['cpus_per_server']} CPUs of its own" if run.get("pinning")
              else "the servers not pinned to CPUs")
    return "\n".join(lines) + (
        f"\n\n{run['rounds']} rounds a run; each round every server answers the same fresh batch of text requests "
        f"({run['prompt_tokens']} prompt tokens, {run['output_tokens']} output tokens each, sent together), the servers "
        f"in a rotated order, {pinned}. top: every request on the top adapter; mix: one on a second "
        "adapter. TPOT: SGLang's decode stage over the tokens after the first, median over the round's requests.")
