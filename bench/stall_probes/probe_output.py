"""What the stall probes' readers (``summary.py``, ``spy_runs.py``) share: their ``--json``
output, written with the command that made it and the run's provenance, like every results file."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from bench import provenance  # noqa: E402


def check_json_path(parser: argparse.ArgumentParser, path: Path | None) -> None:
    """Refuse a ``--json`` path that does not end in ``.json`` (the results file would be named
    otherwise than asked) or whose folder does not exist."""
    if path is None:
        return
    if path.suffix != ".json":
        parser.error(f"--json {path}: give a path ending in .json")
    if not path.parent.is_dir():
        parser.error(f"--json {path}: no folder {path.parent}")


def write(path: Path, body: dict[str, Any], script: str, argv: Sequence[str] | None) -> None:
    """``body`` to ``path`` with the command (``script`` and ``argv``, default this process's
    arguments) and :func:`bench.provenance.record`."""
    provenance.write_results(path.parent, path.stem, body, script, sys.argv[1:] if argv is None else list(argv))
