"""A count of the kernel launches that had to compile a Triton variant, kept apart from the
launcher so that ``/vlora/status`` reads it without importing Triton."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any

from sglang_vlora.config import compile_workers_setting

logger = logging.getLogger(__name__)


class LaunchCompiles:
    """Launches that had to compile a kernel variant (or load it from Triton's disk cache):
    each holds the scheduler's thread for as long (the GPU idles), and while serving every
    request in flight waits. The first call of a shape compiles its variants ahead
    (``ops._compile_table_configs``) and graph capture compiles the decode ones at start, so
    after warm-up this count should stand still; ``/vlora/status`` reports it."""

    def __init__(self) -> None:
        self.count = 0
        self.seconds = 0.0
        self.by_kernel: dict[str, int] = {}
        # per kernel variant ("<kernel> <constexprs> w<warps> s<stages>"): which variant a
        # compile while serving was says which compile-ahead missed it
        self.by_variant: dict[str, int] = {}

    def add(self, kernel: str, seconds: float, variant: str = "") -> None:
        self.count += 1
        self.seconds += seconds
        self.by_kernel[kernel] = self.by_kernel.get(kernel, 0) + 1
        name = f"{kernel} {variant}".strip()
        self.by_variant[name] = self.by_variant.get(name, 0) + 1

    def snapshot(self) -> dict[str, Any]:
        return {"count": self.count, "seconds": self.seconds, "by_kernel": dict(self.by_kernel),
                "by_variant": dict(self.by_variant)}


def describe_variant(constexprs: dict[str, Any], num_warps: int, num_stages: int) -> str:
    """A compiled variant's name: its constexprs, warps and stages (booleans as 0 / 1)."""
    values = " ".join(f"{k}={int(v) if isinstance(v, bool) else v}" for k, v in constexprs.items())
    return f"{values} w{num_warps} s{num_stages}".strip()


LAUNCH_COMPILES = LaunchCompiles()


def compiled_variants(fn: Any) -> int | None:
    """How many variants Triton holds compiled for the kernel ``fn`` (None under the
    interpreter, which compiles nothing, or for anything that is not a Triton kernel)."""
    caches = getattr(fn, "device_caches", None)
    if caches is None:
        return None
    return sum(len(entry[0]) for entry in list(caches.values()))


def launch_counting_compiles(fn: Any, launch: Callable[[], Any], constexprs: dict[str, Any], num_warps: int,
                             num_stages: int) -> Any:
    """Run ``launch`` (a launch of the Triton kernel ``fn``) and, when it made Triton compile a
    new variant (or load one from its disk cache), add it to :data:`LAUNCH_COMPILES` with the
    host time the launch took and log it. Returns what ``launch`` returned."""
    before, start = compiled_variants(fn), time.perf_counter()
    result = launch()
    after = compiled_variants(fn)
    if before is not None and after is not None and after > before:
        seconds, variant = time.perf_counter() - start, describe_variant(constexprs, num_warps, num_stages)
        LAUNCH_COMPILES.add(fn.__name__, seconds, variant)
        logger.info("%s compiled in %.2f s: %s", fn.__name__, seconds, variant)
    return result


# The loads of the variants compiled in a :func:`compiles_in_parallel` block, made when it ends.
_DEFERRED_LOADS: ContextVar[list | None] = ContextVar("vlora_deferred_loads", default=None)


@contextmanager
def compiles_in_parallel() -> Iterator[None]:
    """Run the Triton compiles of :func:`compile_and_load` calls made in the block in a pool of
    threads, and load the compiled variants when the block ends, on the
    calling thread. Compiling ahead every variant the table may pick took about 75 s of an H200
    server's start-up one after another (94 variants, 2026-12-01); Triton's compiler releases
    the GIL while it works, so its compiles overlap (Triton's ``AsyncCompileMode``). The same
    variants are compiled, and each is loaded once, as without the pool. With one worker
    (``SGLANG_VLORA_COMPILE_WORKERS=1``), a Triton without ``AsyncCompileMode`` or inside
    another such block, the calls compile and load as they come."""
    workers = compile_workers_setting()
    if workers <= 1 or _DEFERRED_LOADS.get() is not None:
        yield
        return
    import triton

    async_mode = getattr(triton, "AsyncCompileMode", None)
    if async_mode is None:
        yield
        return
    deferred: list = []
    token = _DEFERRED_LOADS.set(deferred)
    try:
        with ThreadPoolExecutor(workers, thread_name_prefix="vlora-compile") as pool, async_mode(pool):
            yield
    finally:
        _DEFERRED_LOADS.reset(token)
    for load in deferred:
        load()


def compile_and_load(fn: Any, grid: tuple[int, ...], args: tuple, constexprs: dict[str, Any], num_warps: int,
                     num_stages: int, **options: Any) -> None:
    """Compile the Triton kernel ``fn``'s variant for these arguments and load it, launching
    nothing. Triton's ``warmup`` compiles the variant (or loads it from its disk cache) but
    loads its module onto the GPU and builds its launcher, a small C extension, only at the
    variant's first launch. Where Triton's cache does not hold that launcher yet (a fresh
    machine or container), building it runs the C compiler for 200-400 ms (H200 machine,
    Triton 3.6), in the scheduler's thread: the first request whose batch launched the variant
    waited that long, and every request queued behind it (docs/perf.md, "The one-token
    stall"). Here both happen at start-up, with the compile; inside :func:`compiles_in_parallel`
    the load waits for the end of the block."""
    kernel = fn.warmup(*args, **constexprs, num_warps=num_warps, num_stages=num_stages, grid=grid, **options)
    deferred = _DEFERRED_LOADS.get()
    if deferred is not None:
        deferred.append(lambda: _load(fn, _compiled_kernel(kernel), constexprs, num_warps, num_stages))
        return
    _load(fn, kernel, constexprs, num_warps, num_stages)


def _compiled_kernel(kernel: Any) -> Any:
    """The compiled variant behind what ``warmup`` returned inside an ``AsyncCompileMode``: a
    ``FutureKernel``, which the mode has resolved when it ended. Triton 3.6's ``FutureKernel``
    does not pass attribute look-ups on to its kernel (3.8's does), so a load through the future
    would find no ``_init_handles`` and load nothing."""
    import triton

    future = getattr(triton, "FutureKernel", None)
    return kernel.result() if future is not None and isinstance(kernel, future) else kernel


def _load(fn: Any, kernel: Any, constexprs: dict[str, Any], num_warps: int, num_stages: int) -> None:
    """Load a compiled variant onto the GPU and build its launcher (Triton's ``_init_handles``)."""
    if kernel is None:  # Triton's interpreter compiles nothing
        return
    load = getattr(kernel, "_init_handles", None)  # Triton's CompiledKernel (3.x)
    if not callable(load):
        # A Triton whose warmup hands back something else: the variant is compiled but loads at
        # its first launch, in a request's time, so say so rather than carry on as if loaded.
        logger.warning("%s: Triton's warmup returned a %s with no _init_handles, so the variant %s compiled ahead "
                       "loads at its first launch", getattr(fn, "__name__", fn), type(kernel).__name__,
                       describe_variant(constexprs, num_warps, num_stages))
        return
    try:
        load()
    except Exception as exc:  # e.g. Triton's OutOfResources: a config needing more shared memory than this GPU has
        # Compiled ahead because the table may pick it at some token count: Triton keeps the error
        # and raises it again at the variant's first launch, so nothing launches it silently.
        logger.warning("%s: a variant compiled ahead cannot load on this GPU (%s: %s): %s; a batch that picks it "
                       "fails the same way", getattr(fn, "__name__", fn),
                       type(exc).__name__, exc, describe_variant(constexprs, num_warps, num_stages))
