"""What a ``/start_profile`` request may ask of this server.

SGLang 0.5.23 hands a profile request's fields to the scheduler unchecked, and some of them stop
the scheduler, and with it the whole server, on the first request or at ``/stop_profile``:

* ``"activities": ["RPD"]`` imports AMD's ``rpdTracerControl``; where it is not installed (any
  NVIDIA or CPU server) the ``ImportError`` ends the scheduler.
* ``"GPU"``, ``"MEM"`` and ``"CUDA_PROFILER"`` call into CUDA, which a CPU server does not have.
* An ``output_dir`` that cannot be created ends the scheduler at ``/stop_profile``, when the
  trace is written.

An unknown activity was dropped silently: the profile recorded nothing, and ``/stop_profile``
then answered 500. :func:`check_profile_request` refuses these before the request reaches the
scheduler, with the reason (a 400 through :mod:`sglang_vlora.guard_hooks`), and gives a request
naming no activity the part of SGLang's default this server can record (what SGLang's profiler
itself kept of it: CPU alone on a CPU server).
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

# The activities SGLang 0.5.23's profiler knows (scheduler_components/profiler_manager.py).
ACTIVITIES = ("CPU", "GPU", "MEM", "CUDA_PROFILER", "XPU", "RPD")
DEFAULT_ACTIVITIES = ("CPU", "GPU")  # SGLang's when a request names none
# SGLang's default trace folder when a request names none.
PROFILER_DIR_ENV = "SGLANG_TORCH_PROFILER_DIR"


# The scheduler's answers that are about the profile's state, i.e. the client's order of calls
# (scheduler_components/profiler_manager.py); every other failed answer is the server's fault.
STATE_ANSWERS = {
    "Profiling is not in progress": 400,
    "Profiling is already in progress": 409,
}


def failed_answer_status(message: str) -> int:
    """The HTTP status for the scheduler's failed answer to a profile request: 400 for a stop
    with no profile running, 409 for a start while one runs, 500 for anything else (the torch
    profiler failing to start, a trace that could not be written): those are not the client's."""
    return next((status for prefix, status in STATE_ANSWERS.items() if message.startswith(prefix)), 500)


class ProfileRequestError(ValueError):
    """A profile request this server cannot run; the message says which field and why."""


def runnable_activities() -> frozenset[str]:
    """The activities this process's torch and installed packages can record."""
    import torch

    runnable = {"CPU"}
    if torch.cuda.is_available():
        runnable |= {"GPU", "MEM", "CUDA_PROFILER"}
    xpu = getattr(torch, "xpu", None)
    if xpu is not None and xpu.is_available():
        runnable.add("XPU")
    if importlib.util.find_spec("rpdTracerControl") is not None and importlib.util.find_spec("rocpd") is not None:
        runnable.add("RPD")
    return frozenset(runnable)


def activities_to_record(activities: Any, runnable: Iterable[str]) -> list[str]:
    """The activities to record: ``activities`` where it is a non-empty list of known names
    this server can record; for None, SGLang's default (CPU and GPU) less what this server
    cannot record (a CPU server records CPU alone)."""
    runnable = frozenset(runnable)
    if activities is None:
        return [a for a in DEFAULT_ACTIVITIES if a in runnable]
    if not isinstance(activities, list) or not all(isinstance(a, str) for a in activities):
        raise ProfileRequestError(f"'activities' must be a list of names from {list(ACTIVITIES)}, "
                                  f"not {activities!r}")
    if not activities:
        raise ProfileRequestError(f"'activities' names no activity: give one or more of {sorted(runnable)}")
    unknown = [a for a in activities if a not in ACTIVITIES]
    if unknown:
        raise ProfileRequestError(f"'activities' has unknown names {unknown}: the profiler knows {list(ACTIVITIES)}")
    missing = [a for a in activities if a not in runnable]
    if missing:
        raise ProfileRequestError(f"this server cannot record {missing} (it can record {sorted(runnable)}): "
                                  "GPU, MEM and CUDA_PROFILER need CUDA, XPU an XPU, RPD AMD's rpd tracer")
    return list(activities)


def check_steps(num_steps: Any, start_step: Any) -> None:
    for name, value in (("num_steps", num_steps), ("start_step", start_step)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
            raise ProfileRequestError(f"'{name}' must be a whole number of steps, 0 or more, not {value!r}")


def check_output_dir(output_dir: Any) -> None:
    """The trace folder (SGLang's default where None) must exist or be creatable, and be
    writable: it is created here, where SGLang would create it only when the trace is written."""
    if output_dir is not None and not isinstance(output_dir, str):
        raise ProfileRequestError(f"'output_dir' must be a folder path, not {output_dir!r}")
    folder = Path(output_dir if output_dir is not None else os.getenv(PROFILER_DIR_ENV, "/tmp")).expanduser()
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise ProfileRequestError(f"'output_dir' {str(folder)!r} cannot be created: {e.strerror}") from None
    if not os.access(folder, os.W_OK | os.X_OK):
        raise ProfileRequestError(f"'output_dir' {str(folder)!r} is not writable by the server")


def check_profile_request(req: Any, runnable: Iterable[str]) -> None:
    """Raise :class:`ProfileRequestError` for a ``ProfileReq`` the scheduler would fail on;
    otherwise set the activities it records (:func:`activities_to_record`)."""
    activities = activities_to_record(req.activities, runnable)
    check_steps(req.num_steps, req.start_step)
    check_output_dir(req.output_dir)
    req.activities = activities
