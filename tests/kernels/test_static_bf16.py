"""The graph-safe entry points (``ops.lora_apply_static``, ``ops.lora_apply_static_in_gemm``)
in half precision under Triton's interpreter, against fp64 from the same rounded inputs.

Triton 3.8's interpreter stores bfloat16 as uint16 and its ``tl.dot`` converts only 8-bit
float operands before ``np.matmul``, so a bf16 ``tl.dot`` multiplies the raw bit patterns
(1.0 is 0x3F80 = 16256): the kernels' bf16 results come out near 1e10. Every other bf16
operation the kernels use (masked loads, ``tl.where``, casts, stores) is emulated right,
and fp16, which takes the same kernel code, is right with the stock interpreter. The
bf16 cases therefore run with the interpreter's dot corrected for bf16 operands (widened
to fp32 exactly, as a GPU's bf16 dot multiplies them, fp32 accumulation); the first test
pins the limitation, so it fails once Triton fixes it and the correction can go.

Tolerance: relative Frobenius error of the whole output, fp16 2e-3, bf16 2e-2 (the
intermediate is rounded to the activation dtype: about 2^-11 and 2^-8 per element).
"""

from __future__ import annotations

import pytest
import torch
import triton
import triton.language as tl
from triton.runtime import interpreter

from sglang_vlora.atmm import ops
from sglang_vlora.atmm.static_items import StaticWorkItems
from sglang_vlora.atmm.work_items import build_work_items
from tests.kernels.lora_reference import ref_delta, rel_err
from tests.triton_interpreter import use_triton_interpreter

TOL = {torch.float16: 2e-3, torch.bfloat16: 2e-2}
D_IN = 64
MAX_RANK = 16
RANKS = [8, 16, 12, 1]  # the pool's max rank and below it (the expand's partial K tile)
SCALES = [0.5, -1.0, 2.0, 1.5]


@pytest.fixture(autouse=True)
def interpret(monkeypatch) -> None:
    """The static ops take the Triton kernels on CPU tensors only under the interpreter."""
    use_triton_interpreter(monkeypatch)


@pytest.fixture
def bf16_dot(monkeypatch) -> None:
    """The interpreter's ``tl.dot`` with bf16 operands widened to fp32 first."""
    stock = interpreter.InterpreterBuilder.create_dot

    def create_dot(self, a, b, *rest):
        a, b = (self.cast_impl(t, tl.float32) if t.dtype.scalar == tl.bfloat16 else t for t in (a, b))
        return stock(self, a, b, *rest)

    monkeypatch.setattr(interpreter.InterpreterBuilder, "create_dot", create_dot)


@triton.jit
def _dot_kernel(a_ptr, b_ptr, c_ptr, N: tl.constexpr):
    offs = tl.arange(0, N)
    tile = offs[:, None] * N + offs[None, :]
    tl.store(c_ptr + tile, tl.dot(tl.load(a_ptr + tile), tl.load(b_ptr + tile)))


def _dot(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    c = torch.empty(a.shape, dtype=torch.float32)
    _dot_kernel[(1,)](a, b, c, a.shape[0])
    return c


def _small_integers(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Two 16x16 tiles of integers in [-2, 2]: exact in every dtype, so is their product."""
    gen = torch.Generator().manual_seed(0)
    return tuple(torch.randint(-2, 3, (16, 16), generator=gen).to(dtype) for _ in range(2))


def test_interpreter_bf16_dot_multiplies_bit_patterns() -> None:
    a, b = _small_integers(torch.bfloat16)
    bits = [t.view(torch.int16).to(torch.float64) % 65536 for t in (a, b)]  # as uint16
    assert torch.allclose(_dot(a, b).double(), bits[0] @ bits[1], rtol=1e-6)
    a, b = _small_integers(torch.float16)
    assert torch.equal(_dot(a, b), a.float() @ b.float())


def test_corrected_bf16_dot_is_exact(bf16_dot) -> None:
    a, b = _small_integers(torch.bfloat16)
    assert torch.equal(_dot(a, b), a.float() @ b.float())


# (output widths, segment starts, lengths, slots): decode (one token per request) and prefill;
# the last tokens belong to no item (base only; copy items in the shrink-in-GEMM layout)
BATCHES = {
    "decode": ((64,), [0, 2, 4, 5], [2, 2, 1, 2], [0, 1, 2, 3]),
    "decode_qkv": ((64, 16, 16), [0, 2, 4, 5], [2, 2, 1, 2], [0, 1, 2, 3]),
    "prefill": ((64,), [0, 20], [20, 26], [1, 2]),
    "prefill_qkv": ((64, 16, 16), [0, 20], [20, 26], [2, 3]),
}
TOKENS = {"decode": 8, "decode_qkv": 8, "prefill": 48, "prefill_qkv": 48}


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=["fp16", "bf16"])
@pytest.mark.parametrize("in_gemm", [False, True], ids=["separate_shrink", "in_gemm"])
@pytest.mark.parametrize("batch", list(BATCHES))
def test_static_apply_matches_fp64(dtype, in_gemm, batch, request) -> None:
    if dtype == torch.bfloat16:
        request.getfixturevalue("bf16_dot")
    widths, starts, lens, slots = BATCHES[batch]
    offsets = [0]
    for w in widths:
        offsets.append(offsets[-1] + w)
    n, s = TOKENS[batch], len(widths)
    gen = torch.Generator().manual_seed(len(offsets) * n)
    x = torch.randn(n, D_IN, generator=gen).to(dtype)
    w = (torch.randn(offsets[-1], D_IN, generator=gen) / D_IN**0.5).to(dtype)
    a = (torch.randn(len(RANKS), s * MAX_RANK, D_IN, generator=gen) / D_IN**0.5).to(dtype)
    b = (torch.randn(len(RANKS), offsets[-1], MAX_RANK, generator=gen) / MAX_RANK**0.5).to(dtype)
    scales = SCALES[: len(slots)]
    static = StaticWorkItems.allocate(8, n, len(RANKS), "cpu", covers_tokens=in_gemm)
    static.fill(build_work_items(starts, lens, slots, scales, RANKS), n)
    delta = ref_delta(x, a, b, offsets, RANKS, starts, lens, slots, scales)
    if in_gemm:
        w_ext = torch.cat([w, a.reshape(-1, D_IN)])
        out = ops.lora_apply_static_in_gemm(x, w_ext, None, offsets[-1], b, static, offsets)
        ref = x.double() @ w.double().T + delta
    else:
        out = x @ w.T
        ref = out.double() + delta
        ops.lora_apply_static(x, a, b, static, offsets, out)
    assert rel_err(out, ref) < TOL[dtype]
