"""Little-endian loads from a uint8 array, for numba kernels: one definition for the
table's hash (engine/xxh64.py), the wire decoder (formats/_wire_kernels.py) and the
MetaBytes codec (formats/txmeta.py). Inlined where used; the caller has bounds-checked p."""

from __future__ import annotations

import numpy as np
from numba import njit


@njit(inline="always")
def u32(buf, p):
    """u32 LE at buf[p:p + 4], as int64 (always >= 0)."""
    return (
        np.int64(buf[p])
        | (np.int64(buf[p + 1]) << 8)
        | (np.int64(buf[p + 2]) << 16)
        | (np.int64(buf[p + 3]) << 24)
    )


@njit(inline="always")
def u64(buf, p):
    """u64 LE at buf[p:p + 8], as uint64."""
    v = np.uint64(0)
    for i in range(8):
        v |= np.uint64(buf[p + i]) << np.uint64(8 * i)
    return v
