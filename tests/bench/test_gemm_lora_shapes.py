"""bench/gemm_lora_shapes.py's GEMM call with a tile config other than the op's own, under
Triton's interpreter in fp32 against fp64: base + bias + the one adapter's LoRA over every
token, three slices. Tolerance: relative Frobenius error 1e-5."""

import itertools

import pytest

torch = pytest.importorskip("torch")

from bench import gemm_lora_shapes  # noqa: E402
from sglang_vlora.atmm import gemm_lora  # noqa: E402
from tests.triton_interpreter import use_triton_interpreter  # noqa: E402


def test_a_config_of_its_own_computes_the_module(monkeypatch):
    use_triton_interpreter(monkeypatch)
    monkeypatch.setattr(gemm_lora_shapes, "RANK", 8)
    gen = torch.Generator().manual_seed(0)
    m, k, widths = 40, 32, (32, 16, 16)
    offsets = [0, *itertools.accumulate(widths)]
    layer = {"w": torch.randn(offsets[-1], k, generator=gen), "bias": torch.randn(offsets[-1], generator=gen),
             "a": torch.randn(2, 3 * 8, k, generator=gen), "b": torch.randn(2, offsets[-1], 8, generator=gen)}
    x = torch.randn(m, k, generator=gen)
    config = gemm_lora.GemmConfig(block_m=16, block_n=16, block_k=16, group_m=2, num_warps=4, num_stages=1)
    call = gemm_lora_shapes._gemm_call(lambda: (x, layer), x, layer["a"], offsets, config)
    got = call().double()
    xd, ad, bd = x.double(), layer["a"].double(), layer["b"].double()
    ref = xd @ layer["w"].double().T + layer["bias"].double()
    for s in range(3):
        lo, hi = offsets[s], offsets[s + 1]
        ref[:, lo:hi] += gemm_lora_shapes.SCALE * (xd @ ad[1, s * 8 : (s + 1) * 8].T) @ bd[1, lo:hi].T
    assert ((got - ref).norm() / ref.norm()).item() < 1e-5
