"""The switcher on a real (tiny, random) transformers model against peft.

The model's projection weights are rebound into per-kind stacks with
``stack_in_place`` (what the server integration does with SGLang's layers), two peft
adapters with different ranks and target sets are registered from their
``lora_A`` / ``lora_B`` weights, and the model's logits with an adapter merged must
match peft's unmerged forward: relative Frobenius error <= 1e-5 in fp32. After
unmerge the weights and the logits are bit-identical to the base model's.
"""

from __future__ import annotations

import copy

import pytest
import torch

peft = pytest.importorskip("peft")
transformers = pytest.importorskip("transformers")

from sglang_vlora.modes.switcher import LoRADelta, SwiftSwitcher, stack_in_place  # noqa: E402

PROJ = {"q_proj": "self_attn", "k_proj": "self_attn", "v_proj": "self_attn", "o_proj": "self_attn"}
PROJ |= {"gate_proj": "mlp", "up_proj": "mlp", "down_proj": "mlp"}
ADAPTERS = {  # name -> (rank, alpha, targets)
    "a": (4, 8, ["q_proj", "v_proj", "down_proj"]),
    "b": (8, 4, ["q_proj", "k_proj", "o_proj", "gate_proj", "up_proj"]),
}


def rel(x: torch.Tensor, ref: torch.Tensor) -> float:
    return ((x.double() - ref.double()).norm() / ref.double().norm()).item()


def test_switcher_on_a_transformers_model_matches_peft():
    config = transformers.LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    torch.manual_seed(0)
    model = transformers.LlamaForCausalLM(config).eval()
    ids = torch.randint(0, 64, (2, 7))
    with torch.no_grad():
        base_logits = model(ids).logits

    deltas: dict[str, dict[str, LoRADelta]] = {}
    expected: dict[str, torch.Tensor] = {}
    for name, (rank, alpha, targets) in ADAPTERS.items():
        lora = peft.LoraConfig(r=rank, lora_alpha=alpha, target_modules=targets, init_lora_weights=False)
        peft_model = peft.get_peft_model(copy.deepcopy(model), lora).eval()
        with torch.no_grad():
            expected[name] = peft_model(ids).logits
        layers = peft_model.base_model.model.model.layers
        deltas[name] = {}
        for proj in targets:
            mods = [getattr(getattr(layer, PROJ[proj]), proj) for layer in layers]
            deltas[name][proj] = LoRADelta(
                a=torch.stack([m.lora_A["default"].weight for m in mods]),  # requires grad: the
                b=torch.stack([m.lora_B["default"].weight for m in mods]),  # switcher detaches
                scaling=mods[0].scaling["default"],
            )

    layers = model.model.layers
    weights = {proj: [getattr(getattr(layer, PROJ[proj]), proj).weight for layer in layers] for proj in PROJ}
    original = {proj: torch.stack([w.detach().clone() for w in ws]) for proj, ws in weights.items()}
    for ws in weights.values():
        assert not stack_in_place(ws).requires_grad
    switcher = SwiftSwitcher(weights)  # the nn.Parameters themselves, now views of one stack
    assert set(switcher.paths.values()) == {"batched"}
    for name, per_kind in deltas.items():
        switcher.add_adapter(name, per_kind)

    with torch.no_grad():
        for name in ["a", "b", "a", None, "b"]:
            switcher.switch(name)
            logits = model(ids).logits
            if name is None:
                assert torch.equal(logits, base_logits)
            else:
                assert rel(logits, expected[name]) <= 1e-5, name
                assert rel(expected[name], base_logits) > 1e-3  # the adapter changes the output
        switcher.unmerge()
        assert torch.equal(model(ids).logits, base_logits)
    for proj, ws in weights.items():
        assert torch.equal(torch.stack([w.detach() for w in ws]), original[proj]), proj
