"""Adaptive tiling: tile configs, the hardware-limited search space, per-device tables
and the runtime lookup (paper §4.3.2, Appendix B).

Shape keys. ``shrink`` depends on ``(k, n, m)``: ``k = d_in``, ``n = S * rank``,
``m`` = tokens. ``expand`` depends on ``(n, s, r, m)``: ``n = d_out`` over all slices,
``s`` = number of slices, ``r`` = rank, ``m`` = tokens. ``expand_in_gemm``, the expand of
the shrink inside the base GEMM (:mod:`sglang_vlora.atmm.in_gemm`: it reads the base
output and the slot columns from the GEMM's output and writes a new tensor), has the same
keys and its own entries, Triton only; a table without any takes the ``expand`` entries.

Nearest-shape rule, applied one field at a time (shrink: ``k, n, m``; expand:
``s, n, r, m``), each narrowing the entries to those that match the chosen value:

* model dims (``k``, ``n`` of expand): the tuned value closest in ``log2`` (ties: the
  larger);
* ``s``: the same slice count if tuned, else the closest in ``log2``;
* rank-like and token dims (``n`` of shrink, ``r``, ``m``): the smallest tuned value
  ``>=`` the asked one, else the largest tuned value (a config tuned for more rows or
  columns covers fewer; the reverse can leave a grid too small).

No table for the device, or no entry for the op: :func:`default_shrink` /
:func:`default_expand`. Lookups are cached per (device, op, key), cost well under 2 us
once warm and never touch the GPU.

Three implementations. Every entry's ``config`` is the Triton kernel's best config; an
entry tuned with the CUDA C++ implementation too also has ``"cuda": {"config", "us"}``
(a config of an instantiated CUDA tile, :data:`CUDA_SHRINK_TILES` /
:data:`CUDA_EXPAND_TILES`), one tuned with cuBLAS ``"cublas": {"us"}`` (one GEMM per
item, no config), and ``"impl"``, the fastest. :func:`choose` returns
``("cuda", cuda config)`` or ``("cublas", None)`` for ``impl="auto"`` only where the
entry says so; an entry without ``impl`` (older tables) means Triton.

Tables are JSON files in ``tables/`` named after ``torch.cuda.get_device_name()``
(``_`` for anything but letters and digits); ``SGLANG_VLORA_ATMM_TABLE_DIR`` adds a
directory searched first. A GPU without a table of its own takes the table of the
same compute capability with the closest name (``"capability"`` in the table), and
says so in the log; with none of its architecture it runs the untuned defaults and
says that.
"""

from __future__ import annotations

import functools
import itertools
import json
import logging
import math
import os
import re
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

TABLE_DIR = Path(__file__).parent / "tables"
TOKEN_GRID = (1, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)  # token counts the tuner times
logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class ShrinkConfig:
    block_m: int
    block_n: int
    block_k: int
    split_k: int = 1
    num_warps: int = 4
    num_stages: int = 3


@dataclass(frozen=True)
class ExpandConfig:
    block_m: int
    block_n: int
    block_k: int
    num_warps: int = 4
    num_stages: int = 2


def _pow2_at_least(value: int, floor: int = 16) -> int:
    return max(floor, 1 << max(0, math.ceil(math.log2(max(value, 1)))))


def shrink_smem_bytes(cfg: ShrinkConfig, elem_bytes: int = 2) -> int:
    """Shared memory of the pipelined x and A tiles."""
    return cfg.num_stages * (cfg.block_m + cfg.block_n) * cfg.block_k * elem_bytes


def expand_smem_bytes(cfg: ExpandConfig, elem_bytes: int = 2) -> int:
    return max(cfg.num_stages, 1) * (cfg.block_m + cfg.block_n) * cfg.block_k * elem_bytes


def is_valid_tile(*dims: int) -> bool:
    """Hardware rule of the search: every tile dim a power of two and at least 16."""
    return all(d >= 16 and d & (d - 1) == 0 for d in dims)


def default_shrink(k: int, n: int, m: int) -> ShrinkConfig:
    """Untuned fallback: small row tiles for few tokens, split-K when the grid is small."""
    block_m = min(_pow2_at_least(m), 64)
    block_n = min(_pow2_at_least(n), 64)
    programs = math.ceil(m / block_m) * math.ceil(n / block_n)
    split_k = 1
    while programs * split_k < 64 and k // (split_k * 2) >= 512:
        split_k *= 2
    return ShrinkConfig(block_m, block_n, 128 if m <= 64 else 64, split_k, 4, 3)


def default_expand(n: int, s: int, r: int, m: int) -> ExpandConfig:
    block_m = min(_pow2_at_least(m), 64)
    block_k = min(_pow2_at_least(r), 64)
    return ExpandConfig(block_m, 64 if m <= 64 else 128, block_k, 4, 2)


def shrink_candidates(
    k: int, n: int, m: int, sm_count: int = 132, smem_limit: int = 227 * 1024
) -> Iterator[ShrinkConfig]:
    """Search space of one shrink shape.

    Stage 1 varies the tile shape and split-K (4 warps, 3 stages); stage 2 (see
    :mod:`sglang_vlora.atmm.tune`) varies warps and stages of stage 1's best tiles.
    Row tiles no larger than the tokens need (and not 16 from 128 tokens up), column
    tiles between an eighth of and all of ``S * r`` (rounded up to a power of two),
    split-K only while the grid keeps at most two programs per SM and every split
    keeps two K tiles.
    """
    max_m, max_n = _pow2_at_least(m), _pow2_at_least(n)
    for bm, bn, bk in itertools.product((16, 32, 64, 128), (16, 32, 64, 128), (64, 128, 256)):
        if bm > max_m or bn > max_n or bn < max_n // 8 or (m >= 128 and bm == 16):
            continue
        programs = math.ceil(m / bm) * math.ceil(n / bn)
        for split in (1, 2, 4, 8, 16):
            if split > 1 and (programs * split > 2 * sm_count or k < 2 * split * bk):
                continue
            cfg = ShrinkConfig(bm, bn, bk, split, 4, 3)
            if is_valid_tile(bm, bn, bk) and shrink_smem_bytes(cfg) <= smem_limit:
                yield cfg


def expand_candidates(n: int, s: int, r: int, m: int, smem_limit: int = 227 * 1024) -> Iterator[ExpandConfig]:
    """Stage-1 search space of one expand shape (4 warps, 2 stages)."""
    max_m, max_k = _pow2_at_least(m), _pow2_at_least(r)
    for bm, bn, bk in itertools.product((16, 32, 64, 128), (32, 64, 128, 256), (16, 32, 64)):
        if bm > max_m or bk > max_k:
            continue
        cfg = ExpandConfig(bm, bn, bk, 4, 2)
        if is_valid_tile(bm, bn, bk) and expand_smem_bytes(cfg) <= smem_limit:
            yield cfg


def launch_variants(cfg: ShrinkConfig | ExpandConfig, smem_limit: int) -> list:
    """Stage 2: the same tiles with 4 or 8 warps and 1 to 4 pipeline stages."""
    out = []
    for warps, stages in itertools.product((4, 8), (1, 2, 3, 4)):
        cand = type(cfg)(**{**asdict(cfg), "num_warps": warps, "num_stages": stages})
        smem = shrink_smem_bytes(cand) if isinstance(cand, ShrinkConfig) else expand_smem_bytes(cand)
        if smem <= smem_limit and (warps == 4 or cfg.block_m * cfg.block_n >= 64 * 64):
            out.append(cand)
    return out


# ---- tables -------------------------------------------------------------------------

# How each key field is matched when the exact value was not tuned.
_RULES = {
    "shrink": {"k": "log", "n": "ceil", "m": "ceil"},
    "expand": {"s": "log", "n": "log", "r": "ceil", "m": "ceil"},
}
_RULES["expand_in_gemm"] = _RULES["expand"]


def table_filename(device_name: str) -> str:
    return re.sub(r"[^A-Za-z0-9]+", "_", device_name).strip("_") + ".json"


def _table_dirs() -> list[Path]:
    dirs = [Path(p) for p in os.environ.get("SGLANG_VLORA_ATMM_TABLE_DIR", "").split(":") if p]
    return [*dirs, TABLE_DIR]


@functools.cache
def load_table(device_name: str) -> dict[str, Any] | None:
    """The first table found for ``device_name``; else the table of the GPU of the same
    architecture (compute capability) whose name is closest (logged, once); else None
    (untuned defaults, logged)."""
    for d in _table_dirs():
        path = d / table_filename(device_name)
        if path.is_file():
            return json.loads(path.read_text())
    capability = _capability_of(device_name)
    if capability is None:
        return None
    found = same_architecture_table(device_name, capability, _table_dirs())
    if found is None:
        logger.warning(
            "sglang-vlora: no ATMM tiling table for %s (sm_%d%d) nor any GPU of its architecture: "
            "untuned default tiles, which can be far slower in prefill; `make tune` writes one",
            device_name, *capability,
        )
        return None
    path, table = found
    logger.warning(
        "sglang-vlora: no ATMM tiling table for %s; using %s's (%s, same architecture sm_%d%d); "
        "`make tune` writes one for this GPU",
        device_name, table.get("device"), path.name, *capability,
    )
    return table


def same_architecture_table(
    device_name: str, capability: tuple[int, int], dirs: list[Path]
) -> tuple[Path, dict[str, Any]] | None:
    """Among the tables in ``dirs`` that record ``capability``, the one whose device name
    shares the longest prefix with ``device_name`` (ties: the first path in order)."""
    best: tuple[int, Path, dict] | None = None
    for d in dirs:
        for path in sorted(d.glob("*.json")) if d.is_dir() else []:
            table = json.loads(path.read_text())
            if tuple(table.get("capability") or ()) != tuple(capability):
                continue
            common = len(os.path.commonprefix([device_name, str(table.get("device", ""))]))
            if best is None or common > best[0]:
                best = (common, path, table)
    return None if best is None else (best[1], best[2])


def _capability_of(device_name: str) -> tuple[int, int] | None:
    import torch

    if not torch.cuda.is_available():
        return None
    for index in range(torch.cuda.device_count()):
        if torch.cuda.get_device_name(index) == device_name:
            return tuple(torch.cuda.get_device_capability(index))
    return None


def _pick(values: set[int], want: int, rule: str) -> int:
    if want in values:
        return want
    if rule == "ceil":
        above = [v for v in values if v >= want]
        return min(above) if above else max(values)
    return min(values, key=lambda v: (abs(math.log2(max(v, 1)) - math.log2(max(want, 1))), -v))


def nearest_entry(entries: list[dict[str, Any]], op: str, key: dict[str, int]) -> dict | None:
    """Apply the nearest-shape rule (module docstring) to a table's entries of ``op``."""
    rules = _RULES[op]
    for field, rule in rules.items():
        if not entries:
            return None
        chosen = _pick({e[field] for e in entries}, key[field], rule)
        entries = [e for e in entries if e[field] == chosen]
    return entries[0] if entries else None


def triton_configs(device_name: str, op: str, key: dict[str, int]) -> list[ShrinkConfig | ExpandConfig]:
    """Every Triton config the table may pick for ``key`` at any token count: the entries
    the nearest-shape rule keeps for all fields but ``m`` that run Triton, plus the
    untuned default (what a token count outside the table gets without one)."""
    entries = op_entries(load_table(device_name), op)
    for field, rule in _RULES[op].items():
        if field == "m" or not entries:
            continue
        chosen = _pick({e[field] for e in entries}, key[field], rule)
        entries = [e for e in entries if e[field] == chosen]
    cls = ShrinkConfig if op == "shrink" else ExpandConfig
    configs = {cls(**e["config"]) for e in entries if e.get("impl", "triton") == "triton"}
    if not entries:
        for m in TOKEN_GRID:
            configs.add(default_shrink(key["k"], key["n"], m) if op == "shrink" else default_expand(
                key["n"], key["s"], key["r"], m))
    return sorted(configs, key=str)


def op_entries(table: dict[str, Any] | None, op: str) -> list[dict[str, Any]]:
    """A table's entries of ``op``; for ``expand_in_gemm`` in a table without any, its
    ``expand`` entries (tables tuned before the in-GEMM expand had its own)."""
    if not table:
        return []
    if op == "expand_in_gemm" and not table.get(op):
        return table.get("expand", [])
    return table.get(op, [])


def _lookup(device_name: str, op: str, key: dict[str, int]) -> dict | None:
    return nearest_entry(op_entries(load_table(device_name), op), op, key)


IMPLS = ("triton", "cuda", "cublas")
# Each op's shape key, in the order of ``choose``'s ``dims`` and of a table entry's fields.
KEY_FIELDS = {"shrink": ("k", "n", "m"), "expand": ("n", "s", "r", "m"), "expand_in_gemm": ("n", "s", "r", "m")}


@functools.lru_cache(maxsize=65536)
def choose(device_name: str, op: str, impl: str, dims: tuple[int, ...]) -> tuple[str, ShrinkConfig | ExpandConfig | None]:
    """``(implementation, config)`` of one ``op`` shape (``dims`` in the order of the
    module docstring's shape keys) from the nearest tuned entry.

    ``impl="auto"``: the entry's fastest implementation (``"cublas"`` with no config,
    ``"cuda"`` with its CUDA config) where the entry records it, else Triton. A named
    ``impl`` gets that implementation's config of the nearest entry, or its untuned
    default when the entry has none."""
    if impl not in ("auto", *IMPLS):
        raise ValueError(f"unknown ATMM implementation {impl!r}")
    key = dict(zip(KEY_FIELDS[op], dims, strict=True))
    entry = _lookup(device_name, op, key)
    if impl == "auto":
        impl = entry.get("impl", "triton") if entry else "triton"
        if impl != "triton" and impl not in entry:
            impl = "triton"
    if impl == "cublas":
        return "cublas", None
    cls = ShrinkConfig if op == "shrink" else ExpandConfig
    if impl == "cuda":
        cuda = entry.get("cuda") if entry else None
        default = default_cuda_shrink if op == "shrink" else default_cuda_expand
        return "cuda", cls(**cuda["config"]) if cuda else default(*dims)
    default = default_shrink if op == "shrink" else default_expand
    return "triton", cls(**entry["config"]) if entry else default(*dims)


def clear_caches() -> None:
    """Forget loaded tables and looked-up configs (after writing a table, in tests)."""
    load_table.cache_clear()
    choose.cache_clear()


# ---- the CUDA C++ implementation's tiles ---------------------------------------------

# (block_m, block_n, block_k, warps_m, warps_n, warps_k, stages), one per compiled kernel:
# a copy of the X-macro lists ATMM_SHRINK_TILES / ATMM_EXPAND_TILES in
# cuda/atmm_kernels.cuh (tests/kernels/test_cuda_sources.py keeps the two equal). A CUDA
# config is the tile's (block_m, block_n, block_k, num_warps = product of the warps,
# num_stages) plus, for shrink, any split-K.
CUDA_SHRINK_TILES: tuple[tuple[int, ...], ...] = (
    (16, 16, 256, 1, 1, 4, 3),
    (16, 32, 256, 1, 2, 2, 3),
    (16, 64, 128, 1, 4, 1, 4),
    (16, 64, 256, 1, 2, 2, 3),
    (16, 128, 128, 1, 4, 1, 3),
    (32, 32, 128, 2, 2, 1, 3),
    (32, 64, 128, 2, 2, 1, 3),
    (64, 64, 64, 2, 2, 1, 3),
    (64, 128, 64, 2, 2, 1, 3),
    (128, 64, 64, 2, 2, 1, 3),
    (128, 128, 64, 2, 4, 1, 3),
)
CUDA_EXPAND_TILES: tuple[tuple[int, ...], ...] = (
    (16, 64, 16, 1, 4, 1, 2),
    (16, 128, 16, 1, 4, 1, 2),
    (16, 64, 32, 1, 4, 1, 2),
    (16, 128, 32, 1, 4, 1, 2),
    (16, 128, 64, 1, 4, 1, 2),
    (16, 256, 64, 1, 4, 1, 2),
    (32, 128, 32, 2, 2, 1, 2),
    (64, 128, 16, 2, 2, 1, 2),
    (64, 128, 32, 2, 2, 1, 2),
    (64, 128, 64, 2, 2, 1, 2),
    (128, 64, 64, 2, 2, 1, 2),
    (64, 256, 32, 2, 4, 1, 2),
    (128, 128, 32, 2, 4, 1, 2),
)


def _cuda_shrink(tile: tuple[int, ...], split_k: int = 1) -> ShrinkConfig:
    bm, bn, bk, wm, wn, wk, stages = tile
    return ShrinkConfig(bm, bn, bk, split_k, wm * wn * wk, stages)


def _cuda_expand(tile: tuple[int, ...]) -> ExpandConfig:
    bm, bn, bk, wm, wn, wk, stages = tile
    return ExpandConfig(bm, bn, bk, wm * wn * wk, stages)


def is_cuda_config(cfg: ShrinkConfig | ExpandConfig) -> bool:
    """Whether the CUDA implementation has a kernel for ``cfg`` (any split-K)."""
    if isinstance(cfg, ShrinkConfig):
        return cfg.split_k >= 1 and any(_cuda_shrink(t, cfg.split_k) == cfg for t in CUDA_SHRINK_TILES)
    return any(_cuda_expand(t) == cfg for t in CUDA_EXPAND_TILES)


def _split_options(k: int, bk: int, programs: int, sm_count: int) -> Iterator[int]:
    for split in (1, 2, 4, 8, 16):
        if split == 1 or (programs * split <= 2 * sm_count and k >= 2 * split * bk):
            yield split


def cuda_shrink_candidates(k: int, n: int, m: int, sm_count: int = 132) -> Iterator[ShrinkConfig]:
    """Search space of one shrink shape for the CUDA implementation: the compiled tiles
    no larger than the shape needs, with split-K as in :func:`shrink_candidates`."""
    max_m, max_n = _pow2_at_least(m), _pow2_at_least(n)
    for tile in CUDA_SHRINK_TILES:
        bm, bn, bk = tile[:3]
        if bm > max_m or bn > max_n:
            continue
        programs = math.ceil(m / bm) * math.ceil(n / bn)
        for split in _split_options(k, bk, programs, sm_count):
            yield _cuda_shrink(tile, split)


def cuda_expand_candidates(n: int, s: int, r: int, m: int) -> Iterator[ExpandConfig]:
    max_m, max_k = _pow2_at_least(m), _pow2_at_least(r)
    for tile in CUDA_EXPAND_TILES:
        if tile[0] <= max_m and tile[2] <= max_k:
            yield _cuda_expand(tile)


def _closest_tile(tiles, bm: int, bn: int, bk: int) -> tuple[int, ...]:
    def dist(t: tuple[int, ...]) -> tuple[float, float, float]:
        return (abs(math.log2(t[0] / bm)), abs(math.log2(t[1] / bn)), abs(math.log2(t[2] / bk)))

    return min(tiles, key=dist)


def default_cuda_shrink(k: int, n: int, m: int, sm_count: int = 132) -> ShrinkConfig:
    """Untuned CUDA fallback: of the candidate tiles the one closest to a shape-based
    target, split-K while the grid has fewer blocks than SMs and every split keeps 256
    of K (at most 4 splits from 65 tokens up)."""
    bm = min(_pow2_at_least(m), 64 if m <= 2048 else 128)
    bn = min(_pow2_at_least(n), 32 if m <= 64 else 128)
    fits = [t for t in CUDA_SHRINK_TILES if t[0] <= _pow2_at_least(m) and t[1] <= _pow2_at_least(n)]
    tile = _closest_tile(fits or CUDA_SHRINK_TILES, bm, bn, 256 if m <= 64 else 64)
    programs = math.ceil(m / tile[0]) * math.ceil(n / tile[1])
    split, max_split = 1, 16 if m <= 64 else 4
    while split < max_split and programs * split < sm_count and k // (split * 2) >= 256:
        split *= 2
    return _cuda_shrink(tile, split)


def default_cuda_expand(n: int, s: int, r: int, m: int) -> ExpandConfig:
    bm = min(_pow2_at_least(m), 64 if m <= 2048 else 128)
    bk = min(_pow2_at_least(r), 64)
    fits = [t for t in CUDA_EXPAND_TILES if t[0] <= _pow2_at_least(m) and t[2] <= _pow2_at_least(r)]
    return _cuda_expand(_closest_tile(fits or CUDA_EXPAND_TILES, bm, 128, bk))


@functools.cache
def device_name(index: int) -> str:
    """``torch.cuda.get_device_name``, cached (it is the table key)."""
    import torch

    return torch.cuda.get_device_name(index)
