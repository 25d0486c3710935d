"""Tile-config search space and the table lookup's nearest-shape rule (no GPU)."""

from __future__ import annotations

import json
import time

import pytest

from sglang_vlora.atmm import tiling
from sglang_vlora.atmm.tiling import ExpandConfig, ShrinkConfig


def test_candidates_respect_hardware_limits() -> None:
    smem = 100 * 1024
    shrink = list(tiling.shrink_candidates(4096, 64, 8, smem_limit=smem))
    expand = list(tiling.expand_candidates(4096, 1, 64, 4096, smem_limit=smem))
    assert shrink and expand
    for cfg in shrink:
        assert tiling.is_valid_tile(cfg.block_m, cfg.block_n, cfg.block_k)
        assert tiling.shrink_smem_bytes(cfg) <= smem
        assert cfg.block_m == 16  # 8 tokens need no larger row tile
    for cfg in expand:
        assert tiling.is_valid_tile(cfg.block_m, cfg.block_n, cfg.block_k)
        assert tiling.expand_smem_bytes(cfg) <= smem
    for cfg in tiling.launch_variants(shrink[0], smem):
        assert tiling.shrink_smem_bytes(cfg) <= smem
    assert not tiling.is_valid_tile(8, 16) and not tiling.is_valid_tile(48)


def _entry(op: str, config, **key) -> dict:
    return {**key, "config": config.__dict__, "us": 1.0}


@pytest.fixture()
def table(tmp_path, monkeypatch):
    shrink = [
        _entry("shrink", ShrinkConfig(16, 16, 64, 8), k=4096, n=64, m=16),
        _entry("shrink", ShrinkConfig(64, 64, 64, 1), k=4096, n=64, m=1024),
        _entry("shrink", ShrinkConfig(32, 32, 128, 2), k=4096, n=128, m=16),
        _entry("shrink", ShrinkConfig(16, 32, 256, 4), k=11008, n=64, m=16),
    ]
    expand = [
        _entry("expand", ExpandConfig(16, 64, 16), n=4096, s=1, r=64, m=16),
        _entry("expand", ExpandConfig(64, 128, 32), n=4096, s=1, r=64, m=1024),
        _entry("expand", ExpandConfig(16, 128, 64), n=12288, s=3, r=64, m=16),
    ]
    name = "Test GPU 9000"
    (tmp_path / tiling.table_filename(name)).write_text(
        json.dumps({"device": name, "shrink": shrink, "expand": expand})
    )
    monkeypatch.setenv("SGLANG_VLORA_ATMM_TABLE_DIR", str(tmp_path))
    tiling.clear_caches()
    yield name
    tiling.clear_caches()


def test_exact_and_nearest_lookup(table: str) -> None:
    assert tiling.choose(table, "shrink", "triton", (4096, 64, 16))[1] == ShrinkConfig(16, 16, 64, 8)
    # tokens: smallest tuned >= asked, else the largest
    assert tiling.choose(table, "shrink", "triton", (4096, 64, 17))[1] == ShrinkConfig(64, 64, 64, 1)
    assert tiling.choose(table, "shrink", "triton", (4096, 64, 9000))[1] == ShrinkConfig(64, 64, 64, 1)
    assert tiling.choose(table, "shrink", "triton", (4096, 64, 1))[1] == ShrinkConfig(16, 16, 64, 8)
    # S*r: smallest tuned >= asked
    assert tiling.choose(table, "shrink", "triton", (4096, 96, 16))[1] == ShrinkConfig(32, 32, 128, 2)
    # d_in: closest in log2 (3584 -> 4096, 18944 -> 11008)
    assert tiling.choose(table, "shrink", "triton", (3584, 64, 16))[1] == ShrinkConfig(16, 16, 64, 8)
    assert tiling.choose(table, "shrink", "triton", (18944, 64, 16))[1] == ShrinkConfig(16, 32, 256, 4)
    # expand: slice count exact when tuned, else nearest
    assert tiling.choose(table, "expand", "triton", (4608, 3, 32, 8))[1] == ExpandConfig(16, 128, 64)
    assert tiling.choose(table, "expand", "triton", (4096, 1, 64, 600))[1] == ExpandConfig(64, 128, 32)
    assert tiling.choose(table, "expand", "triton", (22016, 2, 64, 16))[1] == ExpandConfig(16, 128, 64)


def test_fallback_without_table() -> None:
    name = "No Such Device"
    assert tiling.load_table(name) is None
    assert tiling.choose(name, "shrink", "triton", (4096, 64, 3))[1] == tiling.default_shrink(4096, 64, 3)
    assert tiling.choose(name, "expand", "triton", (4096, 1, 64, 3))[1] == tiling.default_expand(4096, 1, 64, 3)


def test_lookup_is_cheap(table: str) -> None:
    tiling.choose(table, "shrink", "triton", (4096, 64, 40))[1]
    n = 20000
    t0 = time.perf_counter()
    for _ in range(n):
        tiling.choose(table, "shrink", "triton", (4096, 64, 40))[1]
    per_call = (time.perf_counter() - t0) / n
    assert per_call < 2e-6, per_call


def test_shipped_tables_parse() -> None:
    for path in tiling.TABLE_DIR.glob("*.json"):
        data = json.loads(path.read_text())
        assert path.name == tiling.table_filename(data["device"])
        for entry in data["shrink"]:
            ShrinkConfig(**entry["config"])
        for entry in data["expand"]:
            ExpandConfig(**entry["config"])


def test_impl_field_picks_cuda_and_old_entries_mean_triton(tmp_path, monkeypatch) -> None:
    cuda_s = ShrinkConfig(16, 32, 256, 8, 4, 3)
    cuda_e = ExpandConfig(16, 128, 64, 4, 2)
    shrink = [
        {
            **_entry("shrink", ShrinkConfig(16, 16, 64, 8), k=4096, n=64, m=16),
            "impl": "cuda",
            "cuda": {"config": cuda_s.__dict__, "us": 0.5},
        },
        {
            **_entry("shrink", ShrinkConfig(64, 64, 64, 1), k=4096, n=64, m=1024),
            "impl": "triton",
            "cuda": {"config": ShrinkConfig(64, 64, 64, 1).__dict__, "us": 9.0},
        },
        _entry("shrink", ShrinkConfig(32, 32, 128, 2), k=4096, n=128, m=16),  # an old entry: no impl
    ]
    expand = [
        {
            **_entry("expand", ExpandConfig(16, 64, 16), n=4096, s=1, r=64, m=16),
            "impl": "cuda",
            "cuda": {"config": cuda_e.__dict__, "us": 0.5},
        },
        _entry("expand", ExpandConfig(64, 128, 32), n=4096, s=1, r=64, m=1024),
    ]
    name = "Test GPU 9001"
    (tmp_path / tiling.table_filename(name)).write_text(
        json.dumps({"device": name, "shrink": shrink, "expand": expand})
    )
    monkeypatch.setenv("SGLANG_VLORA_ATMM_TABLE_DIR", str(tmp_path))
    tiling.clear_caches()
    try:
        assert tiling.choose(name, "shrink", "auto", (4096, 64, 8)) == ("cuda", cuda_s)
        assert tiling.choose(name, "shrink", "triton", (4096, 64, 8))[1] == ShrinkConfig(16, 16, 64, 8)  # Triton's, kept
        assert tiling.choose(name, "shrink", "auto", (4096, 64, 1024)) == ("triton", ShrinkConfig(64, 64, 64, 1))
        assert tiling.choose(name, "shrink", "auto", (4096, 128, 16)) == ("triton", ShrinkConfig(32, 32, 128, 2))
        assert tiling.choose(name, "expand", "auto", (4096, 1, 64, 1)) == ("cuda", cuda_e)
        assert tiling.choose(name, "expand", "auto", (4096, 1, 64, 600))[0] == "triton"
        # forced CUDA: the entry's CUDA config where tuned, else the CUDA default
        assert tiling.choose(name, "shrink", "cuda", (4096, 64, 16))[1] == cuda_s
        assert tiling.choose(name, "shrink", "cuda", (4096, 128, 16))[1] == tiling.default_cuda_shrink(4096, 128, 16)
        assert tiling.choose(name, "expand", "cuda", (4096, 1, 64, 600))[1] == tiling.default_cuda_expand(
            4096, 1, 64, 600
        )
    finally:
        tiling.clear_caches()


def test_cuda_candidates_and_defaults_are_compiled_tiles() -> None:
    for k, n, m in [(4096, 8, 1), (4096, 64, 8), (3584, 192, 32), (4096, 64, 1024), (18944, 384, 8192)]:
        cands = list(tiling.cuda_shrink_candidates(k, n, m))
        assert cands and all(tiling.is_cuda_config(c) for c in cands)
        assert all(c.block_m <= max(16, m) * 2 and c.block_n <= max(16, n) * 2 for c in cands)
        assert tiling.is_cuda_config(tiling.default_cuda_shrink(k, n, m))
    for n, s, r, m in [(4096, 1, 8, 1), (12288, 3, 64, 32), (22016, 2, 128, 4096)]:
        cands = list(tiling.cuda_expand_candidates(n, s, r, m))
        assert cands and all(tiling.is_cuda_config(c) for c in cands)
        assert tiling.is_cuda_config(tiling.default_cuda_expand(n, s, r, m))
    assert not tiling.is_cuda_config(ShrinkConfig(16, 16, 64, 1))


def test_impl_field_picks_cublas(tmp_path, monkeypatch) -> None:
    name = "Test GPU 9002"
    shrink = [{**_entry("shrink", ShrinkConfig(64, 64, 64, 1), k=3584, n=64, m=1024), "impl": "cublas",
               "cublas": {"us": 5.0}}]
    expand = [{**_entry("expand", ExpandConfig(64, 128, 32), n=4608, s=3, r=64, m=1024), "impl": "triton",
               "cublas": {"us": 9.0}}]
    (tmp_path / tiling.table_filename(name)).write_text(json.dumps({"device": name, "shrink": shrink,
                                                                    "expand": expand}))
    monkeypatch.setenv("SGLANG_VLORA_ATMM_TABLE_DIR", str(tmp_path))
    tiling.clear_caches()
    try:
        assert tiling.choose(name, "shrink", "auto", (3584, 64, 1024)) == ("cublas", None)
        assert tiling.choose(name, "expand", "auto", (4608, 3, 64, 1024)) == ("triton", ExpandConfig(64, 128, 32))
    finally:
        tiling.clear_caches()


def test_same_architecture_table_is_the_closest_name(tmp_path) -> None:
    for device, cap in (("NVIDIA H100 80GB HBM3", [9, 0]), ("NVIDIA A100-SXM4-80GB", [8, 0]),
                        ("NVIDIA GH200 480GB", [9, 0])):
        (tmp_path / tiling.table_filename(device)).write_text(
            json.dumps({"device": device, "capability": cap, "shrink": [], "expand": []}))
    (tmp_path / "no_capability.json").write_text(json.dumps({"device": "NVIDIA H2", "shrink": []}))
    path, table = tiling.same_architecture_table("NVIDIA H200", (9, 0), [tmp_path])
    assert table["device"] == "NVIDIA H100 80GB HBM3" and path.name == "NVIDIA_H100_80GB_HBM3.json"
    assert tiling.same_architecture_table("NVIDIA A100 40GB", (8, 0), [tmp_path])[1]["capability"] == [8, 0]
    assert tiling.same_architecture_table("NVIDIA B200", (10, 0), [tmp_path]) is None


def test_shipped_tables_record_their_architecture() -> None:
    for path in tiling.TABLE_DIR.glob("*.json"):
        cap = json.loads(path.read_text()).get("capability")
        assert isinstance(cap, list) and len(cap) == 2, path.name


def test_triton_configs_cover_every_token_count_of_a_shape(tmp_path, monkeypatch) -> None:
    name = "Test GPU 9003"
    a, b = ShrinkConfig(16, 32, 64, 8), ShrinkConfig(64, 64, 64, 1)
    shrink = [
        _entry("shrink", a, k=3584, n=192, m=1), _entry("shrink", a, k=3584, n=192, m=32),
        _entry("shrink", b, k=3584, n=192, m=1024),
        {**_entry("shrink", ShrinkConfig(128, 64, 64, 1), k=3584, n=192, m=4096), "impl": "cublas",
         "cublas": {"us": 1.0}},
        _entry("shrink", ShrinkConfig(32, 32, 64, 1), k=3584, n=64, m=32),  # another shape
    ]
    (tmp_path / tiling.table_filename(name)).write_text(json.dumps({"device": name, "shrink": shrink, "expand": []}))
    monkeypatch.setenv("SGLANG_VLORA_ATMM_TABLE_DIR", str(tmp_path))
    tiling.clear_caches()
    try:
        assert tiling.triton_configs(name, "shrink", {"k": 3584, "n": 192}) == sorted([a, b], key=str)
        # no expand entries: the defaults of every token count of the tuning grid
        defaults = {tiling.default_expand(4608, 3, 64, m) for m in tiling.TOKEN_GRID}
        assert set(tiling.triton_configs(name, "expand", {"n": 4608, "s": 3, "r": 64})) == defaults
    finally:
        tiling.clear_caches()


def test_in_gemm_expand_has_its_own_entries_else_the_expand_ones(tmp_path, monkeypatch) -> None:
    """The expand of the shrink inside the GEMM is tuned apart (its layout favours other tiles);
    a table without such entries gives it the separate expand's."""
    name, key = "Test GPU 9004", (4608, 3, 64, 1024)
    separate, in_gemm = ExpandConfig(64, 256, 32), ExpandConfig(128, 128, 16, 8, 3)
    expand = [_entry("expand", separate, n=4608, s=3, r=64, m=1024)]
    monkeypatch.setenv("SGLANG_VLORA_ATMM_TABLE_DIR", str(tmp_path))
    path = tmp_path / tiling.table_filename(name)
    try:
        path.write_text(json.dumps({"device": name, "shrink": [], "expand": expand}))
        tiling.clear_caches()
        assert tiling.choose(name, "expand_in_gemm", "triton", key) == ("triton", separate)
        assert tiling.triton_configs(name, "expand_in_gemm", {"n": 4608, "s": 3, "r": 64}) == [separate]
        own = [_entry("expand", in_gemm, n=4608, s=3, r=64, m=1024)]
        path.write_text(json.dumps({"device": name, "shrink": [], "expand": expand, "expand_in_gemm": own}))
        tiling.clear_caches()
        assert tiling.choose(name, "expand_in_gemm", "auto", key) == ("triton", in_gemm)
        assert tiling.choose(name, "expand", "auto", key) == ("triton", separate)
    finally:
        tiling.clear_caches()
