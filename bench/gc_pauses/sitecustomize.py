"""Log every long Python garbage collection of each process that starts with this folder on
``PYTHONPATH`` (a server's scheduler, tokenizer and detokenizer included, since Python imports
``sitecustomize`` at start-up).

A collection of generation 2 walks every tracked object that ``gc.freeze()`` has not frozen and
holds the thread that triggered it meanwhile: in a scheduler that is a stall of the whole
iteration. ``GC_PAUSE_LOG_MS`` (default 20) is the shortest pause logged; each one is one line on
stderr, which the benchmark's server logs keep:

    gc pause: pid 1234 gen 2 ms 412.3 collected 17 uncollectable 0 frozen 2310112 at 1796067068.85

``frozen``: the objects ``gc.freeze()`` put out of the collector's reach (SGLang freezes them at CUDA-graph
capture). ``at`` is the collection's end, in ``time.time()`` seconds, as the iteration timelines' ``at``.
``bench/gc_pauses/summary.py`` reads them back from the logs. Nothing is logged where the variable
is unset, so the folder on ``PYTHONPATH`` alone changes nothing.
"""

import gc
import os
import sys
import time

_THRESHOLD = os.environ.get("GC_PAUSE_LOG_MS")


def _install(threshold_ms: float) -> None:
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
            sys.stderr.write(
                f"gc pause: pid {os.getpid()} gen {generation} ms {ms:.1f} collected {info.get('collected', 0)} "
                f"uncollectable {info.get('uncollectable', 0)} frozen {gc.get_freeze_count()} at {time.time():.2f}\n")

    gc.callbacks.append(on_collection)


if _THRESHOLD:
    _install(float(_THRESHOLD))
