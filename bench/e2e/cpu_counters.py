"""This process's CPU cycles and instructions, from the hardware counters through
``perf_event_open(2)``, where the machine has them.

A fixed loop that takes longer tells that the host ran it slower, not why: at a lower clock
(fewer cycles a second) or at fewer instructions a cycle (a core shared with a busy hardware
thread, a cold cache). The two counters tell which. A KVM guest has them only when the
hypervisor gives it a virtual PMU; without one the kernel answers ENOENT, and the reason is
what the caller records. Only user-mode counts are asked for, which an unprivileged process
may read at ``perf_event_paranoid`` 2.
"""

from __future__ import annotations

import ctypes
import errno
import os
import platform
import struct

PERF_TYPE_HARDWARE = 0
PERF_COUNT_HW_CPU_CYCLES = 0
PERF_COUNT_HW_INSTRUCTIONS = 1
ATTR_SIZE = 64  # PERF_ATTR_SIZE_VER0: every field used here, accepted by every kernel
EXCLUDE_KERNEL = 1 << 5
EXCLUDE_HV = 1 << 6
READ_TIMES = 1 | 2  # PERF_FORMAT_TOTAL_TIME_ENABLED | PERF_FORMAT_TOTAL_TIME_RUNNING
_SYSCALL_NUMBER = {"x86_64": 298, "aarch64": 241}


def _open_counter(config: int) -> int:
    """A file descriptor counting hardware event ``config`` of this process in user mode, on
    whichever CPU it runs; OSError with the kernel's reason when it cannot."""
    number = _SYSCALL_NUMBER.get(platform.machine())
    if number is None:
        raise OSError(errno.ENOSYS, f"perf_event_open's number is not known on {platform.machine()}")
    attr = bytearray(ATTR_SIZE)
    struct.pack_into("IIQQQQQ", attr, 0, PERF_TYPE_HARDWARE, ATTR_SIZE, config, 0, 0, READ_TIMES,
                     EXCLUDE_KERNEL | EXCLUDE_HV)
    libc = ctypes.CDLL(None, use_errno=True)
    libc.syscall.restype = ctypes.c_long
    fd = libc.syscall(number, ctypes.create_string_buffer(bytes(attr), ATTR_SIZE), 0, -1, -1, 0)
    if fd < 0:
        code = ctypes.get_errno()
        raise OSError(code, os.strerror(code))
    return fd


class CpuCounters:
    """Cycles and instructions of this process since it was made; ``error`` says why there are
    none (then :meth:`read` returns None)."""

    def __init__(self) -> None:
        self.fds: list[int] = []
        self.error: str | None = None
        try:
            for config in (PERF_COUNT_HW_CPU_CYCLES, PERF_COUNT_HW_INSTRUCTIONS):
                self.fds.append(_open_counter(config))
        except OSError as e:
            self.close()
            self.error = f"no hardware counters: {e.strerror} (errno {e.errno})"

    def read(self) -> list[tuple[int, int, int]] | None:
        """Each counter's (count, ns enabled, ns running) so far; None without counters."""
        if not self.fds:
            return None
        return [struct.unpack("QQQ", os.read(fd, 24)) for fd in self.fds]

    @staticmethod
    def between(before: list[tuple[int, int, int]] | None,
                after: list[tuple[int, int, int]] | None) -> tuple[int, int] | None:
        """(cycles, instructions) from ``before`` to ``after``; None without counters or when
        the kernel shared a counter with other events for part of the span (its count would
        be an estimate)."""
        if before is None or after is None:
            return None
        deltas = [(a[0] - b[0], a[1] - b[1], a[2] - b[2]) for b, a in zip(before, after, strict=True)]
        if any(running < enabled for _, enabled, running in deltas):
            return None
        return deltas[0][0], deltas[1][0]

    def close(self) -> None:
        for fd in self.fds:
            os.close(fd)
        self.fds = []
