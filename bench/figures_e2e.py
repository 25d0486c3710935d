"""The README's end-to-end tables, figures blocks of :mod:`bench.report`.

``e2e-headline`` reads ``bench/results/e2e_h200.json``, the merged results that
``python bench/run_e2e.py report bench/results/e2e/*.json`` writes (``--readme README.md``
also puts the block into the README): every call, whatever plugin code it ran.
``e2e-current-<device>`` reads ``bench/results/e2e_current_<device>.json``, which
``python bench/run_e2e.py report FILES --package-as REV [REV ...] --out bench/results/e2e_current_<device>``
writes: only the calls that ran the plugin as it is at REV, or at any of the REVs given (one
device's files: the report refuses to pool devices).
A block is registered only once its file exists: before the benchmark has run there is
nothing to show, and a registered block must appear in the docs with its results file present.
"""

from __future__ import annotations

from typing import Any

from bench.e2e import report as e2e_report
from bench.report import RESULTS, block, describe_source

MERGED = "e2e_h200.json"
BLOCK = "e2e-headline"


def e2e_headline(merged: dict[str, Any]) -> str:
    return e2e_report.headline(merged["runs"], ", ".join(f"`{s}`" for s in merged["sources"]))


def block_text(merged: dict[str, Any], name: str = MERGED) -> str:
    """The block with its markers, as ``python bench/report.py`` writes it."""
    body = e2e_headline(merged).rstrip("\n")
    return (f"<!-- figures:{BLOCK} -->\n{body}\n\n{describe_source(name, merged)}\n"
            f"<!-- /figures:{BLOCK} -->")


if (RESULTS / MERGED).exists():
    block(BLOCK, MERGED)(e2e_headline)


def e2e_current(merged: dict[str, Any]) -> str:
    sel = merged["selection"]
    intro = (f"Only the calls that ran the plugin (`sglang_vlora/`, `cuda/`, `pyproject.toml`) as it is at "
             f"revision{'s' if len(sel['package_as']) > 1 else ''} {e2e_report.selected_revisions(sel)}: "
             f"{sel['calls']} of the {sel['of']} calls given.")
    return intro + " " + e2e_headline(merged)


# One block a device: e2e_current_h200.json -> e2e-current-h200.
for path in sorted(RESULTS.glob("e2e_current_*.json")):
    block("e2e-current-" + path.stem.removeprefix("e2e_current_"), path.name)(e2e_current)
