"""A process that samples something beside a measurement: started before the measurement's
client, stopped after it, its output kept for a summary. It never fails the measurement: a
process that cannot start, or ends early, leaves its error to be recorded instead."""

from __future__ import annotations

import os
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

    def start(self, command: Sequence[str], what: str, cwd: Path | None = None,
              cpus: Sequence[int] | None = None) -> None:
        """Start ``command``; ``cpus``: the CPUs it may run on, set in the child before it runs
        (it does not inherit this process's own, which a pinned call restricts to the client's)."""
        pin = None if cpus is None else (lambda: os.sched_setaffinity(0, cpus))
        try:
            self.process = subprocess.Popen(list(command), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                            cwd=cwd, preexec_fn=pin)
        except subprocess.SubprocessError as e:  # only the pinning runs in the child before the command
            self.error = f"{what} did not start: it could not be pinned to CPUs {list(cpus or [])}: {e}"
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
