"""Handing back to the kernel the C heap a process freed.

glibc's malloc keeps what a process frees for its next allocations: a worker that applied
a burst of the topic (big consume() batches, librdkafka's fetch buffers, the decode's
arrays) keeps the burst's peak resident long after, 70-80 MiB a worker in a measured
catch-up of 1,000,000 entries. `trim()` (malloc_trim(0)) returns the free pages of every
arena, those inside the heap too (glibc >= 2.8 madvises them away), without changing how
the hot path allocates; a worker calls it when it goes idle (consumer/worker/loop.py).
`limit_arenas()` keeps librdkafka's threads to two arenas between them instead of one
each, whose free pages would each stay resident. On a C library without these calls
(musl) both do nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util

_M_ARENA_MAX = -8  # malloc.h
_ARENAS = 2

try:
    _libc = ctypes.CDLL(ctypes.util.find_library("c") or None)
    _malloc_trim = _libc.malloc_trim
    _mallopt = _libc.mallopt
except (OSError, AttributeError):  # not glibc
    _malloc_trim = _mallopt = None


def trim() -> bool:
    """Return the free pages of the C heap to the kernel; True if any were."""
    return bool(_malloc_trim(0)) if _malloc_trim is not None else False


def limit_arenas() -> None:
    """At most _ARENAS malloc arenas for this process's threads from now on (and its forks')."""
    if _mallopt is not None:
        _mallopt(_M_ARENA_MAX, _ARENAS)
