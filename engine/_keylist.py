"""Python lists of bytes into the kernels' flat form: lengths and one joined buffer.

First choice: a list whose items are all exactly `bytes` is read by the compiled
kernels of engine/_pyobjects.py, one pass over the objects (prefetched a few items
ahead) straight into a numpy buffer, with no Python work per item: `fixed()` for
keys (every item checked to have the key size), `join_bytes()` for values (one pass
copying into a buffer that grows when the values outsize its first guess), `pairs()`
for a set_many's keys and values together (one pass over both lists). Anything
else (another sequence type, bytearray or memoryview items, an interpreter whose
objects the kernels cannot read) takes the general path below.

Most callers hold keys as a list of `bytes`. The kernels want one flat buffer and
each item's length; `np.fromiter(map(len, items))` costs several times the join
itself (numpy converts every Python int on its own). Keys of one cache all have one size, so the common case needs no length array at
all: one C-level pass (`set(map(len, items))`) proves every item has the same
`len`, and the joined buffer's size proves `len` counted bytes (a multi-byte
memoryview's `len` counts items: fewer than its bytes, so the sum would fall
short). Mixed lengths (values) take `np.fromiter`, once. bench/test_keylist.py times
these paths; bench/test_table.py shows the list form beside the array form.
"""

from __future__ import annotations

import numpy as np

from shmcache.engine import _pyobjects

_GUESS = 160  # bytes per item a list of values is first given room for (txmeta: 61-141 B); it grows


def fixed(items: list, size: int) -> np.ndarray | None:
    """An (n, size) uint8 array of the items if every one is a `bytes` object of `size`
    bytes, read by the compiled kernel; None otherwise (an item of another type or
    length, or no compiled path here): the caller takes the general path, which also
    words the errors."""
    if type(items) is not list or not _pyobjects.available():
        return None
    n = len(items)
    out = np.empty((n, size), np.uint8)
    if _pyobjects.gather_fixed(id(items), n, id(bytes), size, size, out.reshape(-1)) != -1:
        return None
    return out


def pairs(keys: list, values: list, size: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int] | None:
    """A set_many of two lists in one compiled pass over both (engine/_pyobjects.py
    gather_pairs): (the keys as an (n, size) uint8 array, each value's start and length
    as int64, all the values back to back, the longest value's length); None unless both
    are lists of n `bytes` objects, every key of `size` bytes (the caller takes the
    general path, which words the errors)."""
    n = len(keys)
    if type(keys) is not list or type(values) is not list or len(values) != n or not _pyobjects.available():
        return None
    out = np.empty((n, size), np.uint8)
    flat = out.reshape(-1)
    starts, lens = np.empty(n, np.int64), np.empty(n, np.int64)
    buf = _room(values)
    i, p, longest = _pyobjects.gather_pairs(id(keys), id(values), n, id(bytes), size, flat, 0, starts, lens, buf, 0)
    while 0 <= i < n and lens[i] >= 0:  # out of room: grow, and go on from pair i
        buf = _grown(buf, p, int(lens[i]), n - i)
        i, p, more = _pyobjects.gather_pairs(id(keys), id(values), n, id(bytes), size, flat, i, starts, lens, buf, p)
        longest = max(longest, more)
    return (out, starts, lens, buf[:p], longest) if i == n else None


def _room(items: list) -> np.ndarray:
    """A first buffer for the bytes of a list of values: _GUESS bytes an item, or for a long
    list what its first items promise (not n x the guess)."""
    n = len(items)
    if n <= 4096:
        return np.empty(n * _GUESS + 64, np.uint8)
    sample = items[:256]
    return np.empty(n * (sum(len(v) for v in sample if type(v) is bytes) * 5 // (4 * len(sample))) + 64, np.uint8)


def _grown(buf: np.ndarray, p: int, size: int, left: int) -> np.ndarray:
    """buf, out of room at p for an item of `size` bytes with `left` items to go, grown (by
    what is left at this item's size, at least) with its first p bytes kept."""
    bigger = np.empty(max(2 * len(buf), p + size * left), np.uint8)
    bigger[:p] = buf[:p]
    return bigger


def join_bytes(items: list) -> tuple[np.ndarray, bytes | np.ndarray] | None:
    """(each item's length in bytes as int64, all their bytes back to back, as bytes or a
    uint8 array); None if an item is not bytes-like (the caller words the error, naming
    the item)."""
    n = len(items)
    if type(items) is list and _pyobjects.available():
        lens = np.empty(n, np.int64)
        buf = _room(items)
        i, p = _pyobjects.gather_var(id(items), n, id(bytes), 0, lens, buf, 0)
        while i < n and lens[i] >= 0:  # out of room: grow, and go on from item i
            buf = _grown(buf, p, int(lens[i]), n - i)
            i, p = _pyobjects.gather_var(id(items), n, id(bytes), i, lens, buf, p)
        if i == n:
            return lens, buf[:p]
    try:
        joined = b"".join(items)
    except TypeError:  # not bytes-like, or a strided memoryview, which join refuses
        if not all(isinstance(v, (bytes, bytearray, memoryview)) for v in items):
            return None
        joined = b"".join(map(bytes, items))
        return _lens_by_nbytes(items), joined
    if n and len(items[0]) == len(items[-1]):  # likely one size (keys): one pass proves it
        sizes = set(map(len, items))
        if len(sizes) == 1:
            (size,) = sizes
            if size * n == len(joined):  # else some len() counted items, not bytes
                return np.full(n, size, np.int64), joined
            return _lens_by_nbytes(items), joined
    lens = np.fromiter(map(len, items), np.int64, n)
    if len(joined) != int(lens.sum()):  # multi-byte items: len() counts items, not bytes
        lens = _lens_by_nbytes(items)
    return lens, joined


def _lens_by_nbytes(items: list) -> np.ndarray:
    return np.fromiter((memoryview(v).nbytes for v in items), np.int64, len(items))
