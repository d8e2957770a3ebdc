"""What a caller hands the table handles, checked and turned into the flat arrays the
kernels take, without per-entry Python work where the input allows it.

Every function takes the cache's name (for the error message) and raises the
builtin-derived errors of errors.py naming the item that is wrong and what it
should be. Nothing here touches the segment.

Values come in one of three forms, the same for set_many and apply:
- a sequence of bytes-like objects, one per key;
- an `(offsets, data)` pair: value i is data[offsets[i]:offsets[i + 1]] (offsets int, n + 1 entries);
- a `(starts, lens, data)` triple: value i is data[starts[i]:starts[i] + lens[i]] (a decoded
  Kafka batch, formats/wire.py's Batch, comes in this form).

Python lists of bytes (the second half of this module): first choice, a list whose items
are all exactly `bytes` is read by the compiled kernels of engine/_pyobjects.py, one pass
over the objects (prefetched a few items ahead) straight into a numpy buffer, with no
Python work per item: `fixed()` for keys (every item checked to have the key size),
`join_bytes()` for values (one pass copying into a buffer that grows when the values
outsize its first guess), `pairs()` for a set_many's keys and values together (one pass
over both lists). Anything else (another sequence type, bytearray or memoryview items, an
interpreter whose objects the kernels cannot read) takes the general path, which also
words the errors.

On the general path the kernels still want one flat buffer and each item's length;
`np.fromiter(map(len, items))` costs several times the join itself (numpy converts every
Python int on its own). Keys of one cache all have one size, so the common case needs no
length array at all: one C-level pass (`set(map(len, items))`) proves every item has the
same `len`, and the joined buffer's size proves `len` counted bytes (a multi-byte
memoryview's `len` counts items: fewer than its bytes, so the sum would fall short).
Mixed lengths (values) take `np.fromiter`, once. bench/test_keylist.py times these paths;
bench/test_table.py shows the list form beside the array form.
"""

from __future__ import annotations

import numpy as np

from shmcache.engine import _kernels as K
from shmcache.engine import _pyobjects
from shmcache.errors import KeySizeError, ValueTooLargeError


def keys(name: str, ks: int, keys) -> np.ndarray:
    """(n, ks) C-contiguous uint8 from an array or a sequence of bytes."""
    if isinstance(keys, np.ndarray):
        if keys.dtype != np.uint8 or keys.ndim != 2 or keys.shape[1] != ks:
            raise KeySizeError(
                f"cache {name!r}: keys must be an (n, {ks}) uint8 array, got {keys.dtype} {keys.shape}"
            )
        return np.ascontiguousarray(keys)
    if isinstance(keys, (bytes, bytearray, memoryview, str)):
        raise TypeError(f"cache {name!r}: keys must be a sequence of keys; for one key use get/set/delete")
    keys = keys if isinstance(keys, list) else list(keys)
    arr = fixed(keys, ks)  # every key a bytes object of ks bytes: one compiled pass
    if arr is not None:
        return arr
    packed = join_bytes(keys)
    if packed is None or (packed[0] != ks).any():  # the loop only words the error
        for i, k in enumerate(keys):
            if not isinstance(k, (bytes, bytearray, memoryview)) or memoryview(k).nbytes != ks:
                what = f"{memoryview(k).nbytes} bytes" if isinstance(k, (bytes, bytearray, memoryview)) \
                    else type(k).__name__
                raise KeySizeError(f"cache {name!r}: key {i} is {what}; this cache's keys are {ks} bytes")
    return np.frombuffer(packed[1], np.uint8).reshape(len(keys), ks)


def entries(name: str, ks: int, maxv: int, keys_in, vals) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(keys, starts, lens, data) of a set_many or apply: keys as keys() gives them, values as
    values() does. Two lists of `bytes` are read together in one pass (pairs());
    anything else, or any item that pass does not take, goes through keys() and values(),
    which word the errors."""
    got = pairs(keys_in, vals, ks)
    if got is None:
        k = keys(name, ks, keys_in)
        return (k, *values(name, maxv, vals, len(k)))
    k, starts, lens, data, longest = got
    if longest > maxv:
        _within(name, maxv, lens)
    return k, starts, lens, data


def _within(name: str, maxv: int, lens: np.ndarray) -> None:
    """Raise ValueTooLargeError naming the first value longer than maxv, if one is."""
    if len(lens) and lens.max() > maxv:
        i = int(np.argmax(lens))
        raise ValueTooLargeError(f"cache {name!r}: value {i} is {int(lens[i])} bytes; the limit is {maxv} (max_value)")


def words(k: np.ndarray, kstride: int) -> tuple[np.ndarray, np.ndarray]:
    """The kernels' view of keys: flat uint8 rows padded to kstride (a multiple of 8)
    bytes, and its int64 view (an unaligned view is fine: numba compiles for it and
    x86 loads do not care)."""
    if kstride != k.shape[1]:
        padded = np.zeros((len(k), kstride), np.uint8)
        padded[:, : k.shape[1]] = k
        k = padded
    flat = k.reshape(-1)
    return flat, flat.view(np.int64)


def ints(name: str, arr, what: str) -> np.ndarray:
    """An integer array as given (never a float or bool truncated or taken as 0/1)."""
    a = arr if isinstance(arr, np.ndarray) else np.asarray(arr)
    if a.dtype.kind not in "iu" and a.size:
        raise TypeError(f"cache {name!r}: {what} must be integers, got an array of {a.dtype}")
    return a


def as_bytes(name: str, data, what: str) -> np.ndarray:
    """Flat uint8 bytes of a numpy array (any plain dtype, by its bytes) or a bytes-like object."""
    if isinstance(data, np.ndarray):
        if data.dtype == np.uint8 and data.ndim == 1 and data.flags.c_contiguous:
            return data  # as the wire decoder gives it
        if data.dtype.hasobject:
            raise TypeError(f"cache {name!r}: {what} must be bytes, got an array of {data.dtype}")
        return np.ascontiguousarray(data).reshape(-1).view(np.uint8)
    try:
        m = memoryview(data)
        return np.frombuffer(m if m.c_contiguous else m.tobytes(), np.uint8)
    except TypeError:
        raise TypeError(f"cache {name!r}: {what} must be bytes or a numpy array, "
                        f"got {type(data).__name__}") from None


def actions(name: str, acts, n: int) -> np.ndarray:
    """Actions as uint8, each ADD (0) or DELETE (1): any other value is refused, not
    wrapped into range (256 would be an ADD) or skipped."""
    a = ints(name, acts, "actions (0 ADD, 1 DELETE)")
    if a.shape != (n,):
        raise ValueError(f"cache {name!r}: {n} keys but actions of shape {a.shape}")
    if n and (int(a.max()) > K.DELETE or (a.dtype.kind == "i" and int(a.min()) < K.ADD)):
        i = int(np.flatnonzero((a < K.ADD) | (a > K.DELETE))[0])
        raise ValueError(f"cache {name!r}: action {i} is {int(a[i])}; an action is 0 (ADD) or 1 (DELETE)")
    return np.ascontiguousarray(a, np.uint8)


def hashes(name: str, h, n: int) -> np.ndarray:
    """Precomputed key hashes as the kernels take them: int64 bits of the uint64 xxh64, shape (n,)."""
    if not isinstance(h, np.ndarray) or h.dtype not in (np.uint64, np.int64) or h.shape != (n,):
        what = f"an array of {h.dtype} {h.shape}" if isinstance(h, np.ndarray) else type(h).__name__
        raise ValueError(f"cache {name!r}: hashes must be a uint64 array of shape ({n},), one xxh64 per key; "
                         f"got {what}")
    return np.ascontiguousarray(h).view(np.int64)


def _spans(name: str, maxv: int, starts, lens, data, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    lens = np.asarray(ints(name, lens, "value lengths"), np.int64)
    starts = np.asarray(ints(name, starts, "value starts"), np.int64)
    if lens.shape != (n,) or starts.shape != (n,):
        raise ValueError(f"cache {name!r}: {n} keys but starts/lens of shapes {starts.shape}/{lens.shape}")
    data = as_bytes(name, data, "value data")
    # starts are checked on their own first: with starts <= len(data) and 0 <= lens <= max_value
    # the ends cannot wrap past 2**63 (which made a span far outside data look inside it)
    if n and (lens.max() > maxv or lens.min() < 0 or starts.min() < 0
              or starts.max() > len(data) or (starts + lens).max() > len(data)):
        raise ValueTooLargeError(f"cache {name!r}: a value span is outside data (of {len(data)} bytes) "
                                 f"or over max_value ({maxv})")
    return np.ascontiguousarray(starts), np.ascontiguousarray(lens), data


def _offsets(name: str, maxv: int, offsets, data, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    offsets = ints(name, offsets, "value offsets")
    if offsets.dtype == np.uint64 and offsets.size and offsets.max() > np.iinfo(np.int64).max:
        raise ValueError(f"cache {name!r}: value offsets must rise from 0 to at most len(data)")
    offsets = np.ascontiguousarray(offsets, np.int64)
    data = as_bytes(name, data, "value data")
    if offsets.shape != (n + 1,):
        raise ValueError(f"cache {name!r}: value offsets must have {n + 1} entries for {n} keys, got {offsets.shape}")
    lens = np.empty(n, np.int64)
    bad = K.spans_of_offsets(offsets, len(data), maxv, lens)  # one compiled pass, not six numpy ones
    if bad == -2:
        raise ValueError(f"cache {name!r}: value offsets must rise from 0 to at most len(data)={len(data)}")
    if bad >= 0:
        raise ValueTooLargeError(f"cache {name!r}: value {bad} is {int(offsets[bad + 1] - offsets[bad])} "
                                 f"bytes; the limit is {maxv} (max_value)")
    return offsets[:-1], lens, data


def values(name: str, maxv: int, vals, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(starts, lens, data) from any of the three forms (see the module's docstring),
    each value checked to lie inside data and to be at most maxv bytes."""
    if isinstance(vals, tuple) and len(vals) in (2, 3) and isinstance(vals[0], np.ndarray):
        return _offsets(name, maxv, *vals, n) if len(vals) == 2 else _spans(name, maxv, *vals, n)
    if isinstance(vals, (bytes, bytearray, memoryview, str)):
        raise TypeError(f"cache {name!r}: values must be a sequence of values; for one value use set()")
    vals = vals if isinstance(vals, list) else list(vals)
    if len(vals) != n:
        raise ValueError(f"cache {name!r}: {n} keys but {len(vals)} values")
    packed = join_bytes(vals)
    if packed is None:  # the loop only words the error
        for i, v in enumerate(vals):
            if not isinstance(v, (bytes, bytearray, memoryview)):
                raise TypeError(f"cache {name!r}: value {i} is {type(v).__name__}, not bytes")
    lens, joined = packed
    _within(name, maxv, lens)
    starts = np.cumsum(lens) - lens
    return starts.astype(np.int64, copy=False), lens.astype(np.int64, copy=False), np.frombuffer(joined, np.uint8)


# -- Python lists of bytes, read by one compiled pass (engine/_pyobjects.py) -----------------------

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
