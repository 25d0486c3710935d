"""Does the LoRA work of a module make its base GEMM's host call slower? (GPU)

    python bench/base_linear_host.py [--rounds 40] [--out bench/results --tag base_linear_host_h200]

A sampling profile of the servers (docs/perf.md, "Host time, sampled") put 1.8 ms more host
time per 1024-token prefill in the base GEMM calls of LoRA batches than on the floor. This
benchmark asks the question without a server: 28 eager decoder layers of Qwen2-VL-7B's shapes
(norms and rotary as plain torch ops, q/k/v with bias, attention by SDPA, o, gate/up, down;
1024 tokens), each ``F.linear``'s host call timed with ``perf_counter_ns``, three ways:

* ``base``: no LoRA;
* ``atmm``: after the q/k/v and o GEMMs, the ``atmm`` backend's eager module call
  (``forward_with_base``: the base output, then ``ops.lora_apply``), one rank-64 adapter;
* ``torch_lora``: the same LoRA as two torch matmuls (cuBLAS launches instead of Triton's).

One forward of each way per round, the order rotated each round, so that a slow spell of the
host (``bench/host_speed.py``) hits every way alike. Prints a table, writes JSON.
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

HIDDEN, KV, INTER, LAYERS, RANK, TOKENS = 3584, 512, 18944, 28, 64, 1024
HEADS, KV_HEADS, HEAD_DIM = 28, 4, 128
WAYS = ("base", "atmm", "torch_lora")
MODULES = ("qkv", "o", "gate_up", "down")


class Emulation:
    """Random bf16 weights of ``LAYERS`` layers on the GPU and one prepared ``atmm`` batch."""

    def __init__(self) -> None:
        import torch
        from sglang.srt.model_executor.forward_batch_info import ForwardMode

        from sglang_vlora.backend import ATMMLoRABackend

        self.torch = torch
        dev, dtype = torch.device("cuda"), torch.bfloat16
        g = torch.Generator(device=dev).manual_seed(0)

        def rand(*shape):
            return torch.randn(*shape, device=dev, dtype=dtype, generator=g) * 0.02

        qkv = HIDDEN + 2 * KV
        self.layers = [{"qkv": rand(qkv, HIDDEN), "qkv_bias": rand(qkv), "o": rand(HIDDEN, HIDDEN),
                        "gate_up": rand(2 * INTER, HIDDEN), "down": rand(HIDDEN, INTER),
                        "qkv_a": rand(2, 3 * RANK, HIDDEN), "qkv_b": rand(2, qkv, RANK),
                        "o_a": rand(2, RANK, HIDDEN), "o_b": rand(2, HIDDEN, RANK)} for _ in range(LAYERS)]
        self.x = rand(TOKENS, HIDDEN)
        self.cos, self.sin = rand(TOKENS, 1, HEAD_DIM), rand(TOKENS, 1, HEAD_DIM)
        self.offsets = {"qkv": (0, HIDDEN, HIDDEN + KV, qkv), "o": (0, HIDDEN)}
        self.backend = ATMMLoRABackend(max_loras_per_batch=2, device=dev)
        batch = SimpleNamespace(forward_mode=ForwardMode.EXTEND, batch_size=1,
                                extend_seq_lens=torch.tensor([TOKENS], dtype=torch.int32),
                                extend_seq_lens_cpu=[TOKENS])
        self.backend.prepare_lora_batch(batch, [1], [0, RANK], [0.0, 2.0], use_cuda_graph=False)
        self.times: dict[str, list[float]] = {m: [] for m in MODULES}

    def _linear(self, module: str, x, weight, bias=None):
        began = time.perf_counter_ns()
        out = self.torch.nn.functional.linear(x, weight, bias)
        self.times[module].append((time.perf_counter_ns() - began) / 1e3)
        return out

    def _lora(self, way: str, module: str, x, out, layer: dict):
        a, b = layer[f"{module}_a"], layer[f"{module}_b"]
        if way == "atmm":
            return self.backend.forward_with_base(SimpleNamespace(), x, lambda: out, a, b, None, self.offsets[module])
        if way == "torch_lora":  # slot 1, every slice: one shrink GEMM, one expand GEMM added in place
            return out.addmm_(x @ a[1].t()[:, :RANK], b[1].t()[:RANK], alpha=2.0)
        return out

    def _norm(self, x):
        var = x.float().pow(2).mean(-1, keepdim=True)
        return (x.float() * self.torch.rsqrt(var + 1e-6)).to(x.dtype)

    def forward(self, way: str) -> None:
        F = self.torch.nn.functional
        x = self.x
        for layer in self.layers:
            h = self._norm(x)
            qkv = self._lora(way, "qkv", h, self._linear("qkv", h, layer["qkv"], layer["qkv_bias"]), layer)
            q, k, v = qkv.split([HIDDEN, KV, KV], dim=-1)
            q = q.reshape(TOKENS, HEADS, HEAD_DIM) * self.cos + q.reshape(TOKENS, HEADS, HEAD_DIM) * self.sin
            k = k.reshape(TOKENS, KV_HEADS, HEAD_DIM) * self.cos + k.reshape(TOKENS, KV_HEADS, HEAD_DIM) * self.sin
            v = v.reshape(TOKENS, KV_HEADS, HEAD_DIM)
            group = HEADS // KV_HEADS
            att = F.scaled_dot_product_attention(q.transpose(0, 1)[None],
                                                 k.transpose(0, 1)[None].repeat_interleave(group, 1),
                                                 v.transpose(0, 1)[None].repeat_interleave(group, 1), is_causal=True)
            att = att[0].transpose(0, 1).reshape(TOKENS, HIDDEN)
            x = x + self._lora(way, "o", att, self._linear("o", att, layer["o"]), layer)
            h = self._norm(x)
            gate, up = self._linear("gate_up", h, layer["gate_up"]).chunk(2, dim=-1)
            x = x + self._linear("down", F.silu(gate) * up, layer["down"])


def measure(rounds: int) -> dict[str, dict]:
    """Per way: median host microseconds of each module's ``F.linear`` call, and the median
    host and wall milliseconds of a forward, over ``rounds`` rounds."""
    emu = Emulation()
    torch = emu.torch
    for way in WAYS:  # compile and warm every path
        for _ in range(3):
            emu.forward(way)
    torch.cuda.synchronize()
    per_way = {way: {"calls": {m: [] for m in MODULES}, "host_ms": [], "wall_ms": []} for way in WAYS}
    for r in range(rounds):
        for way in WAYS[r % len(WAYS):] + WAYS[: r % len(WAYS)]:
            for m in MODULES:
                emu.times[m].clear()
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
    return {way: {"linear_host_us": {m: round(statistics.median(v), 2) for m, v in rec["calls"].items()},
                  "forward_host_ms": round(statistics.median(rec["host_ms"]), 2),
                  "forward_wall_ms": round(statistics.median(rec["wall_ms"]), 2)}
            for way, rec in per_way.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=40)
    ap.add_argument("--out", type=Path, default=None, help="write OUT/TAG.json")
    ap.add_argument("--tag", default="base_linear_host")
    args = ap.parse_args()
    if args.rounds < 1:
        ap.error("--rounds must be at least 1")
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("base_linear_host.py needs a CUDA GPU")
    result = measure(args.rounds)
    print(f"{'way':11} " + " ".join(f"{m:>9}" for m in MODULES) + "  forward host ms  wall ms")
    for way, row in result.items():
        print(f"{way:11} " + " ".join(f"{row['linear_host_us'][m]:9.1f}" for m in MODULES)
              + f"  {row['forward_host_ms']:15.2f}  {row['forward_wall_ms']:7.2f}")
    if args.out is not None:
        from bench import provenance

        doc = {"what": "median host microseconds of each F.linear call of 28 eager Qwen2-VL-7B-shaped layers "
                       f"({TOKENS} tokens), without LoRA, with the atmm backend's eager module call after the "
                       "q/k/v and o GEMMs, and with the same LoRA as two torch matmuls; the ways take turns",
               "device": torch.cuda.get_device_name(0), "rounds": args.rounds, "ways": result}
        path = provenance.write_results(args.out, args.tag, doc, "bench/base_linear_host.py", sys.argv[1:])
        print(f"wrote {path}")

if __name__ == "__main__":
    main()
