"""The base weights and LoRA pool laid out for the shrink inside the base GEMM.

:mod:`sglang_vlora.atmm.in_gemm` computes a graph batch's shrink in the base GEMM, over the
base weight with every pool slot's A rows appended. Here the LoRA manager's tensors are laid
out for it, once, when the manager is built (before SGLang sizes the KV cache and captures
graphs): the mode controller stacks each eligible module kind's base weights with room for
the rows (:meth:`~sglang_vlora.modes.controller.ModeController.stack_weights`), and
:func:`attach` makes the pool's A buffers views of those rows, so SGLang's adapter loads and
slot clears write them in place, and gives each layer its :class:`InGemmWeights`. The base
weight stays a view of the same storage, so merges (the switcher) and eager batches that keep
their own shrink kernel (above ``--vlora-eager-in-gemm-max-tokens`` tokens) see the same
tensors as before; smaller eager batches use the rows as graph batches do.

Eligible: tensor parallelism 1 (the A rows then see the whole input, as the base weight does),
plain unquantized linear layers (SGLang's ``UnquantizedLinearMethod``: its GEMM is what the
one over the extended weight replaces; the extended GEMM is torch's ``F.linear``, that
method's default path), a 3-D pool buffer per layer. Kinds left out are logged with the
reason (a warning under ``on``). With ``auto`` the kind
must also be on a GPU and its appended rows at most
:data:`AUTO_MAX_EXTRA_SHARE` of its own: every token pays for every slot's rows. The share is
a guard, not a measured break-even: on the H200 the rows still paid off at a third of q/k/v's
(8 slots, rank 64; docs/perf.md).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

logger = logging.getLogger(__name__)

ATTR = "vlora_in_gemm"  # on a LoRA-wrapped layer: its InGemmWeights
AUTO_MAX_EXTRA_SHARE = 0.5
PLAIN_LINEAR = "UnquantizedLinearMethod"


@dataclass(frozen=True)
class InGemmWeights:
    """One layer's extended GEMM operands."""

    weight: torch.Tensor  # [out + slots * S * max_rank, in]: the base weight's rows, then the pool's A rows
    bias: torch.Tensor | None  # [out + ...], zero past out; None where the base GEMM adds no bias
    out_features: int


def extra_rows(lora_manager, modules: dict[str, list], setting: str) -> dict[str, int]:
    """Per eligible module kind (the pool's keys), the A rows to append to each layer's base
    weight: the pool's ``slots * S * max_rank``. ``setting``: the ``--vlora-shrink-in-gemm``
    value."""
    if setting == "off":
        return {}
    pool = lora_manager.memory_pool
    rows: dict[str, int] = {}
    skipped: dict[str, str] = {}
    tp_one = getattr(pool, "tp_size", 1) == 1 and getattr(lora_manager, "attn_tp_size", 1) == 1
    for name, layers in modules.items():
        buffers = pool.A_buffer.get(name)
        base = [getattr(m, "base_layer", None) for m in layers]
        weights = [getattr(b, "weight", None) for b in base]
        if not tp_one:
            skipped[name] = "tensor parallelism above 1"
        elif not buffers or len(buffers) != len(layers) or not all(
            isinstance(w, torch.Tensor) and w.dim() == 2
            and type(getattr(b, "quant_method", None)).__name__ == PLAIN_LINEAR
            and a.dim() == 3 and a.shape[2] == w.shape[1] and a.dtype == w.dtype and a.device == w.device
            for b, w, a in zip(base, weights, buffers, strict=True)
        ):
            skipped[name] = "not a plain unquantized linear layer with a 3-D pool buffer per layer"
        else:
            extra = buffers[0].shape[0] * buffers[0].shape[1]
            if setting == "auto" and weights[0].device.type != "cuda":
                skipped[name] = "not on a GPU"
            elif setting == "auto" and extra > AUTO_MAX_EXTRA_SHARE * weights[0].shape[0]:
                skipped[name] = f"{extra} appended rows exceed half of its {weights[0].shape[0]}"
            else:
                rows[name] = extra
    if skipped:
        # "on" asked for every kind: say which could not have it (their results are the same).
        log = logger.warning if setting == "on" else logger.info
        log("LoRA shrink kept apart from the base GEMM for %s", skipped)
    return rows


@torch.no_grad()
def attach(lora_manager, modules: dict[str, list], stacks: dict[str, torch.Tensor]) -> list[str]:
    """For each kind in ``stacks`` (``[L, out + extra, in]``, each layer's base weight already
    a view of its first ``out`` rows): the pool's A buffer of layer ``i`` becomes a view of
    rows ``out:`` of ``stacks[kind][i]`` (its contents copied), the base bias a view of a
    zero-padded one, and the layer gets its :class:`InGemmWeights` (attribute :data:`ATTR`).
    The LoRA layers are then pointed at the new pool views. Returns the kinds attached."""
    pool = lora_manager.memory_pool
    for name, stack in stacks.items():
        for i, module in enumerate(modules[name]):
            base = module.base_layer
            out = base.weight.shape[0]
            if base.weight.data_ptr() != stack[i].data_ptr():
                raise RuntimeError(f"{name} layer {i}: the base weight is not the head of its stack")
            old = pool.A_buffer[name][i]
            rows = stack[i, out:].view(old.shape)
            rows.copy_(old)
            pool.A_buffer[name][i] = rows
            bias = None
            if getattr(base, "bias", None) is not None and not getattr(base, "skip_bias_add", False):
                bias = torch.zeros(stack.shape[1], dtype=base.bias.dtype, device=base.bias.device)
                bias[:out].copy_(base.bias)
                base.bias.data = bias[:out]
            setattr(module, ATTR, InGemmWeights(weight=stack[i], bias=bias, out_features=out))
    if stacks:
        lora_manager.update_lora_info()
        if next(iter(stacks.values())).is_cuda:
            torch.cuda.empty_cache()  # the pool's old A buffers, before SGLang sizes the KV cache
        logger.info("LoRA shrink inside the base GEMM for %s (%s extra rows)", sorted(stacks),
                    {k: s.shape[1] - modules[k][0].base_layer.weight.shape[0] for k, s in stacks.items()})
    return sorted(stacks)
