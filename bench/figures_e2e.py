"""The README's end-to-end headline table, a figures block of :mod:`bench.report`.

It reads ``bench/results/e2e_h200.json``, the merged results that
``python bench/run_e2e.py report bench/results/e2e/*.json`` writes (``--readme README.md``
also puts the block into the README). The block is registered only once that file exists:
before the benchmark has run there is nothing to show, and a registered block must appear in
the docs with its results file present.
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
