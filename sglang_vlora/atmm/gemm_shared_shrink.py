"""ATMM's own base GEMM with the shrink shared by the output tiles of each row tile.

:mod:`sglang_vlora.atmm.gemm_lora` adds each token's LoRA delta inside the GEMM's accumulator,
but needs the shrink (``x A^T``) first, from a launch of its own that reads the whole input
again: at 1024 tokens that launch was most of the op's cost over the base GEMM (docs/atmm.md).
Here the output tiles compute the shrink from input tiles they load anyway. The first
``producers`` column tiles of each slice each take one chunk of the K steps. In those steps
they add one more MMA, ``x[rows, chunk] @ A[slot, slice, :, chunk]^T``, into a rank-wide
accumulator (their K loop starts at their chunk, so this is done first). They add the partial
sums to an fp32 scratch atomically and then count themselves in. Each tile of the slice finishes
its own K loop, waits for that count, reads the row tile's shrink from the scratch and adds
``scale * shrink @ B^T`` before it stores its tile. The last tile of the slice to read the
scratch zeroes its rows and the counts. The state is then clean for the next launch, with no
launch of its own to reset it.

A tile waits only for the producers of its own row tile and slice, which come before every
other column tile of the slice in the launch order. A tile whose count is not complete after
``max_polls`` polls computes the shrink of its rows itself (a whole K loop more). So nothing
waits without bound and no launch order or co-residency is assumed.

The partial sums are added in the order they arrive, so the shrink's last fp32 bits (before it
is rounded to the input's dtype for the expand MMA) may differ between runs. Launches must not
run concurrently on several streams of one device: they share the device's scratch.

What it needs is what :func:`gemm_lora.unsupported` checks, plus the pool's A rows 16-byte
aligned (the A tiles come through a tensor descriptor).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from sglang_vlora.atmm import gemm_lora
from sglang_vlora.atmm.fast_launch import FastLauncher
from sglang_vlora.atmm.gemm_lora import GemmConfig, config_for, tile_origin

# Column tiles per slice that compute the shrink. At 16, a 4096-wide slice's tiles at K = 4096
# (64 steps of 64) each add 4 steps of a rank-64 MMA: 1.6% of their MMA work.
PRODUCERS = 16
# Polls of a row tile's count before a tile computes the shrink itself (one poll is one atomic
# round trip to L2, well under a microsecond; the producers are due a few K steps into their loop).
MAX_POLLS = 1024
MAX_SLICES = 3


@triton.jit
def proxy_fence(ON: tl.constexpr):
    """``fence.proxy.async.global``: orders the generic proxy's accesses (the producers' atomic
    adds, seen through the count) before this thread's tensor-descriptor loads (the async proxy),
    which the memory model does not order otherwise. Off under Triton's interpreter (no PTX)."""
    if ON:
        tl.inline_asm_elementwise("fence.proxy.async.global; mov.u32 $0, 0;", "=r", [], dtype=tl.int32,
                                  is_pure=False, pack=1)


@triton.jit
def rows_shrink(x_desc, a_desc, row0, a_row, rank, k0, steps, n_k, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr,
                R_BLOCK: tl.constexpr):
    """fp32 ``x[row0 : row0 + BLOCK_M, steps from k0] @ A[a_row : a_row + rank, same]^T`` as
    ``[BLOCK_M, R_BLOCK]``, the columns past ``rank`` (the pool's next slice or slot) zeroed."""
    acc = tl.zeros((BLOCK_M, R_BLOCK), dtype=tl.float32)
    for i in range(0, steps):
        kk = ((k0 + i) % n_k) * BLOCK_K
        acc = tl.dot(x_desc.load([row0, kk]), a_desc.load([a_row, kk]).T, acc)
    return tl.where(tl.arange(0, R_BLOCK)[None, :] < rank, acc, 0.0)


@triton.jit
def add_partial(scratch_ptr, part, rows, valid, mine, rank, s, R_BLOCK: tl.constexpr, MAX_SLICES: tl.constexpr):
    """Adds ``part`` into the scratch at the tile's rows of one slot (``mine``), slice ``s``."""
    offs_r = tl.arange(0, R_BLOCK)
    ptrs = scratch_ptr + rows[:, None] * (MAX_SLICES * R_BLOCK) + s * R_BLOCK + offs_r[None, :]
    keep = (valid & mine)[:, None] & (offs_r[None, :] < rank)
    tl.atomic_add(ptrs, part, mask=keep, sem="relaxed")


@triton.jit
def expand_into(acc, shrink, bb_desc, slot, slots, scales, ranks_ptr, col0, N, R_BLOCK: tl.constexpr,
                DTYPE: tl.constexpr):
    """``acc + scale * shrink @ B^T`` over the tile's rows of ``slot`` (the other rows, and the
    columns past the slot's rank, masked to zero)."""
    offs_r = tl.arange(0, R_BLOCK)
    rank = tl.load(ranks_ptr + slot)
    keep = (slots == slot)[:, None] & (offs_r[None, :] < rank)
    part_i = tl.where(keep, shrink * scales[:, None], 0.0).to(DTYPE)
    part_b = bb_desc.load([slot * N + col0, 0])
    part_b = tl.where(offs_r[None, :] < rank, part_b, 0.0).to(DTYPE)
    return tl.dot(part_i, part_b.T, acc)


# M changes with every batch: not specialised, so one compiled variant per module shape serves
# every batch.
@triton.jit(do_not_specialize=("M",))
def _gemm_shared_shrink_kernel(x_desc, w_desc, out_desc, a_desc, bb_desc, s_desc, scratch_ptr, counts_ptr, bias_ptr,
                               tok_slots_ptr, tok_scales_ptr, ranks_ptr, M, N, K, off1, off2, a_slot_rows, producers,
                               max_polls, HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                               BLOCK_K: tl.constexpr, R_BLOCK: tl.constexpr, GROUP_M: tl.constexpr,
                               MAX_SLICES: tl.constexpr, PROXY_FENCE: tl.constexpr):
    """One output tile (see the module's docstring). ``counts_ptr``: per (row tile, slice) the
    producers counted in, then the tiles that have read the shrink; zero between launches."""
    row0, col0 = tile_origin(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    dtype = out_desc.dtype
    rows = row0 + tl.arange(0, BLOCK_M)
    valid = rows < M
    slots = tl.load(tok_slots_ptr + rows, mask=valid, other=-1)
    scales = tl.load(tok_scales_ptr + rows, mask=valid, other=0.0)
    s = (col0 >= off1).to(tl.int32) + (col0 >= off2).to(tl.int32)  # the tile's slice
    slice_start = tl.where(s == 0, 0, tl.where(s == 1, off1, off2))
    slice_end = tl.where(s == 0, off1, tl.where(s == 1, off2, N))
    slice_tiles = tl.cdiv(slice_end - slice_start, BLOCK_N)
    column = (col0 - slice_start) // BLOCK_N  # the tile's column within its slice
    slice_producers = tl.minimum(slice_tiles, producers)
    n_k = tl.cdiv(K, BLOCK_K)
    chunk = tl.cdiv(n_k, slice_producers)
    lo = tl.min(tl.where(slots >= 0, slots, 1 << 30))
    hi = tl.max(slots)
    has_lora = hi >= 0
    producing = has_lora & (column < slice_producers)
    k0 = tl.where(producing, column * chunk, 0)
    steps = tl.where(producing, tl.maximum(tl.minimum(chunk, n_k - k0), 0), 0)

    # The producers' share of the shrink first, while the GEMM's accumulator is not live yet
    # (both at once spill at 8 warps of 128x256 tiles): added and counted before the K loop.
    counts = counts_ptr + ((row0 // BLOCK_M) * MAX_SLICES + s) * 2
    if steps > 0:
        for slot in range(lo, hi + 1):
            rank = tl.load(ranks_ptr + slot)
            mine = slots == slot
            if tl.max(mine.to(tl.int32)) > 0:
                part = rows_shrink(x_desc, a_desc, row0, slot * a_slot_rows + s * rank, rank, k0, steps, n_k,
                                   BLOCK_M, BLOCK_K, R_BLOCK)
                add_partial(scratch_ptr, part, rows, valid, mine, rank, s, R_BLOCK, MAX_SLICES)
        tl.debug_barrier()  # every thread's adds before the count (CUTLASS's semaphore pattern)
        tl.atomic_add(counts, 1, sem="release")
    # The K loop from the chunk on: its input tiles were just read, so are in L2.
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for i in range(0, n_k):
        kk = ((k0 + i) % n_k) * BLOCK_K
        acc = tl.dot(x_desc.load([row0, kk]), w_desc.load([col0, kk]).T, acc)

    if has_lora:
        counted = tl.atomic_add(counts, 0, sem="acquire")
        polls = 0
        while (counted < slice_producers) & (polls < max_polls):
            counted = tl.atomic_add(counts, 0, sem="acquire")
            polls += 1
        tl.debug_barrier()
        if counted >= slice_producers:
            proxy_fence(PROXY_FENCE)
            shrink = s_desc.load([row0, s * R_BLOCK])
        else:  # the producers are late: this tile's rows' shrink over the whole K loop, here
            shrink = tl.zeros((BLOCK_M, R_BLOCK), dtype=tl.float32)
            for slot in range(lo, hi + 1):
                rank = tl.load(ranks_ptr + slot)
                mine = slots == slot
                if tl.max(mine.to(tl.int32)) > 0:
                    part = rows_shrink(x_desc, a_desc, row0, slot * a_slot_rows + s * rank, rank, 0, n_k, n_k,
                                       BLOCK_M, BLOCK_K, R_BLOCK)
                    shrink = tl.where(mine[:, None], part, shrink)
        acc = expand_into(acc, shrink, bb_desc, lo, slots, scales, ranks_ptr, col0, N, R_BLOCK, dtype)
        if hi > lo:
            acc = expand_into(acc, shrink, bb_desc, hi, slots, scales, ranks_ptr, col0, N, R_BLOCK, dtype)
            for slot in range(lo + 1, hi):
                acc = expand_into(acc, shrink, bb_desc, slot, slots, scales, ranks_ptr, col0, N, R_BLOCK, dtype)
        tl.debug_barrier()  # every thread's read of the scratch before this tile counts out
        if tl.atomic_add(counts + 1, 1, sem="acq_rel") == slice_tiles - 1:
            s_desc.store([row0, s * R_BLOCK], tl.zeros((BLOCK_M, R_BLOCK), dtype=tl.float32))
            tl.atomic_xchg(counts, 0, sem="relaxed")
            tl.atomic_xchg(counts + 1, 0, sem="relaxed")
    if HAS_BIAS:
        cols = col0 + tl.arange(0, BLOCK_N)
        acc += tl.load(bias_ptr + cols, mask=cols < N, other=0.0).to(tl.float32)[None, :]
    out_desc.store([row0, col0], acc.to(dtype))


_STATE: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = {}


def shared_state(device: torch.device, rows: int, rank_block: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The device's ``(scratch, counts)`` for at least ``rows`` tokens: fp32
    ``[rows, MAX_SLICES * rank_block]`` and int32 per (row tile of 16 rows or more, slice) two
    counts, zero at rest (each launch leaves them so). Grown, zeroed, where too small: the first
    call for a size must not be inside CUDA-graph capture."""
    scratch, counts = _STATE.get(device, (None, None))
    width = MAX_SLICES * rank_block
    if scratch is None or scratch.shape[0] < rows or scratch.shape[1] != width:
        rows = max(rows, scratch.shape[0] if scratch is not None else 0)
        scratch = torch.zeros((rows, width), dtype=torch.float32, device=device)
        counts = torch.zeros(triton.cdiv(rows, 16) * MAX_SLICES * 2, dtype=torch.int32, device=device)
        _STATE[device] = scratch, counts
    return scratch, counts


def unsupported(a_buffer: torch.Tensor) -> str | None:
    """What this kernel needs beyond :func:`gemm_lora.unsupported`, or None."""
    if not a_buffer.is_contiguous() or (a_buffer.shape[2] * a_buffer.element_size()) % 16:
        return "an A pool that is not contiguous with 16-byte aligned rows"
    return None


def launch(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, a_buffer: torch.Tensor,
           b_buffer: torch.Tensor, token_slots: torch.Tensor, token_scales: torch.Tensor, ranks: torch.Tensor,
           slice_offsets: list[int], out: torch.Tensor, config: GemmConfig | None = None,
           producers: int = PRODUCERS, max_polls: int = MAX_POLLS, compile_only: bool = False) -> torch.Tensor:
    """``out = x @ weight.T (+ bias) + LoRA``, the shrink computed inside (no ``inter``):
    ``a_buffer`` ``[slots, S * max_rank, K]`` (slice ``s`` of a slot at row ``s * rank``),
    ``b_buffer`` ``[slots, N, max_rank]``, the token maps of :func:`gemm_lora.token_maps`.
    Returns ``out``. ``compile_only``: compile the kernel these arguments select, launch nothing."""
    m, k = x.shape
    n = weight.shape[0]
    config = config or config_for(b_buffer.shape[2])
    rank_block = max(16, triton.next_power_of_2(b_buffer.shape[2]))
    offs = [int(o) for o in slice_offsets] + [n] * (4 - len(slice_offsets))
    scratch, counts = shared_state(x.device, max(m, 1), rank_block)
    grid = (triton.cdiv(m, config.block_m) * triton.cdiv(n, config.block_n),)
    args = (
        TensorDescriptor.from_tensor(x, [config.block_m, config.block_k]),
        TensorDescriptor.from_tensor(weight, [config.block_n, config.block_k]),
        TensorDescriptor.from_tensor(out, [config.block_m, config.block_n]),
        TensorDescriptor.from_tensor(a_buffer.view(-1, k), [rank_block, config.block_k]),
        TensorDescriptor.from_tensor(b_buffer.view(-1, b_buffer.shape[2]), [config.block_n, rank_block]),
        TensorDescriptor.from_tensor(scratch, [config.block_m, rank_block]),
        scratch, counts, bias if bias is not None else out, token_slots, token_scales, ranks, m, n, k, offs[1],
        offs[2], a_buffer.shape[1], producers, max_polls,
    )
    constexprs = {"HAS_BIAS": bias is not None, "BLOCK_M": config.block_m, "BLOCK_N": config.block_n,
                  "BLOCK_K": config.block_k, "R_BLOCK": rank_block, "GROUP_M": config.group_m,
                  "MAX_SLICES": MAX_SLICES, "PROXY_FENCE": x.is_cuda}
    if compile_only:
        _gemm_shared_shrink_kernel.warmup(*args, grid=grid, **constexprs, num_warps=config.num_warps,
                                          num_stages=config.num_stages)
    else:
        _LAUNCHER(grid, args, constexprs, config.num_warps, config.num_stages)
    return out


_LAUNCHER = FastLauncher(_gemm_shared_shrink_kernel)


def compile_ahead(x: torch.Tensor, a_buffer: torch.Tensor, b_buffer: torch.Tensor, slice_offsets: list[int],
                  has_bias: bool) -> bool:
    """Compile, launching nothing, the kernel :func:`launch` runs for a module of this shape
    (``x``: any rows of its input's width and dtype; the pools as served): a server whose
    prefills replay CUDA graphs would otherwise compile it at its first large eager batch, in
    a user's request. False where the op cannot run these operands (nothing to compile)."""
    n, m = slice_offsets[-1], 16
    weight = torch.empty((n, x.shape[1]), dtype=x.dtype, device=x.device)
    if gemm_lora.unsupported(x, weight, b_buffer, slice_offsets) is not None or unsupported(a_buffer) is not None:
        return False
    maps = torch.empty(m, dtype=torch.int32, device=x.device), torch.empty(m, dtype=torch.float32, device=x.device)
    ranks = torch.empty(b_buffer.shape[0], dtype=torch.int32, device=x.device)
    bias = torch.empty(n, dtype=x.dtype, device=x.device) if has_bias else None
    out = torch.empty((m, n), dtype=x.dtype, device=x.device)
    launch(x[:m], weight, bias, a_buffer, b_buffer, *maps, ranks, slice_offsets, out, compile_only=True)
    return True
