"""The tuner's pure parts (no GPU): grid shapes, layer specs, table writing and merging, and the
search over a stand-in for the GPU's timing."""

from __future__ import annotations

import json
import zlib

import pytest
import torch

from sglang_vlora.atmm import tiling, tune
from sglang_vlora.atmm.tiling import ExpandConfig, ShrinkConfig
from sglang_vlora.atmm.work_items import assign_layers
from tests.triton_interpreter import use_triton_interpreter


def test_parse_layer_and_shapes() -> None:
    assert tune.parse_layer("4096:4096,1024,1024") == (4096, (4096, 1024, 1024))
    shapes = tune.build_shapes([(4096, (4096,)), (11008, (4096,))], [8, 16], [1, 32])
    # o_proj and down_proj share their expand shapes: counted once
    assert len([s for s in shapes if s[0] == "expand"]) == 4
    assert len([s for s in shapes if s[0] == "expand_in_gemm"]) == 4
    assert len([s for s in shapes if s[0] == "shrink"]) == 8
    assert ("shrink", 11008, 16, 32) in shapes


def test_write_table_merges_and_reads_back(tmp_path) -> None:
    path = tmp_path / "t.json"
    first = {("shrink", 4096, 64, 16): (ShrinkConfig(16, 32, 64, 8), 3.0)}
    tune.write_table(first, path, {"device": "X", "runs": [{"ops": ["shrink"]}]})
    second = {
        ("shrink", 4096, 64, 32): (ShrinkConfig(32, 32, 64, 4), 4.0),
        ("expand", 4096, 1, 64, 16, (4096,)): (ExpandConfig(16, 64, 32), 2.0),
    }
    count = tune.write_table(second, path, {"device": "X", "runs": [{"ops": ["both"]}]}, merge=True)
    assert count == 3
    table = json.loads(path.read_text())
    assert [r["ops"] for r in table["runs"]] == [["shrink"], ["both"]]
    entry = tiling.nearest_entry(table["shrink"], "shrink", {"k": 4096, "n": 64, "m": 10})
    assert ShrinkConfig(**entry["config"]) == ShrinkConfig(16, 32, 64, 8)
    entry = tiling.nearest_entry(table["expand"], "expand", {"n": 4096, "s": 1, "r": 64, "m": 16})
    assert ExpandConfig(**entry["config"]) == ExpandConfig(16, 64, 32)


def test_assign_layers_separates_overlaps() -> None:
    # disjoint segments share layer 0; a segment over both needs layer 1
    assert assign_layers([0, 5, 0], [5, 5, 10]) == [0, 0, 1]
    assert assign_layers([0, 0, 0], [4, 4, 4]) == [0, 1, 2]
    assert assign_layers([], []) == []


def test_write_table_records_the_winning_impl(tmp_path) -> None:
    path = tmp_path / "t.json"
    s1, s2 = ("shrink", 4096, 64, 16), ("shrink", 4096, 64, 32)
    e1 = ("expand", 4096, 1, 64, 16, (4096,))
    best = {
        s1: (ShrinkConfig(16, 32, 64, 8), 3.0),
        s2: (ShrinkConfig(32, 32, 64, 4), 4.0),
        e1: (ExpandConfig(16, 64, 32), 2.0),
    }
    cuda_best = {
        s1: (ShrinkConfig(16, 32, 256, 8, 4, 3), 2.5),  # CUDA wins
        e1: (ExpandConfig(16, 128, 64, 4, 2), 2.2),  # Triton wins
    }
    tune.write_table(best, path, {"device": "X", "runs": []}, cuda_best=cuda_best)
    table = json.loads(path.read_text())
    by_m = {e["m"]: e for e in table["shrink"]}
    assert by_m[16]["impl"] == "cuda" and by_m[16]["cuda"]["us"] == 2.5
    assert ShrinkConfig(**by_m[16]["config"]) == ShrinkConfig(16, 32, 64, 8)  # Triton's best kept
    assert "impl" not in by_m[32] and "cuda" not in by_m[32]  # no CUDA timing: reads as Triton
    assert table["expand"][0]["impl"] == "triton"


def test_write_table_picks_the_fastest_of_three_impls(tmp_path) -> None:
    path = tmp_path / "t.json"
    s1, s2 = ("shrink", 3584, 64, 1024), ("shrink", 3584, 64, 8)
    best = {s1: (ShrinkConfig(64, 64, 64, 1), 9.0), s2: (ShrinkConfig(16, 64, 128, 4), 3.0)}
    cuda_best = {s1: (ShrinkConfig(64, 64, 64, 1, 4, 3), 8.0)}
    cublas_best = {s1: 6.5, s2: 7.0}
    tune.write_table(best, path, {"device": "X", "capability": [9, 0], "runs": []}, cuda_best=cuda_best,
                     cublas_best=cublas_best)
    table = json.loads(path.read_text())
    by_m = {e["m"]: e for e in table["shrink"]}
    assert by_m[1024]["impl"] == "cublas" and by_m[1024]["cublas"]["us"] == 6.5
    assert by_m[8]["impl"] == "triton" and by_m[8]["cublas"]["us"] == 7.0
    assert table["capability"] == [9, 0]


class _FakeGpu:
    """Stands in for the GPU timing: a config's microseconds are a fixed function of it, and
    each timing advances a fake clock by one second."""

    def __init__(self) -> None:
        self.now = 0.0
        self.timed: list[tuple] = []

    def monotonic(self) -> float:
        return self.now

    def time_candidate(self, problem, cfg, reps: int, iters: int, impl: str = "triton") -> float:
        self.now += 1.0
        self.timed.append((problem.shape, cfg))
        return _cost(problem.shape, cfg)


def _cost(shape: tuple, cfg) -> float:
    return float(zlib.crc32(repr((shape, cfg)).encode()) % 1000) + 1.0


def _fake_gpu(monkeypatch) -> _FakeGpu:
    gpu = _FakeGpu()
    monkeypatch.setattr(tune, "time", gpu)
    monkeypatch.setattr(tune, "time_candidate", gpu.time_candidate)
    monkeypatch.setattr(tune, "Problem", lambda shape: type("P", (), {"shape": shape})())
    monkeypatch.setattr(tune, "precompile", lambda work, workers: None)
    monkeypatch.setattr(tune, "_hw_limits", lambda: (132, 227 * 1024))
    return gpu


def test_search_keeps_the_fastest_of_both_stages_shrink_first(monkeypatch) -> None:
    gpu = _fake_gpu(monkeypatch)
    shapes = [("expand", 4096, 1, 16, 8, (4096,)), ("shrink", 4096, 16, 8), ("shrink", 4096, 16, 64)]
    best = tune.search(shapes, workers=1, reps=1, iters=1, log=lambda line: None)
    assert set(best) == set(shapes)
    assert gpu.timed[0][0][0] == "shrink" and gpu.timed[-1][0][0] == "expand"
    for shape, (cfg, us) in best.items():
        timed = {c: _cost(s, c) for s, c in gpu.timed if s == shape}
        assert us == min(timed.values()) and timed[cfg] == us
        stage1 = tune.stage1_candidates(shape, 132, 227 * 1024)
        assert set(stage1) < set(timed)  # stage 2 timed more than stage 1's configs
        ranked = sorted(stage1, key=timed.get)
        variants = {v for c in ranked[:3] for v in tiling.launch_variants(c, 227 * 1024)}
        assert set(timed) == set(stage1) | variants


def test_search_budget_cuts_stage_1_then_stage_2(monkeypatch) -> None:
    gpu = _fake_gpu(monkeypatch)
    shapes = [("shrink", 4096, 16, m) for m in (1, 8, 64, 256)]
    first = len(tune.stage1_candidates(shapes[0], 132, 227 * 1024))
    # one second a timing: stage 1 takes no shape once 70% of the budget has passed, and
    # stage 2 times nothing once all of it has; a shape it reaches keeps its stage-1 best
    best = tune.search(shapes, workers=1, reps=1, iters=1, log=lambda line: None, budget_s=first - 0.5)
    assert list(best) == shapes[:1]
    assert len(gpu.timed) == first
    assert best[shapes[0]][1] == min(_cost(shapes[0], c) for _, c in gpu.timed)


def test_cublas_budget_leaves_later_shapes_to_triton(monkeypatch) -> None:
    gpu = _fake_gpu(monkeypatch)
    shapes = [("shrink", 4096, 16, m) for m in (1, 8, 64, 256)]
    lines: list[str] = []
    # one second a timing: after the budget of 1.5 s, the third shape is not timed
    best = tune.search_cublas(shapes, reps=1, iters=1, log=lines.append, budget_s=1.5)
    assert list(best) == shapes[:2] and [s for s, _ in gpu.timed] == shapes[:2]
    assert lines[-1] == "budget: cublas stopped after 2 of 4 shapes"
    assert list(tune.search_cublas(shapes, reps=1, iters=1, log=lines.append)) == shapes  # no budget: all


def test_write_table_keeps_the_in_gemm_expand_apart(tmp_path) -> None:
    path = tmp_path / "t.json"
    key = ("expand", 4096, 1, 64, 16, (4096,))
    tune.write_table({key: (ExpandConfig(16, 64, 32), 2.0)}, path, {"device": "X", "runs": []})
    assert "expand_in_gemm" not in json.loads(path.read_text())  # none tuned: no key
    in_gemm = ("expand_in_gemm", *key[1:])
    tune.write_table({in_gemm: (ExpandConfig(64, 128, 16, 8), 3.0)}, path, {"device": "X", "runs": []}, merge=True)
    table = json.loads(path.read_text())
    assert [ExpandConfig(**e["config"]) for e in table["expand"]] == [ExpandConfig(16, 64, 32)]
    assert [ExpandConfig(**e["config"]) for e in table["expand_in_gemm"]] == [ExpandConfig(64, 128, 16, 8)]


def test_in_gemm_problem_times_the_in_gemm_expand(monkeypatch) -> None:
    """The tuner's in-GEMM problem runs the expand over a GEMM output's layout (the
    interpreter on CPU): a new output of base + scale * inter_slot @ B_slot^T per token."""
    use_triton_interpreter(monkeypatch)
    problem = tune.Problem(("expand_in_gemm", 32, 1, 8, 6, (32,)), dtype=torch.float32, device="cpu")
    problem.launcher(ExpandConfig(16, 32, 16))()
    it, layout = problem.items, problem.layout
    want = layout.base.double().clone()
    for start, n, slot in zip(it.seg_starts_host, it.seg_lens_host, it.slots_host, strict=True):
        block = problem.inter[start : start + n, slot * 8 : (slot + 1) * 8].double()
        want[start : start + n] += block @ problem.b[slot].double().T
    torch.testing.assert_close(problem.out.double(), want, rtol=1e-5, atol=1e-5)
    with pytest.raises(ValueError, match="Triton only"):
        problem.launcher(None, "cublas")
