"""xxh64 over a batch of fixed-size keys, compiled; and the little-endian loads it reads
its lanes with.

The xxhash package hashes one bytes object per call; the table needs the hash of
every key of a 1024-key batch without creating 1024 Python objects. This is the
reference XXH64 algorithm (seed 0 by default) and is checked against
`xxhash.xxh64_intdigest` by the tests for every key length 1..300.

All arithmetic stays in uint64: numba promotes uint64 op int64 to float64.

u32 and u64 are the loads the hash is defined over (XXH64 reads its input as
little-endian words), and the bytes that travel are read with the same ones: the wire
decoder (formats/_wire_kernels.py) and the MetaBytes codec (formats/txmeta.py) import them
from here. Inlined where used; the caller has bounds-checked p.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from shmcache.ipc import jitcache

jitcache.install()  # before this module's kernels are decorated: it may be the first of the package imported

P1 = np.uint64(0x9E3779B185EBCA87)
P2 = np.uint64(0xC2B2AE3D27D4EB4F)
P3 = np.uint64(0x165667B19E3779F9)
P4 = np.uint64(0x85EBCA77C2B2AE63)
P5 = np.uint64(0x27D4EB2F165667C5)


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


@njit(inline="always")
def _rotl(x, r):
    return (x << np.uint64(r)) | (x >> np.uint64(64 - r))


@njit(inline="always")
def _round(acc, lane):
    acc = acc + lane * P2
    acc = _rotl(acc, 31)
    return acc * P1


@njit(inline="always")
def _merge(acc, val):
    acc ^= _round(np.uint64(0), val)
    return acc * P1 + P4


@njit(inline="always")
def _stripes_start(seed):
    """The four accumulators of a key of 32 bytes or more, before its first stripe."""
    return seed + P1 + P2, seed + P2, seed, seed - P1


@njit(inline="always")
def _converge(v1, v2, v3, v4):
    """The four accumulators folded into one, after the last whole stripe."""
    h = _rotl(v1, 1) + _rotl(v2, 7) + _rotl(v3, 12) + _rotl(v4, 18)
    h = _merge(h, v1)
    h = _merge(h, v2)
    h = _merge(h, v3)
    return _merge(h, v4)


@njit(inline="always")
def _lane_tail(h, lane):
    """One remaining 8-byte lane mixed into h."""
    h ^= _round(np.uint64(0), lane)
    return _rotl(h, 27) * P1 + P4


@njit(inline="always")
def _avalanche(h):
    h ^= h >> np.uint64(33)
    h *= P2
    h ^= h >> np.uint64(29)
    h *= P3
    h ^= h >> np.uint64(32)
    return h


@njit(nogil=True, cache=True)
def xxh64_span(buf, start, n, seed):
    """XXH64 of buf[start:start + n] (a 1-d uint8 array)."""
    p = start
    end = start + n
    if n >= 32:
        v1, v2, v3, v4 = _stripes_start(seed)
        while p + 32 <= end:
            v1 = _round(v1, u64(buf, p))
            v2 = _round(v2, u64(buf, p + 8))
            v3 = _round(v3, u64(buf, p + 16))
            v4 = _round(v4, u64(buf, p + 24))
            p += 32
        h = _converge(v1, v2, v3, v4)
    else:
        h = seed + P5
    h += np.uint64(n)
    while p + 8 <= end:
        h = _lane_tail(h, u64(buf, p))
        p += 8
    if p + 4 <= end:
        h ^= np.uint64(u32(buf, p)) * P1
        h = _rotl(h, 23) * P2 + P3
        p += 4
    while p < end:
        h ^= np.uint64(buf[p]) * P5
        h = _rotl(h, 11) * P1
        p += 1
    return _avalanche(h)


@njit(nogil=True, cache=True)
def _rows_bytes(flat, n, width, seed):
    out = np.empty(n, dtype=np.uint64)
    for r in range(n):
        out[r] = xxh64_span(flat, r * width, width, seed)
    return out


@njit(nogil=True, cache=True)
def _rows_words(words, n, nw, seed):
    """The same for keys of nw whole 8-byte lanes, read as uint64 (x86 is little-endian)."""
    out = np.empty(n, dtype=np.uint64)
    for r in range(n):
        base = r * nw
        p = 0
        if nw >= 4:
            v1, v2, v3, v4 = _stripes_start(seed)
            while p + 4 <= nw:
                v1 = _round(v1, words[base + p])
                v2 = _round(v2, words[base + p + 1])
                v3 = _round(v3, words[base + p + 2])
                v4 = _round(v4, words[base + p + 3])
                p += 4
            h = _converge(v1, v2, v3, v4)
        else:
            h = seed + P5
        h += np.uint64(nw * 8)
        while p < nw:
            h = _lane_tail(h, words[base + p])
            p += 1
        out[r] = _avalanche(h)
    return out


@njit(inline="always")
def _xxh64_4words(a, b, c, d):
    """XXH64 (seed 0) of a 32-byte key given as 4 little-endian lanes: branch-free, so a
    loop over keys vectorises (AVX-512 multiplies 8 lanes at once)."""
    v1 = _round(P1 + P2, a)
    v2 = _round(P2, b)
    v3 = _round(np.uint64(0), c)
    v4 = _round(np.uint64(0) - P1, d)
    h = _converge(v1, v2, v3, v4)
    h += np.uint64(32)
    return _avalanche(h)


@njit(nogil=True, cache=True)
def _hash32_into(keys64, hashes, start):
    # Its own function, over slices from 0: LLVM vectorises this loop only so (not a loop
    # from a variable start, nor one inlined into a kernel).
    k = keys64[start * 4:]
    h = hashes[start:]
    for i in range(h.shape[0]):
        b = i * 4
        h[i] = np.int64(_xxh64_4words(np.uint64(k[b]), np.uint64(k[b + 1]), np.uint64(k[b + 2]), np.uint64(k[b + 3])))


@njit(inline="always")
def hash_keys(keys8, keys64, kstride, ks, hashes, start):
    """hashes[i] = xxh64(key i) as int64 bits, for i in start..; key i is keys8[i*kstride:][:ks]
    and keys64 views the same memory (kstride is a multiple of 8)."""
    if ks == 32 and kstride == 32:
        _hash32_into(keys64, hashes, start)
    else:
        for i in range(start, hashes.shape[0]):
            hashes[i] = np.int64(xxh64_span(keys8, i * kstride, ks, np.uint64(0)))


@njit(nogil=True, cache=True)
def _rows32(words, out):
    for r in range(out.shape[0]):
        b = r * 4
        out[r] = _xxh64_4words(words[b], words[b + 1], words[b + 2], words[b + 3])


def xxh64_rows(keys: np.ndarray, seed: int = 0) -> np.ndarray:
    """XXH64 of every row of a C-contiguous 2-d uint8 array, as uint64."""
    n, width = keys.shape
    flat = keys.reshape(n * width)
    if width % 8 == 0 and flat.ctypes.data % 8 == 0:
        if width == 32 and seed == 0:
            out = np.empty(n, np.uint64)
            _rows32(flat.view(np.uint64), out)
            return out
        return _rows_words(flat.view(np.uint64), n, width // 8, np.uint64(seed))
    return _rows_bytes(flat, n, width, np.uint64(seed))
