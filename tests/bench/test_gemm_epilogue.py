"""The LoRA-in-the-GEMM probe's kernels (bench/gemm_epilogue.py) under Triton's interpreter, in
fp32, against fp64: the plain GEMM, and the GEMM with the LoRA MMAs before and after its K
loop over tiles whose rows hold one, two and three slots, positions no item covers, a rank
below the pool's, three slices. Tolerance: relative Frobenius error 1e-5."""

import os

import pytest

torch = pytest.importorskip("torch")

from bench import gemm_epilogue  # noqa: E402
from sglang_vlora.atmm import gemm_lora  # noqa: E402
from sglang_vlora.atmm.work_items import build_work_items  # noqa: E402
from tests.kernels.lora_reference import ref_delta, rel_err  # noqa: E402
from tests.triton_interpreter import use_triton_interpreter  # noqa: E402

OFFSETS = [0, 32, 48, 64]
RANKS = [0, 16, 8, 16]
MAX_RANK = 16
SPEC = (16, 16, 16, 4, 1, False)  # block_m, block_n, block_k, warps, stages, persistent


@pytest.fixture(autouse=True)
def interpret(monkeypatch):
    use_triton_interpreter(monkeypatch)
    assert os.environ["TRITON_INTERPRET"] == "1"


def test_plain_gemm_matches_fp64():
    gen = torch.Generator().manual_seed(0)
    x, w = torch.randn(40, 64, generator=gen), torch.randn(48, 64, generator=gen)
    for spec in (SPEC, (16, 16, 16, 4, 1, True)):
        out = torch.empty(40, 48)
        gemm_epilogue.tma_gemm(x, w, out, spec, programs=4)
        assert rel_err(out, x.double() @ w.double().T) < 1e-5


@pytest.mark.parametrize("lora_first", [False, True])
def test_lora_in_the_gemm_matches_fp64(lora_first):
    gen = torch.Generator().manual_seed(1)
    m, k = 45, 64
    x, w = torch.randn(m, k, generator=gen), torch.randn(OFFSETS[-1], k, generator=gen)
    a = torch.randn(len(RANKS), 3 * MAX_RANK, k, generator=gen)
    b = torch.randn(len(RANKS), OFFSETS[-1], MAX_RANK, generator=gen)
    inter = (x @ a.reshape(-1, k).T).contiguous()  # every slot's shrink columns
    # rows 0-15: slots 1, 2, 3 in one tile; 16-31: slot 2 then nothing; 32-44: slot 0 (rank 0), then 1
    starts, lens, slots, scales = [0, 5, 9, 16, 35], [5, 4, 7, 6, 10], [1, 2, 3, 2, 1], [0.5, -1.0, 2.0, 1.5, 1.0]
    token_slots, token_scales = gemm_lora.token_maps(build_work_items(starts, lens, slots, scales, RANKS), m, "cpu")
    out = torch.empty(m, OFFSETS[-1])
    gemm_epilogue.tma_lora(x, w, out, inter, 3 * MAX_RANK, b, token_slots, token_scales,
                           torch.tensor(RANKS, dtype=torch.int32), OFFSETS, SPEC, lora_first)
    ref = x.double() @ w.double().T + ref_delta(x, a, b, OFFSETS, RANKS, starts, lens, slots, scales)
    assert rel_err(out, ref) < 1e-5
