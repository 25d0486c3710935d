"""Provenance of every benchmark's results (bench/provenance.py): versions read without
importing, the revision from this checkout's git or from the stamp carried with a copy of the
tree, and the ``provenance`` record a results file keeps."""

from __future__ import annotations

import json
import subprocess
import sys

from bench import provenance
from bench import report as bench_report


def test_package_version_reads_the_version_module_not_its_fallback(tmp_path, monkeypatch):
    pkg = tmp_path / "fakesgl"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "version.py").write_text("try:\n    from ._version import __version__\nexcept ImportError:\n"
                                    "    __version__ = '0.0.0.dev0'\n")
    (pkg / "_version.py").write_text("__version__ = version = '0.5.23'\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    assert provenance.package_version("fakesgl") == {"version": "0.5.23", "source": "fakesgl/_version.py"}
    (pkg / "_version.py").unlink()
    assert provenance.package_version("fakesgl")["version"] is None  # the fallback after except is not a version
    assert provenance.package_version("no_such_pkg_here")["version"] is None
    assert sys.modules.get("fakesgl") is None  # read, never imported


def test_code_state_from_a_stamp_when_there_is_no_git(tmp_path, monkeypatch):
    state = provenance.git_state()
    assert state is not None and len(state["revision"]) == 40 and state["files"]
    stamp = tmp_path / "stamp.json"
    monkeypatch.setattr(provenance, "STAMP", stamp)
    monkeypatch.setattr(provenance, "_git", lambda *args: None)  # a tree copied without .git
    unknown = provenance.code_state()
    assert unknown["revision"] is None and "unknown" in unknown["warning"]
    assert provenance.revision_label(unknown) == "unknown revision"
    stamp.write_text(json.dumps({**state, "dirty": False}))
    assert provenance.code_state()["dirty"] is False
    stamp.write_text(json.dumps({**state, "dirty": False, "code_hash": "0" * 16}))  # code changed since
    changed = provenance.code_state()
    assert changed["dirty"] is True and "differs" in changed["warning"]
    assert provenance.revision_label(changed).endswith("DIRTY")


def test_a_git_that_lags_the_tree_yields_to_a_stamp_of_the_same_code(tmp_path, monkeypatch):
    """A copy of the tree whose .git is an older revision's: git calls the code dirty, the
    stamp (written where the code was committed) names its revision while the files hash alike."""
    state = provenance.git_state()
    stamp = tmp_path / "stamp.json"
    monkeypatch.setattr(provenance, "STAMP", stamp)
    stamp.write_text(json.dumps({**state, "revision": "b" * 40, "dirty": False}))
    lagging = {**state, "revision": "a" * 40, "dirty": True, "dirty_paths": state["files"][:2]}
    monkeypatch.setattr(provenance, "git_state", lambda: lagging)
    code = provenance.code_state()
    assert (code["revision"], code["dirty"], code["source"]) == ("b" * 40, False, "stamp")
    assert code["git_here"]["revision"] == "a" * 40
    # a changed file the stamp does not list, or code that hashes otherwise: git's word stands
    monkeypatch.setattr(provenance, "git_state", lambda: {**lagging, "dirty_paths": ["bench/new_file.py"]})
    assert provenance.code_state()["revision"] == "a" * 40
    stamp.write_text(json.dumps({**state, "revision": "b" * 40, "dirty": False, "code_hash": "0" * 16}))
    monkeypatch.setattr(provenance, "git_state", lambda: lagging)
    assert (provenance.code_state()["revision"], provenance.code_state()["dirty"]) == ("a" * 40, True)


def test_a_repository_that_encloses_a_copy_of_the_tree_is_not_its_revision(tmp_path, monkeypatch):
    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True)
    copy = tmp_path / "snapshot"
    copy.mkdir()
    monkeypatch.setattr(provenance, "REPO", copy)
    assert provenance.git_state() is None
    monkeypatch.setattr(provenance, "REPO", tmp_path)
    assert provenance.git_state() is None  # a repository without a commit has no revision


def _environment(revision, dirty):
    return {"device": "NVIDIA H200", "platform": "Linux", "cpu_count": 16,
            "versions": {"python": "3.12.3", "torch": "2.11.0", "torch_source": "dist-info", "sglang": "0.5.23"},
            "code": {"revision": revision, "dirty": dirty, "source": "stamp"}}


def test_record_is_clean_only_with_a_revision_and_unchanged_code():
    record = provenance.record(_environment("a" * 40, False), "2026-11-23T06:00:00+00:00")
    assert record == {
        "git": {"commit": "a" * 40, "clean": True, "from": "stamp"},
        "versions": {"python": "3.12.3", "torch": "2.11.0", "sglang": "0.5.23"},
        "machine": {"device": "NVIDIA H200", "platform": "Linux", "cpu_count": 16},
        "date": "2026-11-23T06:00:00+00:00",
    }
    assert provenance.record(_environment("a" * 40, True), "d")["git"]["clean"] is False
    assert provenance.record(_environment("a" * 40, None), "d")["git"]["clean"] is False  # nothing says
    assert provenance.record(_environment(None, False), "d")["git"]["clean"] is False
    line = bench_report.describe_source("x.json", {"provenance": provenance.record(_environment("b" * 40, True), "d")})
    assert "git revision bbbbbbbbbb (uncommitted changes)." in line


def test_combined_takes_the_newest_run_and_is_clean_only_if_every_run_was():
    old = provenance.record(_environment("a" * 40, False), "2026-11-23T06:00:00+00:00")
    new = provenance.record(_environment("b" * 40, False), "2026-11-23T07:00:00+00:00")
    both = provenance.combined([new, old])
    assert both["git"] == {"commit": "b" * 40, "clean": True, "from": "stamp"} and both["date"] == new["date"]
    assert both["revisions"] == ["a" * 40, "b" * 40]
    dirty = provenance.record(_environment(None, None), "2026-11-23T05:00:00+00:00")
    assert provenance.combined([old, new, dirty])["git"]["clean"] is False
    assert provenance.combined([old, dirty])["revisions"] == ["a" * 40, "unknown"]


def test_record_of_this_checkout_names_its_commit_and_the_versions():
    record = provenance.record()
    assert len(record["git"]["commit"]) == 40 and record["git"]["from"] == "git"
    assert record["versions"]["torch"] and record["versions"]["python"] and record["machine"]["cpu_count"] >= 1
    assert not any(key.endswith("_source") for key in record["versions"])
    assert json.loads(json.dumps(record)) == record


def test_save_run_writes_the_results_with_the_run_record_and_the_quoted_command(tmp_path):
    results = {"rounds": 3}
    provenance.save_run(tmp_path / "r.json", results, None, "bench/image_prefill.py",
                        ["--out", "a dir", "--rounds", "3"])
    saved = json.loads((tmp_path / "r.json").read_text())
    assert saved == results and saved["rounds"] == 3
    assert saved["command"] == "python bench/image_prefill.py --out 'a dir' --rounds 3"
    assert saved["device"] == saved["environment"]["device"] == saved["provenance"]["machine"]["device"]
    assert saved["device"].startswith("CPU")  # no GPU given
    assert saved["provenance"]["date"] == saved["date"]
    assert saved["provenance"]["git"]["commit"] == saved["environment"]["code"].get("revision")
