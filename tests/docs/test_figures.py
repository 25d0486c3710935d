"""Every measured figure in README.md and docs/*.md sits in a block that bench/report.py writes
from a results file in bench/results/; the docs must equal what the script writes now (CPU, no
benchmark is run)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from bench import report

report.load_renderers()

# Results files written before the runs recorded bench.provenance.record(): what each lacks. The
# test below checks the gap is still there, so a re-run that records provenance must remove
# its entry (and is then held to the rule for new files).
LEGACY = {
    "kernels_proj.json": "no git revision",
    "kernels_slices.json": "no git revision",
    "switch_h100.json": "no git revision",
    "e2e_gpu.json": "revision of an older, modified tree; sglang 0.0.0.dev0",
    "e2e_gpu_headline.json": "revision of an older, modified tree; sglang 0.0.0.dev0",
}


def test_docs_figures_equal_what_the_results_files_give() -> None:
    problems = report.update(report.doc_files(), write=False)
    assert not problems, "\n".join(problems) + "\nrun: python bench/report.py"


def test_every_block_is_used_and_every_cited_results_file_exists() -> None:
    texts = {p.name: p.read_text() for p in report.doc_files()}
    used = {name for text in texts.values() for name in report.ANY_MARKER.findall(text)}
    assert set(report.BLOCKS) <= used, f"blocks no doc shows: {sorted(set(report.BLOCKS) - used)}"
    for name, text in texts.items():
        missing = sorted(f for f in report.cited_results(text) if not (report.RESULTS / f).exists())
        assert not missing, f"{name} cites results files that do not exist: {missing}"


# Docs whose measured figures all come from results files: a table row with a decimal number or
# a percentage outside a figures block is a hand-written figure. (The README's sections are
# checked by their owners' blocks; add a doc here once its figures are all in blocks.)
FULLY_RENDERED = ("docs/atmm.md", "docs/modes.md", "docs/trainer.md")


@pytest.mark.parametrize("doc", FULLY_RENDERED)
def test_no_hand_written_figures_in_tables_outside_blocks(doc: str) -> None:
    text = report.MARKER.sub("", (report.REPO / doc).read_text())
    rows = [line for line in text.splitlines() if line.startswith("|") and re.search(r"\d\.\d|\d%", line)]
    assert not rows, f"{doc}: figures outside a figures block: {rows}"


def test_results_files_record_a_clean_revision_and_the_versions() -> None:
    for path in sorted(report.RESULTS.glob("*.json")):
        data = json.loads(path.read_text())
        prov = data.get("provenance")
        if path.name in LEGACY:
            assert prov is None, f"{path.name} records provenance now: remove it from LEGACY"
            continue
        assert prov, f"{path.name} records no provenance (bench.provenance.record())"
        assert prov["git"]["clean"] and len(prov["git"]["commit"]) == 40, path.name
        assert {"python", "torch"} <= set(prov["versions"]), path.name
        assert not prov["versions"].get("sglang", "").startswith("0.0.0"), f"{path.name}: not a released SGLang"


def test_a_stale_or_unknown_block_is_reported_and_rewritten(tmp_path: Path) -> None:
    results = tmp_path / "results"
    shutil.copytree(report.RESULTS, results, ignore=shutil.ignore_patterns("*.png", "*.md"))
    doc = tmp_path / "doc.md"
    doc.write_text("intro\n<!-- figures:switch-table -->\nold numbers\n<!-- /figures:switch-table -->\nend\n")
    assert report.update([doc], results, write=False) == ["doc.md: figures differ from bench/results in block(s) ['switch-table']"]
    assert report.update([doc], results) == []
    assert report.update([doc], results, write=False) == []
    text = doc.read_text()
    assert "old numbers" not in text and "`bench/results/switch_h100.json`" in text and text.endswith("end\n")
    # the figures follow the file: a changed measurement changes the doc
    run = json.loads((results / "switch_h100.json").read_text())
    row = next(r for r in run["rows"] if (r["layout"], r["rank"], r["method"]) == ("qkvo", 64, "exact_fold"))
    row["switch_ms"] = 7.654
    (results / "switch_h100.json").write_text(json.dumps(run))
    assert report.update([doc], results, write=False)
    report.update([doc], results)
    assert "7.65" in doc.read_text() and "missed" in doc.read_text()
    doc.write_text("<!-- figures:no-such-block -->\nx\n<!-- /figures:no-such-block -->\n<!-- figures:switch-table -->\n")
    problems = report.update([doc], results, write=False)
    assert any("no-such-block" in p and "no renderer" in p for p in problems)
    assert any("'switch-table'" in p and "not paired" in p for p in problems)


@pytest.mark.parametrize("name", sorted(report.BLOCKS))
def test_each_block_names_its_source(name: str) -> None:
    text = report.render(name)
    for results in report.BLOCKS[name].results:
        assert f"From `bench/results/{results}`" in text


def test_a_marker_quoted_in_a_sentence_is_not_a_block(tmp_path: Path) -> None:
    doc = tmp_path / "doc.md"
    doc.write_text("Put `<!-- figures:e2e-headline -->` on a line of its own.\n")
    assert report.update([doc], write=False) == []
    assert doc.read_text() == "Put `<!-- figures:e2e-headline -->` on a line of its own.\n"
