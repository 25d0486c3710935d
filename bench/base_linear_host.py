"""Does the LoRA work of a module make its base GEMM's host call slower? (GPU)

    python bench/base_linear_host.py [--rounds 40] [--tokens 1024] [--out bench/results --tag base_linear_host_h200]

A sampling profile of the servers (docs/perf.md, "Host time, sampled") put 1.8 ms more host
time per 1024-token prefill in the base GEMM calls of LoRA batches than on the floor, and
twice the floor's host time in the base GEMM of a 16-token prefill's LoRA modules. This
benchmark asks the question without a server: 28 eager decoder layers of Qwen2-VL-7B's shapes
(norms and rotary as plain torch ops, q/k/v with bias, attention by SDPA, o, gate/up, down;
``--tokens`` tokens), the host call of each module's base GEMM (its first ``F.linear``) timed
with ``perf_counter_ns``, in these ways:

* ``base``: no LoRA;
* ``atmm``: after the q/k/v and o GEMMs, the ``atmm`` backend's eager module call
  (``forward_with_base``: the base output, then the LoRA by the kept launch plans), one
  rank-64 adapter;
* ``atmm_in_gemm``: the ``atmm`` backend's module call as the server runs eager batches of at
  most ``--vlora-eager-in-gemm-max-tokens`` tokens on q/k/v and o: one GEMM over the base
  weight extended by the pool's A rows (the timed call), then the expand;
* ``atmm_in_gemm_op``: the same, through ``ops.lora_apply_static_in_gemm`` with the plan's key
  built at every call (the backend's path before it kept each module's call,
  ``ops.KeptInGemmCall``);
* ``torch_lora``: the same LoRA as two torch matmuls (cuBLAS launches instead of Triton's);
* ``in_gemm_cublas_expand``: the in-GEMM way's GEMM over the extended weight (the timed call),
  then the expand as one cuBLAS GEMM over a block-diagonal B of the slot's slices, added to the
  base columns (``torch.addmm``): a layer whose LoRA launches nothing but cuBLAS, as a design to
  weigh against the in-GEMM call's Triton expand (docs/perf.md, "At 8bdaca1");
* ``in_gemm_cublas_slices``: the same without the block-diagonal B (which the pool would have to
  keep per slot and layer): one cuBLAS GEMM a slice, added in place to the GEMM output's base
  columns, which q/k/v returns as a view (its slices are split into views anyway); a module of
  one slice (o) runs as ``in_gemm_cublas_expand`` does, into a new contiguous output;
* ``atmm_small_gemm``: the ``atmm`` backend's module call as the server runs unmerged eager
  batches of at most ``--vlora-eager-small-gemm-max-tokens`` tokens on q/k/v and o: base GEMM,
  shrink and expand in one kernel (``ops.KeptSmallGemmCall``; no ``F.linear`` call to time);
* ``atmm_small_gemm_all`` (only with ``--mlp-lora``): the same with the adapter on gate/up and
  down too, so every module of the layer runs the one kernel and none calls cuBLAS. With
  ``--mlp-lora`` the gate/up and down weights are stacks like q/k/v's and o's, whatever the way,
  and the GPU time of a forward's gate/up and down calls is measured too, without LoRA and with
  this way's kernel (``gate_up_down_gpu_us``).

Besides the base GEMM's call, each module call's whole host time is timed, and the GPU time
of the q/k/v and o module calls of a forward, per way (one CUDA graph of the 28 layers' calls
replayed: no host time in it).

Every way's weights are those of the server with the shrink inside the GEMM: each q/k/v and o
base weight is the head of a stack whose other rows are the pool's A rows.

One forward of each way per round, the order rotated each round, so that a slow spell of the
host (``bench/host_speed.py``) hits every way alike. Prints a table, writes JSON.

``--sync-before MODULE ...`` waits for the GPU (``torch.cuda.synchronize()``, untimed in the
module's call, inside the forward's host time) before each call of those modules: a call that
is slower after one way's kernels only while the GPU still has work queued gets as fast as the
floor's with it, one slowed by the host's own state does not. It separates the two causes of
the gate/up call's extra host time after the one-kernel way (docs/perf.md).

``--ways WAY ...`` measures only those ways and ``base`` (the others take host time and GPU
memory, and one way that cannot run stops the run).

``--warm-before MODULE ...`` runs one ``F.linear`` of a single row over the module's base weight
before each call of those modules (outside the module call's time, inside the forward's): the host path of a
base GEMM call (torch's dispatch, cuBLAS) just run once, as the o projection's is before gate/up
in every way but the one kernel's. If gate/up's extra time after the one kernel goes with it,
that path was cold in the CPU's caches; if it stays, something else on the host is slow. The
warm call's own host time is timed too (``warm_host_us``): a cost that only moves there is the
first cuBLAS call's after other launches, whatever its shape. ``--warm-rows N`` makes the warm
call's weight the module weight's first ``N`` rows (a GEMM of a few microseconds on the GPU
instead of one that reads the whole weight), to see whether a cheap call warms the path as well.
``--warm-tiny`` makes it a 16 x 16 ``F.linear`` over tensors of its own, nothing of the module's:
if that call takes the extra time and the module's call after it runs as fast as the floor's, the
time is the first cuBLAS call's after other launches, whatever it computes.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path
from types import SimpleNamespace

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

HIDDEN, KV, INTER, LAYERS, RANK, SLOTS = 3584, 512, 18944, 28, 64, 2
HEADS, KV_HEADS, HEAD_DIM = 28, 4, 128
WAYS = ("base", "atmm", "atmm_in_gemm", "atmm_in_gemm_op", "torch_lora", "in_gemm_cublas_expand",
        "in_gemm_cublas_slices", "atmm_small_gemm")
LORA_MODULES = ("qkv", "o")
MODULES = ("qkv", "o", "gate_up", "down")
ALL_MODULES_WAY = "atmm_small_gemm_all"


CUBLAS_EXPAND_WAYS = ("in_gemm_cublas_expand", "in_gemm_cublas_slices")
GPU_TIMED_WAYS = ("base", "atmm_in_gemm", *CUBLAS_EXPAND_WAYS, "atmm_small_gemm")


def ways_of(mlp_lora: bool, only: tuple[str, ...] = ()) -> tuple[str, ...]:
    """The ways a run measures: :data:`WAYS`, and with ``mlp_lora`` the one kernel on every module;
    with ``only``, those of them it names and ``base`` (the floor every way is read against)."""
    ways = WAYS + ((ALL_MODULES_WAY,) if mlp_lora else ())
    return tuple(w for w in ways if not only or w == "base" or w in only)


def lora_modules_of(way: str) -> tuple[str, ...]:
    """The modules whose calls carry the adapter in ``way``."""
    return MODULES if way == ALL_MODULES_WAY else LORA_MODULES


def block_diagonal_b(b_slot, offsets: tuple[int, ...], rank: int):
    """One slot's B (``[out_features, max_rank]``, slices at ``offsets``) as a ``[slices * rank,
    out_features]`` matrix whose rows ``s * rank`` to ``(s + 1) * rank`` hold slice ``s``'s B
    (transposed) in its columns and zeros elsewhere: the expand of every slice as one GEMM."""
    import torch

    slices = len(offsets) - 1
    out = torch.zeros(slices * rank, offsets[-1], dtype=b_slot.dtype, device=b_slot.device)
    for s in range(slices):
        lo, hi = offsets[s], offsets[s + 1]
        out[s * rank : (s + 1) * rank, lo:hi] = b_slot[lo:hi, :rank].t()
    return out


def cublas_expand(y, out_features: int, slot: int, width: int, b_block, scale: float):
    """The in-GEMM output ``y`` (base columns, then ``width`` intermediate columns per slot) to
    the module's output: its base columns plus ``scale`` times the slot's intermediate columns
    times ``b_block`` (:func:`block_diagonal_b`), one cuBLAS call into a new contiguous tensor."""
    import torch

    lo = out_features + slot * width
    return torch.addmm(y[:, :out_features], y[:, lo : lo + width], b_block, alpha=scale)


def cublas_expand_slices(y, out_features: int, slot: int, offsets: tuple[int, ...], rank: int, b_slot,
                         scale: float):
    """:func:`cublas_expand` without a block-diagonal B: one slice's expand per cuBLAS call, from
    the slot's B (``[out_features, max_rank]``) as it is. Several slices are added in place to
    ``y``'s base columns, which come back as a view of ``y``; one slice goes into a new contiguous
    output (``torch.addmm``), as a module whose output is not split must return."""
    import torch

    slices = len(offsets) - 1
    lo = out_features + slot * slices * rank
    if slices == 1:
        return torch.addmm(y[:, :out_features], y[:, lo : lo + rank], b_slot[:, :rank].t(), alpha=scale)
    for s in range(slices):
        y[:, offsets[s] : offsets[s + 1]].addmm_(y[:, lo + s * rank : lo + (s + 1) * rank],
                                                 b_slot[offsets[s] : offsets[s + 1], :rank].t(), alpha=scale)
    return y[:, :out_features]


class TimedLinear:
    """``torch.nn.functional.linear`` that times the next call after :attr:`module` is set (the
    module's base GEMM) and no other: every way's base GEMM is timed by the same code, the
    in-GEMM way's inside ``ops``."""

    def __init__(self, linear) -> None:
        self.linear = linear
        self.module: str | None = None
        self.times: dict[str, list[float]] = {m: [] for m in MODULES}

    def __call__(self, x, weight, bias=None):
        module, self.module = self.module, None
        if module is None:
            return self.linear(x, weight, bias)
        began = time.perf_counter_ns()
        out = self.linear(x, weight, bias)
        self.times[module].append((time.perf_counter_ns() - began) / 1e3)
        return out


class Emulation:
    """Random bf16 weights of ``LAYERS`` layers on the GPU and one prepared ``atmm`` batch."""

    def __init__(self, tokens: int, sync_before: tuple[str, ...] = (), warm_before: tuple[str, ...] = (),
                 warm_rows: int | None = None, warm_tiny: bool = False, mlp_lora: bool = False) -> None:
        import torch
        from sglang.srt.model_executor.forward_batch_info import ForwardMode

        from sglang_vlora import in_gemm_weights
        from sglang_vlora.backend import ATMMLoRABackend

        self.torch = torch
        self.tokens = tokens
        dev, dtype = torch.device("cuda"), torch.bfloat16
        g = torch.Generator(device=dev).manual_seed(0)

        def rand(*shape):
            return torch.randn(*shape, device=dev, dtype=dtype, generator=g) * 0.02

        def stacked(layer: dict, module: str, out: int, slices: int, bias, inputs: int = HIDDEN) -> None:
            """The base weight and the pool's A rows as one stack, as the server lays them out."""
            stack = rand(out + SLOTS * slices * RANK, inputs)
            layer[module], layer[f"{module}_a"] = stack[:out], stack[out:].view(SLOTS, slices * RANK, inputs)
            ext_bias = None
            if bias is not None:
                ext_bias = torch.zeros(stack.shape[0], device=dev, dtype=dtype)
                ext_bias[:out].copy_(bias)
                layer[f"{module}_bias"] = ext_bias[:out]
            fused = in_gemm_weights.InGemmWeights(weight=stack, bias=ext_bias, out_features=out)
            layer[f"{module}_layer"] = SimpleNamespace(**{in_gemm_weights.ATTR: fused})
            layer[f"{module}_fused"] = fused

        qkv = HIDDEN + 2 * KV
        self.offsets = {"qkv": (0, HIDDEN, HIDDEN + KV, qkv), "o": (0, HIDDEN),
                        "gate_up": (0, INTER, 2 * INTER), "down": (0, HIDDEN)}
        self.layers = []
        for _ in range(LAYERS):
            layer = {"qkv_b": rand(SLOTS, qkv, RANK), "o_b": rand(SLOTS, HIDDEN, RANK)}
            stacked(layer, "qkv", qkv, 3, rand(qkv))
            stacked(layer, "o", HIDDEN, 1, None)
            for module in LORA_MODULES:
                layer[f"{module}_b_block"] = block_diagonal_b(layer[f"{module}_b"][1], self.offsets[module], RANK)
            if mlp_lora:
                layer["gate_up_b"], layer["down_b"] = rand(SLOTS, 2 * INTER, RANK), rand(SLOTS, HIDDEN, RANK)
                stacked(layer, "gate_up", 2 * INTER, 2, None)
                stacked(layer, "down", HIDDEN, 1, None, inputs=INTER)
            else:
                layer["gate_up"], layer["down"] = rand(2 * INTER, HIDDEN), rand(HIDDEN, INTER)
            self.layers.append(layer)
        self.x = rand(tokens, HIDDEN)
        self.cos, self.sin = rand(tokens, 1, HEAD_DIM), rand(tokens, 1, HEAD_DIM)
        self.backend = ATMMLoRABackend(max_loras_per_batch=SLOTS, device=dev)
        self.backend.shrink_in_gemm = True  # as the server sets it once the stacks are attached
        batch = SimpleNamespace(forward_mode=ForwardMode.EXTEND, batch_size=1,
                                extend_seq_lens=torch.tensor([tokens], dtype=torch.int32),
                                extend_seq_lens_cpu=[tokens])
        self.backend.prepare_lora_batch(batch, [1], [0, RANK], [0.0, 2.0], use_cuda_graph=False)
        if not self.backend.eager_in_gemm_kept:
            raise SystemExit(f"a batch of {tokens} tokens is past the eager in-GEMM limit "
                             f"({self.backend.eager_in_gemm_max_tokens})")
        self.timer = TimedLinear(torch.nn.functional.linear)
        self.times = self.timer.times
        self.module_times: dict[str, list[float]] = {m: [] for m in MODULES}
        self.warm_times: dict[str, list[float]] = {m: [] for m in MODULES}
        self.sync_before = sync_before
        self.warm_before = warm_before
        self.warm_rows = warm_rows
        self.tiny = (rand(1, 16), rand(16, 16)) if warm_tiny else None

    def _module(self, way: str, module: str, x, layer: dict):
        """The module's call, timed on the host (after the GPU's queue drained, for ``sync_before``'s;
        after one single-row call of its base weight, of its first ``warm_rows`` rows or of a
        16 x 16 weight of its own, timed apart, for ``warm_before``'s)."""
        if module in self.sync_before:
            self.torch.cuda.synchronize()
        if module in self.warm_before:
            began = time.perf_counter_ns()
            self.timer.linear(*(self.tiny or (x[:1], layer[module][: self.warm_rows])))
            self.warm_times[module].append((time.perf_counter_ns() - began) / 1e3)
        began = time.perf_counter_ns()
        out = self._module_call(way, module, x, layer)
        self.module_times[module].append((time.perf_counter_ns() - began) / 1e3)
        return out

    def _module_call(self, way: str, module: str, x, layer: dict):
        """The module's base GEMM (timed) and, for the way's LoRA modules, its LoRA."""
        F = self.torch.nn.functional
        self.timer.module = module
        if module not in lora_modules_of(way):
            return F.linear(x, layer[module])
        a, b, offsets = layer[f"{module}_a"], layer[f"{module}_b"], self.offsets[module]
        if way in ("atmm_in_gemm", "atmm_in_gemm_op", "atmm_small_gemm", ALL_MODULES_WAY):
            self.backend.eager_in_gemm_kept = way != "atmm_in_gemm_op"
            self.backend.eager_small_gemm = way in ("atmm_small_gemm", ALL_MODULES_WAY)
            return self.backend.forward_with_base(layer[f"{module}_layer"], x, None, a, b, None, offsets)
        if way in ("in_gemm_cublas_expand", "in_gemm_cublas_slices"):  # slot 1, as the other LoRA ways
            fused = layer[f"{module}_fused"]
            y = F.linear(x, fused.weight, fused.bias)
            if way == "in_gemm_cublas_slices":
                return cublas_expand_slices(y, fused.out_features, 1, offsets, RANK, b[1], 2.0)
            return cublas_expand(y, fused.out_features, 1, a.shape[1], layer[f"{module}_b_block"], 2.0)
        out = F.linear(x, layer[module], layer.get(f"{module}_bias"))
        if way == "atmm":
            return self.backend.forward_with_base(SimpleNamespace(), x, lambda: out, a, b, None, offsets)
        if way == "torch_lora":  # slot 1, every slice: one shrink GEMM, one expand GEMM added in place
            return out.addmm_(x @ a[1].t()[:, :RANK], b[1].t()[:RANK], alpha=2.0)
        return out

    def check_cublas_expand(self, ways: tuple[str, ...] = CUBLAS_EXPAND_WAYS) -> float:
        """Largest relative difference of the cuBLAS-expand ``ways``' q/k/v and o outputs from the
        ``atmm_in_gemm`` way's on the first layer (the same adapter): the ways emulate a LoRA, so
        they must compute one. Raises past bf16's tolerance."""
        x, layer = self._norm(self.x), self.layers[0]
        worst = 0.0
        for module in LORA_MODULES:
            want = self._module_call("atmm_in_gemm", module, x, layer).float()
            for way in ways:
                got = self._module_call(way, module, x, layer).float()
                diff = ((got - want).norm() / want.norm()).item()
                if diff > 1e-2:
                    raise SystemExit(f"{way} differs from the in-GEMM call by {diff:.3g} (relative) on {module}")
                worst = max(worst, diff)
        self.timer.module = None
        return worst

    def _norm(self, x):
        var = x.float().pow(2).mean(-1, keepdim=True)
        return (x.float() * self.torch.rsqrt(var + 1e-6)).to(x.dtype)

    def forward(self, way: str) -> None:
        F = self.torch.nn.functional
        F.linear = self.timer
        try:
            self._layers(way)
        finally:
            F.linear = self.timer.linear

    def _layers(self, way: str) -> None:
        F = self.torch.nn.functional
        x, tokens = self.x, self.tokens
        for layer in self.layers:
            h = self._norm(x)
            qkv = self._module(way, "qkv", h, layer)
            q, k, v = qkv.split([HIDDEN, KV, KV], dim=-1)
            q = q.reshape(tokens, HEADS, HEAD_DIM) * self.cos + q.reshape(tokens, HEADS, HEAD_DIM) * self.sin
            k = k.reshape(tokens, KV_HEADS, HEAD_DIM) * self.cos + k.reshape(tokens, KV_HEADS, HEAD_DIM) * self.sin
            v = v.reshape(tokens, KV_HEADS, HEAD_DIM)
            group = HEADS // KV_HEADS
            att = F.scaled_dot_product_attention(q.transpose(0, 1)[None],
                                                 k.transpose(0, 1)[None].repeat_interleave(group, 1),
                                                 v.transpose(0, 1)[None].repeat_interleave(group, 1), is_causal=True)
            att = att[0].transpose(0, 1).reshape(tokens, HIDDEN)
            x = x + self._module(way, "o", att, layer)
            h = self._norm(x)
            gate, up = self._module(way, "gate_up", h, layer).chunk(2, dim=-1)
            x = x + self._module(way, "down", F.silu(gate) * up, layer)


    def modules_gpu_us(self, way: str, modules: tuple[str, ...] = LORA_MODULES, replays: int = 20) -> float:
        """GPU microseconds of the ``modules`` calls of one forward (28 layers), from a CUDA graph
        of those calls alone replayed ``replays`` times."""
        torch = self.torch
        h = self._norm(self.x)
        inputs = {"qkv": h, "o": self.x.clone(), "gate_up": h,
                  "down": torch.zeros(self.tokens, INTER, device=h.device, dtype=h.dtype)}
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for layer in self.layers[:2]:  # warm the calls on this stream
                for module in modules:
                    self._module_call(way, module, inputs[module], layer)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            for layer in self.layers:
                for module in modules:
                    self._module_call(way, module, inputs[module], layer)
        graph.replay()
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        for _ in range(replays):
            graph.replay()
        end.record()
        end.synchronize()
        return begin.elapsed_time(end) * 1e3 / replays


def _median(values: list[float]) -> float | None:
    return round(statistics.median(values), 2) if values else None


def measure(rounds: int, tokens: int, sync_before: tuple[str, ...] = (), warm_before: tuple[str, ...] = (),
            warm_rows: int | None = None, warm_tiny: bool = False, mlp_lora: bool = False,
            only: tuple[str, ...] = ()) -> dict[str, dict]:
    """Per way (:func:`ways_of`): median host microseconds of each module's base GEMM call (and of
    the warm call before it), and the median host and wall milliseconds of a forward, over
    ``rounds`` rounds."""
    emu = Emulation(tokens, sync_before, warm_before, warm_rows, warm_tiny, mlp_lora)
    ways = ways_of(mlp_lora, only)
    torch = emu.torch
    for way in ways:  # compile and warm every path
        for _ in range(3):
            emu.forward(way)
    torch.cuda.synchronize()
    if any(way in CUBLAS_EXPAND_WAYS for way in ways):
        emu.check_cublas_expand(tuple(way for way in ways if way in CUBLAS_EXPAND_WAYS))
    per_way = {way: {"calls": {m: [] for m in MODULES}, "modules": {m: [] for m in MODULES},
                     "warm": {m: [] for m in warm_before}, "host_ms": [], "wall_ms": []} for way in ways}
    for r in range(rounds):
        for way in ways[r % len(ways):] + ways[: r % len(ways)]:
            for m in MODULES:
                emu.times[m].clear()
                emu.module_times[m].clear()
                emu.warm_times[m].clear()
            began = time.perf_counter()
            emu.forward(way)
            host = time.perf_counter() - began
            torch.cuda.synchronize()
            wall = time.perf_counter() - began
            rec = per_way[way]
            rec["host_ms"].append(host * 1e3)
            rec["wall_ms"].append(wall * 1e3)
            for m in MODULES:
                rec["calls"][m].extend(emu.times[m])
                rec["modules"][m].extend(emu.module_times[m])
            for m in warm_before:
                rec["warm"][m].extend(emu.warm_times[m])
    gpu = {way: round(statistics.median(emu.modules_gpu_us(way) for _ in range(5)), 1)
           for way in GPU_TIMED_WAYS if way in ways}
    mlp_gpu = {way: round(statistics.median(emu.modules_gpu_us(way, ("gate_up", "down")) for _ in range(5)), 1)
               for way in (("base", ALL_MODULES_WAY) if mlp_lora else ())}
    return {way: {"linear_host_us": {m: _median(v) for m, v in rec["calls"].items()},
                  "module_host_us": {m: _median(v) for m, v in rec["modules"].items()},
                  "warm_host_us": {m: _median(v) for m, v in rec["warm"].items()},
                  "forward_host_ms": round(statistics.median(rec["host_ms"]), 2),
                  "forward_wall_ms": round(statistics.median(rec["wall_ms"]), 2),
                  "qkv_o_gpu_us": gpu.get(way), "gate_up_down_gpu_us": mlp_gpu.get(way)}
            for way, rec in per_way.items()}


def _cell(value: float | None, width: int) -> str:
    return f"{'-':>{width}}" if value is None else f"{value:{width}.1f}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--tokens", type=int, default=1024, help="tokens of the prefill (at most the eager in-GEMM limit)")
    ap.add_argument("--out", type=Path, default=None, help="write OUT/TAG.json")
    ap.add_argument("--tag", default="base_linear_host")
    ap.add_argument("--sync-before", nargs="+", choices=MODULES, default=[], metavar="MODULE",
                    help=f"wait for the GPU before each call of these modules ({', '.join(MODULES)})")
    ap.add_argument("--warm-before", nargs="+", choices=MODULES, default=[], metavar="MODULE",
                    help="run one single-row F.linear of the module's base weight before each call of these "
                         "modules, timed apart from the call")
    ap.add_argument("--warm-rows", type=int, default=None, metavar="N",
                    help="the warm call's weight is the module weight's first N rows (default: all of it)")
    ap.add_argument("--mlp-lora", action="store_true",
                    help=f"add the way {ALL_MODULES_WAY}: the adapter on gate/up and down too, every module one kernel")
    ap.add_argument("--ways", nargs="+", choices=[w for w in (*WAYS, ALL_MODULES_WAY) if w != "base"], default=[],
                    metavar="WAY", help="measure only these ways (and base); default: every way")
    ap.add_argument("--warm-tiny", action="store_true",
                    help="the warm call is a 16 x 16 F.linear over tensors of its own, not the module's weight")
    args = ap.parse_args()
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")
    if args.tokens < 1:
        ap.error("--tokens must be at least 1")
    if args.warm_rows is not None and (args.warm_rows < 1 or not args.warm_before):
        ap.error("--warm-rows must be at least 1 and needs --warm-before")
    if ALL_MODULES_WAY in args.ways and not args.mlp_lora:
        ap.error(f"--ways {ALL_MODULES_WAY} needs --mlp-lora")
    if args.warm_tiny and (not args.warm_before or args.warm_rows is not None):
        ap.error("--warm-tiny needs --warm-before and takes no --warm-rows")
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("base_linear_host.py needs a CUDA GPU")
    result = measure(args.rounds, args.tokens, tuple(args.sync_before), tuple(args.warm_before), args.warm_rows,
                     args.warm_tiny, args.mlp_lora, tuple(args.ways))
    print(f"{'way':16} " + " ".join(f"{m:>9}" for m in MODULES) + " | module call us: "
          + " ".join(f"{m:>9}" for m in MODULES) + "  forward host ms  wall ms  q/k/v+o GPU us")
    for way, row in result.items():
        print(f"{way:16} " + " ".join(_cell(row["linear_host_us"][m], 9) for m in MODULES) + " | "
              + " " * 16 + " ".join(_cell(row["module_host_us"][m], 9) for m in MODULES)
              + f"  {row['forward_host_ms']:15.2f}  {row['forward_wall_ms']:7.2f}  {_cell(row['qkv_o_gpu_us'], 14)}"
              + "".join(f"  warm {m} {_cell(v, 5)}" for m, v in row["warm_host_us"].items())
              + (f"  gate/up+down GPU us {row['gate_up_down_gpu_us']:.1f}" if row["gate_up_down_gpu_us"] is not None else ""))
    if args.out is not None:
        from bench import provenance

        doc = {"what": "median host microseconds of each module's base GEMM call (F.linear) of 28 eager "
                       f"Qwen2-VL-7B-shaped layers ({args.tokens} tokens), without LoRA, with the atmm backend's "
                       "eager module call after the q/k/v and o GEMMs, with its in-GEMM module call (the timed "
                       "GEMM over the weight extended by the A rows; kept per module, and through "
                       "ops.lora_apply_static_in_gemm), with the same LoRA as two torch matmuls, with the in-GEMM "
                       "GEMM then the expand as one cuBLAS GEMM over a block-diagonal B (in_gemm_cublas_expand) or "
                       "one a slice in place (in_gemm_cublas_slices), and with base "
                       "GEMM, shrink and expand in one kernel (ops.KeptSmallGemmCall, no F.linear call); the ways "
                       "take turns. module_host_us: each module call's whole host time; qkv_o_gpu_us: GPU time "
                       "of a forward's q/k/v and o module calls, from a CUDA graph of them (median of 5); "
                       "warm_host_us: the host time of the warm call before each call of the warm_before modules; "
                       "gate_up_down_gpu_us (--mlp-lora): the same for the gate/up and down calls",
               "device": torch.cuda.get_device_name(0), "rounds": args.rounds, "tokens": args.tokens,
               "sync_before": args.sync_before, "warm_before": args.warm_before, "warm_rows": args.warm_rows,
               "warm_tiny": args.warm_tiny,
               "mlp_lora": args.mlp_lora,
               "ways": result}
        path = provenance.write_results(args.out, args.tag, doc, "bench/base_linear_host.py", sys.argv[1:])
        print(f"wrote {path}")

if __name__ == "__main__":
    main()
