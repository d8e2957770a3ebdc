"""Compiled kernels behind `wire`: decoding is a validating scan, then a gather
into arrays sized by the scan; `encode` writes the entries of a message.

Invariants these kernels keep:
- `scan` never reads a byte it has not first bounds-checked against `buf.shape[0]`
  (numba does not bounds-check, so an unguarded read of a hostile length field
  would read past the buffer instead of raising).
- `gather` only walks the `walked` entries that `scan` accepted, so it needs no
  checks of its own; it writes exactly `kept` rows, the count `scan` returned, into
  arrays the caller sized from that count.
- Entries come out in wire order; unknown actions are skipped using their length.
- Positions and lengths are int64 and hashes uint64, never mixed: numba promotes
  uint64 op int64 to float64.

`buf` is always a read-only, C-contiguous 1-d uint8 array (`wire` makes a read-only
view of writable input), so scan and gather compile for one buffer type only.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from shmcache.engine._le import u32, u64

ADD = 0
DELETE = 1

# scan's error codes; wire.py turns them into messages.
OK = 0
TRUNCATED_HEADER = 1  # fewer bytes left than a fixed entry header
TRUNCATED_CONTENT = 2  # the length field points past the end of the buffer
OVER_MAX_VALUE = 3  # the length field exceeds max_value
TRAILING_BYTES = 4  # bytes left after the declared count of entries

LEN_SIZE = 4  # u32 LE content length
ACTION_SIZE = 1


@njit(cache=True, nogil=True, _nrt=False)
def scan(buf, pos, count, hash_size, key_size, max_value):
    """Walk up to `count` entries from byte `pos`, stopping at the first damage.

    An entry is `[hash_size B hash][key_size B key][u8 action][u32 LE len][content]`.
    Returns (walked, kept, unknown, delete_payloads, end, err, err_at, err_len):
    entries walked intact, of which ADD/DELETE kept and unknown-action skipped,
    DELETEs that carried content, the byte after the last intact entry, an error
    code, the byte where the damaged entry starts (-1 if none) and its length field.
    """
    n = np.int64(buf.shape[0])
    pos = np.int64(pos)
    count = np.int64(count)
    max_value = np.int64(max_value)
    action_at = np.int64(hash_size) + np.int64(key_size)
    head = action_at + ACTION_SIZE + LEN_SIZE
    walked = np.int64(0)
    kept = np.int64(0)
    unknown = np.int64(0)
    delete_payloads = np.int64(0)
    err = OK
    err_at = np.int64(-1)
    err_len = np.int64(0)
    p = pos
    while walked < count:
        if p + head > n:
            err = TRUNCATED_HEADER
            err_at = p
            break
        length = u32(buf, p + action_at + ACTION_SIZE)
        if length > max_value:
            err = OVER_MAX_VALUE
            err_at = p
            err_len = length
            break
        if p + head + length > n:
            err = TRUNCATED_CONTENT
            err_at = p
            err_len = length
            break
        action = buf[p + action_at]
        if action == ADD:
            kept += 1
        elif action == DELETE:
            kept += 1
            if length != 0:
                delete_payloads += 1
        else:
            unknown += 1
        p += head + length
        walked += 1
    if err == OK and p != n:
        err = TRAILING_BYTES
        err_at = p
    return walked, kept, unknown, delete_payloads, p, err, err_at, err_len


@njit(cache=True, nogil=True, _nrt=False)
def gather(buf, pos, walked, hash_size, key_size,
           keys_out, actions_out, starts_out, lens_out, hashes_out):
    """Copy the ADD/DELETE entries among the first `walked` (already scanned) into
    the output arrays, in wire order. A DELETE's value length is 0 even if it carried
    content. With hash_size 8 (v2) the sent xxh64 goes to hashes_out.
    Returns the number of entries written."""
    pos = np.int64(pos)
    action_at = np.int64(hash_size) + np.int64(key_size)
    head = action_at + ACTION_SIZE + LEN_SIZE
    flat = keys_out.reshape(-1)
    ks = np.uint64(key_size)
    j = 0
    p = pos
    for _ in range(walked):
        action = buf[p + action_at]
        length = u32(buf, p + action_at + ACTION_SIZE)
        if action == ADD or action == DELETE:
            # unsigned indices: no negative-index fix-up per byte, so the copy vectorises
            src = np.uint64(p + hash_size)
            dst = np.uint64(j) * ks
            for b in range(ks):
                flat[dst + b] = buf[src + b]
            actions_out[j] = action
            starts_out[j] = p + head
            lens_out[j] = length if action == ADD else 0
            if hash_size != 0:
                hashes_out[j] = u64(buf, p)
            j += 1
        p += head + length
    return j


@njit(cache=True, nogil=True, _nrt=False)
def encode(out, pos, hash_size, keys, actions, offsets, data, hashes):
    """Write entry i = [hash][key][action][u32 LE len][data[offsets[i]:offsets[i+1]]]
    for every row of `keys` into `out` from byte `pos` (the u64 LE hash only if
    hash_size is 8, for v2).
    The caller sized `out` exactly and checked that offsets rise within `data`.
    Returns the byte after the last entry."""
    n, key_size = keys.shape
    p = np.int64(pos)
    for i in range(n):
        if hash_size != 0:
            h = hashes[i]
            for b in range(hash_size):
                out[p + b] = np.uint8((h >> np.uint64(8 * b)) & np.uint64(0xFF))
            p += hash_size
        for b in range(key_size):
            out[p + b] = keys[i, b]
        p += key_size
        out[p] = actions[i]
        p += ACTION_SIZE
        start = offsets[i]
        length = offsets[i + 1] - start
        for b in range(LEN_SIZE):
            out[p + b] = np.uint8((length >> (8 * b)) & 0xFF)
        p += LEN_SIZE
        for b in range(length):
            out[p + b] = data[start + b]
        p += length
    return p
