"""Swift switcher: bit-exact base weights after 10,000 random switches, merged outputs
against unmerged ones, the batched and loop paths, fused slices, the in-place
(non-exact) scheme, and bad input.

Tolerance for merged vs unmerged outputs (bf16): relative Frobenius error
``||y_merged - y_unmerged|| / ||y_unmerged|| <= 1e-2`` (bf16 keeps 8 significant bits,
eps 2^-8 = 3.9e-3; both sides carry a few roundings), and each side within 1e-2 of
an fp64 computation.
"""

from __future__ import annotations

import random

import pytest
import torch

from sglang_vlora.modes.switcher import (
    LoRADelta,
    SwiftSwitcher,
    deltas_from_pool,
    slice_kinds,
    stack_in_place,
)

LAYERS = 3
SHAPES = {"q": (16, 12), "o": (12, 16), "down": (12, 20)}  # kind -> (out, in)
ADAPTERS = {"a": 4, "b": 8, "c": 2, "d": 16}  # name -> rank
TOL = 1e-2


def rel(x: torch.Tensor, ref: torch.Tensor) -> float:
    return ((x.double() - ref.double()).norm() / ref.double().norm()).item()


def base_weights(seed: int = 0, dtype: torch.dtype = torch.bfloat16) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return {k: torch.randn(LAYERS, out, inp, generator=g).to(dtype) for k, (out, inp) in SHAPES.items()}


def adapter_deltas(seed: int, rank: int, kinds=tuple(SHAPES)) -> dict[str, LoRADelta]:
    g = torch.Generator().manual_seed(seed)
    deltas = {}
    for k in kinds:
        out, inp = SHAPES[k]
        a = torch.randn(LAYERS, rank, inp, generator=g) / inp**0.5
        b = torch.randn(LAYERS, out, rank, generator=g) / rank**0.5
        deltas[k] = LoRADelta(a=a.bfloat16(), b=b.bfloat16(), scaling=0.5 + seed / 4)
    return deltas


def all_adapters() -> dict[str, dict[str, LoRADelta]]:
    # adapter "c" targets only q and o: kinds an adapter leaves out stay base
    return {
        name: adapter_deltas(i + 1, rank, ("q", "o") if name == "c" else tuple(SHAPES))
        for i, (name, rank) in enumerate(ADAPTERS.items())
    }


def make_switcher(weights, exact: bool = True) -> SwiftSwitcher:
    sw = SwiftSwitcher(weights, exact=exact)
    for name, deltas in all_adapters().items():
        sw.add_adapter(name, deltas)
    return sw


def assert_bits_equal(live: dict[str, torch.Tensor], original: dict[str, torch.Tensor]) -> None:
    for k in original:
        assert torch.equal(live[k].view(torch.int16), original[k].view(torch.int16)), k


def test_ten_thousand_random_switches_keep_base_bit_identical():
    weights = base_weights()
    original = {k: w.clone() for k, w in weights.items()}
    sw = make_switcher(weights)
    rng = random.Random(4)
    choices = [*ADAPTERS, None]
    checkpoints = set(rng.sample(range(10_000), 12))
    for step in range(10_000):
        sw.switch(rng.choice([c for c in choices if c != sw.merged]))
        if step in checkpoints:  # unmerge, compare bits, go back
            merged = sw.merged
            sw.unmerge()
            assert_bits_equal(weights, original)
            sw.switch(merged)
    sw.unmerge()
    assert_bits_equal(weights, original)
    assert sw.switch_count >= 10_000


def test_merged_weights_do_not_drift_with_history():
    """A merged adapter's weights are the same bits whatever came before."""
    weights = base_weights()
    sw = make_switcher(weights)
    sw.merge("b")
    direct = {k: w.clone() for k, w in weights.items()}
    rng = random.Random(1)
    for _ in range(500):
        sw.switch(rng.choice([*ADAPTERS, None]))
    sw.merge("d")
    sw.merge("b")
    assert_bits_equal(weights, direct)


@pytest.mark.parametrize("name", list(ADAPTERS))
def test_merged_outputs_match_unmerged(name):
    weights = base_weights(seed=3)
    original = {k: w.clone() for k, w in weights.items()}
    sw = make_switcher(weights)
    deltas = all_adapters()
    sw.merge("a")
    sw.merge(name)  # a fused switch unless name == "a"
    g = torch.Generator().manual_seed(7)
    for k, (_, inp) in SHAPES.items():
        x = torch.randn(5, inp, generator=g).bfloat16()
        d = deltas[name].get(k)
        for layer in range(LAYERS):
            merged = x @ weights[k][layer].T
            unmerged = x @ original[k][layer].T
            exact = x.double() @ original[k][layer].double().T
            if d is not None:
                unmerged = unmerged + d.scaling * ((x @ d.a[layer].T) @ d.b[layer].T)
                exact = exact + d.scaling * (x.double() @ d.a[layer].double().T) @ d.b[layer].double().T
            assert rel(merged, unmerged) <= TOL, (k, layer)
            assert rel(merged, exact) <= TOL and rel(unmerged, exact) <= TOL, (k, layer)
            if d is None:
                assert torch.equal(weights[k][layer], original[k][layer])


def test_loop_path_for_separate_layers_matches_batched():
    stacked = base_weights(seed=5)
    separate = {k: [w[i].clone() for i in range(LAYERS)] for k, w in stacked.items()}
    original = {k: w.clone() for k, w in stacked.items()}
    batched, loop = make_switcher(stacked), make_switcher(separate)
    assert set(batched.paths.values()) == {"batched"} and set(loop.paths.values()) == {"loop"}
    for name in ["a", "d", "c", None, "b"]:
        batched.switch(name)
        loop.switch(name)
        for k in SHAPES:
            assert rel(torch.stack(separate[k]), stacked[k]) <= 1e-2
    loop.unmerge()
    assert_bits_equal({k: torch.stack(v) for k, v in separate.items()}, original)


def test_stack_in_place_rebinds_parameters_to_one_stack():
    g = torch.Generator().manual_seed(0)
    layers = [torch.nn.Linear(12, 16, bias=False, dtype=torch.bfloat16) for _ in range(LAYERS)]
    for layer in layers:
        torch.nn.init.normal_(layer.weight, generator=g)
    before = [layer.weight.detach().clone() for layer in layers]
    params = [layer.weight for layer in layers]
    stack = stack_in_place(params)
    for i, layer in enumerate(layers):
        assert layer.weight is params[i] and torch.equal(layer.weight, before[i])
        assert layer.weight.data_ptr() == stack[i].data_ptr()
    sw = SwiftSwitcher({"q": [layer.weight.data for layer in layers]})
    assert sw.paths == {"q": "batched"}
    sw.add_adapter("a", {"q": adapter_deltas(1, 4, ("q",))["q"]})
    x = torch.randn(3, 12, generator=g).bfloat16()
    base_out = layers[1](x)
    sw.merge("a")
    assert not torch.equal(layers[1](x), base_out)  # the model sees the merged weights
    sw.unmerge()
    assert torch.equal(layers[1](x), base_out)


def test_fused_slices_from_pool_layout():
    """qkv as one fused stack split into three kinds; adapters read from SGLang-layout
    pools with mixed ranks; merged = W0 + per-slice delta."""
    g = torch.Generator().manual_seed(2)
    offsets, d_in, max_rank = [0, 16, 20, 24], 12, 8
    fused = torch.randn(LAYERS, offsets[-1], d_in, generator=g).bfloat16()
    original = fused.clone()
    a_pool = [torch.randn(3, 3 * max_rank, d_in, generator=g).bfloat16() for _ in range(LAYERS)]
    b_pool = [torch.randn(3, offsets[-1], max_rank, generator=g).bfloat16() for _ in range(LAYERS)]
    sw = SwiftSwitcher(slice_kinds(fused, ["q", "k", "v"], offsets))
    assert set(sw.paths.values()) == {"batched"}
    for name, slot, rank in [("r4", 1, 4), ("r8", 2, 8)]:
        deltas = deltas_from_pool(a_pool, b_pool, slot, rank, offsets, scaling=2.0)
        sw.add_adapter(name, dict(zip(["q", "k", "v"], deltas, strict=True)))
    sw.merge("r8")
    sw.merge("r4")
    for layer in range(LAYERS):
        a, b = a_pool[layer][1].double(), b_pool[layer][1].double()
        for s in range(3):
            lo, hi = offsets[s], offsets[s + 1]
            expect = original[layer, lo:hi].double() + 2.0 * b[lo:hi, :4] @ a[s * 4 : (s + 1) * 4]
            assert rel(fused[layer, lo:hi], expect) <= 1e-2
    sw.unmerge()
    assert torch.equal(fused.view(torch.int16), original.view(torch.int16))


def test_in_place_scheme_is_close_but_drifts():
    """exact=False: the fused one-GEMM switch stays within tolerance of the exact
    result but does not restore the bits (why the exact scheme is the default)."""
    weights = base_weights(seed=9)
    original = {k: w.clone() for k, w in weights.items()}
    sw = make_switcher(weights, exact=False)
    assert sw.pristine_bytes == 0
    for name in ["a", "b", "d", "a", "c", "b"]:
        sw.merge(name)
    reference = make_switcher({k: w.clone() for k, w in original.items()})
    reference.merge("b")
    for k in SHAPES:
        assert rel(weights[k], reference._kinds[k].stack) <= 1e-2
    sw.unmerge()
    changed = sum(int((weights[k] != original[k]).sum()) for k in SHAPES)
    assert changed > 0
    for k in SHAPES:
        assert rel(weights[k], original[k]) <= 1e-2


def test_pristine_bytes_is_one_copy_of_targeted_weights():
    weights = base_weights()
    sw = SwiftSwitcher(weights)
    assert sw.pristine_bytes == sum(w.numel() * 2 for w in weights.values())


def test_bad_input():
    weights = base_weights()
    sw = make_switcher(weights)
    with pytest.raises(KeyError):
        sw.merge("nope")
    with pytest.raises(ValueError, match="already registered"):
        sw.add_adapter("a", {})
    with pytest.raises(ValueError, match="unknown kinds"):
        sw.add_adapter("e", {"gate": adapter_deltas(1, 4, ("q",))["q"]})
    with pytest.raises(ValueError, match="expected a"):
        sw.add_adapter("e", {"o": adapter_deltas(1, 4, ("q",))["q"]})
    sw.merge("a")
    with pytest.raises(ValueError, match="merged"):
        sw.remove_adapter("a")
    with pytest.raises(ValueError, match="pristine_device"):
        SwiftSwitcher(weights, exact=False, pristine_device="cpu")
    with pytest.raises(ValueError, match="offsets"):
        slice_kinds(weights["q"], ["q", "k"], [0, 8, 12])
