"""FastLauncher's argument checks and cache key (the GPU path is in tests/gpu)."""

from __future__ import annotations

import os

import pytest
import torch
import triton
import triton.language as tl

from sglang_vlora.atmm.fast_launch import FastLauncher, _arg_key


@triton.jit
def _copy(src_ptr, dst_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(dst_ptr + offs, tl.load(src_ptr + offs, mask=offs < n), mask=offs < n)


@triton.jit
def _copy_pdl(src_ptr, dst_ptr, n, BLOCK: tl.constexpr, USE_PDL: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(dst_ptr + offs, tl.load(src_ptr + offs, mask=offs < n), mask=offs < n)


@triton.jit
def _constexpr_first(BLOCK: tl.constexpr, dst_ptr):
    tl.store(dst_ptr + tl.arange(0, BLOCK), tl.zeros((BLOCK,), tl.float32))


def test_constexprs_must_come_last() -> None:
    assert FastLauncher(_copy).constexpr_names == ("BLOCK",)
    with pytest.raises(ValueError, match="constexpr parameters must come last"):
        FastLauncher(_constexpr_first)


def test_arguments_are_checked() -> None:
    launch = FastLauncher(_copy)
    src = torch.arange(8, dtype=torch.float32)
    with pytest.raises(TypeError, match="takes 3 runtime arguments"):
        launch((1,), (src, src), {"BLOCK": 8}, 4, 2)
    with pytest.raises(TypeError, match="BLOCK"):
        launch((1,), (src, src, 8), {"SIZE": 8}, 4, 2)


def test_key_is_at_least_tritons_specialisation() -> None:
    # integers: 1, multiples of 16 and the integer type are told apart, as Triton does
    assert len({_arg_key(v) for v in (1, 2, 16, 32, 2**31, 2**63)}) == 5
    assert _arg_key(16) == _arg_key(32) and _arg_key(3) == _arg_key(5)
    t = torch.zeros(8, dtype=torch.float32)
    assert _arg_key(t) != _arg_key(t[1:])  # a 4-byte offset breaks 16-byte alignment
    assert _arg_key(t) != _arg_key(t.half())
    with pytest.raises(TypeError):
        _arg_key("text")


def test_descriptors_are_keyed_by_dtype_and_block_shape() -> None:
    """Triton specialises a tensor descriptor on its dtype and block shape only (the launch
    encodes the rest): so does the key, whatever the tensor's shape or address."""
    from triton.tools.tensor_descriptor import TensorDescriptor

    t = torch.zeros(64, 64, dtype=torch.bfloat16)
    key = _arg_key(TensorDescriptor.from_tensor(t, [16, 32]))
    assert key == _arg_key(TensorDescriptor.from_tensor(torch.zeros(128, 32, dtype=torch.bfloat16), [16, 32]))
    assert key != _arg_key(TensorDescriptor.from_tensor(t, [32, 32]))
    assert key != _arg_key(TensorDescriptor.from_tensor(t.half(), [16, 32]))


@pytest.mark.skipif(os.environ.get("TRITON_INTERPRET") != "1", reason="CPU tensors need Triton's interpreter")
def test_launch_runs_the_kernel() -> None:
    """Under the interpreter every launch takes Triton's path and nothing is kept; the
    result is the kernel's either way."""
    launch = FastLauncher(_copy)
    src = torch.arange(10, dtype=torch.float32)
    dst = torch.zeros(10)
    launch((2,), (src, dst, 10), {"BLOCK": 8}, 4, 2)
    assert torch.equal(dst, src)


class _FakeTritonKernel:
    """Stands in for a JIT function on a GPU (none here): ``fn[grid](...)`` compiles a variant
    per new ``BLOCK`` (growing ``device_caches`` as Triton does) and runs nothing."""

    def __init__(self, fn) -> None:
        self.fn, self.__name__ = fn, "_copy"
        self.device_caches = {0: ({}, None, None, None, None)}

    def __getitem__(self, grid):
        def run(*args, BLOCK, num_warps, num_stages):
            self.device_caches[0][0].setdefault(BLOCK, object())

        return run


def test_launches_that_compile_are_counted(monkeypatch) -> None:
    from sglang_vlora.atmm.launch_compiles import LaunchCompiles

    counts = LaunchCompiles()
    monkeypatch.setattr("sglang_vlora.atmm.launch_compiles.LAUNCH_COMPILES", counts)
    launch = FastLauncher(_copy)
    launch.fn = _FakeTritonKernel(_copy.fn)
    src = torch.zeros(8)
    launch((1,), (src, src, 8), {"BLOCK": 8}, 4, 2)
    launch((1,), (src, src, 8), {"BLOCK": 8}, 4, 2)  # compiled already: not counted
    launch((1,), (src, src, 8), {"BLOCK": 16}, 4, 2)
    snap = counts.snapshot()
    assert snap["count"] == 2 and snap["by_kernel"] == {"_copy": 2} and snap["seconds"] >= 0
    # which variants compiled: what a compile-ahead that missed one must add
    assert snap["by_variant"] == {"_copy BLOCK=8 w4 s2": 1, "_copy BLOCK=16 w4 s2": 1}
    from sglang_vlora.atmm.launch_compiles import describe_variant

    assert describe_variant({"PAIRED": True, "CAP": 16}, 8, 3) == "PAIRED=1 CAP=16 w8 s3"


def test_a_kernel_asking_for_pdl_is_compiled_with_it() -> None:
    """A true ``USE_PDL`` constexpr adds Triton's ``launch_pdl`` option to the launch that
    compiles the kernel (and so to its compiled handle); anything else adds nothing."""
    from sglang_vlora.atmm.fast_launch import launch_options

    assert launch_options({"USE_PDL": True, "BLOCK": 8}) == {"launch_pdl": True}
    assert launch_options({"USE_PDL": False}) == {} and launch_options({"BLOCK": 8}) == {}

    seen = []

    class Kernel(_FakeTritonKernel):
        def __getitem__(self, grid):
            def run(*args, **kwargs):
                seen.append(kwargs)

            return run

    launch = FastLauncher(_copy_pdl)
    launch.fn = Kernel(_copy_pdl.fn)
    src = torch.zeros(8)
    launch((1,), (src, src, 8), {"BLOCK": 8, "USE_PDL": True}, 4, 2)
    launch((1,), (src, src, 8), {"BLOCK": 8, "USE_PDL": False}, 4, 2)
    assert [k.get("launch_pdl") for k in seen] == [True, None]


class _Compiled:
    """What Triton's ``warmup`` returns: a compiled kernel, loaded (module and launcher) only on demand."""

    def __init__(self) -> None:
        self.loaded = 0

    def _init_handles(self) -> None:
        self.loaded += 1


class _Kernel:
    def __init__(self, returns) -> None:
        self.returns, self.calls = returns, []

    def warmup(self, *args, **kwargs):
        self.calls.append((args, kwargs))
        return self.returns


def test_compile_and_load_loads_what_warmup_compiled() -> None:
    # Triton builds a variant's launcher (a C compile) at its first launch, not in warmup: a
    # real compile needs a GPU (tests/gpu/test_compile_ahead.py checks it there).
    from sglang_vlora.atmm.launch_compiles import compile_and_load

    kernel = _Kernel(_Compiled())
    compile_and_load(kernel, (4,), (1, 2), {"BLOCK": 16}, 4, 2, launch_pdl=True)
    assert kernel.returns.loaded == 1
    assert kernel.calls == [((1, 2), {"BLOCK": 16, "num_warps": 4, "num_stages": 2, "grid": (4,), "launch_pdl": True})]


def test_compile_and_load_under_the_interpreter_loads_nothing() -> None:
    from sglang_vlora.atmm.launch_compiles import compile_and_load

    kernel = _Kernel(None)  # the interpreter compiles nothing
    compile_and_load(kernel, (1,), (), {}, 4, 2)
    assert len(kernel.calls) == 1


def test_a_warmup_result_that_cannot_load_is_logged(caplog) -> None:
    # Triton 3.6's FutureKernel had no _init_handles of its own: a load that finds none says so
    # (the variant then loads at its first launch, in a request's time).
    from sglang_vlora.atmm.launch_compiles import compile_and_load

    kernel = _Kernel(object())
    kernel.__name__ = "_shrink_kernel"
    with caplog.at_level("WARNING", logger="sglang_vlora.atmm.launch_compiles"):
        compile_and_load(kernel, (1,), (), {"BLOCK_M": 64}, 4, 3)
    assert "_shrink_kernel" in caplog.text and "no _init_handles" in caplog.text and "BLOCK_M=64 w4 s3" in caplog.text


def test_a_variant_that_cannot_load_is_logged_not_raised_at_start_up(caplog) -> None:
    # The table's configs are compiled ahead for every token count; one this GPU cannot load
    # (Triton raises again at its first launch) must not stop the server from starting.
    from sglang_vlora.atmm.launch_compiles import compile_and_load

    class _TooLarge(_Compiled):
        def _init_handles(self) -> None:
            raise RuntimeError("out of resource: shared memory, Required: 262144, Hardware limit: 232448")

    kernel = _Kernel(_TooLarge())
    kernel.__name__ = "_expand_kernel"
    with caplog.at_level("WARNING", logger="sglang_vlora.atmm.launch_compiles"):
        compile_and_load(kernel, (1,), (), {"BLOCK_M": 128}, 8, 3)
    assert "_expand_kernel" in caplog.text and "cannot load on this GPU" in caplog.text
    assert "shared memory" in caplog.text and "BLOCK_M=128 w8 s3" in caplog.text
