"""Direct driver launches: the parameter layout read from real compiled ATMM kernels (Triton
compiles for a CUDA target without a GPU; only loading and launching need one, so the driver
call is replaced by a recorder here; tests/gpu launches for real)."""

from __future__ import annotations

import copy
import ctypes
import json
import os
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from sglang_vlora.atmm import driver_launch, triton_kernels
from sglang_vlora.atmm.fast_launch import FastLauncher

REPO = Path(__file__).resolve().parents[2]

FOLDED = 1  # Triton folds an integer argument equal to 1 into a constant
SHRINK_CONSTEXPRS = {"CAP": 4, "HAS_PERM": True, "EVEN_K": True, "EVEN_N": True, "BLOCK_M": 64, "BLOCK_N": 64,
                     "BLOCK_K": 64, "SPLIT_K": 1}
EXPAND_CONSTEXPRS = {"CAP": 4, "NUM_SLICES": 3, "HAS_PERM": False, "CHECK_LAYER": False, "PAIRED": False,
                     "ALIGNED": True, "IN_GEMM": False, "BLOCK_M": 64, "BLOCK_N": 128, "BLOCK_K": 16, "K_GROUP": 16}
INT_POINTERS = ("seg", "slots", "row", "ranks", "perm", "layers", "partners", "count")

# Compiles in a process of its own: the suite runs under TRITON_INTERPRET=1, where @triton.jit
# kernels are interpreted functions that Triton's compiler cannot take.
_COMPILE = """
import json, sys
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from sglang_vlora.atmm import triton_kernels

out = {}
for name, spec in json.loads(sys.argv[1]).items():
    fn = getattr(triton_kernels, name)
    constants = {(fn.arg_names.index(k),): v for k, v in spec["constants"].items()}
    compiled = triton.compile(ASTSource(fn, spec["signature"], constants), target=GPUTarget("cuda", 90, 32))
    meta = compiled.metadata
    fields = ("num_warps", "num_ctas", "shared", "global_scratch_size", "profile_scratch_size",
              "launch_cooperative_grid", "launch_pdl")
    out[name] = {"signature": compiled.src.signature, "ptx": compiled.asm["ptx"], "name": compiled.name,
                 "metadata": {f: getattr(meta, f, 0) for f in fields}}
print(json.dumps(out))
"""


def _specialisation(fn, unspecialised: tuple[str, ...], constexprs: dict[str, int | bool]) -> tuple[dict, tuple]:
    """The signature and constants Triton's launch makes for arguments where every
    specialisable integer is 1 (folded) and every other one a plain int32, and one argument
    tuple (runtime then constexpr values) of that kind."""
    signature, constants, args = {}, {}, []
    for index, name in enumerate(fn.arg_names):
        if name in constexprs:
            signature[name], constants[name] = "constexpr", constexprs[name]
            args.append(constexprs[name])
        elif name.endswith("_ptr"):
            signature[name] = "*i32" if name.split("_")[0] in INT_POINTERS else "*bf16"
            args.append(torch.empty(4, dtype=torch.int32))  # only its address is packed
        elif name in unspecialised:
            signature[name] = "i32"
            args.append(1000 + index)
        else:
            signature[name], constants[name] = "constexpr", FOLDED
            args.append(FOLDED)
    return {"signature": signature, "constants": constants}, tuple(args)


@pytest.fixture(scope="module")
def kernels(tmp_path_factory) -> dict[str, tuple[SimpleNamespace, tuple]]:
    """``{kernel: (compiled, args)}`` for the shrink and the expand, each compiled for sm_90 by
    Triton (its signature, metadata and PTX; the function handle a GPU would have loaded)."""
    specs, args = {}, {}
    for name, unspecialised, constexprs in (
        ("_shrink_kernel", triton_kernels.SHRINK_UNSPECIALISED, SHRINK_CONSTEXPRS),
        ("_expand_kernel", triton_kernels.EXPAND_UNSPECIALISED, EXPAND_CONSTEXPRS),
    ):
        specs[name], args[name] = _specialisation(getattr(triton_kernels, name), unspecialised, constexprs)
    env = {**os.environ, "TRITON_INTERPRET": "0", "TRITON_CACHE_DIR": str(tmp_path_factory.mktemp("triton"))}
    done = subprocess.run([sys.executable, "-c", _COMPILE, json.dumps(specs)], capture_output=True, text=True,
                          env=env, cwd=REPO, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    compiled = json.loads(done.stdout)
    return {name: (_loaded(compiled[name]), args[name]) for name in specs}


def _loaded(data: dict, function: int = 0x5000) -> SimpleNamespace:
    return SimpleNamespace(src=SimpleNamespace(signature=dict(data["signature"])), asm={"ptx": data["ptx"]},
                           name=data["name"], metadata=SimpleNamespace(**data["metadata"]), function=function)


@pytest.fixture()
def shrink(kernels) -> tuple[SimpleNamespace, tuple]:
    compiled, args = kernels["_shrink_kernel"]
    return copy.deepcopy(compiled), args


def test_ptx_declares_the_signatures_parameters_then_scratch(shrink) -> None:
    compiled, args = shrink
    layout = driver_launch.kernel_layout(compiled)
    assert isinstance(layout, driver_launch.KernelLayout), layout
    kept = [i for i, kind in enumerate(compiled.src.signature.values()) if kind != "constexpr"]
    assert [i for i, _ in layout.params] == kept  # folded integers and constexprs are no parameters
    assert 1 <= layout.scratch <= 2
    assert layout.block == 32 * compiled.metadata.num_warps and layout.shared == compiled.metadata.shared
    sizes = driver_launch.ptx_param_sizes(compiled.asm["ptx"], compiled.name)
    assert sizes == [ctypes.sizeof(c) for _, c in layout.params] + [8] * layout.scratch


def test_expand_kernel_layout(kernels) -> None:
    compiled, _ = kernels["_expand_kernel"]
    layout = driver_launch.kernel_layout(compiled)
    assert isinstance(layout, driver_launch.KernelLayout), layout
    assert len(layout.params) == sum(kind != "constexpr" for kind in compiled.src.signature.values())


def test_a_layout_that_does_not_match_the_ptx_is_refused(shrink) -> None:
    compiled, _ = shrink
    first_int = next(name for name, kind in compiled.src.signature.items() if kind == "i32")
    compiled.src.signature[first_int] = "i64"  # the PTX declares a 4-byte parameter there
    reason = driver_launch.kernel_layout(compiled)
    assert isinstance(reason, str) and "do not match" in reason


def test_kernels_needing_what_the_plain_launch_lacks_are_refused(shrink) -> None:
    compiled, _ = shrink
    for field, value, why in (("num_ctas", 2, "cluster"), ("global_scratch_size", 64, "scratch"),
                              ("launch_pdl", True, "programmatic"), ("shared", 300 * 1024, "shared memory")):
        changed = copy.deepcopy(compiled)
        setattr(changed.metadata, field, value)
        assert why in driver_launch.kernel_layout(changed)
    compiled.function = 0
    assert "no loaded function" in driver_launch.kernel_layout(compiled)
    compiled.function, compiled.src.signature["K"] = 0x5000, "fp16"
    assert "argument type" in driver_launch.kernel_layout(compiled)
class _Recorder:
    """Stands in for ``cuLaunchKernel`` (no driver here): decodes the parameter buffer as
    the driver would read it, through the addresses it holds."""

    def __init__(self, layout: driver_launch.KernelLayout):
        self.layout, self.calls = layout, []

    def __call__(self, function, gx, gy, gz, bx, by, bz, shared, stream, params, extra) -> int:
        types = [c for _, c in self.layout.params] + [ctypes.c_uint64] * self.layout.scratch
        values = [ctype.from_address(params[i]).value for i, ctype in enumerate(types)]
        self.calls.append({"function": function, "grid": (gx, gy, gz), "block": (bx, by, bz), "shared": shared,
                           "stream": stream, "values": values, "extra": extra})
        return 0


def test_direct_launch_packs_every_parameter_and_patches_the_leading_pointers(shrink) -> None:
    compiled, args = shrink
    layout = driver_launch.kernel_layout(compiled)
    recorder = _Recorder(layout)
    launch = driver_launch.DirectLaunch(layout, (12, 2), args, 3, recorder)
    expected = [args[i].data_ptr() if isinstance(args[i], torch.Tensor) else args[i] for i, _ in layout.params]
    expected += [0] * layout.scratch
    lead = [0x7F0000001000, 0x7F0000002000, 0x7F0000003000]
    launch(*lead, stream=0xABC)
    launch(*[p + 256 for p in lead], stream=0xDEF)
    first, second = recorder.calls
    assert first["values"] == lead + expected[3:]
    assert second["values"] == [p + 256 for p in lead] + expected[3:]
    assert first["grid"] == (12, 2, 1) and first["block"] == (layout.block, 1, 1)
    assert (first["function"], first["shared"], first["stream"], second["stream"]) == (
        layout.function, layout.shared, 0xABC, 0xDEF)
    assert first["extra"] is None
    with pytest.raises(ValueError):  # a zip of unequal lengths
        launch(*lead[:2], stream=0)


def test_a_failed_launch_raises(shrink) -> None:
    compiled, args = shrink
    layout = driver_launch.kernel_layout(compiled)
    launch = driver_launch.DirectLaunch(layout, (1,), args, 3, lambda *a: 700)
    with pytest.raises(RuntimeError, match="CUDA error 700"):
        launch(1, 2, 3, stream=0)


def test_runner_falls_back_to_tritons_handle(shrink) -> None:
    """With direct launches off (or a kernel the driver path refuses) a prepared launch goes
    through Triton's compiled handle, given the fixed arguments after the new pointers."""
    seen = []

    class Handle:
        def __getitem__(self, grid):
            return lambda *args, stream: seen.append((grid, args, stream))

    launcher = FastLauncher(triton_kernels._shrink_kernel)
    launcher.use_direct(False)
    run = launcher.runner(Handle(), (5,), (None, None, 7, 8), 2)
    run(100, 200, stream=3)
    assert seen == [((5, 1, 1), (100, 200, 7, 8), 3)]
    assert launcher.direct_count() == 0


def test_the_switch_takes_0_or_1_only(monkeypatch) -> None:
    from sglang_vlora.config import DIRECT_LAUNCH_ENV, direct_launch_setting

    monkeypatch.delenv(DIRECT_LAUNCH_ENV, raising=False)
    assert direct_launch_setting() is True
    monkeypatch.setenv(DIRECT_LAUNCH_ENV, "0")
    assert direct_launch_setting() is False and FastLauncher(triton_kernels._shrink_kernel).direct is False
    monkeypatch.setenv(DIRECT_LAUNCH_ENV, "false")
    with pytest.raises(ValueError, match="must be 0 or 1, got 'false'"):
        FastLauncher(triton_kernels._shrink_kernel)


def test_the_pdl_switch_takes_0_or_1_only(monkeypatch) -> None:
    from sglang_vlora.config import PDL_ENV, pdl_setting

    monkeypatch.delenv(PDL_ENV, raising=False)
    assert pdl_setting() is True
    monkeypatch.setenv(PDL_ENV, "0")
    assert pdl_setting() is False
    monkeypatch.setenv(PDL_ENV, "yes")
    with pytest.raises(ValueError, match="SGLANG_VLORA_PDL must be 0 or 1, got 'yes'"):
        pdl_setting()


def test_only_the_in_gemm_expand_on_hopper_asks_for_pdl(monkeypatch) -> None:
    """PDL needs grid dependency control (compute capability 9.0): never on CPU tensors (the
    interpreter), never on an older GPU, never with the switch off, and only for the in-GEMM
    expand, whose previous kernel is the GEMM that computed its inputs."""
    from sglang_vlora.atmm.in_gemm import split_output
    from sglang_vlora.atmm.static_items import StaticWorkItems
    from sglang_vlora.config import PDL_ENV

    monkeypatch.delenv(PDL_ENV, raising=False)
    cuda = torch.device("cuda", 0)
    monkeypatch.setattr(triton_kernels, "_capability", lambda index: (9, 0))
    most = triton_kernels.PDL_MAX_ROWS
    assert triton_kernels.PDL_MAX_SLICES == 1
    assert triton_kernels.expand_pdl(cuda, most, 1) is True
    assert triton_kernels.expand_pdl(cuda, most + 1, 1) is False
    assert triton_kernels.expand_pdl(cuda, 8, 2) is False  # stacked slices (gate/up, q/k/v): no gain
    assert triton_kernels.expand_pdl(cuda, 8, 3) is False
    assert triton_kernels.expand_pdl(torch.device("cpu"), 8, 1) is False
    monkeypatch.setenv(PDL_ENV, "0")
    assert triton_kernels.expand_pdl(cuda, 8, 1) is False
    monkeypatch.delenv(PDL_ENV)
    monkeypatch.setattr(triton_kernels, "_capability", lambda index: (8, 0))
    assert triton_kernels.expand_pdl(cuda, 8, 1) is False

    # with PDL available, only the in-GEMM expand asks for it, for its row bound and slices
    asked = []
    monkeypatch.setattr(triton_kernels, "expand_pdl",
                        lambda device, rows, num_slices: asked.append((rows, num_slices)) or True)
    items = StaticWorkItems.allocate(4, 8, 2, "cpu", covers_tokens=True)
    b = torch.zeros(2, 32, 8)
    y = torch.zeros(8, 32 + 2 * 8)
    inter, layout = split_output(y, 32, 2)
    out = torch.zeros(8, 32)
    cfg = triton_kernels.ExpandConfig(16, 32, 16, 4, 2)
    args = (items.seg_starts, items.seg_lens, items.slots, items.scales, items.row_starts, items.seg_lens, 1,
            items.ranks, None, [0, 32], 8, cfg)
    ((_, _, in_gemm_constexprs),) = triton_kernels._expand_calls(inter, b, out, *args, in_gemm=layout)
    ((_, _, separate_constexprs),) = triton_kernels._expand_calls(torch.zeros(8, 8), b, out, *args)
    assert in_gemm_constexprs["USE_PDL"] is True and separate_constexprs["USE_PDL"] is False
    assert asked == [(8, 1)]


@pytest.mark.parametrize(("rows", "slices"), [(16, 1), (512, 1), (16, 3)])
def test_compile_ahead_of_an_in_gemm_expand_compiles_each_pdl_variant_batches_may_launch(
        monkeypatch, rows: int, slices: int) -> None:
    """A compile ahead does not know the rows eager batches will have, and PDL is decided by
    them: a one-slice in-GEMM expand compiled at any row bound must compile both its PDL
    variants (a server compiled the missing one while serving, about 0.5 s a variant), a
    stacked one only its variant without PDL."""
    from sglang_vlora.atmm.in_gemm import split_output
    from sglang_vlora.atmm.static_items import StaticWorkItems

    monkeypatch.setattr(triton_kernels, "expand_pdl",
                        lambda device, rows, num_slices: rows <= triton_kernels.PDL_MAX_ROWS and num_slices == 1)
    compiled = []
    monkeypatch.setattr(triton_kernels, "_launch", lambda launcher, grid, args, constexprs, config, compile_only:
                        compiled.append((constexprs["USE_PDL"], compile_only)))
    items = StaticWorkItems.allocate(4, rows, 2, "cpu", covers_tokens=True)
    width = 32 * slices
    b = torch.zeros(2, width, 8)
    y = torch.zeros(rows, width + 2 * 8 * slices)
    inter, layout = split_output(y, width, 2)
    out = torch.zeros(rows, width)
    offsets = [32 * s for s in range(slices + 1)]
    triton_kernels.launch_expand(inter, b, out, items.seg_starts, items.seg_lens, items.slots, items.scales,
                                 items.row_starts, items.seg_lens, 1, items.ranks, None, offsets, rows,
                                 triton_kernels.ExpandConfig(16, 32, 16, 4, 2), compile_only=True, in_gemm=layout)
    assert compiled == ([(False, True), (True, True)] if slices == 1 else [(False, True)])
