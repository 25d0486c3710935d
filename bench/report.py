"""Write the measured figures of README.md and docs/*.md from the results files in bench/results/.

    python bench/report.py            # rewrite every figures block from its results file
    python bench/report.py --check    # change nothing; list each block that differs (exit 1)

A *figures block* is a span of a markdown file between two markers, written by this script
and never by hand:

    <!-- figures:switch-table -->
    | layout | rank | ... |
    <sub>From `bench/results/switch_h200.json`: device, date, versions, git revision.</sub>
    <!-- /figures:switch-table -->

Each block name is registered with the results file(s) it reads and a function that returns
its markdown; the script appends the source line (file, device, date, versions, git revision
as the file records them). The same block may appear in several files. Each kind of results
file has one renderer module holding its blocks (kernels, mode switches and fusion are here),
so after a benchmark rewrites its file, re-running this script is all that updates the docs.
``tests/docs/test_figures.py`` fails when a block differs from what its file gives, when a
marker names no registered block, when the docs quote a results file that does not exist or
that predates provenance (``bench/results/legacy/``), and when a results file records no clean
revision and released versions.

Plugging in a renderer for another kind (for example the end-to-end results): create
``bench/figures_<kind>.py``; every ``bench/figures_*.py`` is imported by this script and by the
test, so nothing here needs an edit::

    from bench.report import block

    @block("e2e-headline", "e2e_h200.json")
    def e2e_headline(run: dict) -> str:
        # one argument per results file named, the parsed JSON; return markdown
        return "| point | ours | ... |\\n|---|---|...|"

then put ``<!-- figures:e2e-headline -->`` / ``<!-- /figures:e2e-headline -->`` where the
figures go and run ``python bench/report.py``.

A benchmark that writes a results file records :func:`bench.provenance.record` in it (key
``"provenance"``): the git revision, whether the code was clean, the versions of the packages
that ran, the machine and the date. Run benchmarks from a clean checkout of the commit under
test so that the revision describes the code that produced the numbers; a machine that gets a
copy of the tree without ``.git`` reads the revision from the stamp carried with it
(``python bench/run_e2e.py stamp``, see :mod:`bench.provenance`).
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib
import json
import re
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"
DOC_GLOBS = ("README.md", "docs/*.md")
# A marker is a line of its own (a marker quoted inside a sentence is not one).
MARKER = re.compile(
    r"(?P<open>^<!-- figures:(?P<name>[\w.-]+) -->\n)(?P<body>.*?)(?P<close>^<!-- /figures:(?P=name) -->$)",
    re.S | re.M,
)
ANY_MARKER = re.compile(r"^<!-- /?figures:([\w.-]+) -->$", re.M)
VERSIONED_PACKAGES = ("torch", "triton", "transformers", "peft", "sglang", "sglang-vlora", "numpy")


@dataclasses.dataclass(frozen=True)
class Block:
    """A named figures block: the results files it reads and the function writing its markdown."""

    name: str
    results: tuple[str, ...]
    render: Callable[..., str]


BLOCKS: dict[str, Block] = {}


def block(name: str, *results: str) -> Callable[[Callable[..., str]], Callable[..., str]]:
    """Register ``render(*parsed_results) -> markdown`` as the figures block ``name``."""

    def register(render: Callable[..., str]) -> Callable[..., str]:
        if name in BLOCKS and BLOCKS[name].render.__qualname__ != render.__qualname__:
            raise ValueError(f"figures block {name!r} is registered twice")
        BLOCKS[name] = Block(name, tuple(results), render)
        return render

    return register


def load_renderers(bench_dir: Path = REPO / "bench") -> None:
    """Import every ``bench/figures_*.py`` (each registers its blocks)."""
    for path in sorted(bench_dir.glob("figures_*.py")):
        importlib.import_module(f"bench.{path.stem}")


# ---------------------------------------------------------------- sources


def recorded_provenance(data: dict[str, Any]) -> dict[str, Any] | None:
    """What a results file records of its run in :func:`bench.provenance.record`'s layout: its
    ``provenance``, or for one end-to-end run (which keeps its whole environment) the record
    built from that; None for a file that records neither."""
    # Imported here: run as a script, this file has the repository on its path only in main.
    from bench import provenance

    if "provenance" in data:
        return data["provenance"]
    if "run_id" in data and "code" in data:
        return provenance.record(data, data["date"])
    return None


def describe_source(name: str, data: dict[str, Any]) -> str:
    """One line naming a results file and what it records of its run. A file that records no
    provenance shows its own device, date and version fields and says the revision is missing."""
    prov = recorded_provenance(data)
    if prov:
        commit = prov["git"]["commit"]
        git = (commit[:10] if commit else "unknown") + ("" if prov["git"]["clean"] else " (uncommitted changes)")
        device, date, versions = prov["machine"]["device"], prov["date"], dict(prov["versions"])
    else:
        versions = dict(data.get("versions") or {k: data[k] for k in ("torch", "triton", "sglang") if k in data})
        git = versions.pop("sglang_vlora_git", None) or "not recorded"
        device, date = data.get("device", "device not recorded"), data.get("date", "")
    shown = ", ".join(f"{k} {v}" for k, v in versions.items() if k in ("torch", "triton", "transformers", "sglang"))
    return f"<sub>From `bench/results/{name}`: {device}, {date[:10]}, {shown}; git revision {git}.</sub>"


# ---------------------------------------------------------------- rendering


def render(name: str, results_dir: Path = RESULTS) -> str:
    """The full text of block ``name`` (without its markers)."""
    spec = BLOCKS[name]
    data = [json.loads((results_dir / f).read_text()) for f in spec.results]
    body = spec.render(*data).rstrip("\n")
    sources = "\n".join(describe_source(f, d) for f, d in zip(spec.results, data, strict=True))
    return f"{body}\n\n{sources}\n"


def doc_files(root: Path = REPO) -> list[Path]:
    return sorted({p for pattern in DOC_GLOBS for p in root.glob(pattern)})


def rewrite(text: str, where: str, results_dir: Path = RESULTS) -> tuple[str, list[str]]:
    """``text`` with every block re-rendered, and the problems found (unknown or unpaired markers)."""
    problems = []
    opened = ANY_MARKER.findall(text)
    for name in set(opened):
        if opened.count(name) % 2 or not re.search(rf"^<!-- figures:{re.escape(name)} -->\n", text, re.M):
            problems.append(f"{where}: markers of block {name!r} are not paired (open on its own line, then close)")
        elif name not in BLOCKS:
            problems.append(f"{where}: block {name!r} has no renderer (known: {sorted(BLOCKS)})")

    def fill(match: re.Match[str]) -> str:
        name = match["name"]
        if name not in BLOCKS:
            return match[0]
        missing = [f for f in BLOCKS[name].results if not (results_dir / f).exists()]
        if missing:
            problems.append(f"{where}: block {name!r} reads {missing}, not in {results_dir.name}/")
            return match[0]
        return match["open"] + render(name, results_dir) + match["close"]

    return MARKER.sub(fill, text), problems


def update(files: Iterable[Path], results_dir: Path = RESULTS, write: bool = True) -> list[str]:
    """Re-render every block of ``files``; with ``write`` save the changes. Returns the problems,
    including (without ``write``) each block that differs from its results file."""
    problems = []
    for path in files:
        text = path.read_text()
        new, found = rewrite(text, path.name, results_dir)
        problems += found
        if new == text:
            continue
        if write:
            path.write_text(new)
        else:
            stale = [m["name"] for m in MARKER.finditer(text) if m[0] not in new]
            problems.append(f"{path.name}: figures differ from bench/results in block(s) {stale}")
    return problems


def cited_results(text: str) -> set[str]:
    """Results files a doc names as ``bench/results/<path>`` (a plain path, no pattern; ``.json``,
    ``.json.gz``, ``.md`` or ``.png``), relative to bench/results/."""
    return set(re.findall(r"bench/results/((?:[\w.-]+/)*[\w.-]+\.(?:json\.gz|json|md|png))(?![\w{|*])", text))


def quoted_results(texts: Iterable[str]) -> set[str]:
    """The results files that docs quote: those their figures blocks read and those they name."""
    quoted: set[str] = set()
    for text in texts:
        quoted |= cited_results(text)
        quoted |= {f for name in set(ANY_MARKER.findall(text)) if name in BLOCKS for f in BLOCKS[name].results}
    return quoted


# ---------------------------------------------------------------- kernels (bench/kernels.py)

# Labels of bench/kernels.py's SHAPES (a shape not listed here shows under its own name).
KERNEL_SHAPES = {
    "proj": "proj 4096x4096",
    "qkv": "qkv (3 slices)",
    "gate_up": "gate_up (2x11008)",
    "q2_qkv": "Qwen2-VL qkv (3584+512+512)",
    "q2_o": "Qwen2-VL o 3584x3584",
}
KERNEL_METHODS = {
    "atmm": "ATMM",
    "atmm_overlap": "ATMM overlapped",
    "atmm_in_gemm": "ATMM shrink in the GEMM",
    "atmm_gemm": "ATMM LoRA in its own GEMM",
    "atmm_cuda": "ATMM CUDA C++",
    "sglang_triton": "SGLang triton",
    "sglang_csgmv": "SGLang csgmv",
    "bmm": "padded bmm (dLoRA-like)",
}
PEERS = ("sglang_triton", "sglang_csgmv", "bmm")
# The ATMM issue's targets: rank-64 prefill of 1k-8k tokens at most 20% (stretch 10%), decode up
# to 32 tokens at most 30% (every rank).
TARGET_PCT = {"prefill": 20.0, "decode": 30.0}
PREFILL_STRETCH_PCT = 10.0
PREFILL_TARGET_RANK = 64
DECODE_TARGET_TOKENS = 32


def _kernel_rows(*runs: dict) -> list[dict]:
    return [row for run in runs for row in run["rows"]]


def _methods(rows: list[dict]) -> list[str]:
    """The methods the rows report, known ones first in :data:`KERNEL_METHODS` order (a new
    method of bench/kernels.py shows under its own name)."""
    seen = dict.fromkeys(m for r in rows for m in r["extra_pct"])
    return [m for m in KERNEL_METHODS if m in seen] + [m for m in seen if m not in KERNEL_METHODS]


def _extra(rows: list[dict], method: str) -> list[float]:
    """The method's extra in the rows where it ran (None: not run there, or failed)."""
    return [r["extra_pct"][method] for r in rows if r["extra_pct"].get(method) is not None]


# ATMM's Triton entry points; the graph-safe ones are what decode runs. ``atmm_in_gemm`` is in
# runs of bench/kernels.py from after the shrink moved into the GEMM only, ``atmm_gemm`` (an eager
# prefill entry point) in runs from 2026-11-25 on.
GRAPH_ENTRY_POINTS = ("atmm_overlap", "atmm_in_gemm")
TRITON_ENTRY_POINTS = ("atmm", *GRAPH_ENTRY_POINTS, "atmm_gemm")


def _best_of(row: dict, methods: Sequence[str]) -> float:
    return min(row["extra_pct"][m] for m in methods if row["extra_pct"].get(m) is not None)


def _best_triton(row: dict) -> float:
    return _best_of(row, TRITON_ENTRY_POINTS)


def _best_graph(row: dict) -> float:
    return _best_of(row, GRAPH_ENTRY_POINTS)


def _max_err(rows: list[dict]) -> float:
    """The largest bf16 error of ATMM's Triton entry points over ``rows``."""
    return max(r["err"][m] for r in rows for m in TRITON_ENTRY_POINTS if isinstance(r["err"].get(m), float))


def table_head(*columns: str) -> list[str]:
    """A markdown table's header and rule lines."""
    return ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]


def _span(values: Sequence[float], unit: str = "%") -> str:
    if not values:
        return "-"
    low, high = round(min(values)), round(max(values))  # ints: no "-0"
    return f"{low}{unit}" if low == high else f"{low}{' to ' if low < 0 else '-'}{high}{unit}"


def _shapes(rows: list[dict]) -> list[str]:
    return list(dict.fromkeys(r["shape"] for r in rows))


def _kernel_groups(rows: list[dict]) -> list[tuple[str, str, list[dict]]]:
    """(shape, mode label, rows) for decode up to 32 tokens, decode above, and prefill."""
    groups = []
    for shape in _shapes(rows):
        for mode, test in (
            ("decode", lambda r: r["mode"] == "decode" and r["tokens"] <= DECODE_TARGET_TOKENS),
            ("decode", lambda r: r["mode"] == "decode" and r["tokens"] > DECODE_TARGET_TOKENS),
            ("prefill", lambda r: r["mode"] == "prefill"),
        ):
            members = [r for r in rows if r["shape"] == shape and test(r)]
            if members:
                tokens = sorted({r["tokens"] for r in members})
                label = f"{tokens[0]}-{tokens[-1]}" if len(tokens) > 1 else f"{tokens[0]}"
                groups.append((shape, f"{mode}, {label} tokens", members))
    return groups


@block("kernels-summary", "kernels_proj_h200.json", "kernels_slices_h200.json")
def kernels_summary(proj: dict, slices: dict) -> str:
    """README: extra time over the base GEMM at rank 64, ranges over 1 and 4 adapters."""
    rows = _kernel_rows(proj, slices)
    rank64 = [r for r in rows if r["rank"] == 64]
    methods = _methods(rows)
    lines = [
        "| shape | mode | " + " | ".join(KERNEL_METHODS.get(m, m) for m in methods) + " |",
        "|---" * (2 + len(methods)) + "|",
    ]
    for shape, label, members in _kernel_groups(rank64):
        spans = [_span(_extra(members, m)) for m in methods]
        lines.append(f"| {KERNEL_SHAPES.get(shape, shape)} | {label} | " + " | ".join(spans) + " |")
    beats = sum(_best_triton(r) < min(r["extra_pct"][p] for p in PEERS) for r in rows)
    err = _max_err(rows)
    prefill = [_best_triton(r) for r in rows if r["mode"] == "prefill"]
    proj_decode = [_best_triton(r) for r in rows if r["mode"] == "decode" and r["shape"] == "proj"]
    with_cuda = [r for r in rows if "atmm_cuda" in r["extra_pct"]]
    cuda_slower = sum(r["extra_pct"]["atmm_cuda"] > r["extra_pct"]["atmm"] for r in with_cuda)
    met = _targets_met(rows)
    lines += [
        "",
        f"ATMM (the best of its Triton entry points) beats every peer in {beats} of {len(rows)} "
        f"measured cells (all ranks), and its bf16 error against fp32 is at most {err:.1e}. Over all "
        f"ranks, ATMM's prefill costs {_span(prefill)} and decode of the 4096x4096 projection "
        f"{_span(proj_decode)}; the targets (at most {TARGET_PCT['prefill']:.0f}% in rank-"
        f"{PREFILL_TARGET_RANK} prefill, {TARGET_PCT['decode']:.0f}% in decode up to {DECODE_TARGET_TOKENS} "
        f"tokens) are met in {met}. "
        f"The CUDA C++ implementation is slower than `lora_apply`'s Triton path in {cuda_slower} of "
        f"{len(with_cuda)} cells where it ran.",
    ]
    return "\n".join(lines)


def _target_prefill(rows: list[dict]) -> list[float]:
    """The best Triton entry point's extra in each prefill cell the prefill target is about."""
    return [_best_triton(r) for r in rows if r["mode"] == "prefill" and r["rank"] == PREFILL_TARGET_RANK]


def _targets_met(rows: list[dict]) -> str:
    """'N of M prefill cells (K at the stretch) and K of L decode cells', with the target each
    mode has."""
    prefill = _target_prefill(rows)
    decode = [r for r in rows if r["mode"] == "decode" and r["tokens"] <= DECODE_TARGET_TOKENS]
    met_prefill = sum(v <= TARGET_PCT["prefill"] for v in prefill)
    stretch = sum(v <= PREFILL_STRETCH_PCT for v in prefill)
    met_decode = sum(_best_graph(r) <= TARGET_PCT["decode"] for r in decode)
    by_shape = ", ".join(
        f"{shape} {sum(_best_graph(r) <= TARGET_PCT['decode'] for r in decode if r['shape'] == shape)}"
        f" of {sum(r['shape'] == shape for r in decode)}"
        for shape in _shapes(decode)
    )
    return (
        f"{met_prefill} of {len(prefill)} prefill cells ({stretch} at the {PREFILL_STRETCH_PCT:.0f}% stretch) "
        f"and {met_decode} of {len(decode)} decode cells "
        f"with the better graph-safe entry point ({by_shape})"
    )


@block("kernels-rank64", "kernels_proj_h200.json", "kernels_slices_h200.json")
def kernels_rank64(proj: dict, slices: dict) -> str:
    """docs/atmm.md: every rank-64 cell, extra time in % of the base GEMM, the best in bold."""
    rows = [r for r in _kernel_rows(proj, slices) if r["rank"] == 64]
    methods = _methods(rows)
    lines = [
        "| shape | mode | tokens | adapters | merged µs | " + " | ".join(f"{KERNEL_METHODS.get(m, m)} %" for m in methods)
        + " | ATMM bf16 err |",
        "|---" * (6 + len(methods)) + "|",
    ]
    for row in rows:
        best = min(v for v in row["extra_pct"].values() if v is not None)
        cells = [
            "-" if row["extra_pct"].get(m) is None  # not run, or failed in this cell
            else f"**{row['extra_pct'][m]:.0f}**" if row["extra_pct"][m] == best
            else f"{row['extra_pct'][m]:.0f}"
            for m in methods
        ]
        lines.append(
            f"| {row['shape']} | {row['mode']} | {row['tokens']} | {row['adapters']} | {row['us']['merged']:.1f} | "
            + " | ".join(cells)
            + f" | {row['err']['atmm']:.4f} |"
        )
    return "\n".join(lines)


@block("kernels-ranges", "kernels_proj_h200.json", "kernels_slices_h200.json")
def kernels_ranges(proj: dict, slices: dict) -> str:
    """docs/atmm.md: the spans over every rank, the targets, and the CUDA C++ comparison."""
    rows = _kernel_rows(proj, slices)
    proj_rows = [r for r in rows if r["shape"] == "proj"]
    ranks = sorted({r["rank"] for r in proj_rows})

    def span(method: str, mode: str, members: list[dict] = proj_rows) -> str:
        return _span(_extra([r for r in members if r["mode"] == mode], method))

    def best_peer(mode: str) -> str:
        return _span([min(r["extra_pct"][p] for p in PEERS) for r in proj_rows if r["mode"] == mode])

    err = _max_err(rows)
    prefill = _target_prefill(rows)
    small = [r for r in rows if r["mode"] == "decode" and r["tokens"] <= DECODE_TARGET_TOKENS]
    decode = []
    for shape in _shapes(small):
        values = [_best_graph(r) for r in small if r["shape"] == shape]
        met = sum(v <= TARGET_PCT["decode"] for v in values)
        decode.append(f"{shape} {_span(values)} (met in {met} of {len(values)} cells)")
    with_cuda = [r for r in rows if "atmm_cuda" in r["extra_pct"]]
    faster_cuda = [r for r in with_cuda if r["extra_pct"]["atmm_cuda"] <= r["extra_pct"]["atmm"]]
    r64 = [r for r in proj_rows if r["rank"] == 64]
    lines = [
        f"Over ranks {ranks[0]}-{ranks[-1]} (proj): ATMM decode {span('atmm', 'decode')}, overlapped "
        f"{span('atmm_overlap', 'decode')}, shrink in the GEMM {span('atmm_in_gemm', 'decode')}; prefill "
        f"{span('atmm', 'prefill')}, shrink in the GEMM {span('atmm_in_gemm', 'prefill')}; the best peer per cell: "
        f"decode {best_peer('decode')}, prefill {best_peer('prefill')}. ATMM's bf16 error against fp32 "
        f"is at most {err:.4f} in every cell (`err` in the JSON).",
        "",
        f"Targets: rank-{PREFILL_TARGET_RANK} prefill (at most {TARGET_PCT['prefill']:.0f}%, stretch "
        f"{PREFILL_STRETCH_PCT:.0f}%) is met in {sum(v <= TARGET_PCT['prefill'] for v in prefill)} of "
        f"{len(prefill)} cells, the stretch in {sum(v <= PREFILL_STRETCH_PCT for v in prefill)} ({_span(prefill)} "
        f"with the best Triton entry point). Decode (at most {TARGET_PCT['decode']:.0f}% up to "
        f"{DECODE_TARGET_TOKENS} tokens, the better graph-safe entry point, all ranks): {'; '.join(decode)}.",
        "",
        f"CUDA C++ (`atmm_cuda`) against `lora_apply`'s Triton path: slower in {len(with_cuda) - len(faster_cuda)} "
        f"of {len(with_cuda)} cells (proj rank 64: decode {span('atmm_cuda', 'decode', r64)} vs "
        f"{span('atmm', 'decode', r64)}, prefill {span('atmm_cuda', 'prefill', r64)} vs "
        f"{span('atmm', 'prefill', r64)}); as fast or faster in "
        + (
            "; ".join(
                f"{r['shape']} {r['mode']} of {r['tokens']} tokens, rank {r['rank']}, {r['adapters']} adapter(s) "
                f"({r['extra_pct']['atmm_cuda']:.1f}% vs {r['extra_pct']['atmm']:.1f}%, overlapped Triton "
                f"{r['extra_pct']['atmm_overlap']:.1f}%)"
                for r in faster_cuda
            )
            or "no cell"
        )
        + ".",
    ]
    return "\n".join(lines)


@block("in-gemm-parts", "in_gemm_parts_h200.json")
def in_gemm_parts(parts: dict) -> str:
    """docs/atmm.md: the shrink-in-GEMM op's time by part (bench/in_gemm_parts.py), % of the base GEMM."""
    lines = table_head("cell (tokens x adapters)", "rank", "appended columns %", "expand %", "whole op %",
                       "plain copy of the base columns %", "expand / copy")
    for r in parts["rows"]:
        p = r["parts"]
        lines.append(
            f"| {r['shape']} {r['mode']} {r['tokens']}x{r['adapters']} | {r['rank']} | {p['appended_columns_pct']:.1f} | "
            f"{p['expand_pct']:.1f} | {p['in_gemm_pct']:.1f} | {p['copy_floor_pct']:.1f} | {p['expand_over_copy']:.2f} |"
        )
    return "\n".join(lines)


@block("expand-pdl", "expand_pdl_h200.json")
def expand_pdl(run: dict) -> str:
    """docs/atmm.md: the in-GEMM op with its expand launched with and without PDL
    (bench/expand_pdl.py), extra over the base GEMM in % of it."""
    lines = table_head("cell (tokens x adapters)", "base GEMM µs", "PDL off %",
                       f"PDL on, up to {run['pdl_max_rows']} rows %", "PDL at every row count %",
                       "same bits")
    for r in run["rows"]:
        pct = r["extra_pct"]
        base = sorted(r["us"]["merged"])[len(r["us"]["merged"]) // 2]
        lines.append(f"| {r['cell']} | {base:.1f} | {pct['off']:.1f} | {pct['on']:.1f} | {pct['on_all_rows']:.1f} | "
                     f"{'yes' if r['bit_exact'] else 'no'} |")
    return "\n".join(lines)


@block("graph-step-pdl", "graph_step_pdl_off_h200.json", "graph_step_pdl_on_h200.json",
       "graph_step_pdl_all_rows_h200.json")
def graph_step_pdl(off: dict, on: dict, all_rows: dict) -> str:
    """docs/atmm.md: a decode graph step's LoRA cost (bench/graph_step.py, in-GEMM, unmerged) with
    the expand launched without PDL, with it up to the shipped row limit, and at every row count."""
    lines = table_head("requests", "PDL off µs", f"PDL on, up to {on['pdl_max_rows']} rows µs",
                       "PDL at every row count µs")
    for a, b, c in zip(off["rows"], on["rows"], all_rows["rows"], strict=True):
        lines.append(f"| {a['requests']} | {_step_us(a)} | {_step_us(b)} | {_step_us(c)} |")
    return "\n".join(lines)


def _step_us(row: dict) -> str:
    """A graph step's in-GEMM LoRA cost in µs: the median trial (min-max)."""
    ms = sorted(row["in_gemm_adds_ms"])
    return f"{1000 * ms[len(ms) // 2]:.1f} ({1000 * ms[0]:.1f}-{1000 * ms[-1]:.1f})"


@block("expand-pdl-slices", "expand_pdl_slices_h200.json")
def expand_pdl_slices(run: dict) -> str:
    """docs/atmm.md: the in-GEMM op with its expand launched with PDL as shipped (rows and slices
    limited) against PDL at every slice count and at every row and slice count
    (bench/expand_pdl.py), extra over the base GEMM in % of it."""
    ways = list(run["ways"])
    labels = {**run["ways"], "on": f"PDL on, up to {run['pdl_max_rows']} rows and {run['pdl_max_slices']} slice "
                                    "(shipped)"}
    lines = table_head("cell (tokens x adapters)", "base GEMM µs", *(f"{labels[w]} %" for w in ways), "same bits")
    for r in run["rows"]:
        base = sorted(r["us"]["merged"])[len(r["us"]["merged"]) // 2]
        lines.append(f"| {r['cell']} | {base:.1f} | " + " | ".join(f"{r['extra_pct'][w]:.1f}" for w in ways)
                     + f" | {'yes' if r['bit_exact'] else 'no'} |")
    return "\n".join(lines)


@block("graph-step-pdl-slices", "graph_step_pdl_slices_off_h200.json", "graph_step_pdl_slices_on_h200.json",
       "graph_step_pdl_slices_all_h200.json")
def graph_step_pdl_slices(off: dict, on: dict, all_slices: dict) -> str:
    """docs/atmm.md: a decode graph step's LoRA cost (bench/graph_step.py, in-GEMM, unmerged) with
    the expand launched without PDL, with it as shipped (one-slice expands of at most the row
    limit) and with it for expands of every slice count."""
    lines = table_head("requests", "PDL off µs",
                       f"PDL on, up to {on['pdl_max_rows']} rows and {on['pdl_max_slices']} slice (shipped) µs",
                       f"PDL on at every slice count (up to {all_slices['pdl_max_slices']}) µs")
    for a, b, c in zip(off["rows"], on["rows"], all_slices["rows"], strict=True):
        lines.append(f"| {a['requests']} | {_step_us(a)} | {_step_us(b)} | {_step_us(c)} |")
    return "\n".join(lines)


@block("kernels-prefill-rounds", "kernels_prefill_rounds_h200.json")
def kernels_prefill_rounds(run: dict) -> str:
    """docs/atmm.md and README: rank-64 prefill cells with the methods taking turns over rounds
    (bench/kernels.py --rounds): each entry point's median extra over the base GEMM and the
    range of its per-round extras, and how many cells the best one brings within the target."""
    methods = [m for m in run["rows"][0]["rounds_us"] if m != "merged"]
    lines = table_head("cell (tokens x adapters)", "base GEMM µs (rounds)",
                       *(f"{KERNEL_METHODS.get(m, m)} % (rounds)" for m in methods), "best %")
    best_all = []
    for r in run["rows"]:
        rounds = r["rounds_us"]
        base = rounds["merged"]
        cells = []
        for m in methods:
            per_round = [100 * (t - b) / b for t, b in zip(rounds[m], base, strict=True)]
            cells.append(f"{r['extra_pct'][m]:.1f} ({min(per_round):.1f}-{max(per_round):.1f})")
        best = min(r["extra_pct"][m] for m in methods)
        best_all.append(best)
        lines.append(f"| {r['shape']} {r['tokens']}x{r['adapters']} | {r['us']['merged']:.1f} "
                     f"({min(base):.0f}-{max(base):.0f}) | " + " | ".join(cells) + f" | {best:.1f} |")
    n_rounds = len(run["rows"][0]["rounds_us"]["merged"])
    target, stretch = TARGET_PCT["prefill"], PREFILL_STRETCH_PCT
    lines += ["", f"Over {n_rounds} rounds in turns, the best entry point's median is at most {target:.0f}% in "
              f"{sum(b <= target for b in best_all)} of {len(best_all)} cells and at most {stretch:.0f}% in "
              f"{sum(b <= stretch for b in best_all)}."]
    return "\n".join(lines)


@block("gemm-epilogue", "gemm_epilogue_h200.json", "gemm_epilogue_h200_b.json")
def gemm_epilogue(first: dict, second: dict) -> str:
    """docs/atmm.md: the LoRA MMAs inside a Triton GEMM (bench/gemm_epilogue.py), two runs, % over
    cuBLAS's base GEMM of the same run."""
    lines = table_head("cell (tokens x adapters)", "cuBLAS µs", "ATMM shrink in the GEMM %", "Triton TMA GEMM alone %",
                       "LoRA in the GEMM %", "the same, no masks or scale %", "ATMM shrink + LoRA in the GEMM %")

    def both(a: dict, b: dict, key: str) -> str:
        return " / ".join("-" if r["pct"][key] is None else f"{r['pct'][key]:.1f}" for r in (a, b))

    for a, b in zip(first["rows"], second["rows"], strict=True):
        lines.append(
            f"| {a['shape']} prefill {a['tokens']}x{a['adapters']} | {a['us']['merged']:.1f} / {b['us']['merged']:.1f} | "
            f"{both(a, b, 'in_gemm')} | {both(a, b, 'tma_gemm')} | {both(a, b, 'fused')} | {both(a, b, 'raw')} | "
            f"{both(a, b, 'op')} |"
        )
    return "\n".join(lines)


@block("gemm-lora-shapes", "gemm_lora_shapes_h200.json", "host_cost_lora_gemm_h200.json")
def gemm_lora_shapes(shapes: dict, host: dict) -> str:
    """docs/atmm.md: the LoRA in ATMM's GEMM against the usual eager path on Qwen2-VL-7B's module
    shapes (bench/gemm_lora_shapes.py), and the backend's eager call both ways (layer_cost.py)."""
    configs = [k for k in shapes["rows"][0] if k.startswith("gemm[")]
    lines = table_head("module", "tokens", "off: GPU µs (spread)", *(f"{c}: GPU / off" for c in configs),
                       f"host µs a call: off / {configs[0]}")
    for r in shapes["rows"]:
        off = r["off"]
        ratios = [f"{r[c]['gpu_us'] / off['gpu_us']:.2f}" if c in r else "-" for c in configs]
        lines.append(f"| {r['module']} | {r['tokens']} | {off['gpu_us']:.1f} ({off['spread']:.2f}) | "
                     f"{' | '.join(ratios)} | {off['host_us']:.0f} / {r[configs[0]]['host_us']:.0f} |")
    lines += ["", "The backend's eager `forward_with_base` of one module, `--vlora-lora-gemm` on and off:", ""]
    lines += table_head("module", "tokens", "on: host µs", "on: GPU µs", "off: host µs", "off: GPU µs")
    for r in host["eager_module_paths"]:
        on, off = r.get("on", r.get("auto")), r["off"]  # "auto": the setting's name before 65427d6
        lines.append(f"| {r['module']} | {r['tokens']} | {on['host_us']:.1f} | {on['gpu_us']:.1f} | "
                     f"{off['host_us']:.1f} | {off['gpu_us']:.1f} |")
    return "\n".join(lines)


# ---------------------------------------------------------------- mode switches (bench/switch.py)

SWITCH_LAYOUTS = {"qkvo": "q,k,v,o 4096x4096", "all": "all 7 projections (+MLP 11008)"}
SWITCH_TARGET_MS = 3.2  # the modes issue's target: q,k,v,o of 32 layers at rank 64


def _switch_row(run: dict, layout: str, rank: int, method: str) -> dict:
    return next(r for r in run["rows"] if (r["layout"], r["rank"], r["method"]) == (layout, rank, method))


def _ops(row: dict) -> str:
    return f"{row['merge_ms']:.2f} / {row['switch_ms']:.2f} / {row['unmerge_ms']:.2f}"


@block("switch-table", "switch_h200.json")
def switch_table(run: dict) -> str:
    """README and docs/modes.md: ms per merge / switch / unmerge, ours vs the in-place baselines."""
    lines = table_head("layout", "rank", "ours (exact, one Triton pass): merge / switch / unmerge",
                       "per-layer `addmm_` (dLoRA-like)", "one `baddbmm_` per kind", "HBM floor (copy)")
    for layout, rank in sorted({(r["layout"], r["rank"]) for r in run["rows"]}, key=lambda k: (k[0] != "qkvo", k[1])):
        cells = [_ops(_switch_row(run, layout, rank, m)) for m in ("exact_fold", "loop_addmm", "baddbmm")]
        lines.append(
            f"| {SWITCH_LAYOUTS[layout]} | {rank} | " + " | ".join(cells) + f" | {run['copy_floor_ms'][layout]:.2f} |"
        )
    ours = _switch_row(run, "qkvo", 64, "exact_fold")
    worst = max(ours["merge_ms"], ours["switch_ms"], ours["unmerge_ms"])
    baselines = [r["changed"] for r in run["rows"] if r["method"] in ("loop_addmm", "baddbmm")]
    exact = [r for r in run["rows"] if r["exact"]]
    lines += [
        "",
        f"Target: q,k,v,o of {run['layers']} layers at rank 64, merge, switch and unmerge at most "
        f"{SWITCH_TARGET_MS} ms each: {'met' if worst <= SWITCH_TARGET_MS else 'missed'} "
        f"({ours['merge_ms']:.2f}, {ours['switch_ms']:.2f} and {ours['unmerge_ms']:.2f} ms; the copy floor is "
        f"{run['copy_floor_ms']['qkvo']:.2f} ms). One merge / unmerge cycle of the in-place baselines changes "
        f"{_span([100 * c for c in baselines])} of the weight elements ({run['dtype']}); the exact scheme "
        f"changes {'none' if all(r['changed'] == 0 for r in exact) else 'some'}. It keeps a pristine copy of "
        f"the targeted weights on the GPU: {run['weights_gib']['qkvo']:.1f} GiB for q,k,v,o, "
        f"{run['weights_gib']['all']:.1f} GiB for all projections.",
    ]
    return "\n".join(lines)


# ---------------------------------------------------------------- modes per layer (bench/mode_cost.py)


def _us(ms: float | None) -> str:
    return "-" if ms is None else f"{1000 * ms:+.0f}"


@block("mode-cost-table", "mode_cost_h200.json")
def mode_cost_table(run: dict) -> str:
    """docs/modes.md: microseconds each mode adds to one layer's base GEMMs, per batch and share."""
    lines = table_head("batch (tokens x requests)", "share of `k`", "base GEMMs, us", "unmerge adds, us",
                       "mixture adds, us", "merge adds, us", "mixture's error vs unmerged")
    for r in run["rows"]:
        lines.append(
            f"| {r['tokens']} x {r['requests']} | {r['share']:.2f} | {1000 * r['base_ms']:.0f} | "
            f"{_us(r['unmerge_adds_ms'])} | {_us(r['mixture_adds_ms'])} | {_us(r.get('merge_adds_ms'))} | "
            f"{r['mixture_rel_err']:.1e} |"
        )
    mixed = [r for r in run["rows"] if r["share"] < 1.0 and r["items"]["mixture"] > 0]
    worse = [r for r in mixed if r["mixture_adds_ms"] > r["unmerge_adds_ms"]]
    lines += [
        "",
        f"Per layer (q/k/v + o, rank {run['rank']}, {run['adapters']} adapters, {run['dtype']}; each layer timed "
        f"eagerly, launches included). Wherever a batch holds requests of other adapters, mixture adds more than "
        f"unmerge in {len(worse)} of {len(mixed)} cells: its `-k` term is a second LoRA pass over their tokens. "
        f"A batch of `k` alone (share 1.00) runs merged with nothing added.",
    ]
    return "\n".join(lines)


# ---------------------------------------------------------------- fusion (bench/fusion.py)


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def _fusion_rollbacks(manifest: dict) -> str:
    parts = []
    for rejection in manifest["rejections"]:
        below = ", ".join(f"{task} {acc:.2f}" for task, acc in rejection["below"].items())
        parts.append(f"`{rejection['task']}` into `{rejection['adapter']}` (val: {below})")
    return "; ".join(parts) if parts else "none"


@block("fusion-summary", "fusion_cpu.json")
def fusion_summary(run: dict) -> str:
    """README: the worked example in one sentence."""
    manifest = run["manifest"]
    entries = [t for a in manifest["adapters"] for t in a["tasks"]]
    return (
        f"Worked example (`{run['spec']}`, seed {manifest['seed']}, {run['setup']}): "
        f"**{len(manifest['order'])} datasets -> {len(manifest['adapters'])} adapters**, "
        f"{sum(t['meets'] for t in entries)} of {len(entries)} tasks at or above their requirement on the "
        f"val split that drove the decisions and {sum(t['test_meets'] for t in entries)} of {len(entries)} on "
        f"the held-out test split, {_count(len(manifest['rejections']), 'rollback')}, "
        f"{manifest['train_seconds']:.0f} s of training and evaluation."
    )


@block("fusion-table", "fusion_cpu.json")
def fusion_table(run: dict) -> str:
    """docs/trainer.md: every task's adapter, val and test accuracy, requirement; rollbacks; time."""
    manifest = run["manifest"]
    lines = ["| adapter | task | answer | val accuracy | test accuracy | required |", "| --- | --- | --- | --- | --- | --- |"]
    for adapter in manifest["adapters"]:
        for t in adapter["tasks"]:
            lines.append(
                f"| {adapter['name']} | {t['task']} | {t['answer']} | {t['val_accuracy']:.2f} | "
                f"{t['test_accuracy']:.2f} | {t['required']:.2f} |"
            )
    sizes = [len(a["tasks"]) for a in manifest["adapters"]]
    lines += [
        "",
        f"`{run['command']}` ({run['setup']}; dataset order {', '.join(manifest['order'])}): "
        f"{len(manifest['order'])} datasets -> {len(manifest['adapters'])} adapters "
        f"({manifest['tasks_per_adapter']} per adapter, {max(sizes)} in the fullest). Rolled back: "
        f"{_fusion_rollbacks(manifest)}. Training and evaluation took {manifest['train_seconds']:.0f} s "
        f"({run['wall_s']:.0f} s wall).",
    ]
    return "\n".join(lines)


# ---------------------------------------------------------------- command line


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 if a block differs")
    args = parser.parse_args(argv)
    load_renderers()
    problems = update(doc_files(), write=not args.check)
    for problem in problems:
        print(problem, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    # Run as a script, this file is ``__main__``; renderer modules import ``bench.report``, so the
    # registry in use must be that module's.
    sys.path.insert(0, str(REPO))
    from bench import report

    sys.exit(report.main())
