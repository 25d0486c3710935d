"""Log the two kinds of stall a Python server thread takes without saying so, in each process
that starts with this folder on ``PYTHONPATH`` (a server's scheduler, tokenizer and detokenizer
included: Python imports ``sitecustomize`` at start-up). Each is one line on stderr, which the
benchmark's server logs keep; ``bench/stall_probes/summary.py`` reads them back.

* ``GC_PAUSE_LOG_MS=N``: every garbage collection of at least N ms. A collection of generation 2
  walks every tracked object that ``gc.freeze()`` has not frozen, holding the thread that
  triggered it (in a scheduler, the iteration running)::

    gc pause: pid 1234 gen 2 ms 412.3 collected 17 uncollectable 0 frozen 375 at 1796067068.85

  ``frozen``: the objects ``gc.freeze()`` put out of the collector's reach.
* ``TRITON_COMPILE_LOG=1``: every Triton kernel variant a process compiles or loads from Triton's
  disk cache, any kernel's (SGLang's own too), through Triton's JIT hooks::

    triton compile: pid 1234 kernel _fwd_kernel ms 380.2 warmup 0 at 1796067068.85 sig _fwd_kernel[num_warps=4, ...](...)

  ``sig``: Triton's description of the variant (its options and each argument's type and
  specialisation), where this Triton passes one. ``spec``: the same variant from the
  specialisation data Triton records for it, where there is one: each argument's type, tuples
  spelt out, and each argument (``name.i`` for a tuple's i-th element) Triton took as divisible
  by 16 (``div16``). Triton 3.6's ``sig`` prints a tuple argument as ``()``, and a kernel whose
  pointers come in tuples (SGLang's input copy) gets one variant per set of pointers aligned to 16
  bytes, which only ``spec`` tells apart::

    ... sig _small_copy_kernel[...](sources: () spec sources=(*i64,*i32) ... div16 sources.0,destinations.0

``at`` is the event's end in ``time.time()`` seconds, the clock of ``/vlora/timeline``'s ``at``.
Where neither variable is set the folder on ``PYTHONPATH`` changes nothing.
"""

from __future__ import annotations

import gc
import json
import os
import sys
import threading
import time


def _log(line: str, tail: str = "") -> None:
    sys.stderr.write(f"{line} at {time.time():.2f}{tail}\n")


def _log_gc_pauses(threshold_ms: float) -> None:
    started: dict[int, float] = {}

    def on_collection(phase: str, info: dict) -> None:
        generation = info.get("generation", -1)
        if phase == "start":
            started[generation] = time.perf_counter()
            return
        begun = started.pop(generation, None)
        if begun is None:
            return
        ms = (time.perf_counter() - begun) * 1000.0
        if ms >= threshold_ms:
            _log(f"gc pause: pid {os.getpid()} gen {generation} ms {ms:.1f} collected {info.get('collected', 0)} "
                 f"uncollectable {info.get('uncollectable', 0)} frozen {gc.get_freeze_count()}")

    gc.callbacks.append(on_collection)


def _type_text(ty: object) -> str:
    """A signature entry as Triton writes it, a tuple's (JSON: a list's) as ``(*i64,*i32)``."""
    if isinstance(ty, (list, tuple)):
        return "(" + ",".join(_type_text(t) for t in ty) + ")"
    return str(ty)


def variant_of(compile_info: object) -> str:
    """A variant's argument types and 16-byte divisibility, read from the specialisation data of
    Triton's hook (a JSON text); "" where there is none or it cannot be read."""
    try:
        data = json.loads(compile_info["specialization_data"])  # type: ignore[index]
        names = list(data["signature"])
        types = " ".join(f"{name}={_type_text(ty)}" for name, ty in data["signature"].items())
        divisible = []
        for path, attrs in zip(data.get("attrs_keys", []), data.get("attrs_vals", []), strict=True):
            if any(list(a) == ["tt.divisibility", 16] for a in attrs):
                divisible.append(".".join([names[path[0]], *map(str, path[1:])]))
        return f"{types} div16 {','.join(divisible) or '-'}"
    except Exception:
        return ""


def _log_triton_compiles() -> None:
    try:
        from triton import knobs
    except Exception as exc:  # no Triton, or one without JIT hooks: say so, change nothing
        _log(f"triton compile: not logged in pid {os.getpid()} ({type(exc).__name__}: {exc})")
        return
    started: dict[int, float] = {}

    def before(*args, **kwargs):
        started[threading.get_ident()] = time.perf_counter()
        return None  # anything true would make Triton skip the compile

    def after(*args, **kwargs):
        begun = started.pop(threading.get_ident(), None)
        ms = -1.0 if begun is None else (time.perf_counter() - begun) * 1000.0
        fn = kwargs.get("fn")
        name = getattr(fn, "name", None) or getattr(fn, "__name__", None) or "?"
        signature = " ".join(str(kwargs.get("repr", "")).split())  # which variant: the arguments' types
        variant = variant_of(kwargs.get("compile"))
        _log(f"triton compile: pid {os.getpid()} kernel {name} ms {ms:.1f} "
             f"warmup {int(bool(kwargs.get('is_manual_warmup')))}",
             (f" sig {signature}" if signature else "") + (f" spec {variant}" if variant else ""))
        return None

    knobs.runtime.jit_cache_hook = before
    knobs.runtime.jit_post_compile_hook = after


def _threshold_ms(value: str) -> float | None:
    """``GC_PAUSE_LOG_MS`` as milliseconds; None (and a line saying why) where it is no such number:
    this runs in every process started with the folder on its path, which must start anyway."""
    try:
        ms = float(value)
    except ValueError:
        ms = -1.0
    if not ms >= 0:  # also NaN
        _log(f"gc pause: not logged in pid {os.getpid()} (GC_PAUSE_LOG_MS={value!r} is not a number of ms >= 0)")
        return None
    return ms


if os.environ.get("GC_PAUSE_LOG_MS"):
    threshold = _threshold_ms(os.environ["GC_PAUSE_LOG_MS"])
    if threshold is not None:
        _log_gc_pauses(threshold)
if os.environ.get("TRITON_COMPILE_LOG") == "1":
    _log_triton_compiles()
