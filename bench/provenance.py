"""Where a result comes from, for every benchmark: the code's git revision (clean or not), the
real versions of what ran, the machine, the date.

A benchmark records :func:`record` in its results file under ``"provenance"`` (the layout
``bench/report.py`` prints under each figures block and ``tests/docs/test_figures.py``
checks); the end-to-end runs also keep :func:`environment` whole.

The benchmark GPU machine gets a copy of the working tree, possibly without ``.git``, and a
trimmed SGLang without ``dist-info`` (``importlib.metadata`` knows nothing of it). So:

* versions are read from each package's own version module (``sglang/_version.py``, written
  by its build), without importing the package;
* the revision comes from git where this checkout is a repository of its own (never from a
  repository that encloses a copy of the tree); else from a *stamp* written beside the
  checkout before the tree is sent (``python bench/run_e2e.py stamp``), which records the
  revision, whether the code was clean, and a hash of the code files; the machine that runs
  re-hashes the same files and reports ``dirty`` when they differ from the stamp.
"""

from __future__ import annotations

import datetime
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import platform
import re
import shlex
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
STAMP = REPO / ".cache" / "bench" / "git_stamp.json"
# The code a benchmark result depends on (results files and docs are not part of it).
CODE_PATHS = ("sglang_vlora", "cuda", "bench", "pyproject.toml")
CODE_SUFFIXES = (".py", ".sh", ".cu", ".cuh", ".cpp", ".h", ".json", ".toml", ".csv")
_VERSION_RE = re.compile(r"^__version__\s*(?::\s*str\s*)?=\s*(?:version\s*=\s*)?['\"]([^'\"]+)['\"]", re.M)


def package_version(module: str, dist: str | None = None) -> dict[str, str | None]:
    """``{"version", "source"}`` of an importable package: its distribution metadata, else
    its ``_version.py`` / ``version.py`` / ``__init__.py`` read as text (never a fallback
    string such as SGLang's ``0.0.0.dev0``, which only appears after an ``except``)."""
    try:
        return {"version": importlib.metadata.version(dist or module), "source": "dist-info"}
    except importlib.metadata.PackageNotFoundError:
        pass
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        return {"version": None, "source": "not importable"}
    root = Path(next(iter(spec.submodule_search_locations)))
    for name in ("_version.py", "version.py", "__init__.py"):
        path = root / name
        if path.exists():
            found = _VERSION_RE.search(path.read_text(errors="replace"))
            if found:
                return {"version": found.group(1), "source": str(Path(module) / name)}
    return {"version": None, "source": f"no version in {root.name}/"}


PACKAGES = (("torch", None), ("triton", None), ("sglang", None), ("transformers", None), ("peft", None),
            ("numpy", None), ("sglang_vlora", "sglang-vlora"))


def versions() -> dict[str, Any]:
    """Python's version and each of :data:`PACKAGES`' with where it was read (``<name>_source``)."""
    out: dict[str, Any] = {"python": platform.python_version()}
    for module, dist in PACKAGES:
        info = package_version(module, dist)
        out[module] = info["version"]
        out[f"{module}_source"] = info["source"]
    if out["sglang_vlora"] is None:
        found = re.search(r'^version = "([^"]+)"', (REPO / "pyproject.toml").read_text(), re.M)
        out.update(sglang_vlora=found.group(1) if found else None, sglang_vlora_source="pyproject.toml")
    return out


def code_files() -> list[str]:
    """The code files (relative paths) as git sees them: tracked or untracked, not ignored."""
    listed = _git("ls-files", "-co", "--exclude-standard", "--", *CODE_PATHS) or ""
    return sorted(p for p in listed.splitlines()
                  if p.endswith(CODE_SUFFIXES) and "/results/" not in p and (REPO / p).is_file())


def code_hash(files: list[str]) -> str:
    """sha256 over the files' paths and contents (a missing file counts as empty)."""
    h = hashlib.sha256()
    for rel in files:
        path = REPO / rel
        h.update(rel.encode() + b"\0" + (path.read_bytes() if path.is_file() else b"") + b"\0")
    return h.hexdigest()[:16]


def _git(*args: str) -> str | None:
    if not shutil.which("git"):
        return None
    try:
        done = subprocess.run(["git", *args], cwd=REPO, capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout if done.returncode == 0 else None


# What the served plugin is built from: the package, its CUDA C++ sources and its pins.
PACKAGE_PATHS = ("sglang_vlora", "cuda", "pyproject.toml")


def package_tree(revision: str) -> str | None:
    """The git object ids of :data:`PACKAGE_PATHS` at ``revision``, joined: two revisions with
    the same value served the same plugin code (the benchmark harness and the docs may differ).
    None where git does not know the revision (or there is no git)."""
    if full_revision(revision) is None:
        return None
    ids = [(_git("rev-parse", "--verify", "--quiet", f"{revision}^{{commit}}:{path}") or "-").strip()
           for path in PACKAGE_PATHS]
    return ":".join(ids)


def full_revision(revision: str) -> str | None:
    """The full commit id git gives ``revision`` (None where it knows none)."""
    out = _git("rev-parse", "--verify", "--quiet", f"{revision}^{{commit}}")
    return out.strip() or None if out else None


def git_state() -> dict[str, Any] | None:
    """Revision and cleanliness from git (None without a repository whose top is this
    checkout). Dirty means a modified or untracked, not ignored, code file (:data:`CODE_PATHS`)."""
    top = (_git("rev-parse", "--show-toplevel") or "").strip()
    if not top or Path(top).resolve() != REPO.resolve():
        return None  # no repository, or one that encloses a copy of the tree: not this code's
    rev = (_git("rev-parse", "HEAD") or "").strip()
    if not rev:
        return None
    changed = _git("status", "--porcelain", "--untracked-files=all", "--", *CODE_PATHS) or ""
    paths = [line[3:] for line in changed.splitlines() if line.strip() and "/results/" not in line]
    files = code_files()
    return {"revision": rev, "dirty": bool(paths), "dirty_paths": paths[:20], "source": "git",
            "files": files, "code_hash": code_hash(files)}


def write_stamp(path: Path = STAMP) -> dict[str, Any]:
    """Record the checkout's git state for a machine that gets the tree without ``.git``."""
    state = git_state()
    if state is None:
        raise RuntimeError("no git repository here: the stamp records a git revision")
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(state, indent=1))
    return state


def code_state() -> dict[str, Any]:
    """The revision of the code that runs, from git or else the stamp; ``dirty`` is True
    when the code differs from the recorded revision, None when nothing says. Where git sees
    changes and a stamp's files hash the same as the code here, the stamp's revision is the
    code's (``git_here`` keeps what git said)."""
    git = git_state()
    if git is not None and not (git["dirty"] and STAMP.exists()):
        return git
    if not STAMP.exists():
        return {"revision": None, "dirty": None, "source": "none",
                "warning": "no .git and no stamp (run `python bench/run_e2e.py stamp` and carry "
                           ".cache/bench/git_stamp.json): the revision is unknown"}
    stamp = json.loads(STAMP.read_text())
    now = code_hash(stamp.get("files", []))
    same = now == stamp.get("code_hash")
    state = {**stamp, "source": "stamp", "code_hash_here": now, "dirty": bool(stamp.get("dirty")) or not same}
    if git is not None:
        # A copy of the tree whose .git lags it (the device machine may get the last landed
        # revision's .git beside this session's files): git calls it dirty, and only a stamp
        # whose files hash the same says which revision the code is.
        if not same or not set(git["dirty_paths"]) <= set(stamp.get("files", [])):
            return git
        state["git_here"] = {"revision": git["revision"], "dirty": git["dirty"], "dirty_paths": git["dirty_paths"]}
    if not same:
        state["warning"] = "the code differs from the stamp's revision (edited after the stamp was written)"
    return state


def revision_label(state: dict[str, Any]) -> str:
    """``abc1234``, ``abc1234 DIRTY`` or ``unknown revision``."""
    rev = state.get("revision")
    if not rev:
        return "unknown revision"
    return rev[:10] + (" DIRTY" if state.get("dirty") or state.get("dirty") is None else "")


def gpu_info() -> dict[str, Any] | None:
    """GPU 0 from nvidia-smi, else from torch in a child process (no CUDA context in this
    process: it would hold GPU memory while the servers run); None without a GPU."""
    if not shutil.which("nvidia-smi"):
        return _torch_gpu_info()
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=name,memory.total,memory.free,driver_version",
             "--format=csv,noheader,nounits"], capture_output=True, text=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return _torch_gpu_info()
    rows = [r.split(", ") for r in out.strip().splitlines() if r.strip()]
    if not rows or len(rows[0]) != 4:
        return _torch_gpu_info()
    name, total, free, driver = rows[0]
    return {"name": name, "count": len(rows), "memory_total_mib": int(float(total)),
            "memory_free_mib": int(float(free)), "driver": driver, "source": "nvidia-smi"}


_TORCH_QUERY = (
    "import json, torch\n"
    "if torch.cuda.is_available():\n"
    "    free, total = torch.cuda.mem_get_info(0)\n"
    "    print(json.dumps({'name': torch.cuda.get_device_name(0), 'count': torch.cuda.device_count(),\n"
    "                      'memory_total_mib': total >> 20, 'memory_free_mib': free >> 20, 'driver': None,\n"
    "                      'source': 'torch'}))\n"
)


def _torch_gpu_info() -> dict[str, Any] | None:
    if importlib.util.find_spec("torch") is None:
        return None
    try:
        out = subprocess.run([sys.executable, "-c", _TORCH_QUERY], capture_output=True, text=True, timeout=180)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = out.stdout.strip().splitlines()
    return json.loads(lines[-1]) if out.returncode == 0 and lines else None


def environment(gpu: dict[str, Any] | None) -> dict[str, Any]:
    """The machine, the versions, the code's state and the SGLang variables that change
    performance (``gpu``: :func:`gpu_info`)."""
    keys = ("SGLANG_FORCE_FUSED_OP_BACKEND", "SGLANG_SKIP_SGL_KERNEL_VERSION_CHECK",
            "SGLANG_UNIFIED_RADIX_TREE_CORE_BACKEND", "CUDA_VISIBLE_DEVICES")
    cpu = f"CPU ({platform.processor() or platform.machine()}, {os.cpu_count()} cores)"
    return {
        "device": gpu["name"] if gpu else cpu,
        "gpu": gpu,
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "python_executable": sys.executable,
        "versions": versions(),
        "code": {k: v for k, v in code_state().items() if k != "files"},
        "environment": {k: os.environ[k] for k in keys if k in os.environ},
    }


def now() -> str:
    """The date and time (UTC) as results files record it."""
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


def record(env: dict[str, Any] | None = None, date: str | None = None) -> dict[str, Any]:
    """The ``"provenance"`` entry of a results file: ``git`` (``commit``, ``clean``: the code
    files were unchanged from that commit, ``from``: git or the stamp), ``versions``,
    ``machine`` and ``date``. ``env`` is an :func:`environment` taken already (or a results
    dict that holds one's keys), ``date`` when the run was; by default both are taken now."""
    env = env if env is not None else environment(gpu_info())
    code = env["code"]
    return {
        "git": {"commit": code.get("revision"), "clean": bool(code.get("revision")) and code.get("dirty") is False,
                "from": code.get("source")},
        "versions": {k: v for k, v in env["versions"].items() if not k.endswith("_source")},
        "machine": {"device": env["device"], "platform": env["platform"], "cpu_count": env["cpu_count"]},
        "date": date or now(),
    }


def combined(records: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One :func:`record` for results merged from several runs: the newest run's, clean only if
    every run's code was, with every run's revision under ``revisions``."""
    newest = max(records, key=lambda r: r["date"])
    clean = all(r["git"]["clean"] for r in records)
    return {**newest, "git": {**newest["git"], "clean": clean},
            "revisions": sorted({r["git"]["commit"] or "unknown" for r in records})}


def save_run(path: Path, results: dict[str, Any], gpu: dict[str, Any] | None, script: str,
             argv: Sequence[str]) -> None:
    """Write a server benchmark's ``results`` to ``path`` (JSON) with, added in place, what
    every such results file records: ``environment`` (with ``gpu``, taken before the servers
    started), ``device``, ``date`` (now), ``command`` (``script`` and its ``argv``) and
    ``provenance``."""
    results["environment"] = environment(gpu)
    results["device"] = results["environment"]["device"]
    results["date"] = now()
    results["command"] = f"python {script} " + shlex.join(argv)
    results["provenance"] = record(results["environment"], results["date"])
    path.write_text(json.dumps(results, indent=1, default=str))


def write_results(out: Path, tag: str, doc: dict[str, Any], script: str, argv: Sequence[str]) -> Path:
    """Write ``doc`` as ``out/tag.json`` with the command that ran (``script`` and its
    ``argv``) and this run's :func:`record`; the path written."""
    full = {**doc, "command": " ".join(["python", script, *argv]), "provenance": record()}
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{tag}.json"
    path.write_text(json.dumps(full, indent=1) + "\n")
    return path
