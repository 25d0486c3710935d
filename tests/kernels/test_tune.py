"""The tuner's pure parts (no GPU): grid shapes, layer specs, table writing and merging."""

from __future__ import annotations

import json

from sglang_vlora.atmm import tiling, tune
from sglang_vlora.atmm.tiling import ExpandConfig, ShrinkConfig
from sglang_vlora.atmm.work_items import assign_layers


def test_parse_layer_and_shapes() -> None:
    assert tune.parse_layer("4096:4096,1024,1024") == (4096, (4096, 1024, 1024))
    shapes = tune.build_shapes([(4096, (4096,)), (11008, (4096,))], [8, 16], [1, 32])
    # o_proj and down_proj share their expand shapes: counted once
    assert len([s for s in shapes if s[0] == "expand"]) == 4
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
