"""The q/k/v layer and pool of ``test_graph_modes`` with the pool's A rows appended to the base
weight (``in_gemm_weights``' layout), in bf16 on the GPU, the fp64 reference of a batch
through it, and an eager batch as SGLang hands it to the backend, for the GPU checks of the
eager paths."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from tests.gpu.test_graph_modes import QKV, RANKS, SCALINGS, D


def appended_qkv_layer(g: torch.Generator):
    """``(layer, pool_a, pool_b)``: a LoRA layer whose base weight (1024 -> 1024 + 256 + 256, with
    bias) has the pool's A rows appended, pool max rank 64; ``pool_a`` is a view of those rows."""
    from sglang_vlora.in_gemm_weights import ATTR, InGemmWeights

    max_rank = max(RANKS)
    a = torch.randn(4, 3 * max_rank, D, generator=g) * D**-0.5
    b = torch.randn(4, QKV[-1], max_rank, generator=g) * max_rank**-0.5
    w = torch.randn(QKV[-1], D, generator=g) * D**-0.5
    bias = torch.randn(QKV[-1], generator=g)
    stack = torch.cat([w, a.reshape(-1, D)]).to("cuda", torch.bfloat16)
    bias_ext = torch.cat([bias, torch.zeros(a.shape[0] * a.shape[1])]).to("cuda", torch.bfloat16)
    layer = SimpleNamespace(**{ATTR: InGemmWeights(weight=stack, bias=bias_ext, out_features=QKV[-1])})
    return layer, stack[QKV[-1] :].view(a.shape), b.to("cuda", torch.bfloat16)


def reference(x: torch.Tensor, layer, pool_a: torch.Tensor, pool_b: torch.Tensor, requests) -> torch.Tensor:
    """fp64 on the CPU, from the same bf16 operands: base + bias + each request's own adapter
    (``requests``: ``(tokens, slot)`` in order; slot 0 is the no-adapter slot)."""
    from sglang_vlora.in_gemm_weights import ATTR

    fused = getattr(layer, ATTR)
    xd = x.double().cpu()
    ad, bd = pool_a.double().cpu(), pool_b.double().cpu()
    ref = xd @ fused.weight[: QKV[-1]].double().cpu().T + fused.bias[: QKV[-1]].double().cpu()
    start = 0
    for n, slot in requests:
        r = RANKS[slot]
        for s in range(3) if r else ():
            lo, hi = QKV[s], QKV[s + 1]
            ref[start : start + n, lo:hi] += SCALINGS[slot] * (xd[start : start + n] @ ad[slot, s * r : (s + 1) * r].T
                                                               @ bd[slot, lo:hi, :r].T)
        start += n
    return ref


def cuda_backend(**options):
    """An ``atmm`` backend on the GPU with these ``VLoRAConfig`` options, four pool slots, the
    layers' appended rows in use (as the server sets it once the stacks are attached)."""
    from sglang_vlora.backend import ATMMLoRABackend
    from sglang_vlora.config import VLoRAConfig
    from sglang_vlora.runtime import VLoRARuntime

    backend = ATMMLoRABackend(max_loras_per_batch=4, device=torch.device("cuda"), impl="auto",
                              runtime=VLoRARuntime(VLoRAConfig(**options)))
    backend.shrink_in_gemm = True
    return backend


def extend_batch(lens: list[int]) -> SimpleNamespace:
    """An extend (prefill) batch of requests of ``lens`` tokens, as the backend reads it."""
    from sglang.srt.model_executor.forward_batch_info import ForwardMode

    return SimpleNamespace(forward_mode=ForwardMode.EXTEND, batch_size=len(lens),
                           extend_seq_lens=torch.tensor(lens, dtype=torch.int32), extend_seq_lens_cpu=list(lens))
