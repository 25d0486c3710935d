"""The mode controller over a stand-in LoRA manager (no server): the base weights are
stacked once when the manager is built (before SGLang would capture CUDA graphs), every
switch then updates those same storages in place (so captured graphs stay valid), and
decode CUDA graphs no longer refuse a mode. Plus the bound that sizes the graphs'
static work items in every mode."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
import torch

from sglang_vlora import in_gemm_weights
from sglang_vlora.atmm.work_items import build_work_items
from sglang_vlora.config import VLoRAConfig
from sglang_vlora.modes import mode_hooks
from sglang_vlora.modes.controller import ModeController
from sglang_vlora.modes.delora import MAX_MODE_LAYERS, max_mode_items, mode_item_lists
from sglang_vlora.runtime import VLoRARuntime

LAYERS = 3
D = 16
QKV = [0, 16, 20, 24]  # q 16, k 4, v 4
MAX_RANK = 8
ADAPTERS = {"a": (0, 4, 2.0), "b": (1, 8, 0.5)}  # name: (pool slot, rank, scaling)


def fake_manager(backend_name: str = "atmm"):
    g = torch.Generator().manual_seed(0)
    layers = []
    for i in range(LAYERS):
        qkv = SimpleNamespace(base_layer=torch.nn.Linear(D, QKV[-1], bias=False), output_offset_cpu=torch.tensor(QKV))
        o = SimpleNamespace(base_layer=torch.nn.Linear(D, D, bias=False))
        layers.append({f"model.layers.{i}.self_attn.qkv_proj": qkv, f"model.layers.{i}.self_attn.o_proj": o})
    a_buf = {
        "qkv_proj": [torch.randn(2, 3 * MAX_RANK, D, generator=g) for _ in range(LAYERS)],
        "o_proj": [torch.randn(2, MAX_RANK, D, generator=g) for _ in range(LAYERS)],
    }
    b_buf = {
        "qkv_proj": [torch.randn(2, QKV[-1], MAX_RANK, generator=g) for _ in range(LAYERS)],
        "o_proj": [torch.randn(2, D, MAX_RANK, generator=g) for _ in range(LAYERS)],
    }
    uid_to_slot = {f"uid-{n}": slot for n, (slot, _, _) in ADAPTERS.items()}
    pool = SimpleNamespace(A_buffer=a_buf, B_buffer=b_buf, uid_to_buffer_id=uid_to_slot, get_buffer_id=uid_to_slot.get)
    return SimpleNamespace(
        lora_modules=layers,
        memory_pool=pool,
        lora_backend=SimpleNamespace(name=backend_name, graph_items=object()),  # graphs on
        loras={f"uid-{n}": SimpleNamespace(config=SimpleNamespace(r=r), scaling=s) for n, (_, r, s) in ADAPTERS.items()},
        lora_refs={f"uid-{n}": SimpleNamespace(lora_name=n) for n in ADAPTERS},
    )


def expected_weight(manager, name, layer, adapter):
    """W0 + s B A for every slice of one layer (fp64)."""
    slot, r, s = ADAPTERS[adapter]
    offsets = QKV if name == "qkv_proj" else [0, D]
    a = manager.memory_pool.A_buffer[name][layer][slot].double()
    b = manager.memory_pool.B_buffer[name][layer][slot].double()
    delta = torch.zeros(offsets[-1], D, dtype=torch.float64)
    for j in range(len(offsets) - 1):
        lo, hi = offsets[j], offsets[j + 1]
        delta[lo:hi] = s * b[lo:hi, :r] @ a[j * r : (j + 1) * r]
    return delta


def test_weights_are_stacked_when_the_manager_is_built_and_switched_in_place():
    manager = fake_manager()
    modules = [(name.rsplit(".", 1)[-1], i, m) for i, layer in enumerate(manager.lora_modules) for name, m in layer.items()]
    originals = {(name, i): m.base_layer.weight.detach().clone() for name, i, m in modules}
    x = torch.randn(5, D)
    before = {(name, i): m.base_layer(x) for name, i, m in modules}

    rt = VLoRARuntime(VLoRAConfig())
    mode_hooks.lora_manager_init_after(rt, None, manager)
    ctl = rt.controller
    assert sorted(ctl.stacks) == ["o_proj", "qkv_proj"]
    for name, i, m in modules:  # the model's parameters are views of the stacks, same values
        assert m.base_layer.weight.data_ptr() == ctl.stacks[name][i].data_ptr()
        assert torch.equal(m.base_layer(x), before[(name, i)])
    # What a CUDA graph captured after this point would hold: these addresses.
    captured = {(name, i): m.base_layer.weight.data_ptr() for name, i, m in modules}

    for mode, adapter in [("merge", "a"), ("mixture", "b"), ("merge", "a"), ("unmerge", None)]:
        status = ctl.apply(mode, adapter)
        assert (status["mode"], status["merged_adapter"]) == (mode, adapter)
        assert set(status["paths"].values()) == {"batched"}  # one baddbmm_ per kind, not a loop
        for name, i, m in modules:
            w = m.base_layer.weight
            assert w.data_ptr() == captured[(name, i)], "a switch moved a weight: captured graphs would go stale"
            if adapter is None:
                assert torch.equal(w, originals[(name, i)])
            else:
                want = originals[(name, i)].double() + expected_weight(manager, name, i, adapter)
                torch.testing.assert_close(w.double(), want, rtol=1e-5, atol=1e-5)


class UnquantizedLinearMethod:
    """Stands in for SGLang's plain linear method (matched by class name)."""


def test_shrink_in_gemm_says_why_a_kind_keeps_its_shrink_apart(caplog):
    manager = fake_manager()
    modules = ModeController(manager).modules()
    with caplog.at_level("WARNING", logger=in_gemm_weights.__name__):
        assert in_gemm_weights.extra_rows(manager, modules, "on") == {}
    assert "not a plain unquantized linear layer" in caplog.text and "qkv_proj" in caplog.text
    manager.memory_pool.tp_size = 2
    for module in (m for layer in manager.lora_modules for m in layer.values()):
        module.base_layer.quant_method = UnquantizedLinearMethod()
    caplog.clear()
    with caplog.at_level("WARNING", logger=in_gemm_weights.__name__):
        assert in_gemm_weights.extra_rows(manager, modules, "on") == {}
    assert "tensor parallelism above 1" in caplog.text


def test_shrink_in_gemm_puts_the_pool_rows_after_each_base_weight():
    """--vlora-shrink-in-gemm on: each kind's stack holds the pool's A rows after every layer's
    weight, the pool's buffers are views of them (same values), each layer gets its extended
    weight, the LoRA layers are re-pointed once, and merges still fold in place. With "auto" on
    a CPU, and for layers that are not plain linear ones, nothing is appended."""
    for setting, plain, appended in (("auto", True, False), ("on", False, False), ("on", True, True)):
        manager = fake_manager()
        pointed: list[bool] = []
        manager.update_lora_info = lambda pointed=pointed: pointed.append(True)
        modules = [(n.rsplit(".", 1)[-1], i, m) for i, layer in enumerate(manager.lora_modules) for n, m in layer.items()]
        for _, _, m in modules:
            if plain:
                m.base_layer.quant_method = UnquantizedLinearMethod()
        pool_before = {k: [a.clone() for a in v] for k, v in manager.memory_pool.A_buffer.items()}
        rt = VLoRARuntime(VLoRAConfig(shrink_in_gemm=setting))
        mode_hooks.lora_manager_init_after(rt, None, manager)
        ctl = rt.controller
        assert manager.lora_backend.shrink_in_gemm == appended, setting
        assert sorted(ctl.extended_stacks) == (["o_proj", "qkv_proj"] if appended else []), setting
        assert pointed == ([True] if appended else [])
        if not appended:
            assert all(not hasattr(m, in_gemm_weights.ATTR) for _, _, m in modules)
            continue
        for name, i, m in modules:
            stack, out = ctl.extended_stacks[name], m.base_layer.weight.shape[0]
            pool = manager.memory_pool.A_buffer[name][i]
            assert pool.data_ptr() == stack[i, out:].data_ptr() and torch.equal(pool, pool_before[name][i])
            fused = getattr(m, in_gemm_weights.ATTR)
            assert fused.out_features == out and fused.bias is None
            assert torch.equal(fused.weight, torch.cat([m.base_layer.weight, pool.reshape(-1, D)]))
        originals = {(name, i): m.base_layer.weight.detach().clone() for name, i, m in modules}
        ctl.apply("merge", "b")
        for name, i, m in modules:
            want = originals[(name, i)].double() + expected_weight(manager, name, i, "b")
            torch.testing.assert_close(m.base_layer.weight.double(), want, rtol=1e-5, atol=1e-5)
            assert torch.equal(getattr(m, in_gemm_weights.ATTR).weight[: m.base_layer.weight.shape[0]],
                               m.base_layer.weight)


def test_modes_still_need_the_atmm_backend():
    manager = fake_manager("triton")
    rt = VLoRARuntime(VLoRAConfig())
    mode_hooks.lora_manager_init_after(rt, None, manager)
    ctl = rt.controller
    assert ctl.stacks == {}  # nothing moved for a backend that cannot run the modes
    with pytest.raises(ValueError, match="--lora-backend atmm"):
        ctl.apply("merge", "a")


def test_kinds_that_cannot_be_stacked_are_left_alone():
    manager = fake_manager()
    layer0 = manager.lora_modules[0]["model.layers.0.self_attn.o_proj"]
    layer0.base_layer.weight.data = layer0.base_layer.weight.data.double()
    for layer in manager.lora_modules:  # an MoE layer: no .weight
        layer["model.layers.0.mlp.experts"] = SimpleNamespace(base_layer=SimpleNamespace())
    ctl = ModeController(manager)
    assert ctl.stack_weights() == ["qkv_proj"]


def test_max_mode_items_bounds_every_batch():
    """The static items' capacity: no batch of n requests, in any mode, has more than
    max_mode_items(n) items or more than MAX_MODE_LAYERS overlap layers; the bound is
    reached."""
    ranks = [0, 8, 16, 4, 2]
    scalings = [0.0, 1.0, 2.0, 0.5, 1.5]
    g = torch.Generator().manual_seed(1)
    for trial in range(2000):
        n = int(torch.randint(1, 12, (1,), generator=g))
        slots = torch.randint(0, len(ranks), (n,), generator=g).tolist()
        lens = torch.randint(0 if trial % 3 else 1, 3, (n,), generator=g).tolist()
        starts = [sum(lens[:i]) for i in range(n)]
        merged = [None, 1, 2, 3, 4][trial % 5]
        lists = mode_item_lists(starts, lens, slots, ranks, scalings, merged)
        assert len(lists[0]) <= max_mode_items(n)
        assert build_work_items(*lists[:4], ranks, partners=lists[4]).num_layers <= MAX_MODE_LAYERS
    for n in (1, 7, 8):  # adapter and base-only requests alternating, merged 2 not among them
        worst = [1, 0] * (n // 2) + [1] * (n % 2)
        assert len(mode_item_lists(list(range(n)), [1] * n, worst, ranks, scalings, 2)[0]) == max_mode_items(n)


@pytest.mark.parametrize("policy, compiles", [("vlora", True), ("merge-only", True), ("unmerge-only", False)])
def test_switch_kernels_are_compiled_ahead_where_the_policy_merges(monkeypatch, policy, compiles):
    """Built with the manager: the fold for the loaded adapters' ranks and the pool's largest,
    where the policy ever merges (unmerge-only never switches the weights)."""
    calls = []
    monkeypatch.setattr(ModeController, "compile_switch_ahead", lambda self, ranks: calls.append(set(ranks)))
    manager = fake_manager()
    manager.configs = {uid: lora.config for uid, lora in manager.loras.items()}
    manager.max_lora_rank = 16
    mode_hooks.lora_manager_init_after(VLoRARuntime(VLoRAConfig(policy=policy)), None, manager)
    assert calls == ([{4, 8, 16}] if compiles else [])
    assert mode_hooks.switch_ranks(SimpleNamespace()) == set()  # nothing loaded, no pool rank: nothing


def test_a_failed_compile_ahead_is_logged_and_the_server_goes_on(monkeypatch, caplog):
    def fail(self, ranks):
        raise RuntimeError("no compiler here")

    monkeypatch.setattr(ModeController, "compile_switch_ahead", fail)
    manager = fake_manager()
    manager.max_lora_rank = 8
    rt = VLoRARuntime(VLoRAConfig())
    mode_hooks.lora_manager_init_after(rt, None, manager)
    assert rt.controller is not None and sorted(rt.controller.stacks) == ["o_proj", "qkv_proj"]
    assert "not compiled ahead (no compiler here)" in caplog.text


def test_a_compile_ahead_is_logged_with_its_ranks_and_kinds(monkeypatch, caplog):
    """What an operator reads in the server log to know the first merge will not compile."""
    monkeypatch.setattr(ModeController, "compile_switch_ahead", lambda self, ranks: ["o_proj", "qkv_proj"])
    manager = fake_manager()
    manager.configs = {uid: lora.config for uid, lora in manager.loras.items()}
    manager.max_lora_rank = 16
    with caplog.at_level(logging.INFO, logger=mode_hooks.__name__):
        mode_hooks.lora_manager_init_after(VLoRARuntime(VLoRAConfig()), None, manager)
    assert "switch kernels compiled ahead for ranks [4, 8, 16] of o_proj, qkv_proj" in caplog.text


def test_compile_switch_ahead_compiles_only_stacks_on_a_gpu(monkeypatch):
    from sglang_vlora.modes import fold_kernel

    compiled = []
    monkeypatch.setattr(fold_kernel, "compile_ahead", lambda weights, ranks: compiled.append(weights.shape))
    ctl = ModeController(fake_manager())
    ctl.stack_weights()
    assert ctl.compile_switch_ahead({4, 8}) == [] and compiled == []  # CPU stacks switch with torch ops


def test_an_adapter_loaded_later_has_its_switch_kernels_compiled_in_the_load(monkeypatch):
    calls = []
    monkeypatch.setattr(ModeController, "compile_switch_ahead", lambda self, ranks: calls.append(set(ranks)))
    manager = fake_manager()
    rt = VLoRARuntime(VLoRAConfig())
    mode_hooks.lora_manager_init_after(rt, None, manager)  # no ranks known: nothing compiled
    manager.configs = {"uid-new": SimpleNamespace(r=32)}
    ref = SimpleNamespace(lora_id="uid-new", lora_name="new")
    loaded, failed = SimpleNamespace(success=True), SimpleNamespace(success=False)
    assert mode_hooks.compile_switch_after_load(rt, loaded, manager, ref) is loaded
    assert calls == [{32}]
    mode_hooks.compile_switch_after_load(rt, failed, manager, ref)  # a failed load: nothing
    never = VLoRARuntime(VLoRAConfig(policy="unmerge-only"))
    never.controller = rt.controller
    mode_hooks.compile_switch_after_load(never, loaded, manager, ref)  # never merges: nothing
    assert calls == [{32}]
