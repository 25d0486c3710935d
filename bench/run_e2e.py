"""End-to-end serving benchmark (the method: docs/bench.md; the code: bench/e2e/).

    python bench/run_e2e.py calls                         # what each call runs, in priority order
    python bench/run_e2e.py run --call cpu-smoke          # the harness on the tiny CPU model
    python bench/run_e2e.py run --call mixed-skewed       # one GPU call (< 10 min): 3 servers, 6 measurements
    python bench/run_e2e.py report bench/results/e2e/*.json --readme README.md   # -> bench/results/e2e_h200.*
    python bench/run_e2e.py stamp                         # record the git revision before sending the tree
    python bench/run_e2e.py parallel-check 'CALL ...' ...  # bench/gpu_parallel.sh's check of its call lines
    python bench/run_e2e.py cpu-shares N                  # the host's CPUs split between N calls side by side
    python bench/run_e2e.py on-cpus 0,1,2 -- CMD ...      # run CMD on those CPUs only

``run`` writes ``<out>/<tag>.json`` after every measurement; ``report`` merges any number of
such files (repeats of a (system, point) across calls add up) into ``<out>.json``, writes
``<out>.md`` and ``<out>_e2e.png`` / ``<out>_lora_cost.png``, and with ``--readme`` puts the
headline table into the README's ``e2e-headline`` figures block (which ``python
bench/report.py`` re-renders from ``bench/results/e2e_h200.json``; see bench/figures_e2e.py).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench import provenance  # noqa: E402
from bench.e2e import cpu_pinning, plan, report, runner  # noqa: E402

DEFAULT_BUDGET_S = {"gpu": 520.0, "cpu": 1200.0}
DEFAULT_REPORT = REPO / "bench" / "results" / "e2e_h200"


def device_command(call: str) -> str:
    return f"bash bench/gpu_e2e.sh {call}"


def cmd_calls(_args: argparse.Namespace) -> dict[str, Any]:
    for name, call in plan.CALLS.items():
        order = plan.order(call, call.systems)
        points = {pid: plan.scaled(plan.points_of(call.scale)[pid], call.scale_requests) for pid in call.points}
        busy = sum(points[m.point].arrivals_s + runner.OVERHEAD_S[points[m.point].client] for m in order)
        priority = plan.FULL.index(name) + 1 if name in plan.FULL else "-"
        print(f"{name:15} priority {priority}: {call.scale}, servers {', '.join(call.systems)}; points "
              f"{', '.join(call.points)} x {call.repeats} = {len(order)} measurements, ~{busy:.0f} s of "
              f"measuring after start-up and warm-up. {call.why}"
              + (f" (server flags: {' '.join(call.server_args)})" if call.server_args else ""))
    print("\nOn the GPU machine (repo root, .sgc carried): " + device_command("<call>"))
    return {"calls": list(plan.CALLS)}


def cmd_run(args: argparse.Namespace) -> dict[str, Any]:
    try:
        call = plan.get_call(args.call, args.systems or (), args.points or (), args.repeats)
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None
    tag = args.tag or f"e2e_{call.name}"
    log_dir = args.log_dir or REPO / ".cache" / "bench" / "logs" / tag
    budget = args.budget_s if args.budget_s is not None else DEFAULT_BUDGET_S[call.scale]
    extra = plan.server_args(call, args.server_args)
    try:
        started = plan.startable(call.systems, provenance.gpu_info() is not None, args.force)
        pinning = (cpu_pinning.assign(cpu_pinning.ordered_cpus(), started, args.cpus_per_server)
                   if args.cpus_per_server else None)
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None
    return runner.run_call(call, args.argv, args.out, log_dir, tag, budget, args.seed, extra, args.force, pinning)


def call_traces(call: plan.Call, seed: int) -> set[tuple[str, int, int]]:
    """The request traces ``call`` run with ``--seed seed`` sends: (point, requests, client seed)
    per point and round (:func:`plan.trace_seed`)."""
    points = plan.points_of(call.scale)
    return {(pid, plan.scaled(points[pid], call.scale_requests).requests, plan.trace_seed(seed, r))
            for pid in call.points for r in range(call.repeats)}


def cmd_parallel_check(args: argparse.Namespace) -> dict[str, Any]:
    """Refuse, before anything starts, call lines of bench/gpu_parallel.sh that ``run`` would
    refuse, a text call beside a vision call (unless ``--allow-mixed``): see plan.host_load, and a
    call that pins its servers (``--cpus-per-server``) to more CPUs than its share of the host
    (:func:`cpu_pinning.shares`: with several lines each call runs on its share) leaves it,
    at least one for the client.
    Warn where two lines would send the same request traces (seeds within their rounds of each
    other): such rounds are not independent draws, and the report's interval draws them together."""
    loads, traces, pinned = {}, {}, []
    for line in args.lines:
        words = line.split()
        if not words or words[0] in ("test-gpu", "test-gpu-server"):
            continue
        run = parse_args(["run", "--call", *words])
        try:
            call = plan.get_call(run.call, run.systems or (), run.points or (), run.repeats)
        except ValueError as e:
            raise SystemExit(f"error: {line!r}: {e}") from None
        loads[line] = plan.host_load(call)
        traces[line] = call_traces(call, run.seed)
        if run.cpus_per_server:
            pinned.append((line, run.cpus_per_server * len(call.systems) + 1))
    calls = sum(bool(line.split()) for line in args.lines)
    if pinned and calls > 1:
        try:
            share = len(cpu_pinning.shares(cpu_pinning.ordered_cpus(), calls)[0])
        except ValueError as e:
            raise SystemExit(f"error: {e}") from None
        for line, needed in pinned:
            if needed > share:
                raise SystemExit(f"error: {line!r} pins its servers (--cpus-per-server) to {needed - 1} CPUs and "
                                 f"needs one more for the client, but beside {calls - 1} other line(s) its share "
                                 f"of the host is {share} CPUs: lower --cpus-per-server or run fewer calls")
    shared = {}
    lines = list(traces)
    for i, a in enumerate(lines):
        for b in lines[i + 1:]:
            seeds = sorted({seed for _, _, seed in traces[a] & traces[b]})
            if seeds:
                shared[f"{a!r} and {b!r}"] = seeds
                print(f"warning: {a!r} and {b!r} send the same requests in the rounds of client seeds {seeds}: "
                      "give calls meant as independent seeds at least --repeats apart (docs/bench.md)", file=sys.stderr)
    if len(set(loads.values())) > 1 and not args.allow_mixed:
        named = "; ".join(f"{line!r}: {load}" for line, load in loads.items())
        raise SystemExit(f"error: text and vision calls side by side ({named}). The vision call's image work "
                         "on the shared CPUs moves the text call's host-bound prefills (docs/bench.md, \"What the "
                         "harness resolves\"): run them on separate machines, or pass --allow-mixed "
                         "(gpu_parallel.sh: E2E_ALLOW_MIXED=1)")
    return {"host_loads": loads, "shared_traces": shared}


def cmd_cpu_shares(args: argparse.Namespace) -> dict[str, Any]:
    """Print the CPUs of each of ``args.calls`` calls side by side, one comma-separated line a
    call (bench/gpu_parallel.sh runs call i on line i's)."""
    try:
        blocks = cpu_pinning.shares(cpu_pinning.ordered_cpus(), args.calls)
    except ValueError as e:
        raise SystemExit(f"error: {e}") from None
    for block in blocks:
        print(",".join(map(str, block)))
    return {"shares": blocks}


def cmd_on_cpus(args: argparse.Namespace) -> dict[str, Any]:
    """Replace this process by ``args.command`` restricted to the CPUs ``args.cpus`` (its
    children inherit them): bench/gpu_parallel.sh's way of keeping a call to its share, with
    no other tool needed on the machine."""
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        raise SystemExit("error: on-cpus: no command after --")
    try:
        cpus = {int(c) for c in args.cpus.split(",")}
        os.sched_setaffinity(0, cpus)
    except (ValueError, OSError) as e:
        raise SystemExit(f"error: on-cpus {args.cpus!r}: {e}") from None
    try:
        os.execvp(command[0], command)
    except OSError as e:
        raise SystemExit(f"error: on-cpus: cannot run {command[0]!r}: {e}") from None


def cmd_prepare(args: argparse.Namespace) -> dict[str, Any]:
    """Build a scale's model and adapters once, so that calls started side by side
    (bench/gpu_parallel.sh) find them built instead of writing the same files at once."""
    from bench.e2e import servers

    model, adapters, _info = servers.prepare_assets(plan.setup_of(args.scale), servers.REPO / ".cache" / "bench")
    print(f"[e2e] {args.scale}: model {_rel(model)}, {len(adapters)} adapters")
    return {"model": str(model), "adapters": {k: str(v) for k, v in adapters.items()}}


def cmd_report(args: argparse.Namespace) -> dict[str, Any]:
    out: Path = args.out
    if args.readme is not None and args.readme.resolve() == REPO / "README.md" and out.resolve() != DEFAULT_REPORT:
        raise SystemExit(f"error: --readme README.md needs --out {DEFAULT_REPORT.relative_to(REPO)} (the file its "
                         "figures block reads)")
    if out.with_suffix(".json").resolve() in {Path(r).resolve() for r in args.results}:
        raise SystemExit(f"error: --out {out} would overwrite its input {out.with_suffix('.json')}: choose another")
    try:
        runs = report.load(args.results)
    except (OSError, ValueError) as e:  # a missing or malformed file, or files that do not pool
        raise SystemExit(f"error: {e}") from None
    selection = None
    if args.package_as is not None:
        if args.readme is not None:
            raise SystemExit("error: --package-as writes a file of its own; its README block "
                             "(e2e-current-<device>) is rendered by `python bench/report.py`, not --readme")
        try:
            runs, selection = report.same_package(runs, args.package_as)
        except ValueError as e:
            raise SystemExit(f"error: {e}") from None
        if not runs:
            raise SystemExit(f"error: none of the {selection['of']} calls given ran the plugin as it is "
                             f"at {' or '.join(args.package_as)} ({report.selected_revisions(selection)})")
        print(f"[e2e] {selection['calls']} of {selection['of']} calls ran the plugin as at {report.selected_revisions(selection)}")
    out.parent.mkdir(parents=True, exist_ok=True)
    sources = list(dict.fromkeys(_rel(Path(r["_file"])) for r in runs))  # a merged file gives several runs
    combined = report.merged(runs, sources, selection)
    runner.write_json(out.with_suffix(".json"), combined)
    md = out.with_suffix(".md")
    md.write_text(report.markdown(runs))
    files = [out.with_suffix(".json"), md, *report.plots(runs, out)]
    if args.readme is not None:
        from bench import figures_e2e

        text = args.readme.read_text()
        args.readme.write_text(report.put_headline(text, figures_e2e.block_text(combined, out.name + ".json")))
        files.append(args.readme)
    print("[e2e] wrote " + ", ".join(map(str, files)))
    return {"files": [str(f) for f in files], "aggregate": report.aggregate(runs)}


def _rel(path: Path) -> str:
    try:
        return str(Path(path).resolve().relative_to(REPO))
    except ValueError:
        return Path(path).name


def cmd_stamp(_args: argparse.Namespace) -> dict[str, Any]:
    state = provenance.write_stamp()
    print(f"[e2e] {provenance.STAMP.relative_to(REPO)}: {provenance.revision_label(state)}"
          + (f" (changed: {', '.join(state['dirty_paths'])})" if state["dirty"] else ""))
    return state


def parse_args(argv: Sequence[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    sub.add_parser("calls", help="list the calls").set_defaults(func=cmd_calls)
    sub.add_parser("stamp", help="write .cache/bench/git_stamp.json").set_defaults(func=cmd_stamp)
    pc = sub.add_parser("parallel-check", help="check bench/gpu_parallel.sh's call lines before anything starts")
    pc.add_argument("lines", nargs="+", help="call lines, each 'CALL [run flags]' (test-gpu and test-gpu-server lines are skipped)")
    pc.add_argument("--allow-mixed", action="store_true", help="allow text and vision calls side by side")
    pc.set_defaults(func=cmd_parallel_check)
    cs = sub.add_parser("cpu-shares", help="the host's CPUs split between calls side by side, a line each")
    cs.add_argument("calls", type=int)
    cs.set_defaults(func=cmd_cpu_shares)
    oc = sub.add_parser("on-cpus", help="run a command on the given CPUs only")
    oc.add_argument("cpus", help="comma-separated CPU numbers")
    oc.add_argument("command", nargs=argparse.REMAINDER, help="-- CMD [ARGS...]")
    oc.set_defaults(func=cmd_on_cpus)
    pr = sub.add_parser("prepare", help="build a scale's model and adapters once (before parallel calls)")
    pr.add_argument("--scale", choices=("gpu", "cpu"), default="gpu")
    pr.set_defaults(func=cmd_prepare)
    r = sub.add_parser("run", help="run one call")
    r.add_argument("--call", required=True, help=f"one of {', '.join(plan.CALLS)}")
    r.add_argument("--systems", nargs="+", help="override the call's systems")
    r.add_argument("--points", nargs="+", help="override the call's points")
    r.add_argument("--repeats", type=int, help="override the call's repeats")
    r.add_argument("--budget-s", type=float, help="wall-clock budget; measurements that do not fit are skipped "
                   f"(default {DEFAULT_BUDGET_S})")
    r.add_argument("--out", type=Path, default=REPO / "bench" / "results" / "e2e")
    r.add_argument("--tag", help="results file stem (default e2e_<call>)")
    r.add_argument("--log-dir", type=Path, help="server logs (default .cache/bench/logs/<tag>)")
    r.add_argument("--seed", type=int, default=0)
    r.add_argument("--force", action="store_true", help="also start systems that need a GPU on a CPU machine")
    r.add_argument("--cpus-per-server", type=int, default=0, metavar="N",
                   help="pin each server to N CPUs of its own and the clients to the rest (default 0: the "
                        "kernel places them); with calls side by side, start each under its own taskset -c")
    r.add_argument("--server-args", nargs=argparse.REMAINDER, default=[],
                   help="extra sglang.launch_server flags for every server (must come last)")
    r.set_defaults(func=cmd_run)
    m = sub.add_parser("report", help="merge results files into markdown, plots, README table")
    m.add_argument("results", nargs="+", type=Path)
    m.add_argument("--out", type=Path, default=DEFAULT_REPORT,
                   help="output stem: <out>.json (merged), <out>.md, <out>_e2e.png, <out>_lora_cost.png")
    m.add_argument("--readme", type=Path, help="put the headline table into this file's e2e-headline block")
    m.add_argument("--package-as", metavar="REV", nargs="+",
                   help="keep only the calls that ran the plugin (sglang_vlora/, cuda/, pyproject.toml) as it "
                        "is at git revision REV, e.g. HEAD, or at any of several REVs")
    m.set_defaults(func=cmd_report)
    args = p.parse_args(argv)
    args.argv = list(argv)
    return args


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    args = parse_args(list(sys.argv[1:] if argv is None else argv))
    return args.func(args)


if __name__ == "__main__":
    main()
