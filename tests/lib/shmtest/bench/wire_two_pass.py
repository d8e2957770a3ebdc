"""The decode of a consume() batch as it was up to commit 94080f9 (formats/_wire_kernels.py
scan_many and gather_many), for bench/test_worker_loop.py to run beside today's: every
message scanned for its counts, then every message gathered, a second walk of its bytes.
The per-message kernels `scan` and `gather` it calls are still the module's own."""

from __future__ import annotations

import numpy as np
from numba import njit

from shmcache.formats._wire_kernels import (_V1_HEADER, _V2_COUNT_AT, _V2_ENTRY_HEADER, _V2_HEADER, M_COLUMNS,
                                             M_DECLARED, M_DELETE_PAYLOADS, M_KEPT, M_UNKNOWN, M_VERSION, M_WALKED, OK,
                                             gather, scan)
from shmcache.engine.xxh64 import u32


@njit(nogil=True, _nrt=False)
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


@njit(nogil=True, _nrt=False)
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
