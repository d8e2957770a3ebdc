"""Compiled kernels behind `wire`: decoding is a validating scan, then a gather
into arrays sized by the scan; `encode` writes the entries of a message;
`decode_clean_many` decodes the clean messages of a whole consume() batch, each
checked and gathered in one pass (formats/wire_batch.py).

Invariants these kernels keep:
- `scan` never reads a byte it has not first bounds-checked against `buf.shape[0]`
  (numba does not bounds-check, so an unguarded read of a hostile length field
  would read past the buffer instead of raising).
- `gather` only walks the `walked` entries that `scan` accepted, so it needs no
  checks of its own; it writes exactly `kept` rows, the count `scan` returned, into
  arrays the caller sized from that count.
- `decode_clean_many` checks every read as `scan` does, against its message's end,
  and writes only rows below its outputs' length (a message they cannot hold is
  left to wire.decode, as a damaged one is).
- Entries come out in wire order; unknown actions are skipped using their length.
- Positions and lengths are int64 and hashes uint64, never mixed: numba promotes
  uint64 op int64 to float64.

`buf` is always a read-only, C-contiguous 1-d uint8 array (`wire` makes a read-only
view of writable input), so scan and gather compile for one buffer type only.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from shmcache.engine.layout import ADD, DELETE
from shmcache.engine.xxh64 import u32, u64

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


@njit(inline="always")
def _put(buf, p, hash_size, head, action, length, j, ks, keys_flat, actions_out, starts_out, lens_out, hashes_out):
    """Row j of the outputs from the ADD/DELETE entry at byte p: its key, action, content's
    start and length (0 for a DELETE, whatever it carried) and, for v2, its sent xxh64."""
    src = np.uint64(p + hash_size)  # unsigned indices: no negative-index fix-up per byte, the copy vectorises
    dst = np.uint64(j) * ks
    for b in range(ks):
        keys_flat[dst + b] = buf[src + b]
    actions_out[j] = action
    starts_out[j] = p + head
    lens_out[j] = length if action == ADD else 0
    if hash_size != 0:
        hashes_out[j] = u64(buf, p)


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
            _put(buf, p, hash_size, head, action, length, j, ks, flat, actions_out, starts_out, lens_out, hashes_out)
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


# -- many messages at once (formats/wire_batch.py) -------------------------------
# decode_clean_many's row per message: the version it decodes cleanly as (0: not cleanly, leave
# it to wire.decode), then scan's walked, kept, unknown and delete_payloads, and the count
M_VERSION, M_WALKED, M_KEPT, M_UNKNOWN, M_DELETE_PAYLOADS, M_DECLARED, M_COLUMNS = range(7)
_V2_COUNT_AT = 4  # the v2 header: 4 magic bytes, then the u32 LE count
_V2_HEADER = 8
_V1_HEADER = 4
_V2_ENTRY_HEADER = 8 + 32 + ACTION_SIZE + LEN_SIZE


@njit(inline="always")
def _walk_clean(buf, s, n, pos, count, hash_size, key_size, max_value, j, keys_out, actions_out, starts_out,
                lens_out, hashes_out, row):
    """scan() and gather() of one message buf[s:s + n] in ONE pass, for the clean case: its
    `count` entries from byte s + pos, intact, ending exactly at its end, written from row j
    of the outputs (hashes too when hash_size is 8), and the message's figures into `row`.
    Returns the row after its last entry; -1 at the first damage or when the outputs are
    full (their rows written from j are then garbage, `row` untouched). Every read is
    bounds-checked against s + n first, as in scan()."""
    action_at = np.int64(hash_size) + np.int64(key_size)
    head = action_at + ACTION_SIZE + LEN_SIZE
    cap = actions_out.shape[0]
    ks = np.uint64(key_size)
    end = s + n
    p = s + pos
    walked = kept = unknown = dp = np.int64(0)
    while walked < count:
        if p + head > end:
            return -1
        length = u32(buf, p + action_at + ACTION_SIZE)
        if length > max_value or p + head + length > end:
            return -1
        action = buf[p + action_at]
        if action == ADD or action == DELETE:
            if j >= cap:
                return -1
            _put(buf, p, hash_size, head, action, length, j, ks, keys_out, actions_out, starts_out, lens_out,
                 hashes_out)
            if action == DELETE and length != 0:
                dp += 1
            j += 1
            kept += 1
        else:
            unknown += 1
        p += head + length
        walked += 1
    if p != end:
        return -1
    row[M_WALKED] = walked
    row[M_KEPT] = kept
    row[M_UNKNOWN] = unknown
    row[M_DELETE_PAYLOADS] = dp
    row[M_DECLARED] = count
    return j


@njit(cache=True, nogil=True, _nrt=False)
def decode_clean_many(buf, starts, ends, key_size, max_value, out, keys_out, actions_out, starts_out, lens_out,
                      hashes_out):
    """Decode each message buf[starts[m]:ends[m]] (ends within buf) the way wire.decode reads
    a clean one, in one pass over its bytes: a message with the v2 magic and a count that
    fits is v2 if its entries walk cleanly to its end (else version 0: wire.decode then
    tries it as v1), any other is v1 if its entries do. Its entries go, in message order, to the flat
    outputs (keys_out: key_size bytes a row; starts_out: positions in buf; hashes_out: the
    sent xxh64 of v2 entries, unchecked here), all sized for the same number of rows.
    out[m] gets the version (0 if neither holds cleanly: damage, or a v2 message that is
    not; wire.decode then decides) and scan's figures. Returns (messages of version 0, rows
    written); a message that does not fit in the outputs counts as version 0."""
    j = np.int64(0)
    bad = 0
    for m in range(starts.shape[0]):
        s = np.int64(starts[m])
        n = np.int64(ends[m]) - s
        row = out[m]
        for c in range(M_COLUMNS):
            row[c] = 0
        version = 0
        if n >= _V1_HEADER:
            magic = buf[s] == 0xFF and buf[s + 1] == 0x02 and buf[s + 2] == 0 and buf[s + 3] == 0
            if magic and n >= _V2_HEADER and u32(buf, s + _V2_COUNT_AT) * _V2_ENTRY_HEADER <= n - _V2_HEADER:
                e = _walk_clean(buf, s, n, _V2_HEADER, u32(buf, s + _V2_COUNT_AT), 8, key_size, max_value, j,
                                keys_out, actions_out, starts_out, lens_out, hashes_out, row)
                version = 2
            else:
                e = _walk_clean(buf, s, n, _V1_HEADER, u32(buf, s), 0, key_size, max_value, j,
                                keys_out, actions_out, starts_out, lens_out, hashes_out, row)
                version = 1
            if e < 0:
                version = 0
            else:
                j = e
        row[M_VERSION] = version
        if version == 0:
            bad += 1
    return bad, j
