"""Key columns as the engine takes them: an Arrow array -> an (n, key_size) uint8 array.

A key column is binary (each key exactly key_size bytes) or a string of 2 *
key_size hex digits (either case). The conversion is vectorised: binary keys are a
view of the Arrow data buffer when nothing is null, hex keys go through a 256-entry
table. A null key is not an error: it comes back as a row of zeros with
`valid[i] = False`, and the callers make it a miss. A key of the wrong length or a
non-hex character is an error naming the column, the row within the batch and the
key (`KeySizeError`, a ValueError).

`check_type` is the driver-side check of a Spark column type, so that a wrong type
fails when the plan is built, not in an executor.
"""

from __future__ import annotations

import numpy as np

from shmcache.errors import KeySizeError

# hex digit -> value, 255 for anything else
_HEX = np.full(256, 255, np.uint8)
for _c, _v in zip(b"0123456789abcdef", range(16)):
    _HEX[_c] = _v
for _c, _v in zip(b"ABCDEF", range(10, 16)):
    _HEX[_c] = _v


def check_type(spark_type, column: str, who: str) -> None:
    """Raise TypeError unless a Spark column type can hold keys (binary or string)."""
    from pyspark.sql.types import BinaryType, StringType

    if not isinstance(spark_type, (BinaryType, StringType)):
        raise TypeError(f"{who}: key column {column!r} is {spark_type.simpleString()}; "
                        "expected binary (raw keys) or string (hex)")


def from_arrow(arr, key_size: int, column: str, who: str) -> tuple[np.ndarray, np.ndarray]:
    """(keys (n, key_size) uint8, valid (n,) bool) from a binary or hex-string Arrow array."""
    import pyarrow as pa

    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    n = len(arr)
    t = arr.type
    if arr.null_count == 0 and t == pa.binary():  # what Spark sends for a binary column: a view, no copy
        offsets = np.frombuffer(arr.buffers()[1], np.int32, n + 1, arr.offset * 4)
        if n and offsets[-1] - offsets[0] == n * key_size and (offsets[1:] - offsets[:-1] == key_size).all():
            data = np.frombuffer(arr.buffers()[2], np.uint8, n * key_size, int(offsets[0]))
            return data.reshape(n, key_size), np.ones(n, np.bool_)
    valid = np.ones(n, np.bool_) if arr.null_count == 0 else ~arr.is_null().to_numpy(zero_copy_only=False)
    if pa.types.is_fixed_size_binary(t):
        if t.byte_width != key_size:
            raise KeySizeError(f"{who}: key column {column!r} holds {t.byte_width}-byte keys; "
                               f"this cache's keys are {key_size} bytes")
        arr = arr.cast(pa.binary())
        t = arr.type
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        width, what = key_size, "bytes"
    elif pa.types.is_string(t) or pa.types.is_large_string(t):
        width, what = 2 * key_size, "hex characters"
    else:
        raise TypeError(f"{who}: key column {column!r} is {t}; expected binary (raw keys) or string (hex)")
    if not valid.all():  # nulls: a placeholder of the right width, masked by `valid`
        arr = arr.fill_null(("0" * width) if what == "hex characters" else b"\0" * width)
    flat = _fixed_width(arr, width, valid, column, who, what)
    if what == "bytes":
        return flat.reshape(n, key_size), valid
    nib = _HEX[flat].reshape(n, width)
    bad = nib == 255
    if bad.any():
        row = int(np.flatnonzero(bad.any(axis=1))[0])
        raise KeySizeError(f"{who}: key column {column!r}, row {row} of this batch: {_show(arr[row])} "
                           f"is not {width} hex characters")
    return np.ascontiguousarray((nib[:, 0::2] << 4) | nib[:, 1::2]), valid


def _fixed_width(arr, width: int, valid, column: str, who: str, what: str) -> np.ndarray:
    """The bytes of every value, back to back, after checking each is `width` long."""
    bufs = arr.buffers()
    off_type = np.int64 if _is_large(arr) else np.int32
    offsets = np.frombuffer(bufs[1], off_type, len(arr) + 1, arr.offset * np.dtype(off_type).itemsize)
    lens = np.diff(offsets)
    if len(lens) and (lens != width).any():
        row = int(np.flatnonzero(lens != width)[0])
        raise KeySizeError(f"{who}: key column {column!r}, row {row} of this batch: {_show(arr[row])} is "
                           f"{int(lens[row])} {what}; keys of this cache are {width} {what}")
    if len(arr) == 0:
        return np.empty(0, np.uint8)
    data = np.frombuffer(bufs[2], np.uint8)
    return data[int(offsets[0]):int(offsets[-1])]


def _is_large(arr) -> bool:
    import pyarrow as pa

    return pa.types.is_large_binary(arr.type) or pa.types.is_large_string(arr.type)


def _show(scalar) -> str:
    v = scalar.as_py()
    if isinstance(v, bytes):
        return f"key {v[:40].hex()}{'...' if len(v) > 40 else ''}"
    return f"key {v[:80]!r}"
