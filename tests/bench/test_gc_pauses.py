"""bench/gc_pauses: the start-up hook logs real collections of a fresh interpreter, and the
summary reads them back."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HOOK_DIR = REPO / "bench" / "gc_pauses"
# A collection over a few hundred thousand tracked lists: milliseconds on any machine.
WORK = "import gc\nkept = [[i] for i in range(300000)]\ngc.collect()\n"


def _python(env_extra: dict[str, str]) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "GC_PAUSE_LOG_MS"}
    env.update(PYTHONPATH=str(HOOK_DIR), **env_extra)
    return subprocess.run([sys.executable, "-c", WORK], env=env, capture_output=True, text=True, timeout=60)


def test_logs_each_collection_over_the_threshold_and_the_summary_reads_them(tmp_path: Path) -> None:
    proc = _python({"GC_PAUSE_LOG_MS": "0"})
    assert proc.returncode == 0, proc.stderr
    log = tmp_path / "server.log"
    log.write_text("unrelated line\n" + proc.stderr)
    sys.path.insert(0, str(HOOK_DIR))
    try:
        import summary
    finally:
        sys.path.remove(str(HOOK_DIR))
    found = summary.pauses(log.read_text())
    assert found and all(p["ms"] >= 0 and p["at"] > 1e9 for p in found)
    assert any(p["generation"] == 2 for p in found)  # the explicit gc.collect()
    result = summary.main([str(log), "--list-ms", "0", "--json", str(tmp_path / "s.json")])[str(log)]
    assert sum(g["count"] for g in result["by_generation"].values()) == len(found) == len(result["long"])
    assert (tmp_path / "s.json").exists()


def test_without_the_variable_nothing_is_logged() -> None:
    proc = _python({})
    assert proc.returncode == 0 and "gc pause:" not in proc.stderr


def test_a_high_threshold_logs_nothing() -> None:
    proc = _python({"GC_PAUSE_LOG_MS": "100000"})
    assert proc.returncode == 0 and "gc pause:" not in proc.stderr
