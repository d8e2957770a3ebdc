"""The compiled lookup kernel: the readers' side of the table (the writers' is _kernels.py;
the rules every kernel keeps, and the bucket helpers and prefetches both use, are _bucket.py).

Invariants it keeps (layout in layout.py):
- Readers never write the segment and take no lock: a bucket is read between two
  acquire loads of its seqlock version; a read is kept only when the version was even
  (or is the odd version of a dead writer, or of damage, that the caller accepted as it
  stands) and did not move; otherwise it is read again.
- Every read of shared memory is bounded by the reader's own geometry, fixed at attach
  (never re-read from the header): bucket meta and index rows come from the key's hash;
  an index slot's offset is used only if it is 16-aligned and a record header and key
  fit in the bucket's ring from there (_slot_off_bad); a
  record's value length only if it is <= max value and the value ends inside the ring.
  numba does not check bounds; these checks are what keeps any byte pattern from
  making a reader fault.
- A corruption, for a reader: a slot of the key's tag whose offset is no record's, or
  a record carrying the key's hash that is not a whole LIVE record, seen in a bucket
  whose even version did not move during the read (so no writer was at work). The key
  is a miss and counters[1] counts it. A slot pointing at a DEAD record of the key in a
  dead writer's bucket read as it stands is the dead writer's half-done delete, not
  damage: not counted.
- Every call returns: a bucket that stays odd, or whose version keeps moving, for
  spin_limit tries hands the key back as STUCK; the caller (engine/reader.py Reader) decides to
  read it as it stands, or to yield and try again. Once the call's bound has passed, the
  caller calls with give_up: then the kernel itself gives such a bucket up (given_up[b])
  and reports its keys missing, each a corruption counted, a given-up bucket's at once,
  without handing anything back: the rest of the batch costs one pass, not one call a key.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from shmcache.engine._bucket import (
    _BUCKET_MASK,
    _LEN_MASK,
    G_KEY,
    G_KSTRIDE,
    G_MAXV,
    G_RING,
    G_SLOTS,
    _home,
    _key_eq,
    _prefetch_bucket,
    _slot_off_bad,
    _tag,
    _tagged_entry,
)
from shmcache.engine._intrinsics import copy_bytes, prefetch
from shmcache.engine.xxh64 import hash_keys
from shmcache.engine.layout import F_LIVE, M_VERSION, POS_BITS, POS_MASK, RECORD_HEADER, ROW_WORDS
from shmcache.ipc.atomics import fence_acquire, load_acquire

# The lookup's own software pipeline (the writers' is in _kernels.py): key i + _AHEAD_BUCKET's
# bucket and index line, key i + _AHEAD_RECORD's record, found through that index line, which
# must have arrived: the record's distance is half the bucket's. The distances are chosen with
# bench/test_lookup_bounds.py (bench/README.md "What bounds a lookup").
_AHEAD_BUCKET = 32
_AHEAD_RECORD = 16

# lookup status
DONE, NEED_SPACE, STUCK = 0, 1, 2
C_RETRIES, C_CORRUPTIONS = 0, 1  # the counters array


@njit(inline="always")
def _prefetch_record(index, ring8, slots, ring, h, span):
    """Prefetch the lines of [record, record + span) of the first slot on the key's probe
    path that has its tag (_tagged_entry): a hint, read without the seqlock (a prefetch
    never faults; the index is clamped to the bucket's ring all the same). The home
    slot's record would be someone else's half the time in a full bucket. A miss whose
    path holds no such tag prefetches nothing. Records are 16-byte aligned, so a 48-byte
    header and key cross a line half the time: every line from the one the record starts
    in to the one its span ends in is fetched (whole lines counted from its start would
    miss the last)."""
    b = h & _BUCKET_MASK
    e = _tagged_entry(index, b * slots, slots, h)
    if e != 0:
        end = b * ring + ring - 1
        r = b * ring + (e & POS_MASK) - 1
        p = r & ~63
        while p < r + span:
            prefetch(ring8, min(p, end), 0)
            p += 64


@njit(nogil=True, cache=True, _nrt=False)
def lookup(meta, index, ring8, ring64, geo, keys8, keys64, hashes, start, found, offsets, out, out_pos,
           want_values, value_guess, static_bucket, static_version, spin_limit, counters, given_up, give_up):
    """Hash and look keys start.. up; returns (next index, out_pos, DONE | NEED_SPACE | STUCK).

    hashes[i] receives each key's xxh64 in the call with start 0; a call again from a later
    start (after NEED_SPACE or STUCK, with the same arrays) finds them there, so a batch is
    hashed once however often it is handed back. found[i] is set per key; with want_values
    the value is copied to out[out_pos:] and offsets[i + 1] is its end.
    value_guess (bytes, e.g. the mean value length seen so far) sizes the prefetch of each record.
    NEED_SPACE: out is too small for key i's value. STUCK: key i's bucket stayed
    odd, or its version kept moving, for spin_limit tries; the caller checks the lock
    owner and calls again, with static_bucket and static_version set to accept that
    bucket as it stands while its version does not move (a dead writer's, or damage),
    or, past its bound, calls again with give_up: then a bucket stuck for spin_limit tries
    is marked in given_up (NBUCKETS bools) and its keys, and every key of a bucket marked
    there, are misses, each counted in counters[C_CORRUPTIONS].
    counters[C_RETRIES] counts retries after a concurrent write, counters[C_CORRUPTIONS]
    damaged records met (see the module's docstring).
    """
    slots, ring, ks, maxv, kst = geo[G_SLOTS], geo[G_RING], geo[G_KEY], geo[G_MAXV], geo[G_KSTRIDE]
    mask = slots - 1
    lim = np.uint64(ring - RECORD_HEADER - ks)  # a record header and key fit from an offset <= lim
    n = hashes.shape[0]
    span = RECORD_HEADER + ks + (value_guess if want_values else 0)
    if start == 0:
        hash_keys(keys8, keys64, kst, ks, hashes, 0)
    for j in range(start, min(n, start + _AHEAD_BUCKET)):
        _prefetch_bucket(meta, index, slots, hashes[np.uint64(j)])
    for j in range(start, min(n, start + _AHEAD_RECORD)):
        _prefetch_record(index, ring8, slots, ring, hashes[np.uint64(j)], span)
    for i in range(start, n):
        if i + _AHEAD_BUCKET < n:
            _prefetch_bucket(meta, index, slots, hashes[np.uint64(i + _AHEAD_BUCKET)])
        if i + _AHEAD_RECORD < n:
            _prefetch_record(index, ring8, slots, ring, hashes[np.uint64(i + _AHEAD_RECORD)], span)
        h = hashes[np.uint64(i)]
        b = h & _BUCKET_MASK
        mb = b * ROW_WORDS
        ibase = b * slots
        rbase = b * ring
        tag = _tag(h)
        koff = i * kst
        spins = 0
        bad = False
        stuck = False
        while True:
            v1 = load_acquire(meta, mb + M_VERSION)
            if v1 & 1 and not (b == static_bucket and v1 == static_version):
                if given_up[b]:
                    stuck = True
                    break
                spins += 1
                if spins >= spin_limit:
                    if not give_up:
                        return i, out_pos, STUCK
                    given_up[b] = True
                    stuck = True
                    break
                continue
            hit = -1
            vlen = 0
            bad = False
            s = _home(h, slots)
            for _ in range(slots):
                e = index[np.uint64(ibase + s)]
                if e == 0:
                    break
                if (e >> POS_BITS) == tag:
                    off = (e & POS_MASK) - 1
                    if _slot_off_bad(off, lim):
                        bad = True
                    else:
                        w = (rbase + off) >> 3
                        if ring64[np.uint64(w)] == h:
                            word = ring64[np.uint64(w + 1)]
                            ln = word & _LEN_MASK
                            if (word >> 32) != F_LIVE or ln > maxv or off + RECORD_HEADER + ks + ln > ring:
                                bad = True
                            elif _key_eq(ring8, ring64, rbase + off + RECORD_HEADER, keys8, keys64, koff, ks):
                                hit = rbase + off + RECORD_HEADER + ks
                                vlen = ln
                                break
                s = (s + 1) & mask
            if want_values and hit >= 0:
                if out_pos + vlen > out.shape[0]:
                    return i, out_pos, NEED_SPACE
                copy_bytes(out, out_pos, ring8, hit, vlen)  # bounds: out_pos + vlen checked above
            fence_acquire()
            if load_acquire(meta, mb + M_VERSION) == v1:
                break
            counters[C_RETRIES] += 1
            spins += 1
            if spins >= spin_limit:  # a version that never settles: the caller bounds the wait
                if not give_up:
                    return i, out_pos, STUCK
                given_up[b] = True
                stuck = True
                break
        if stuck:  # given up: a miss, and a corruption counted
            counters[C_CORRUPTIONS] += 1
            found[np.uint64(i)] = False
            offsets[np.uint64(i + 1)] = out_pos
            continue
        if bad and not (v1 & 1):
            counters[C_CORRUPTIONS] += 1
        found[np.uint64(i)] = hit >= 0
        if want_values and hit >= 0:
            out_pos += vlen
        offsets[np.uint64(i + 1)] = out_pos
    return n, out_pos, DONE
