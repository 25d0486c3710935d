"""The switch kernels compiled ahead (``fold_kernel.compile_ahead``, what the mode controller
runs at start-up) are the variants the switcher's merges, switches and unmerges launch: on CPU,
by the specialisation key of every launch (what Triton compiles one kernel per), recorded
instead of run. The model's shapes are the benchmark's (Qwen2-VL-7B: q/k/v/o of 3584 wide)."""

from __future__ import annotations

import pytest
import torch

from sglang_vlora.modes import fold_kernel
from sglang_vlora.modes.switcher import LoRADelta, SwiftSwitcher, slice_kinds

HIDDEN, KV, LAYERS = 3584, 512, 2


def _key(value):
    """Triton's specialisation of one argument: tensors by dtype and 16-byte alignment,
    integers by ``== 1`` and divisibility by 16, floats by type."""
    if isinstance(value, torch.Tensor):
        return "tensor", value.dtype, value.data_ptr() % 16 == 0
    if isinstance(value, bool):
        return "bool", value
    if isinstance(value, int):
        return "int", value == 1, value % 16 == 0
    return type(value).__name__


class _Recorder:
    """Stands in for the Triton kernel: records each launch's and each warm-up's key."""

    def __init__(self):
        self.launched: set[tuple] = set()
        self.compiled: set[tuple] = set()

    @staticmethod
    def _signature(args, kwargs) -> tuple:
        return tuple(map(_key, args)), tuple(sorted(kwargs.items()))

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.launched.add(self._signature(args, kwargs))

    def warmup(self, *args, grid, **kwargs):
        self.compiled.add(self._signature(args, kwargs))


@pytest.fixture
def kernel(monkeypatch) -> _Recorder:
    recorder = _Recorder()
    monkeypatch.setattr(fold_kernel, "_fold_kernel", recorder)
    return recorder


def _delta(kind: torch.Tensor, rank: int, seed: int) -> LoRADelta:
    g = torch.Generator().manual_seed(seed)
    layers, out, inp = kind.shape
    # as the controller's deltas_from_pool makes them: contiguous stacks of the pool's rows
    return LoRADelta(a=torch.randn(layers, rank, inp, generator=g).to(kind.dtype),
                     b=torch.randn(layers, out, rank, generator=g).to(kind.dtype), scaling=0.5)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_switches_launch_only_the_variants_compiled_ahead(kernel, dtype) -> None:
    qkv = torch.zeros(LAYERS, HIDDEN + 2 * KV, HIDDEN, dtype=dtype)
    kinds = {**slice_kinds(qkv, ["qkv_proj.0", "qkv_proj.1", "qkv_proj.2"], [0, HIDDEN, HIDDEN + KV, HIDDEN + 2 * KV]),
             "o_proj.0": torch.zeros(LAYERS, HIDDEN, HIDDEN, dtype=dtype)}
    ranks = (8, 64)
    for weights in kinds.values():  # what ModeController.compile_switch_ahead runs
        fold_kernel.compile_ahead(weights, ranks)
    switcher = SwiftSwitcher(kinds, exact=True, kernel="triton")
    assert {k._kinds[name].path for k in [switcher] for name in kinds} == {"fold"}
    for i, rank in enumerate(ranks):
        switcher.add_adapter(f"r{rank}", {name: _delta(w, rank, i) for name, w in kinds.items()})
    switcher.switch("r8")  # a merge from the base weights (src: the weights themselves)
    switcher.switch("r64")  # a switch (src: the pristine copy)
    switcher.switch(None)  # an unmerge (the copy back)
    switcher.switch("r64")
    assert kernel.launched, "the switcher launched nothing: not the fold path"
    assert {dict(sig[1])["ADD_LORA"] for sig in kernel.launched} == {True, False}  # folds and the copy
    missing = kernel.launched - kernel.compiled
    assert not missing, f"{len(missing)} launched variant(s) not compiled ahead"


def test_compile_ahead_refuses_a_rank_below_one(kernel) -> None:
    with pytest.raises(ValueError, match="positive"):
        fold_kernel.compile_ahead(torch.zeros(1, 16, 16), [0])


class _CompilingKernel(_Recorder):
    """Stands in for the Triton kernel on a GPU: a launch or a warm-up of a new
    specialisation compiles it (grows ``device_caches`` as Triton does)."""

    __name__ = "_fold_kernel"

    def __init__(self):
        super().__init__()
        self.device_caches = {0: ({}, None, None, None, None)}

    def __getitem__(self, grid):
        def run(*args, **kwargs):
            self.device_caches[0][0].setdefault(self._signature(args, kwargs), object())

        return run

    def warmup(self, *args, grid, **kwargs):
        self.device_caches[0][0].setdefault(self._signature(args, kwargs), object())


def test_a_switch_that_compiles_shows_in_kernel_compiles(monkeypatch) -> None:
    """A fold variant not compiled ahead (an adapter of another rank) compiles at its switch,
    while serving: counted in ``/vlora/status`` ``kernel_compiles`` with its variant, as the
    ATMM kernels' compiles are; the variants compiled ahead count nothing."""
    from sglang_vlora.atmm import launch_compiles

    counts = launch_compiles.LaunchCompiles()
    monkeypatch.setattr(launch_compiles, "LAUNCH_COMPILES", counts)
    monkeypatch.setattr(fold_kernel, "_fold_kernel", _CompilingKernel())
    o = torch.zeros(LAYERS, HIDDEN, HIDDEN, dtype=torch.bfloat16)
    fold_kernel.compile_ahead(o, [8])
    switcher = SwiftSwitcher({"o_proj.0": o}, exact=True, kernel="triton")
    switcher.add_adapter("r8", {"o_proj.0": _delta(o, 8, 0)})
    switcher.add_adapter("r32", {"o_proj.0": _delta(o, 32, 1)})
    switcher.switch("r8")
    switcher.switch(None)
    assert counts.snapshot()["count"] == 0
    switcher.switch("r32")  # rank 32 was not compiled ahead
    snap = counts.snapshot()
    assert snap["count"] == 1 and snap["by_kernel"] == {"_fold_kernel": 1}
    (variant,) = snap["by_variant"]
    assert "BLOCK_R=32 ADD_LORA=1" in variant and variant.endswith("w4 s3")
