"""GPU checks of the compiled Triton kernels (skipped without CUDA or under the
interpreter): bf16 against fp64 at model sizes, and CUDA-graph replay with other
work items than at capture (the stale-segment-count bug class of SGLang PR #28371).

The CUDA C++ implementation (built on first use by ``sglang_vlora.atmm.cuda_ext``; a
build failure fails these tests with the compiler's error) gets the same checks, on
every compiled tile, plus unaligned shapes and graph capture.

Run on a GPU machine: ``TRITON_INTERPRET=0 python -m pytest tests/kernels/test_cuda.py``
(or ``bash bench/gpu_check_cuda.sh``).
Tolerance: bf16 relative error of the LoRA delta <= 1e-2.
"""

from __future__ import annotations

import os

import pytest
import torch

from sglang_vlora.atmm import ops, split_k
from sglang_vlora.atmm.static_items import StaticWorkItems
from sglang_vlora.atmm.work_items import build_work_items
from tests.kernels.lora_reference import launch_apply, ref_delta, rel_err

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available() or os.environ.get("TRITON_INTERPRET") == "1",
    reason="needs a CUDA GPU and compiled Triton",
)

RANKS = [0, 8, 16, 64, 128]  # mixed ranks in one pool; slot 0 is the no-adapter slot
BF16_TOL = 1e-2


def pool(d_in: int, offsets: list[int], gen: torch.Generator):
    s, max_rank = len(offsets) - 1, max(RANKS)
    a = torch.randn(len(RANKS), s * max_rank, d_in, generator=gen) / d_in**0.5
    b = torch.randn(len(RANKS), offsets[-1], max_rank, generator=gen) / max_rank**0.5
    return a.cuda().bfloat16(), b.cuda().bfloat16()


def delta_fp64(x, a, b, offsets, starts, lens, slots, scales, perm=None):
    return ref_delta(x, a, b, offsets, RANKS, starts, lens, slots, scales, perm)


@pytest.mark.parametrize(
    "offsets", [[0, 4096], [0, 4096, 4608, 5120], [0, 11008, 22016]], ids=["o", "qkv", "gate_up"]
)
@pytest.mark.parametrize("n_tokens", [1, 7, 64, 300, 2048])
def test_bf16_mixed_ranks(offsets: list[int], n_tokens: int) -> None:
    gen = torch.Generator().manual_seed(n_tokens + len(offsets))
    d_in = 4096
    a, b = pool(d_in, offsets, gen)
    x = torch.randn(n_tokens, d_in, generator=gen).cuda().bfloat16()
    cut = [0, n_tokens // 3, n_tokens // 2, n_tokens]
    starts = [cut[0], cut[1], cut[2], 0]
    lens = [cut[1] - cut[0], cut[2] - cut[1], cut[3] - cut[2], n_tokens]
    slots, scales = [1, 4, 3, 2], [0.5, 2.0, -1.0, -0.25]  # last item overlaps all
    perm = torch.randperm(n_tokens, generator=gen).cuda()
    items = build_work_items(starts, lens, slots, scales, RANKS, device="cuda", permutation=perm)
    base = torch.randn(n_tokens, offsets[-1], generator=gen).cuda().bfloat16()
    out = ops.lora_apply(x, a, b, items, offsets, base.clone())
    ref = delta_fp64(x, a, b, offsets, starts, lens, slots, scales, perm)
    assert rel_err(out.float() - base.float(), ref) < BF16_TOL
    inter = ops.lora_shrink(x, a, items, len(offsets) - 1)
    out2 = ops.lora_expand(inter, b, items, offsets, base.clone())
    assert rel_err(out2.float() - base.float(), ref) < BF16_TOL


def test_graph_replay_with_other_items() -> None:
    """Capture once, refill with 1..5 adapters, overlap and an empty batch, replay."""
    gen = torch.Generator().manual_seed(7)
    offsets = [0, 4096, 4608, 5120]
    n_tokens, d_in = 32, 4096
    a, b = pool(d_in, offsets, gen)
    static = StaticWorkItems.allocate(8, n_tokens, len(RANKS), "cuda", max_layers=2)
    x = torch.zeros(n_tokens, d_in, device="cuda", dtype=torch.bfloat16)
    out = torch.zeros(n_tokens, offsets[-1], device="cuda", dtype=torch.bfloat16)
    first = build_work_items([0], [n_tokens], [1], [1.0], RANKS, device="cuda")
    static.fill(first, n_tokens)
    ops.lora_apply_static(x, a, b, static, offsets, out)  # compile outside capture
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        ops.lora_apply_static(x, a, b, static, offsets, out)
    # the overlapped entry point: shrink on a side stream next to a "base GEMM"
    side = torch.cuda.Stream()
    out2 = torch.zeros_like(out)
    base2 = torch.zeros_like(out)

    def base_fn() -> torch.Tensor:
        return out2.copy_(base2)

    ops.lora_apply_static_with_base(x, a, b, static, offsets, base_fn, side)
    graph2 = torch.cuda.CUDAGraph()
    with torch.cuda.stream(stream), torch.cuda.graph(graph2, stream=stream):
        ops.lora_apply_static_with_base(x, a, b, static, offsets, base_fn, side)
    torch.cuda.synchronize()
    batches = [
        ([0, 8, 16, 24, 28], [8, 8, 8, 4, 4], [1, 2, 3, 4, 1], [1.0, 0.5, 2.0, 1.0, -1.0]),
        ([0], [n_tokens], [4], [1.0]),
        ([], [], [], []),
        ([0, 0, 20], [20, 20, 12], [2, 3, 4], [1.0, -1.0, 0.5]),  # mixture: overlap
        ([3], [5], [3], [1.0]),
    ]
    for starts, lens, slots, scales in batches:
        perm = torch.randperm(n_tokens, generator=gen).cuda()
        items = build_work_items(starts, lens, slots, scales, RANKS, device="cuda", permutation=perm)
        static.fill(items, n_tokens)
        x.copy_(torch.randn(n_tokens, d_in, generator=gen).bfloat16())
        base = torch.randn(n_tokens, offsets[-1], generator=gen).bfloat16()
        out.copy_(base)
        base2.copy_(base)
        graph.replay()
        graph2.replay()
        torch.cuda.synchronize()
        ref = delta_fp64(x, a, b, offsets, starts, lens, slots, scales, perm)
        for result in (out, out2):
            if not starts:
                assert torch.equal(result.cpu(), base)
            else:
                assert rel_err(result.float().cpu() - base.float(), ref) < BF16_TOL, (starts, lens)


# ---- the CUDA C++ implementation (sglang_vlora.atmm.cuda_ext) ---------------------------


@pytest.fixture(scope="module")
def cuda_mod():
    """The built extension; a build failure fails the tests (with the build error)."""
    from sglang_vlora.atmm import cuda_ext

    return cuda_ext.load()


def run_cuda(x, a, b, items, offsets, out, scfg, ecfg):
    """:func:`launch_apply` through the CUDA extension, its grids the items' exact row tiles."""
    from sglang_vlora.atmm import cuda_ext

    rows = tuple(cuda_ext.exact_row_tiles(items.seg_lens_host, cfg.block_m) for cfg in (scfg, ecfg))
    return launch_apply(cuda_ext, x, a, b, items, offsets, out, (scfg, ecfg), rows)


def check_shrink_rows(inter, x, a, items, num_slices, tol):
    """Each item's intermediate rows, first S*r columns, against fp64."""
    row = 0
    for i in range(items.num_items):
        n, slot = items.seg_lens_host[i], items.slots_host[i]
        width = num_slices * items.ranks_host[slot]
        start = items.seg_starts_host[i]
        pos = torch.arange(start, start + n)
        rows = pos if items.permutation is None else items.permutation.cpu()[pos]
        ref = x.double().cpu()[rows] @ a.double().cpu()[slot, :width].T
        assert rel_err(inter[row : row + n, :width], ref) < tol, i
        row += n


# items with an empty segment, a rank-0 slot, mixed ranks, negative scales and an item
# overlapping the others (mixture mode: two overlap layers)
def mixed_items(n_tokens: int):
    cut = [0, n_tokens // 3, n_tokens // 3, n_tokens // 2, n_tokens]
    starts = [cut[0], cut[1], cut[2], cut[3], 0, 0]
    lens = [cut[1] - cut[0], 0, cut[3] - cut[2], cut[4] - cut[3], n_tokens, n_tokens]
    slots = [1, 2, 4, 3, 2, 0]
    scales = [0.5, 1.0, 2.0, -1.0, -0.25, 1.0]
    return starts, lens, slots, scales


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=["bf16", "fp16"])
@pytest.mark.parametrize(
    "offsets", [[0, 4096], [0, 4096, 4608, 5120], [0, 11008, 22016]], ids=["o", "qkv", "gate_up"]
)
@pytest.mark.parametrize("n_tokens", [1, 7, 64, 300, 2048])
def test_cuda_impl_matches_fp64(cuda_mod, offsets: list[int], n_tokens: int, dtype: torch.dtype) -> None:
    gen = torch.Generator().manual_seed(n_tokens * 7 + len(offsets))
    d_in = 4096
    a, b = (t.to(dtype) for t in pool(d_in, offsets, gen))
    x = torch.randn(n_tokens, d_in, generator=gen).cuda().to(dtype)
    starts, lens, slots, scales = mixed_items(n_tokens)
    perm = torch.randperm(n_tokens, generator=gen).cuda()
    items = build_work_items(starts, lens, slots, scales, RANKS, device="cuda", permutation=perm)
    ref = ref_delta(x, a, b, offsets, RANKS, starts, lens, slots, scales, perm)
    base = torch.randn(n_tokens, offsets[-1], generator=gen).cuda().to(dtype)
    out = ops.lora_apply(x, a, b, items, offsets, base.clone(), impl="cuda")
    assert rel_err(out.float() - base.float(), ref) < BF16_TOL
    inter = ops.lora_shrink(x, a, items, len(offsets) - 1, impl="cuda")
    out2 = ops.lora_expand(inter, b, items, offsets, base.clone(), impl="cuda")
    assert rel_err(out2.float() - base.float(), ref) < BF16_TOL
    # the table's choice per shape (CUDA or Triton, mixed across shrink / expand) agrees too
    out3 = ops.lora_apply(x, a, b, items, offsets, base.clone())
    assert rel_err(out3.float() - base.float(), ref) < BF16_TOL


def _all_tile_configs():
    from sglang_vlora.atmm import tiling

    shrink = [tiling._cuda_shrink(t, split) for t in tiling.CUDA_SHRINK_TILES for split in (1, 3)]
    expand = [tiling._cuda_expand(t) for t in tiling.CUDA_EXPAND_TILES]
    return shrink, expand


def test_every_cuda_tile(cuda_mod) -> None:
    """Each compiled tile (shrink with and without split-K) on ragged, permuted,
    overlapping items over 3 slices; poisoned intermediate; rows of no item untouched."""
    from sglang_vlora.atmm import tiling

    assert [tuple(t) for t in cuda_mod.tiles("shrink")] == list(tiling.CUDA_SHRINK_TILES)
    assert [tuple(t) for t in cuda_mod.tiles("expand")] == list(tiling.CUDA_EXPAND_TILES)
    gen = torch.Generator().manual_seed(11)
    offsets = [0, 1024, 1280, 1536]
    d_in, n_tokens = 1024, 150
    a, b = pool(d_in, offsets, gen)
    x = torch.randn(n_tokens, d_in, generator=gen).cuda().bfloat16()
    starts, lens, slots, scales = (
        [0, 40, 40, 90, 10],
        [40, 0, 50, 50, 60],
        [1, 2, 4, 3, 2],
        [1.0, 1.0, -0.5, 2.0, -1.0],
    )
    perm = torch.randperm(n_tokens, generator=gen).cuda()
    items = build_work_items(starts, lens, slots, scales, RANKS, device="cuda", permutation=perm)
    ref = ref_delta(x, a, b, offsets, RANKS, starts, lens, slots, scales, perm)
    base = torch.randn(n_tokens, offsets[-1], generator=gen).cuda().bfloat16()
    untouched = torch.ones(n_tokens, dtype=torch.bool)
    untouched[perm.cpu()[torch.arange(0, 140)]] = False  # tokens 140..149 belong to no item
    shrink_cfgs, expand_cfgs = _all_tile_configs()
    for i, scfg in enumerate(shrink_cfgs):
        ecfg = expand_cfgs[i % len(expand_cfgs)]
        inter, out = run_cuda(x, a, b, items, offsets, base.clone(), scfg, ecfg)
        check_shrink_rows(inter, x, a, items, 3, BF16_TOL)
        assert rel_err(out.float() - base.float(), ref) < BF16_TOL, (scfg, ecfg)
        assert torch.equal(out[untouched.cuda()], base[untouched.cuda()])
        assert not split_k.split_counters(x.device).any()  # re-armed for the next launch
    for ecfg in expand_cfgs:
        _, out = run_cuda(x, a, b, items, offsets, base.clone(), shrink_cfgs[0], ecfg)
        assert rel_err(out.float() - base.float(), ref) < BF16_TOL, ecfg


def test_cuda_unaligned_and_odd_shapes(cuda_mod) -> None:
    """Ranks and d_in that are not multiples of 8, slice offsets not multiples of 8,
    strided x: the element-wise load / store paths."""
    gen = torch.Generator().manual_seed(12)
    ranks = [0, 12, 20, 5]
    offsets = [0, 100, 157, 203]
    d_in, n_tokens = 1001, 37
    a = (torch.randn(4, 3 * 20, d_in, generator=gen) / d_in**0.5).cuda().half()
    b = (torch.randn(4, offsets[-1], 20, generator=gen) / 20**0.5).cuda().half()
    x_wide = torch.randn(n_tokens, d_in + 3, generator=gen).cuda().half()
    x = x_wide[:, 1 : d_in + 1]  # row stride d_in + 3, base not 16-byte aligned
    starts, lens, slots, scales = [0, 10, 0, 30], [10, 20, 30, 7], [1, 2, 3, 1], [1.0, -2.0, 0.5, 1.5]
    items = build_work_items(starts, lens, slots, scales, ranks, device="cuda")
    ref = ref_delta(x, a, b, offsets, ranks, starts, lens, slots, scales)
    base = torch.randn(n_tokens, offsets[-1], generator=gen).cuda().half()
    for scfg, ecfg in zip(*(cfgs[::3] for cfgs in _all_tile_configs()), strict=False):
        inter, out = run_cuda(x, a, b, items, offsets, base.clone(), scfg, ecfg)
        check_shrink_rows(inter, x, a, items, 3, BF16_TOL)
        assert rel_err(out.float() - base.float(), ref) < BF16_TOL, (scfg, ecfg)


def test_cuda_under_graph_capture(cuda_mod) -> None:
    """The eager entry points with impl="cuda" capture and replay (same items)."""
    gen = torch.Generator().manual_seed(13)
    offsets = [0, 4096, 4608, 5120]
    a, b = pool(4096, offsets, gen)
    x = torch.randn(32, 4096, generator=gen).cuda().bfloat16()
    starts, lens, slots, scales = [0, 8, 16], [8, 8, 16], [1, 4, 3], [1.0, 0.5, -1.0]
    items = build_work_items(starts, lens, slots, scales, RANKS, device="cuda")
    out = torch.zeros(32, offsets[-1], device="cuda", dtype=torch.bfloat16)
    ops.lora_apply(x, a, b, items, offsets, out, impl="cuda")  # warm-up outside capture
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream), torch.cuda.graph(graph, stream=stream):
        ops.lora_apply(x, a, b, items, offsets, out, impl="cuda")
    ref = ref_delta(x, a, b, offsets, RANKS, starts, lens, slots, scales)
    for _ in range(2):
        out.zero_()
        graph.replay()
        torch.cuda.synchronize()
        assert rel_err(out.float(), ref) < BF16_TOL
