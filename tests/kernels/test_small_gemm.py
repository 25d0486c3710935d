"""Base GEMM, shrink and expand in one launch (``small_gemm``, ``ops.KeptSmallGemmCall``) in Triton's
interpreter against an fp64 ``x W^T + b + LoRA``: several adapters, tokens without one (copy
items), a permuted batch, ranks below the pool's with NaN past them, one slice without bias,
kept calls sharing a plan; and what it refuses. Tolerance: relative Frobenius error 1e-5 (fp32)."""

from __future__ import annotations

import pytest
import torch

from sglang_vlora.atmm import ops, small_gemm
from sglang_vlora.atmm.static_items import StaticWorkItems
from sglang_vlora.atmm.work_items import build_work_items
from sglang_vlora.modes.delora import mode_item_lists
from tests.kernels.lora_reference import ref_delta, rel_err
from tests.triton_interpreter import use_triton_interpreter

D_IN = 40  # not a multiple of the K tile: the masked K loop
OFFSETS = [0, 80, 96, 112]  # three slices, as q/k/v; slice 0 spans two column tiles
RANKS = [0, 8, 16, 24]  # slot 0: the no-adapter slot
SCALINGS = [0.0, 2.0, 0.5, 1.5]
MAX_RANK = 32  # the pool's: every slot's rank is below it


def pool(gen: torch.Generator, offsets: list[int] = OFFSETS):
    """Base weight and bias, A and B with NaN past each slot's rank, and the base weight with
    every slot's A rows appended (what the server hands the op)."""
    n, slices = offsets[-1], len(offsets) - 1
    w = torch.randn(n, D_IN, generator=gen) / D_IN**0.5
    bias = torch.randn(n, generator=gen)
    a = torch.full((len(RANKS), slices * MAX_RANK, D_IN), float("nan"))
    b = torch.full((len(RANKS), n, MAX_RANK), float("nan"))
    for slot, r in enumerate(RANKS):
        a[slot, : slices * r] = torch.randn(slices * r, D_IN, generator=gen) / D_IN**0.5
        b[slot, :, :r] = torch.randn(n, r, generator=gen) / max(r, 1) ** 0.5
    w_ext = torch.cat([w, torch.nan_to_num(a).reshape(-1, D_IN)])
    return w, bias, a, b, w_ext


def covering(tokens: int) -> StaticWorkItems:
    return StaticWorkItems.allocate(capacity=4, max_tokens=64, num_slots=len(RANKS), device="cpu",
                                    covers_tokens=True)


def reference(x, w, bias, a, b, lists, offsets=OFFSETS, perm=None) -> torch.Tensor:
    base = x.double() @ w.double().T + (0 if bias is None else bias.double())
    return base + ref_delta(x, torch.nan_to_num(a), torch.nan_to_num(b), offsets, RANKS, *lists[:4], perm)


def test_one_launch_matches_fp64_with_several_adapters_and_tokens_without_one(monkeypatch) -> None:
    use_triton_interpreter(monkeypatch)
    gen = torch.Generator().manual_seed(3)
    w, bias, a, b, w_ext = pool(gen)
    starts, lens, slots = [0, 5, 25, 31], [5, 20, 4, 2], [1, 3, 2, 0]  # slot 0 adds nothing
    n = 36  # tokens 29-35 have no item: copy items cover them
    lists = mode_item_lists(starts, lens, slots, RANKS, SCALINGS, None)
    static = covering(n)
    static.fill(build_work_items(*lists[:4], RANKS), n, cover_to=n)
    x = torch.randn(n, D_IN, generator=gen)
    out = torch.full((n, OFFSETS[-1]), float("nan"))
    small_gemm.launch(x, w_ext, bias, a, b, out, static, OFFSETS)
    assert rel_err(out, reference(x, w, bias, a, b, lists)) < 1e-5


def test_permuted_batch_one_slice_without_bias(monkeypatch) -> None:
    use_triton_interpreter(monkeypatch)
    gen = torch.Generator().manual_seed(4)
    offsets = [0, 48]
    w, _, a, b, w_ext = pool(gen, offsets)
    n = 20
    perm = torch.randperm(n, generator=gen)
    lists = ([0, 7], [7, 9], [2, 3], [1.5, -0.5])
    static = covering(n)
    static.fill(build_work_items(*lists, RANKS, permutation=perm), n, cover_to=n)
    x = torch.randn(n, D_IN, generator=gen)
    out = torch.full((n, offsets[-1]), float("nan"))
    small_gemm.launch(x, w_ext, None, a, b, out, static, offsets)
    ref = reference(x, w, None, a, b, lists, offsets, perm)
    assert rel_err(out, ref) < 1e-5


def test_kept_calls_share_one_plan_for_a_bound_and_check_the_batch(monkeypatch) -> None:
    """Two layers' calls and two batches of one bound run one prepared launch; each batch
    matches fp64 and the in-GEMM call over the same items; a batch the items do not cover
    exactly is refused before anything runs."""
    use_triton_interpreter(monkeypatch)
    gen = torch.Generator().manual_seed(5)
    layers = [pool(gen) for _ in range(2)]
    static, plans, in_gemm_plans = covering(64), {}, {}
    calls = [ops.KeptSmallGemmCall(w_ext, bias, OFFSETS[-1], a, b, static, OFFSETS, 16, plans)
             for _, bias, a, b, w_ext in layers]
    for tokens, lists in ((9, ([0, 4], [4, 5], [1, 3], [2.0, 1.5])), (13, ([3], [7], [2], [0.5]))):
        static.fill(build_work_items(*lists, RANKS), tokens, cover_to=tokens)
        x = torch.randn(tokens, D_IN, generator=gen)
        for call, (w, bias, a, b, w_ext) in zip(calls, layers, strict=True):
            assert call.serves(w_ext, a, b, static, 16)
            out = call(x)
            assert out.shape == (tokens, OFFSETS[-1]) and out.is_contiguous()
            assert rel_err(out, reference(x, w, bias, a, b, lists)) < 1e-5
            b_fin = torch.nan_to_num(b)
            bias_ext = torch.cat([bias, torch.zeros(w_ext.shape[0] - bias.shape[0])])
            in_gemm = ops.KeptInGemmCall(w_ext, bias_ext, OFFSETS[-1], b_fin, static, OFFSETS, 16, in_gemm_plans)
            assert (out - in_gemm(x)).abs().max() < 1e-5
        with pytest.raises(ValueError, match=f"copy items reach position {tokens}"):
            calls[0](x[:-1])
    assert len(plans) == 1
    assert not calls[0].serves(layers[0][4], layers[0][2], layers[0][3], static, 32)


def test_refuses_what_it_cannot_run() -> None:
    gen = torch.Generator().manual_seed(6)
    _, bias, a, b, w_ext = pool(gen)
    plain = StaticWorkItems.allocate(capacity=4, max_tokens=8, num_slots=len(RANKS), device="cpu")
    paired = StaticWorkItems.allocate(capacity=4, max_tokens=8, num_slots=len(RANKS), device="cpu", max_layers=2,
                                      paired=True, covers_tokens=True)
    n = OFFSETS[-1]
    assert "cover every token" in small_gemm.unsupported(w_ext, n, a, b, plain, OFFSETS)
    assert "more than one layer" in small_gemm.unsupported(w_ext, n, a, b, paired, OFFSETS)
    ok = covering(8)
    assert small_gemm.unsupported(w_ext, n, a, b, ok, OFFSETS) is None
    assert "slices" in small_gemm.unsupported(w_ext, n, a, b, ok, [0, 16, 32, 48, n])
    assert "inputs" in small_gemm.unsupported(w_ext[:, :-1], n, a, b, ok, OFFSETS)
    assert "for 3 slices" in small_gemm.unsupported(w_ext, n, a[:, :40], b, ok, OFFSETS)
    wide = torch.zeros(len(RANKS), n, 2 * small_gemm.MAX_RANK)  # a pool of max rank 128
    assert "max rank 128" in small_gemm.unsupported(w_ext, n, torch.zeros(len(RANKS), 3 * 128, D_IN), wide, ok,
                                                    OFFSETS)
    with pytest.raises(ValueError, match="cover every token"):
        ops.KeptSmallGemmCall(w_ext, bias, n, a, b, plain, OFFSETS, 8, {})
    with pytest.raises(ValueError, match="contiguous rows"):
        small_gemm.launch(torch.randn(D_IN, 8).T, w_ext, bias, a, b, torch.empty(8, n), ok, OFFSETS)
