"""Compile-ahead's Triton compiles in a pool of threads (``launch_compiles.compiles_in_parallel``):
the compiles overlap, every variant is loaded once after all are compiled, on the calling thread,
and one worker, nesting or a failing compile behave as without the pool. A real compile needs a
GPU (tests/gpu/test_compile_ahead.py); here the kernels stand in for Triton's JIT functions and
go through Triton's own ``AsyncCompileMode`` as a JIT function's ``warmup`` does."""

from __future__ import annotations

import os
import threading

import pytest
import torch
import triton
from triton.runtime import _async_compile

from sglang_vlora.atmm import ops, tiling
from sglang_vlora.atmm.launch_compiles import compile_and_load, compiles_in_parallel
from sglang_vlora.config import COMPILE_WORKERS_CAP, COMPILE_WORKERS_ENV, compile_workers_setting

pytestmark = pytest.mark.skipif(getattr(triton, "AsyncCompileMode", None) is None,
                                reason="this Triton has no AsyncCompileMode")


class _Compiled:
    def __init__(self, events: list) -> None:
        self.events = events

    def _init_handles(self) -> None:
        self.events.append(("load", threading.current_thread().name))


class _JitKernel:
    """A Triton JIT function's ``warmup`` as Triton runs it: the compile goes to the active
    ``AsyncCompileMode`` when there is one (a future in its place), else runs here."""

    __name__ = "_stand_in_kernel"

    def __init__(self, events: list, compile_fn) -> None:
        self.events, self.compile_fn = events, compile_fn

    def warmup(self, *args, **kwargs):
        key = repr(sorted(kwargs.items()))

        def compile_variant():
            self.compile_fn()
            self.events.append(("compile", threading.current_thread().name))
            return _Compiled(self.events)

        mode = _async_compile.active_mode.get()
        if mode is None:
            return compile_variant()
        return mode.submit(key, compile_variant, lambda kernel: None)


@pytest.fixture(params=["forwarding", "plain"])
def future_kernel(request, monkeypatch):
    """Triton's ``FutureKernel`` as 3.8 has it (attribute look-ups go on to the compiled kernel)
    and as 3.6 has it (they do not: the loads must ask the future for its kernel)."""
    if request.param == "plain":
        monkeypatch.delattr(_async_compile.FutureKernel, "__getattr__", raising=False)
    return request.param


def test_compiles_overlap_and_each_variant_loads_once_after_all_are_compiled(monkeypatch, future_kernel):
    monkeypatch.setenv(COMPILE_WORKERS_ENV, "2")
    events: list = []
    both_compiling = threading.Barrier(2, timeout=20)  # breaks unless two compiles run at once
    kernel = _JitKernel(events, both_compiling.wait)
    with compiles_in_parallel():
        compile_and_load(kernel, (1,), (), {"BLOCK": 16}, 4, 2)
        compile_and_load(kernel, (1,), (), {"BLOCK": 32}, 4, 2)
        assert not [e for e in events if e[0] == "load"]  # loads wait for the end of the block
    compiles = [name for what, name in events if what == "compile"]
    loads = [name for what, name in events if what == "load"]
    assert len(compiles) == 2 and all(name.startswith("vlora-compile") for name in compiles)
    assert loads == [threading.current_thread().name] * 2
    assert [what for what, _ in events] == ["compile", "compile", "load", "load"]


def test_one_worker_compiles_and_loads_each_variant_as_it_comes(monkeypatch):
    monkeypatch.setenv(COMPILE_WORKERS_ENV, "1")
    events: list = []
    kernel = _JitKernel(events, lambda: None)
    with compiles_in_parallel():
        compile_and_load(kernel, (1,), (), {"BLOCK": 16}, 4, 2)
        assert [what for what, _ in events] == ["compile", "load"]
    assert {name for _, name in events} == {threading.current_thread().name}


def test_a_block_inside_another_leaves_the_loads_to_the_outer_one(monkeypatch, future_kernel):
    monkeypatch.setenv(COMPILE_WORKERS_ENV, "2")
    events: list = []
    kernel = _JitKernel(events, lambda: None)
    with compiles_in_parallel():
        with compiles_in_parallel():  # no second AsyncCompileMode (Triton refuses one)
            compile_and_load(kernel, (1,), (), {"BLOCK": 16}, 4, 2)
        compile_and_load(kernel, (1,), (), {"BLOCK": 32}, 4, 2)
        assert not [e for e in events if e[0] == "load"]
    assert [what for what, _ in events].count("load") == 2


def test_a_compile_that_fails_in_a_worker_raises_at_the_end_of_the_block_and_loads_nothing(monkeypatch):
    monkeypatch.setenv(COMPILE_WORKERS_ENV, "2")
    events: list = []

    def fail():
        raise RuntimeError("PTX assembly failed")

    with pytest.raises(RuntimeError, match="PTX assembly failed"), compiles_in_parallel():
        compile_and_load(_JitKernel(events, lambda: None), (1,), (), {"BLOCK": 16}, 4, 2)
        compile_and_load(_JitKernel(events, fail), (1,), (), {"BLOCK": 32}, 4, 2)
    assert not [e for e in events if e[0] == "load"]
    assert _async_compile.active_mode.get() is None  # the next block may start its own


def test_a_shapes_table_configs_compile_in_the_pool(monkeypatch, future_kernel):
    monkeypatch.setenv(COMPILE_WORKERS_ENV, "2")
    monkeypatch.setattr(ops, "_compiles_ahead_for", lambda t: True)  # as on a GPU
    monkeypatch.setattr(ops, "_COMPILED", set())
    monkeypatch.setattr(tiling, "triton_configs", lambda dev, op, key: ["config a", "config b"])
    events: list = []
    kernel = _JitKernel(events, threading.Barrier(2, timeout=20).wait)
    ops._compile_table_configs("expand", {"n": 8}, torch.empty(1),
                               lambda cfg: compile_and_load(kernel, (1,), (), {"CFG": cfg}, 4, 2))
    assert [what for what, _ in events] == ["compile", "compile", "load", "load"]


@pytest.mark.parametrize("value", ["0", "-2", "two", "1.5", ""])
def test_the_compile_workers_setting_refuses_what_is_not_a_whole_number_from_1(monkeypatch, value):
    monkeypatch.setenv(COMPILE_WORKERS_ENV, value)
    with pytest.raises(ValueError, match=COMPILE_WORKERS_ENV):
        compile_workers_setting()


def test_the_compile_workers_default_is_the_cpus_this_process_may_use_at_most_the_cap(monkeypatch):
    monkeypatch.delenv(COMPILE_WORKERS_ENV, raising=False)
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(3)))
    assert compile_workers_setting() == 3
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(64)))
    assert compile_workers_setting() == COMPILE_WORKERS_CAP
