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

# Results files in bench/results/ that record no git revision but that a doc still quotes: what
# each lacks and the only docs that may quote it. The tests below check the gap is still there,
# so a re-run that records provenance must remove its entry. Files that predate provenance and
# that no doc quotes live in bench/results/legacy/.
UNRECORDED: dict[str, tuple[str, set[str]]] = {}


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


def _results_files() -> list[str]:
    """Every JSON results file under bench/results/ (relative to it) but the legacy ones."""
    paths = (p.relative_to(report.RESULTS) for p in report.RESULTS.rglob("*.json"))
    return sorted(str(p) for p in paths if p.parts[0] != "legacy")


def test_results_files_record_a_clean_revision_and_the_released_versions() -> None:
    for name in _results_files():
        prov = report.recorded_provenance(json.loads((report.RESULTS / name).read_text()))
        if name in UNRECORDED:
            assert prov is None, f"{name} records provenance now: remove it from UNRECORDED"
            continue
        assert prov, f"{name} records no provenance (bench.provenance.record())"
        assert prov["git"]["clean"] and len(prov["git"]["commit"] or "") == 40, name
        assert {"python", "torch"} <= set(prov["versions"]), name
        assert not (prov["versions"].get("sglang") or "").startswith("0.0.0"), f"{name}: not a released SGLang"


def test_docs_quote_only_results_files_with_provenance() -> None:
    quoted = {}
    for path in report.doc_files():
        for name in report.quoted_results([path.read_text()]):
            quoted.setdefault(name, set()).add(str(path.relative_to(report.REPO)))
    assert "fusion_cpu.json" in quoted  # the README's and docs/trainer.md's blocks read it
    for name, docs in sorted(quoted.items()):
        assert not name.startswith("legacy/"), f"{sorted(docs)} quote {name}, which predates provenance"
        if name.endswith(".json"):
            assert name in _results_files(), f"{sorted(docs)} quote {name}, not a results file in bench/results/"
        if name in UNRECORDED:
            lacks, allowed = UNRECORDED[name]
            assert docs <= allowed, f"{sorted(docs - allowed)} quote {name}, which records {lacks}"


def test_the_legacy_files_say_what_they_lack() -> None:
    legacy = report.RESULTS / "legacy"
    readme = (legacy / "README.md").read_text()
    for path in legacy.glob("*.json"):
        assert report.recorded_provenance(json.loads(path.read_text())) is None, path.name
        assert f"`{path.stem}.*`" in readme, f"legacy/README.md does not name {path.stem}.*"


def test_cited_results_reads_paths_in_subfolders_not_patterns() -> None:
    text = "`bench/results/e2e/run_1.json`, bench/results/a.png, `bench/results/e2e/*.json`, bench/results/x_{y}.json"
    assert report.cited_results(text) == {"e2e/run_1.json", "a.png"}
    # a gzipped recording by its whole name; a path that ends a sentence still counts
    text = "`bench/results/e2e/probes/spy.json.gz`, and bench/results/e2e_h200.md."
    assert report.cited_results(text) == {"e2e/probes/spy.json.gz", "e2e_h200.md"}


def test_a_stale_or_unknown_block_is_reported_and_rewritten(tmp_path: Path) -> None:
    results = tmp_path / "results"
    shutil.copytree(report.RESULTS, results, ignore=shutil.ignore_patterns("*.png", "*.md"))
    doc = tmp_path / "doc.md"
    doc.write_text("intro\n<!-- figures:switch-table -->\nold numbers\n<!-- /figures:switch-table -->\nend\n")
    assert report.update([doc], results, write=False) == ["doc.md: figures differ from bench/results in block(s) ['switch-table']"]
    assert report.update([doc], results) == []
    assert report.update([doc], results, write=False) == []
    text = doc.read_text()
    assert "old numbers" not in text and "`bench/results/switch_h200.json`" in text and text.endswith("end\n")
    # the figures follow the file: a changed measurement changes the doc
    run = json.loads((results / "switch_h200.json").read_text())
    row = next(r for r in run["rows"] if (r["layout"], r["rank"], r["method"]) == ("qkvo", 64, "exact_fold"))
    row["switch_ms"] = 7.654
    (results / "switch_h200.json").write_text(json.dumps(run))
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
