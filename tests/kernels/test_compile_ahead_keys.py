"""Compile-ahead compiles the variants later launches use: on CPU, by the specialisation key
of every launch (what Triton compiles one kernel per), with the kernels' launches recorded
instead of run. The GPU check that nothing compiles while serving is tests/gpu/test_compile_ahead.py."""

from __future__ import annotations

import inspect
import os
from types import SimpleNamespace

import pytest
import torch

from sglang_vlora.atmm import ops, tiling, triton_kernels
from sglang_vlora.atmm.fast_launch import _arg_key
from sglang_vlora.atmm.work_items import build_work_items
from sglang_vlora.modes.delora import mode_work_items

DEVICE = "NVIDIA H200"  # the shipped table whose prefill configs split K
K = 3584
TOKEN_COUNTS = (37, 40, 273, 601, 1001)  # odd, even and multiples of 16, as prefills come


def _specialisation(launcher, args: tuple, constexprs: dict, config, unspecialised: tuple[str, ...]) -> tuple:
    """What Triton keys a compiled variant on: constexprs, warps, stages, and per argument
    its specialisation (integers Triton must not specialise only by their type)."""
    names = list(inspect.signature(launcher.fn.fn).parameters)[: len(args)]
    per_arg = tuple(
        ("int", a in range(-(2**31), 2**31)) if name in unspecialised else _arg_key(a)
        for name, a in zip(names, args, strict=True)
    )
    return tuple(sorted(constexprs.items())), config.num_warps, config.num_stages, per_arg


@pytest.fixture
def recorded(monkeypatch) -> list[tuple]:
    """Every ``_launch`` as (kernel name, compile_only, specialisation), nothing run."""
    calls: list[tuple] = []

    def record(launcher, grid, args, constexprs, config, compile_only):
        unspecialised = (triton_kernels.SHRINK_UNSPECIALISED if launcher is triton_kernels._SHRINK
                         else triton_kernels.EXPAND_UNSPECIALISED)
        calls.append((launcher.fn.fn.__name__, compile_only,
                      _specialisation(launcher, args, constexprs, config, unspecialised)))

    monkeypatch.setattr(triton_kernels, "_launch", record)
    return calls


def _shrink_args(rows: int, rank: int, slices: int) -> tuple:
    """The arguments ``ops`` launches the shrink with for one item of ``rows`` tokens."""
    x = torch.zeros(rows, K, dtype=torch.bfloat16)
    a = torch.zeros(2, slices * rank, K, dtype=torch.bfloat16)
    inter = torch.empty(rows, slices * rank, dtype=torch.bfloat16)
    items = build_work_items([0], [rows], [1], [1.0], [0, rank])
    perm = ops._kernel_permutation(items, rows)
    return (x, a, inter, items.seg_starts, items.seg_lens, items.slots, items.row_starts, items.ranks, perm, slices,
            rows)


@pytest.mark.parametrize("rank", [8, 64])
def test_shrink_compiled_ahead_is_the_variant_every_token_count_launches(recorded, rank: int) -> None:
    configs = tiling.triton_configs(DEVICE, "shrink", {"k": K, "n": 3 * rank})
    assert any(c.split_k > 1 for c in configs)  # the split-K partials are what this guards
    for cfg in configs:
        recorded.clear()
        triton_kernels.launch_shrink(*_shrink_args(TOKEN_COUNTS[0], rank, 3), cfg, compile_only=True)
        for rows in TOKEN_COUNTS:
            triton_kernels.launch_shrink(*_shrink_args(rows, rank, 3), cfg)
        compiled = {key for _, ahead, key in recorded if ahead}
        launched = {key for _, ahead, key in recorded if not ahead}
        assert len(compiled) == 1 and launched == compiled, cfg


def _expand_launches(items, rows: int, rank: int, widths: tuple[int, ...], cfg, compile_only: bool) -> None:
    inter = torch.zeros(rows, 3 * rank, dtype=torch.bfloat16)
    b = torch.zeros(3, sum(widths), rank, dtype=torch.bfloat16)
    out = torch.zeros(rows, sum(widths), dtype=torch.bfloat16)
    offsets = (0, widths[0], widths[0] + widths[1], sum(widths))
    perm = ops._kernel_permutation(items, rows)
    if compile_only:
        ops._compile_expand_variants(inter, b, out, items, perm, offsets, min(items.total_rows, rows), cfg)
        return
    layers, num_layers, partners = ops.expand_layout(items)
    triton_kernels.launch_expand(inter, b, out, items.seg_starts, items.seg_lens, items.slots, items.scales,
                                 items.row_starts, layers, num_layers, items.ranks, perm, offsets,
                                 min(items.total_rows, rows), cfg, partners=partners)


def test_expand_compiled_ahead_covers_one_layer_and_mixture_batches(recorded) -> None:
    rank, widths = 64, (3584, 512, 512)
    for cfg in tiling.triton_configs(DEVICE, "expand", {"n": sum(widths), "s": 3, "r": rank}):
        recorded.clear()
        _expand_launches(build_work_items([0], [40], [1], [1.0], [0, rank]), 40, rank, widths, cfg, True)
        for rows in TOKEN_COUNTS:
            _expand_launches(build_work_items([0], [rows], [1], [1.0], [0, rank]), rows, rank, widths, cfg, False)
            mixture = mode_work_items([0, rows // 2], [rows // 2, rows - rows // 2], [1, 0], [0, rank, rank],
                                      [0.0, 1.0, 0.5], 2)
            assert mixture.partners is not None  # mixture: the pairs' variant
            _expand_launches(mixture, rows, rank, widths, cfg, False)
        compiled = {key for _, ahead, key in recorded if ahead}
        launched = {key for _, ahead, key in recorded if not ahead}
        assert len(compiled) == 2 and launched == compiled, cfg


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="launches the kernels' Triton path on CPU")
def test_eager_in_gemm_compiled_ahead_covers_the_one_layer_and_the_paired_buffers(recorded, monkeypatch) -> None:
    """The backend compiles the eager in-GEMM expand over its one-layer buffers (unmerged
    batches), then over its paired ones (mixture batches), whose kernel variant differs
    (``ops.static_variant``). Both must be compiled: a variant compiled for neither is compiled
    by a served batch, stalling every request in flight (seen on the H200 as 1-3 s compiles of
    ``_expand_kernel`` in mixture prefills). Launches of every token count, from both buffer sets,
    use only compiled variants."""
    from sglang_vlora.atmm.fast_launch import FastLauncher
    from sglang_vlora.atmm.static_items import StaticWorkItems
    from sglang_vlora.modes.delora import max_mode_items

    def record_launch(launcher, grid, args, constexprs, num_warps, num_stages):
        config = SimpleNamespace(num_warps=num_warps, num_stages=num_stages)
        recorded.append((launcher.fn.fn.__name__, False, _specialisation(
            launcher, args, constexprs, config, triton_kernels.EXPAND_UNSPECIALISED)))

    monkeypatch.setattr(FastLauncher, "__call__", record_launch)
    monkeypatch.setattr(ops, "_device_name", lambda t: DEVICE)
    monkeypatch.setattr(ops, "_compiles_ahead_for", lambda t: True)  # as on a GPU
    monkeypatch.setattr(ops, "_COMPILED", set())
    k, rank, slots, offsets = 512, 16, 4, [0, 512, 640, 768]
    gemm_rows = offsets[-1] + slots * 3 * rank
    weight = torch.randn(gemm_rows, k, dtype=torch.bfloat16) * k**-0.5
    b = torch.randn(slots, offsets[-1], rank, dtype=torch.bfloat16)
    buffers = {paired: StaticWorkItems.allocate(capacity=max_mode_items(slots), max_tokens=2048, num_slots=slots, device="cpu",
                                                max_layers=2 if paired else 1, paired=paired, covers_tokens=True)
               for paired in (False, True)}
    for paired in (False, True):  # the backend's order (_compile_eager_kernels)
        ops.compile_in_gemm(torch.empty(16, k, dtype=torch.bfloat16), gemm_rows, offsets[-1], b, buffers[paired],
                            offsets)
    compiled = {key for _, ahead, key in recorded if ahead}
    assert compiled
    recorded.clear()
    plans: dict = {}
    for tokens in (40, 273, 1001):
        half = tokens // 2
        for paired, merged in ((False, None), (True, 2)):  # unmerged, then mixture's pairs
            work = mode_work_items([0, half], [half, tokens - half], [1, 0], [0, rank, rank, rank], [0.0, 1.0, 0.5, 0.5],
                                   merged)
            buffers[paired].fill(work, tokens, cover_to=tokens)
            x = torch.randn(tokens, k, dtype=torch.bfloat16)
            ops.lora_apply_static_in_gemm(x, weight, None, offsets[-1], b, buffers[paired], offsets, impl="triton",
                                          plans=plans)
    launched = {key for _, _, key in recorded}
    assert {dict(key[0])["PAIRED"] for key in launched} == {False, True}
    assert launched <= compiled, "launched a variant the compile-ahead did not compile"
