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


# -- many messages at once (consumer/wire_batch.py) -------------------------------
# scan_many's row per message: the version it decodes cleanly as (0: not cleanly, leave
# it to wire.decode), then scan's walked, kept, unknown and delete_payloads, and the count
M_VERSION, M_WALKED, M_KEPT, M_UNKNOWN, M_DELETE_PAYLOADS, M_DECLARED, M_COLUMNS = range(7)
_V2_COUNT_AT = 4  # the v2 header: 4 magic bytes, then the u32 LE count
_V2_HEADER = 8
_V1_HEADER = 4
_V2_ENTRY_HEADER = 8 + 32 + ACTION_SIZE + LEN_SIZE


@njit(cache=True, nogil=True, _nrt=False)
def scan_many(buf, starts, ends, key_size, max_value, out):
    """Scan each message buf[starts[m]:ends[m]] the way wire.decode reads a clean one: v2
    if it has the v2 magic, its count fits and its entries scan cleanly to its end; else
    v1 if those scan cleanly. out[m] gets the version (0 if neither holds cleanly: damage,
    or a v2 message that is not: wire.decode then decides) and scan's figures.
    Returns the number of messages with version 0. v2 hashes are not checked here."""
    bad = 0
    for m in range(starts.shape[0]):
        s = np.int64(starts[m])
        msg = buf[s:np.int64(ends[m])]
        n = np.int64(msg.shape[0])
        for c in range(M_COLUMNS):
            out[m, c] = 0
        version = 0
        if n >= _V1_HEADER:
            magic = msg[0] == 0xFF and msg[1] == 0x02 and msg[2] == 0 and msg[3] == 0
            if magic and n >= _V2_HEADER and u32(msg, _V2_COUNT_AT) * _V2_ENTRY_HEADER <= n - _V2_HEADER:
                count = u32(msg, _V2_COUNT_AT)
                walked, kept, unknown, dp, _end, err, _at, _len = scan(msg, _V2_HEADER, count, 8, key_size, max_value)
                version = 2 if err == OK else 0  # not cleanly v2: wire.decode tries it as v1
            else:
                count = u32(msg, 0)
                walked, kept, unknown, dp, _end, err, _at, _len = scan(msg, _V1_HEADER, count, 0, key_size, max_value)
                version = 1 if err == OK else 0
            if version:
                out[m, M_WALKED] = walked
                out[m, M_KEPT] = kept
                out[m, M_UNKNOWN] = unknown
                out[m, M_DELETE_PAYLOADS] = dp
                out[m, M_DECLARED] = count
        out[m, M_VERSION] = version
        if version == 0:
            bad += 1
    return bad


@njit(cache=True, nogil=True, _nrt=False)
def gather_many(buf, starts, ends, scanned, key_size, keys_out, actions_out, starts_out, lens_out, hashes_out):
    """gather() each message scan_many found clean (no version 0 among them) into one set
    of arrays, in message order; starts_out are positions in buf. v2 hashes go to
    hashes_out (sized for every entry when any message is v2, else empty)."""
    j = np.int64(0)
    for m in range(starts.shape[0]):
        s = np.int64(starts[m])
        msg = buf[s:np.int64(ends[m])]
        kept = scanned[m, M_KEPT]
        v2 = scanned[m, M_VERSION] == 2
        e = j + kept
        gather(msg, _V2_HEADER if v2 else _V1_HEADER, scanned[m, M_WALKED], 8 if v2 else 0, key_size,
               keys_out[j:e], actions_out[j:e], starts_out[j:e], lens_out[j:e],
               hashes_out[j:e] if v2 else hashes_out[0:0])
        for i in range(j, e):
            starts_out[i] += s
        j = e
    return j
