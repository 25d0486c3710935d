"""A process that samples something beside a measurement: started before the measurement's
client, stopped after it, its output kept for a summary. It never fails the measurement: a
process that cannot start, or ends early, leaves its error to be recorded instead."""

from __future__ import annotations

import subprocess
from collections.abc import Sequence
from pathlib import Path


class SideProcess:
    """Subclasses call :meth:`start` in ``__enter__`` and read ``output`` and ``error`` after
    the ``with`` block."""

    def __init__(self) -> None:
        self.process: subprocess.Popen[str] | None = None
        self.output = ""
        self.error = ""

    def start(self, command: Sequence[str], what: str, cwd: Path | None = None) -> None:
        try:
            self.process = subprocess.Popen(list(command), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                            cwd=cwd)
        except OSError as e:  # recorded; the measurement goes on without it
            self.error = f"{what} did not start: {e}"

    def __exit__(self, *exc: object) -> None:
        if self.process is None:
            return
        if self.process.poll() is None:
            self.process.terminate()
        try:
            self.output, self.error = self.process.communicate(timeout=5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.output, self.error = self.process.communicate()
