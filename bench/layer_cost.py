"""In-server LoRA time next to the kernel benchmark's prediction for the same shapes.

    python bench/layer_cost.py --profile bench/results/profile_h200.json \\
        --table sglang_vlora/atmm/tables/NVIDIA_H200.json [--out bench/results --tag layer_cost_h200]

In-server (from ``bench/profile_server.py``'s summary of SGLang's profiler traces, one
window per scenario): the GPU time of the LoRA kernels per forward (prefill) or per decode
step, and the GPU time the LoRA adds: the growth of the GPU's busy time (the union of all
kernels) over the no-LoRA server of the same run; less than the kernels' own time where
they overlap the base GEMMs. Wall-clock spans are not used: one prefill forward's span
is set by the host (its launches) and varied by +-40 ms between identical runs. Prediction: the tuning table's
isolated timing (CUDA-graph replays of one launch, the chosen implementation) of each
kernel the model runs, summed over Qwen2-VL-7B's 28 layers x (qkv shrink + expand, o
shrink + expand). Prints a table, writes JSON and a PNG.

    python bench/layer_cost.py --host-only [--slots 8] [--tokens 1024 2048 4096] [--rounds 7] \\
        [--policy unmerge-only] [--out bench/results --tag host_cost_h200]

times only the host side of the eager path (GPU), ``host_cost`` below, and one eager module
call four ways (``eager_module_paths``: ``--slots`` pool slots appended, at each of ``--tokens``),
and writes them with the run's provenance.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from sglang_vlora.atmm import tiling  # noqa: E402
from sglang_vlora.config import POLICIES  # noqa: E402

LAYERS = 28
HIDDEN, KV = 3584, 512
RANK = 64
# (shrink key (k, n), expand key (n, s)) of the two LoRA modules of a Qwen2-VL-7B layer
MODULES = {
    "qkv": ((HIDDEN, 3 * RANK), (HIDDEN + 2 * KV, 3)),
    "o": ((HIDDEN, RANK), (HIDDEN, 1)),
}
AGREE = 1.3  # in-server LoRA time (GPU busy time it adds) within this factor of the prediction


def entry_us(entries: list[dict], op: str, key: dict[str, int]) -> float:
    """The nearest entry's time of the implementation the table picks."""
    entry = tiling.nearest_entry(entries, op, key)
    if entry is None:
        raise SystemExit(f"the table has no {op} entry near {key}")
    impl = entry.get("impl", "triton")
    if impl == "cuda":
        return entry["cuda"]["us"]
    if impl == "cublas":
        return entry["cublas"]["us"]
    return entry["us"]


def predicted_us(table: dict, tokens: int) -> float:
    total = 0.0
    for (k, n), (n_out, s) in MODULES.values():
        total += entry_us(table["shrink"], "shrink", {"k": k, "n": n, "m": tokens})
        total += entry_us(table["expand"], "expand", {"n": n_out, "s": s, "r": RANK, "m": tokens})
    return LAYERS * total


def rows(profile: dict, table: dict, system: str) -> list[dict]:
    out = []
    floor = profile["systems"]["nolora"]
    for scenario, s in profile["systems"][system].items():
        n, prompt, _, _ = (profile["scenarios"][scenario][f] for f in ("requests", "prompt", "output", "adapters"))
        decode = scenario.startswith("decode")
        tokens = n if decode else n * prompt
        lora_us = s["gpu_us_per_step"].get("lora", 0.0)
        cost = s["busy_us_per_step"] - floor[scenario]["busy_us_per_step"]
        pred = predicted_us(table, tokens)
        out.append({
            "system": system, "scenario": scenario, "tokens": tokens, "per": "decode step" if decode else "forward",
            "lora_kernels_us": round(lora_us, 1), "lora_cost_us": round(cost, 1), "predicted_us": round(pred, 1),
            "kernels_over_prediction": round(lora_us / pred, 3), "cost_over_prediction": round(cost / pred, 3),
            "lora_kernels_us_per_token": round(lora_us / tokens, 4) if not decode else None,
        })
    return out


def host_cost(tokens: int = 1024, calls: int = 200, rounds: int = 7) -> dict:
    """Host microseconds per eager LoRA module call of the ``atmm`` backend (qkv of
    Qwen2-VL-7B, one rank-64 adapter, ``tokens`` tokens), the GPU kept busy so that no
    call waits for it; and, for comparison, of the two bare kernel launches it makes, each
    way: prepared launches straight through the driver (``driver_launch``, the default),
    prepared launches through Triton's compiled handle, and the unprepared launch path.
    Every figure is the median over ``rounds`` rounds in which the ways take turns (the
    host's speed drifts, docs/perf.md)."""
    import ctypes
    import statistics
    from types import SimpleNamespace

    import torch
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    from bench.gemm_lora_shapes import time_calls
    from sglang_vlora.atmm import ops, triton_kernels
    from sglang_vlora.backend import ATMMLoRABackend

    dev = torch.device("cuda")
    widths = (HIDDEN, KV, KV)
    slice_offsets = [0, HIDDEN, HIDDEN + KV, HIDDEN + 2 * KV]
    offsets = torch.tensor(slice_offsets, dtype=torch.int32)
    a = torch.randn(2, 3 * RANK, HIDDEN, device=dev, dtype=torch.bfloat16) * 0.01
    b = torch.randn(2, sum(widths), RANK, device=dev, dtype=torch.bfloat16) * 0.01
    x = torch.randn(tokens, HIDDEN, device=dev, dtype=torch.bfloat16)
    out = torch.zeros(tokens, sum(widths), device=dev, dtype=torch.bfloat16)
    backend = ATMMLoRABackend(max_loras_per_batch=2, device=dev)
    batch = SimpleNamespace(forward_mode=ForwardMode.EXTEND, batch_size=1,
                            extend_seq_lens=torch.tensor([tokens], dtype=torch.int32), extend_seq_lens_cpu=[tokens])
    launchers = (triton_kernels._SHRINK, triton_kernels._EXPAND)

    def prepare() -> None:
        backend.prepare_lora_batch(batch, [1], [0, RANK], [0.0, 2.0], use_cuda_graph=False)

    def per_call(fn) -> float:
        for _ in range(5):
            fn()
        torch.cuda.synchronize()
        return time_calls(fn, calls)[1]  # host us, GPU work queued ahead: no call waits for it

    def module_call() -> None:
        backend.run_qkv_lora(x, a, b, output_offset_cpu=offsets, base_output=out)

    prepare()
    items = backend.work_items
    inter = torch.empty(tokens, a.shape[1], device=dev, dtype=x.dtype)
    dev_name = ops._device_name(x)
    scfg = tiling.choose(dev_name, "shrink", "triton", (HIDDEN, 3 * RANK, tokens))[1]
    ecfg = tiling.choose(dev_name, "expand", "triton", (sum(widths), 3, RANK, tokens))[1]

    def launches() -> None:
        triton_kernels.launch_shrink(x, a, inter, items.seg_starts, items.seg_lens, items.slots, items.row_starts,
                                     items.ranks, None, 3, tokens, scfg)
        triton_kernels.launch_expand(inter, b, out, items.seg_starts, items.seg_lens, items.slots, items.scales,
                                     items.row_starts, items.layers, 1, items.ranks, None, slice_offsets, tokens, ecfg)

    def prepared_launches(direct: bool):  # what an eager batch's launch plans run for the 2nd-28th layer
        for launcher in launchers:
            launcher.use_direct(direct)
        shrink = triton_kernels.prepare_shrink(x, a, inter, items.seg_starts, items.seg_lens, items.slots,
                                               items.row_starts, items.ranks, None, 3, tokens, scfg)
        expand = triton_kernels.prepare_expand(inter, b, out, items.seg_starts, items.seg_lens, items.slots,
                                               items.scales, items.row_starts, items.layers, 1, items.ranks, None,
                                               slice_offsets, tokens, ecfg)

        def run() -> None:
            shrink(x, a, inter)
            for launch in expand:
                launch(inter, b, out, out)

        run()  # the first launch picks the way
        return run

    ways = {"direct": prepared_launches(True)}
    direct_kernels = sum(launcher.direct_count() for launcher in launchers)  # before the next way clears them
    ways["triton_handle"] = prepared_launches(False)
    context = ctypes.c_void_p()
    get_context = ctypes.CDLL("libcuda.so.1").cuCtxGetCurrent  # the cheapest driver call, for scale
    samples: dict[str, list[float]] = {}
    for _ in range(rounds):
        for direct, name in ((True, "qkv_module_call_us"), (False, "qkv_module_call_triton_handle_us")):
            for launcher in launchers:
                launcher.use_direct(direct)
            backend._eager_plans.clear()
            prepare()  # a new batch: its launch plans, built anew, take the way just set
            samples.setdefault(name, []).append(per_call(module_call))
        for launcher in launchers:
            launcher.use_direct(True)
        timed = {"prepare_lora_batch_us": prepare, "two_direct_launches_us": ways["direct"],
                 "two_prepared_launches_triton_handle_us": ways["triton_handle"], "two_triton_launches_us": launches,
                 "intermediate_alloc_us": lambda: torch.empty_like(inter),
                 "one_trivial_driver_call_us": lambda: get_context(ctypes.byref(context))}
        for name, fn in timed.items():
            samples.setdefault(name, []).append(per_call(fn))
    result = {"tokens": tokens, "rounds": rounds, "kernels_launched_direct": direct_kernels}
    for name, values in samples.items():
        result[name] = round(statistics.median(values), 1)
        result[name.removesuffix("_us") + "_range_us"] = [round(min(values), 1), round(max(values), 1)]
    return result


# The eager paths of eager_module_paths: name -> (config options, whether the backend keeps launch
# plans across batches, the batches_by_layout entries it counts)
EAGER_PATHS = {
    "on": ({"lora_gemm": "on", "lora_gemm_min_tokens": 1}, True, {"eager_lora_gemm"}),
    "in_gemm": ({"lora_gemm": "off"}, True, {"eager_in_gemm", "eager_kept"}),
    "off": ({"lora_gemm": "off", "eager_in_gemm_max_tokens": 0}, True, {"eager_kept"}),
    "off_per_batch": ({"lora_gemm": "off", "eager_in_gemm_max_tokens": 0}, False, set()),
}
COUNTED_LAYOUTS = ("eager_lora_gemm", "eager_in_gemm", "eager_kept")


def eager_module_paths(tokens_list: tuple[int, ...] = (1024, 2048, 4096), calls: int = 100,
                       slots: int = 8, rounds: int = 7, policy: str | None = None) -> list[dict]:
    """Per LoRA module of a Qwen2-VL-7B layer (qkv with bias, o without; one rank-64 adapter over
    the whole batch; a pool of ``slots`` slots, SGLang's default 8, appended to the base weight),
    host and GPU microseconds of one eager ``forward_with_base`` call of the ``atmm`` backend
    four ways: ``on``, ``--vlora-lora-gemm on`` (``ops.lora_apply_gemm``: the shrink, then
    ATMM's GEMM with the LoRA in its accumulator); ``in_gemm``, the shrink inside the base GEMM
    over every slot's appended rows, then one expand (``ops.lora_apply_static_in_gemm``, the default up
    to ``--vlora-eager-in-gemm-max-tokens``, here set to the batch's tokens); ``off``, SGLang's
    base GEMM (here ``F.linear``), then the shrink and expand by launch plans kept across batches
    (``ops.lora_apply_kept``, the default above that limit); ``off_per_batch``, the same by plans
    built for every batch (``ops.lora_apply``, what ran before plans were kept). Host: the GPU kept
    busy so that no call waits; GPU: CUDA events around ``calls`` calls back to back. The ways
    take turns over ``rounds`` rounds (the order rotated each round) and each figure is the
    median of its rounds, with the host's range: this host's speed drifts by more than the
    ways differ, so timing them one after another would compare different speeds. ``policy``:
    ``--vlora-policy`` of every way (None: the default); under ``unmerge-only`` no batch can hold
    overlapping items, so the static buffers and their kernels take one layer of items, no pairs."""
    import functools
    from types import SimpleNamespace

    import torch
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    from bench.gemm_lora_shapes import time_calls
    from sglang_vlora.backend import ATMMLoRABackend
    from sglang_vlora.config import VLoRAConfig
    from sglang_vlora.in_gemm_weights import ATTR, InGemmWeights
    from sglang_vlora.runtime import VLoRARuntime

    dev, dtype = torch.device("cuda"), torch.bfloat16
    g = torch.Generator(device=dev).manual_seed(0)
    modules = {"qkv": ((HIDDEN, HIDDEN + KV, HIDDEN + 2 * KV), True), "o": ((HIDDEN,), False)}
    result = []
    for name, (widths, has_bias) in modules.items():
        offsets = (0, *widths)
        n, s = widths[-1], len(widths)
        a = torch.randn(slots, s * RANK, HIDDEN, device=dev, dtype=dtype, generator=g) * HIDDEN**-0.5
        b = torch.randn(slots, n, RANK, device=dev, dtype=dtype, generator=g) * RANK**-0.5
        w = torch.randn(n, HIDDEN, device=dev, dtype=dtype, generator=g) * HIDDEN**-0.5
        bias = torch.randn(n, device=dev, dtype=dtype, generator=g) if has_bias else None
        stack = torch.cat([w, a.reshape(-1, HIDDEN)])
        stack_bias = None if bias is None else torch.cat([bias, bias.new_zeros(a.shape[0] * a.shape[1])])
        layer = SimpleNamespace(**{ATTR: InGemmWeights(weight=stack, bias=stack_bias, out_features=n)})
        pool_a = stack[n:].view(a.shape)
        base_w, base_b = stack[:n], None if stack_bias is None else stack_bias[:n]
        for tokens in tokens_list:
            x = torch.randn(tokens, HIDDEN, device=dev, dtype=dtype, generator=g)
            batch = SimpleNamespace(forward_mode=ForwardMode.EXTEND, batch_size=1,
                                    extend_seq_lens=torch.tensor([tokens], dtype=torch.int32),
                                    extend_seq_lens_cpu=[tokens])
            row = {"module": name, "tokens": tokens}
            ranks, scalings = [0] + [RANK] * (slots - 1), [0.0] + [2.0] * (slots - 1)
            calls_by_way, new_batch_by_way, new_bound_by_way = {}, {}, {}
            for setting, (options, kept_plans, layouts) in EAGER_PATHS.items():
                options = {"eager_in_gemm_max_tokens": tokens, **({"policy": policy} if policy else {}), **options}
                runtime = VLoRARuntime(VLoRAConfig(**options))
                backend = ATMMLoRABackend(max_loras_per_batch=slots, device=dev, runtime=runtime)
                backend.shrink_in_gemm = True
                backend.kept_plans = kept_plans
                backend.prepare_lora_batch(batch, [1], ranks, scalings, use_cuda_graph=False)
                call = functools.partial(backend.forward_with_base, layer, x,
                                         functools.partial(torch.nn.functional.linear, x, base_w, base_b),
                                         pool_a, b, None, offsets)
                for _ in range(5):
                    call()
                torch.cuda.synchronize()
                counts = backend.batches_by_layout
                if any(counts[k] != (k in layouts) for k in COUNTED_LAYOUTS):
                    raise RuntimeError(f"{name} {tokens}: eager path {setting} ran another path ({counts})")
                calls_by_way[setting] = call
                new_batch_by_way[setting] = functools.partial(
                    _new_batch, backend, batch, [1], ranks, scalings, call, False)
                new_bound_by_way[setting] = functools.partial(
                    _new_batch, backend, batch, [1], ranks, scalings, call, True)
            timed: dict[str, list[tuple[float, float]]] = {way: [] for way in calls_by_way}
            new_batch: dict[str, list[float]] = {way: [] for way in calls_by_way}
            new_bound: dict[str, list[float]] = {way: [] for way in calls_by_way}
            ways = list(calls_by_way)
            for r in range(rounds):
                for way in ways[r % len(ways):] + ways[:r % len(ways)]:
                    timed[way].append(time_calls(calls_by_way[way], calls))
                    new_batch[way].append(new_batch_by_way[way]())
                    new_bound[way].append(new_bound_by_way[way]())
            for way, samples in timed.items():
                gpu = statistics.median(g for g, _ in samples)
                hosts = [h for _, h in samples]
                row[way] = {"host_us": round(statistics.median(hosts), 1), "gpu_us": round(gpu, 1),
                            "host_us_range": [round(min(hosts), 1), round(max(hosts), 1)],
                            "new_batch_host_us": round(statistics.median(new_batch[way]), 1),
                            "new_bound_host_us": round(statistics.median(new_bound[way]), 1)}
            result.append(row)
    return result


def _new_batch(backend, batch, weight_indices, ranks, scalings, call, new_bound: bool,
               first_calls: int = 2) -> float:
    """Host us of preparing a new batch and its first ``first_calls`` module calls, less
    ``first_calls`` calls of the prepared batch: what a batch costs beyond its steady calls.
    ``new_bound``: the kept launch plans cleared first, as for a batch whose token bound
    (``ops.kept_plan_tokens``) no earlier batch had (a way without kept plans builds its plans
    anew for every batch either way)."""
    import torch

    torch.cuda.synchronize()
    if new_bound:
        backend._eager_plans.clear()
    began = time.perf_counter()
    backend.prepare_lora_batch(batch, weight_indices, ranks, scalings, use_cuda_graph=False)
    for _ in range(first_calls):
        call()
    new = time.perf_counter() - began
    torch.cuda.synchronize()
    began = time.perf_counter()
    for _ in range(first_calls):
        call()
    steady = time.perf_counter() - began
    torch.cuda.synchronize()
    return (new - steady) * 1e6


def plot(result: list[dict], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    labels = [r["scenario"] for r in result]
    x = range(len(result))
    fig, ax = plt.subplots(figsize=(7, 3.5))
    width = 0.27
    ax.bar([i - width for i in x], [r["predicted_us"] for r in result], width, label="kernel table prediction")
    ax.bar(list(x), [r["lora_kernels_us"] for r in result], width, label="in-server LoRA kernels (GPU)")
    ax.bar([i + width for i in x], [r["lora_cost_us"] for r in result], width, label="GPU busy time LoRA adds")
    ax.set_xticks(list(x), labels)
    ax.set_yscale("log")
    ax.set_ylabel("us per forward / decode step")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


def write_host_cost(out: Path, tag: str, slots: int = 8, tokens: tuple[int, ...] = (1024, 2048, 4096),
                    rounds: int = 7, policy: str | None = None) -> None:
    """``host_cost()`` and ``eager_module_paths(tokens, slots=slots, rounds=rounds)`` as a
    results file of its own, with the run's provenance."""
    import provenance
    import torch

    from sglang_vlora.config import VLoRAConfig

    host = host_cost()
    print(f"host per eager call (us): {host}")
    paths = eager_module_paths(tokens, slots=slots, rounds=rounds, policy=policy)
    for r in paths:
        print(f"{r['module']:3} {r['tokens']:5d} tokens: " + " | ".join(
            f"{way} host {r[way]['host_us']:6.1f} us ({r[way]['host_us_range'][0]:.1f}-{r[way]['host_us_range'][1]:.1f}) "
            f"GPU {r[way]['gpu_us']:7.1f} us new batch +{r[way]['new_batch_host_us']:6.1f} us "
            f"(new bound +{r[way]['new_bound_host_us']:6.1f})" for way in EAGER_PATHS))
    doc = {
        "what": "host microseconds of the atmm backend's eager path (no profiler), GPU kept busy so no call waits, "
                "medians of rounds in which the ways take turns: one prepare_lora_batch of a 1024-token, "
                "one-adapter prefill; one qkv LoRA module call of Qwen2-VL-7B (rank 64) with its launches straight "
                "through the driver and through Triton's launcher; the two kernel launches that call makes, "
                "prepared (direct, and through Triton's compiled handle) and unprepared; one allocation of the "
                "call's intermediate; one trivial driver call (cuCtxGetCurrent) for scale; eager_module_paths: "
                "host and GPU microseconds of one eager forward_with_base of a qkv and an o module (slots: the "
                "pool slots appended) four ways: on (--vlora-lora-gemm on), in_gemm (the shrink inside the base GEMM, "
                "one expand), off (the base GEMM, then the shrink and the expand, launch plans kept across batches) "
                "and off_per_batch (the same, launch plans built for every batch), the ways taking turns "
                "over `rounds` rounds (medians; host_us_range: the host's spread over the rounds); new_batch_host_us: the "
                "host time a new batch adds beyond its steady calls (prepare_lora_batch and the first calls; kept "
                "plans reused), new_bound_host_us: the same with the kept plans cleared (a batch of a token bound "
                "not seen before), one sample of each a round",
        "device": torch.cuda.get_device_name(0),
        "host_us": host,
        "slots": slots,
        "rounds": rounds,
        "policy": policy or VLoRAConfig.policy,
        "eager_module_paths": paths,
    }
    path = provenance.write_results(out, tag, doc, "bench/layer_cost.py", sys.argv[1:])
    print(f"wrote {path}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--profile", type=Path)
    ap.add_argument("--table", type=Path)
    ap.add_argument("--system", default="atmm")
    ap.add_argument("--out", type=Path, default=REPO / "bench" / "results")
    ap.add_argument("--tag", default=None, help="results file name (default layer_cost_h200 / host_cost_h200)")
    ap.add_argument("--host", action="store_true", help="also time the host side of an eager call (GPU)")
    ap.add_argument("--host-only", action="store_true", help="time only the host side of an eager call (GPU)")
    ap.add_argument("--slots", type=int, default=8, help="--host-only: pool slots appended to the base weight")
    ap.add_argument("--tokens", type=int, nargs="+", default=[1024, 2048, 4096],
                    help="--host-only: the eager module call's token counts")
    ap.add_argument("--policy", default=None,
                    help="--host-only: --vlora-policy of the eager module call's ways (default: the plugin's)")
    ap.add_argument("--rounds", type=int, default=7,
                    help="--host-only: rounds in which the eager module call's ways take turns")
    args = ap.parse_args()
    if args.slots < 2 or min(args.tokens) < 1 or args.rounds < 1:
        ap.error("--slots must be at least 2 (one slot is the pool's empty one), --tokens and --rounds positive")
    if args.policy is not None and args.policy not in POLICIES:
        ap.error(f"--policy must be one of {POLICIES}, got {args.policy!r}")
    if args.host_only:
        write_host_cost(args.out, args.tag or "host_cost_h200", args.slots, tuple(args.tokens), args.rounds,
                        args.policy)
        return
    if args.profile is None or args.table is None:
        ap.error("--profile and --table are needed unless --host-only")
    args.tag = args.tag or "layer_cost_h200"
    profile = json.loads(args.profile.read_text())
    table = json.loads(args.table.read_text())
    result = rows(profile, table, args.system)
    print(f"{'scenario':9} {'tokens':>6} {'predicted':>10} {'kernels':>9} {'k/pred':>7} {'busy+':>9} {'b/pred':>7}")
    for r in result:
        print(f"{r['scenario']:9} {r['tokens']:6d} {r['predicted_us']:10.1f} {r['lora_kernels_us']:9.1f} "
              f"{r['kernels_over_prediction']:7.2f} {r['lora_cost_us']:9.1f} {r['cost_over_prediction']:7.2f}")
    agree = all(1 / AGREE <= r["cost_over_prediction"] <= AGREE for r in result)
    print(f"in-server LoRA time (GPU busy time it adds) within {AGREE}x of the prediction in every scenario: "
          f"{agree}")
    host = host_cost() if args.host else None
    if host:
        print(f"host per eager call (us): {host}")
    env = profile.get("environment", {})
    meta = {"device": profile.get("device"), "date": profile.get("date"), "code": env.get("code"),
            "versions": env.get("versions"), "profile_command": profile.get("command")}
    doc = {"meta": {**meta, "profile": args.profile.name, "table": args.table.name,
                    "written": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")},
           "agree_factor": AGREE, "all_within": agree, "rows": result, "host_us": host,
           "provenance": profile.get("provenance")}  # derived from the profile: its run's provenance
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.tag}.json").write_text(json.dumps(doc, indent=1) + "\n")
    plot(result, args.out / f"{args.tag}.png")


if __name__ == "__main__":
    main()
