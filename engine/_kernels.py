"""Compiled table kernels: apply (writers), lookup (readers), repair (after a takeover).

Invariants these kernels keep (layout in layout.py):
- A bucket changes only under its lock, between an odd and the next even seqlock
  version; readers retry when the version was odd or moved.
- Every state a writer killed at any instruction can leave is still readable
  without tearing, so readers can read a dead writer's bucket before anyone
  repairs it: a record is complete before the head passes it and before a slot
  points at it; a record is marked DEAD before its slot is removed; a slot is
  removed before the tail passes its record, and ring space is reused only
  behind the tail. An interrupted backward shift leaves a duplicate slot, never
  a hole.
- Readers never write. Nothing here reads outside its arrays even when a
  reader sees a bucket mid-change: every position and length taken from shared
  memory is bounds-checked before use (numba does not check bounds).

The kernels are compiled without numba's reference counting (`_nrt=False`): they
allocate nothing, and with it every inlined helper taking arrays paid an atomic
incref/decref pair per array per call (8 per key in the key compare alone,
half of a lookup's time).

Arrays are 1-d views of the segment: meta/index/ring64 int64, ring8 uint8.
`geo` = [slots, ring bytes, key size, max value, max live entries, key stride].
Keys come as one flat uint8 array and an int64 view of the same memory, rows
`key stride` (key size rounded up to 8) bytes apart, so keys compare a word at a
time. Hashes are passed as int64 (the bits of the uint64 xxh64).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from shmcache.engine._memcpy import copy_bytes
from shmcache.engine._prefetch import prefetch
from shmcache.engine._xxh64 import hash_keys, xxh64_span
from shmcache.engine.layout import (
    BUCKET_BITS,
    W_DELETE_MISSES,
    W_DELETES,
    W_SETS,
    W_UNKNOWN,
    F_DEAD,
    F_LIVE,
    F_PAD,
    M_EVICTIONS,
    M_HEAD,
    M_LIVE,
    M_LIVE_BYTES,
    M_LOCK,
    M_TAIL,
    M_TAKEOVERS,
    M_VERSION,
    NBUCKETS,
    POS_BITS,
    POS_MASK,
    RECORD_ALIGN,
    RECORD_HEADER,
    ROW_WORDS,
    TAG_SHIFT,
)
from shmcache.ipc.atomics import cas, fence_acquire, fence_release, load_acquire, store_release

ADD = 0
DELETE = 1

G_SLOTS, G_RING, G_KEY, G_MAXV, G_MAXLIVE, G_KSTRIDE = 0, 1, 2, 3, 4, 5


# lookup status
DONE, NEED_SPACE, STUCK = 0, 1, 2

_BUCKET_MASK = NBUCKETS - 1
_LEN_MASK = 0xFFFFFFFF


@njit(inline="always")
def _home(h, slots):
    return (h >> BUCKET_BITS) & (slots - 1)


@njit(inline="always")
def _tag(h):
    return (h >> TAG_SHIFT) & 0xFFFF


@njit(inline="always")
def _record_size(ks, vlen):
    return (RECORD_HEADER + ks + vlen + RECORD_ALIGN - 1) // RECORD_ALIGN * RECORD_ALIGN


@njit(inline="always")
def _key_eq(ring8, ring64, roff, keys8, keys64, koff, ks):
    """ring8[roff:roff+ks] == keys8[koff:koff+ks]; roff and koff are multiples of 8."""
    # unsigned indices: numba skips its negative-index fix-up, which blocks vectorising
    rw = np.uint64(roff >> 3)
    kw = np.uint64(koff >> 3)
    for j in range(np.uint64(ks >> 3)):
        if ring64[rw + j] != keys64[kw + j]:
            return False
    ur = np.uint64(roff)
    uk = np.uint64(koff)
    for j in range(np.uint64(ks & ~7), np.uint64(ks)):
        if ring8[ur + j] != keys8[uk + j]:
            return False
    return True


@njit(inline="always")
def _copy(dst, d, src, s, n):
    # an explicit loop (numba's slice assignment checks overlap and may copy twice), with
    # unsigned indices (no negative-index fix-up per byte: 20x faster)
    ud = np.uint64(d)
    us = np.uint64(s)
    for j in range(np.uint64(n)):
        dst[ud + j] = src[us + j]


# -- writer side: the caller holds the bucket lock, so shared memory is trusted ------


@njit(inline="always")
def _find(index, ibase, slots, ring8, ring64, rbase, ring, h, keys8, keys64, koff, ks):
    """(slot holding the key or -1, first empty slot on its probe path or -1)."""
    mask = slots - 1
    i = _home(h, slots)
    tag = _tag(h)
    for _ in range(slots):
        e = index[ibase + i]
        if e == 0:
            return -1, i
        if (e >> POS_BITS) == tag:
            off = (e & POS_MASK) - 1
            if ring64[(rbase + off) >> 3] == h and _key_eq(ring8, ring64, rbase + off + RECORD_HEADER, keys8, keys64, koff, ks):
                return i, -1
        i = (i + 1) & mask
    return -1, -1


@njit(inline="always")
def _remove_slot(index, ibase, slots, ring64, rbase, ring, i):
    """Backward-shift deletion (linear probing needs no tombstones)."""
    mask = slots - 1
    j = i
    while True:
        j = (j + 1) & mask
        e = index[ibase + j]
        if e == 0:
            break
        k = _home(ring64[(rbase + (e & POS_MASK) - 1) >> 3], slots)
        if (i < k <= j) if i <= j else (i < k or k <= j):
            continue  # its home lies in (i, j]: it stays reachable where it is
        index[ibase + i] = e  # copy first: until i is cleared or reused, e sits twice, never nowhere
        i = j
    index[ibase + i] = 0


@njit(inline="always")
def _evict_oldest(meta, mb, index, ibase, slots, ring64, rbase, ring, ks):
    """Reclaim the record at the tail; count it if it was live. Returns False on an empty ring."""
    tail = meta[mb + M_TAIL]
    if tail >= meta[mb + M_HEAD]:
        return False
    off = tail % ring
    w = (rbase + off) >> 3
    word = ring64[w + 1]
    flags = word >> 32
    if flags == F_PAD:
        size = ring - off
    else:
        vlen = word & _LEN_MASK
        size = _record_size(ks, vlen)
        if flags == F_LIVE:
            h = ring64[w]
            mask = slots - 1
            i = _home(h, slots)
            for _ in range(slots):
                e = index[ibase + i]
                if e == 0:
                    break
                if (e & POS_MASK) - 1 == off:
                    _remove_slot(index, ibase, slots, ring64, rbase, ring, i)
                    break
                i = (i + 1) & mask
            ring64[w + 1] = (F_DEAD << 32) | vlen
            meta[mb + M_LIVE] -= 1
            meta[mb + M_LIVE_BYTES] -= size
            meta[mb + M_EVICTIONS] += 1
    meta[mb + M_TAIL] = tail + size
    return True


@njit(inline="always")
def _add(meta, mb, index, ibase, slots, ring8, ring64, rbase, ring, ks, max_live,
         h, keys8, keys64, koff, vdata, vstart, vlen):
    size = _record_size(ks, vlen)
    head = meta[mb + M_HEAD]
    off = head % ring
    if ring - off < size:  # no wrapping records: pad to the ring end and start over at 0
        pad = ring - off
        while head + pad - meta[mb + M_TAIL] > ring:
            _evict_oldest(meta, mb, index, ibase, slots, ring64, rbase, ring, ks)
        ring64[((rbase + off) >> 3) + 1] = F_PAD << 32
        head += pad
        meta[mb + M_HEAD] = head
        off = 0
    while head + size - meta[mb + M_TAIL] > ring or meta[mb + M_LIVE] >= max_live:
        if not _evict_oldest(meta, mb, index, ibase, slots, ring64, rbase, ring, ks):
            break
    w = (rbase + off) >> 3
    p = rbase + off + RECORD_HEADER
    ring64[w] = h
    _copy(ring8, p, keys8, koff, ks)
    _copy(ring8, p + ks, vdata, vstart, vlen)
    ring64[w + 1] = (F_LIVE << 32) | vlen
    meta[mb + M_HEAD] = head + size
    entry = (_tag(h) << POS_BITS) | (off + 1)
    found, empty = _find(index, ibase, slots, ring8, ring64, rbase, ring, h, keys8, keys64, koff, ks)
    if found >= 0:
        old = index[ibase + found]
        ow = (rbase + (old & POS_MASK) - 1) >> 3
        olen = ring64[ow + 1] & _LEN_MASK
        index[ibase + found] = entry
        ring64[ow + 1] = (F_DEAD << 32) | olen
        meta[mb + M_LIVE_BYTES] += size - _record_size(ks, olen)
    else:
        index[ibase + empty] = entry  # an empty slot exists: live < max_live < slots
        meta[mb + M_LIVE] += 1
        meta[mb + M_LIVE_BYTES] += size


@njit(inline="always")
def _delete(meta, mb, index, ibase, slots, ring8, ring64, rbase, ring, ks, h, keys8, keys64, koff):
    found, _ = _find(index, ibase, slots, ring8, ring64, rbase, ring, h, keys8, keys64, koff, ks)
    if found < 0:
        return False
    w = (rbase + (index[ibase + found] & POS_MASK) - 1) >> 3
    vlen = ring64[w + 1] & _LEN_MASK
    ring64[w + 1] = (F_DEAD << 32) | vlen  # dead first: a crash before the slot goes cannot resurrect it
    _remove_slot(index, ibase, slots, ring64, rbase, ring, found)
    meta[mb + M_LIVE] -= 1
    meta[mb + M_LIVE_BYTES] -= _record_size(ks, vlen)
    return True


# Software pipelining: while key i is looked up, the record of key i + _AHEAD_RECORD
# and the bucket of key i + _AHEAD_BUCKET are on their way into the cache. A few
# dozen misses in flight is what the core can track; more only queue up.
_AHEAD_BUCKET = 16
_AHEAD_RECORD = 8


@njit(inline="always")
def _prefetch_bucket(meta, index, slots, h):
    b = h & _BUCKET_MASK
    prefetch(meta, b * ROW_WORDS, 0)
    prefetch(index, b * slots + _home(h, slots), 0)


@njit(inline="always")
def _prefetch_write(meta, index, ring8, ring64, slots, ring, ks, h, vlen):
    """Prefetch, for writing, every line the key's new record will fill (its size is known:
    whole lines from the head missed the tail of a record 25 % of the time), the header
    and key of the record it may replace, and the oldest record (a full ring evicts it
    first: every add in steady state). Each miss left to the write itself cost ~20 %."""
    b = h & _BUCKET_MASK
    base = b * ring
    end = base + ring - 1
    hp = base + meta[b * ROW_WORDS + M_HEAD] % ring
    p = hp & ~63
    stop = hp + _record_size(ks, vlen)
    while p < stop:
        prefetch(ring8, min(p, end), 1)
        p += 64
    e = index[b * slots + _home(h, slots)]
    if e != 0:
        r = base + (e & POS_MASK) - 1
        prefetch(ring8, min(r, end), 1)
        prefetch(ring8, min(r + RECORD_HEADER + ks - 1, end), 1)
    prefetch(ring8, base + meta[b * ROW_WORDS + M_TAIL] % ring, 1)


@njit(inline="always")
def _prefetch_record(index, ring8, slots, ring, h, span):
    """Prefetch the lines of [record, record + span) that the key's home slot points at:
    a hint, read without the seqlock. Records are 16-byte aligned, so a 48-byte header
    and key cross a line half the time: whole lines from a record's start missed the
    rest, and contains_many ran 20 % slower."""
    b = h & _BUCKET_MASK
    e = index[b * slots + _home(h, slots)]
    if e != 0:
        end = b * ring + ring - 1
        r = b * ring + (e & POS_MASK) - 1
        p = r & ~63
        while p < r + span:
            prefetch(ring8, min(p, end), 0)
            p += 64


@njit(nogil=True, cache=True, _nrt=False)
def apply_entries(meta, index, ring8, ring64, geo, keys8, keys64, hashes, actions,
                  vstarts, vlens, vdata, start, me, spin_limit, counters):
    """Hash and apply entries start.. in order, each under its bucket's lock and seqlock.

    hashes[i] receives each key's xxh64; `counters` is the writer's own row of the
    segment's writer table (layout W_*), counted in place as entries are applied.
    Returns the index of the first entry not applied: n when all were, or an entry
    whose bucket lock stayed held by another owner for spin_limit tries (the caller
    checks that owner's liveness, takes the lock over if it is dead, and calls again
    from there).
    """
    slots, ring, ks, max_live, kst = geo[G_SLOTS], geo[G_RING], geo[G_KEY], geo[G_MAXLIVE], geo[G_KSTRIDE]
    n = hashes.shape[0]
    hash_keys(keys8, keys64, kst, ks, hashes, start)
    for j in range(start, min(n, start + _AHEAD_BUCKET)):
        _prefetch_bucket(meta, index, slots, hashes[j])
    for j in range(start, min(n, start + _AHEAD_RECORD)):
        _prefetch_write(meta, index, ring8, ring64, slots, ring, ks, hashes[j], vlens[j])
    for i in range(start, n):
        if i + _AHEAD_BUCKET < n:
            _prefetch_bucket(meta, index, slots, hashes[i + _AHEAD_BUCKET])
        if i + _AHEAD_RECORD < n:
            _prefetch_write(meta, index, ring8, ring64, slots, ring, ks, hashes[i + _AHEAD_RECORD], vlens[i + _AHEAD_RECORD])
        h = hashes[i]
        b = h & _BUCKET_MASK
        mb = b * ROW_WORDS
        spins = 0
        while True:
            if load_acquire(meta, mb + M_LOCK) == 0 and cas(meta, mb + M_LOCK, 0, me) == 0:
                break
            spins += 1
            if spins >= spin_limit:
                return i
        v = meta[mb + M_VERSION]
        store_release(meta, mb + M_VERSION, v + 1)
        fence_release()
        ibase = b * slots
        rbase = b * ring
        act = actions[i]
        if act == ADD:
            _add(meta, mb, index, ibase, slots, ring8, ring64, rbase, ring, ks, max_live,
                 h, keys8, keys64, i * kst, vdata, vstarts[i], vlens[i])
            counters[W_SETS] += 1
        elif act == DELETE:
            if _delete(meta, mb, index, ibase, slots, ring8, ring64, rbase, ring, ks, h, keys8, keys64, i * kst):
                counters[W_DELETES] += 1
            else:
                counters[W_DELETE_MISSES] += 1
        else:
            counters[W_UNKNOWN] += 1
        store_release(meta, mb + M_VERSION, v + 2)
        store_release(meta, mb + M_LOCK, 0)
    return n


@njit(nogil=True, cache=True, _nrt=False)
def spans_of_offsets(offsets, data_len, max_value, lens):
    """lens[i] = offsets[i + 1] - offsets[i], checking in one pass that offsets rise from
    >= 0 to at most data_len and that no length exceeds max_value. Returns -1 if all is
    well, else the index of the first bad value (-2: the offsets themselves are bad)."""
    n = lens.shape[0]
    if n and (offsets[0] < 0 or offsets[n] > data_len):
        return -2
    for i in range(n):
        ln = offsets[i + 1] - offsets[i]
        if ln < 0:
            return -2
        if ln > max_value:
            return i
        lens[i] = ln
    return -1


@njit(nogil=True, cache=True, _nrt=False)
def repair_bucket(meta, index, ring8, ring64, geo, b):
    """Rebuild bucket b after its lock was taken over from a dead writer, then unlock.

    The caller holds the lock (CAS from the dead owner's word). The version is
    moved to a new odd value first, so a reader that was reading the dead
    writer's bucket as it stood sees the change and retries. The index is
    rebuilt from the ring between tail and head; later records of a key win.
    """
    slots, ring, ks, maxv, max_live = geo[G_SLOTS], geo[G_RING], geo[G_KEY], geo[G_MAXV], geo[G_MAXLIVE]
    mb = b * ROW_WORDS
    v = meta[mb + M_VERSION]
    nv = v + 2 if v & 1 else v + 1
    store_release(meta, mb + M_VERSION, nv)
    fence_release()
    ibase = b * slots
    rbase = b * ring
    index[ibase:ibase + slots] = 0
    head = meta[mb + M_HEAD]
    tail = meta[mb + M_TAIL]
    if tail > head or head - tail > ring:  # never written so by a writer; start the bucket afresh
        tail = head
        meta[mb + M_TAIL] = tail
    live = 0
    live_bytes = 0
    pos = tail
    while pos < head:
        off = pos % ring
        w = (rbase + off) >> 3
        word = ring64[w + 1]
        flags = word >> 32
        vlen = word & _LEN_MASK
        if flags == F_PAD:
            pos += ring - off
            continue
        size = _record_size(ks, vlen)
        if (flags != F_LIVE and flags != F_DEAD) or vlen > maxv or off + size > ring:
            head = pos  # damaged: keep what came before it
            meta[mb + M_HEAD] = head
            break
        if flags == F_LIVE:
            h = ring64[w]
            kp = rbase + off + RECORD_HEADER
            if np.int64(xxh64_span(ring8, kp, ks, np.uint64(0))) != h:
                ring64[w + 1] = (F_DEAD << 32) | vlen
            else:
                found, empty = _find(index, ibase, slots, ring8, ring64, rbase, ring, h, ring8, ring64, kp, ks)
                entry = (_tag(h) << POS_BITS) | (off + 1)
                if found >= 0:
                    old = index[ibase + found]
                    ow = (rbase + (old & POS_MASK) - 1) >> 3
                    olen = ring64[ow + 1] & _LEN_MASK
                    ring64[ow + 1] = (F_DEAD << 32) | olen
                    index[ibase + found] = entry
                    live_bytes += size - _record_size(ks, olen)
                elif live < max_live and empty >= 0:
                    index[ibase + empty] = entry
                    live += 1
                    live_bytes += size
                else:
                    ring64[w + 1] = (F_DEAD << 32) | vlen
        pos += size
    meta[mb + M_LIVE] = live
    meta[mb + M_LIVE_BYTES] = live_bytes
    meta[mb + M_TAKEOVERS] += 1
    store_release(meta, mb + M_VERSION, nv + 1)
    store_release(meta, mb + M_LOCK, 0)


# -- reader side: no locks, shared memory may change under us -------------------------


@njit(nogil=True, cache=True, _nrt=False)
def lookup(meta, index, ring8, ring64, geo, keys8, keys64, hashes, start, found, offsets, out, out_pos,
           want_values, value_guess, static_bucket, static_version, spin_limit, counters):
    """Hash and look keys start.. up; returns (next index, out_pos, DONE | NEED_SPACE | STUCK).

    hashes[i] receives each key's xxh64. found[i] is set per key; with want_values
    the value is copied to out[out_pos:] and offsets[i + 1] is its end.
    value_guess (bytes, e.g. the mean value length seen so far) sizes the prefetch of each record.
    NEED_SPACE: out is too small for key i's value. STUCK: key i's bucket stayed
    odd (mid-write) for spin_limit tries; the caller checks the lock owner and, if
    it is dead, calls again with static_bucket and static_version set, which
    accepts that bucket as it stands while its version does not move.
    counters[0] counts retries after a concurrent write.
    """
    slots, ring, ks, maxv, kst = geo[G_SLOTS], geo[G_RING], geo[G_KEY], geo[G_MAXV], geo[G_KSTRIDE]
    mask = slots - 1
    n = hashes.shape[0]
    span = RECORD_HEADER + ks + (value_guess if want_values else 0)
    hash_keys(keys8, keys64, kst, ks, hashes, start)
    for j in range(start, min(n, start + _AHEAD_BUCKET)):
        _prefetch_bucket(meta, index, slots, hashes[j])
    for j in range(start, min(n, start + _AHEAD_RECORD)):
        _prefetch_record(index, ring8, slots, ring, hashes[j], span)
    for i in range(start, n):
        if i + _AHEAD_BUCKET < n:
            _prefetch_bucket(meta, index, slots, hashes[i + _AHEAD_BUCKET])
        if i + _AHEAD_RECORD < n:
            _prefetch_record(index, ring8, slots, ring, hashes[i + _AHEAD_RECORD], span)
        h = hashes[i]
        b = h & _BUCKET_MASK
        mb = b * ROW_WORDS
        ibase = b * slots
        rbase = b * ring
        tag = _tag(h)
        koff = i * kst
        spins = 0
        while True:
            v1 = load_acquire(meta, mb + M_VERSION)
            if v1 & 1 and not (b == static_bucket and v1 == static_version):
                spins += 1
                if spins >= spin_limit:
                    return i, out_pos, STUCK
                continue
            hit = -1
            vlen = 0
            s = _home(h, slots)
            for _ in range(slots):
                e = index[ibase + s]
                if e == 0:
                    break
                if (e >> POS_BITS) == tag:
                    off = (e & POS_MASK) - 1
                    if 0 <= off and off + RECORD_HEADER + ks <= ring:
                        w = (rbase + off) >> 3
                        word = ring64[w + 1]
                        ln = word & _LEN_MASK
                        if (ring64[w] == h and (word >> 32) == F_LIVE and ln <= maxv
                                and off + RECORD_HEADER + ks + ln <= ring
                                and _key_eq(ring8, ring64, rbase + off + RECORD_HEADER, keys8, keys64, koff, ks)):
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
            counters[0] += 1
            spins += 1
        found[i] = hit >= 0
        if want_values and hit >= 0:
            out_pos += vlen
        offsets[i + 1] = out_pos
    return n, out_pos, DONE
