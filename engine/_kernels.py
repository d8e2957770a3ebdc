"""Compiled table kernels: apply (writers) and repair; lookup (readers) is in _lookup.py.

Invariants these kernels keep (layout in layout.py):
- A bucket changes only under its lock, between an odd and the next even seqlock
  version; readers retry when the version was odd or moved. A writer takes the lock,
  then makes the version odd; makes it even, then unlocks. So an odd version under a
  free lock is damage: the writer that next takes the lock counts it and rebuilds.
- Every state a writer killed at any instruction can leave is still readable
  without tearing, so readers can read a dead writer's bucket before anyone
  repairs it: a record is complete before the head passes it and before a slot
  points at it; a record is marked DEAD before its slot is removed; a slot is
  removed before the tail passes its record, and ring space is reused only
  behind the tail. An interrupted backward shift leaves a duplicate slot, never
  a hole.
- The segment's bytes are untrusted, for writers too (a file in a world-writable
  directory): every position, length and count read from shared memory is checked
  against the bucket's bounds before it indexes anything, reads and writes alike.
  numba does not check bounds, so these checks are all that stands between a damaged
  byte and a segfault. Under the lock a writer checks the bucket's head, tail and
  counts (_bucket_ok) and, on its way, each index slot it follows (_find,
  _remove_slot) and each record it reclaims (_evict_oldest). A failed check is a
  corruption: counted in the writer's row (W_CORRUPTIONS), the bucket is rebuilt
  from its ring (_rebuild, safe on any bytes), and the entry applied again, once;
  damage met again (another process scribbling meanwhile) drops the entry.
- Every loop is bounded by the geometry (slots, ring bytes), never by a word read
  from shared memory; a lock spin returns to the caller after spin_limit tries.
- Readers never write (see _lookup.py for the reader's side of these rules).

This file is longer than the package's others on purpose: apply, evict, remove and
rebuild share the bucket helpers and every rule above; split, each half would have to
restate them and keep them in step.

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

from shmcache.engine._prefetch import prefetch
from shmcache.engine import layout as L
from shmcache.engine._xxh64 import hash_keys, xxh64_span
from shmcache.engine.layout import (
    BUCKET_BITS,
    W_DELETE_MISSES,
    W_DELETES,
    W_SETS,
    W_UNKNOWN,
    W_CORRUPTIONS,
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
from shmcache.ipc.atomics import cas, fence_release, load_acquire, store_release

ADD = 0
DELETE = 1

G_SLOTS, G_RING, G_KEY, G_MAXV, G_MAXLIVE, G_KSTRIDE = 0, 1, 2, 3, 4, 5


_BUCKET_MASK = NBUCKETS - 1
_AHEAD_RUN = 16  # records of a run after a removed slot prefetched together (a full bucket's runs: ~8)
_LEN_MASK = 0xFFFFFFFF
# head and tail: bits that no writer sets (sign, >= 2**62, below 16-byte alignment)
_POS_BAD = -(1 << 62) | (RECORD_ALIGN - 1)


@njit(inline="always")
def _home(h, slots):
    return (h >> BUCKET_BITS) & (slots - 1)


@njit(inline="always")
def _tag(h):
    return (h >> TAG_SHIFT) & 0xFFFF


_record_size = njit(inline="always")(L.record_size)  # the layout's own formula, compiled


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


# -- writer side: the caller holds the bucket lock; the bytes are still untrusted -------
# Every helper that reads a position or length from the bucket checks it first and
# returns a failure (BAD, False, -1) instead of using it; apply_entries then counts a
# corruption, rebuilds the bucket from its ring (_rebuild) and applies the entry again.

BAD = -2  # _find: a slot or record on the key's probe path is damaged


@njit(inline="always")
def _bucket_ok(meta, mb, ring, max_live):
    """The bucket's head, tail and counts are a state a writer can leave: 0 <= tail <= head
    < 2**62, both 16-aligned, head - tail <= ring, 0 <= live <= max_live, 0 <= live
    bytes <= ring. Unsigned compares: one per word, on words the lock already loaded."""
    head = meta[mb + M_HEAD]
    tail = meta[mb + M_TAIL]
    # non-short-circuit: one branch on the lot (the words share the meta row's cache line)
    return not (((head | tail) & _POS_BAD) != 0) | (np.uint64(head - tail) > np.uint64(ring)) \
        | (np.uint64(meta[mb + M_LIVE]) > np.uint64(max_live)) | (np.uint64(meta[mb + M_LIVE_BYTES]) > np.uint64(ring))


@njit(inline="always")
def _find(index, ibase, slots, ring8, ring64, rbase, ring, maxv, h, keys8, keys64, koff, ks):
    """(slot holding the key or -1, first empty slot on its probe path or -1); (BAD, -1) if a
    slot of the key's tag points outside the ring, or its record is not a whole LIVE one."""
    mask = slots - 1
    lim = np.uint64(ring - RECORD_HEADER - ks)  # >= 0: the geometry holds a largest record
    i = _home(h, slots)
    tag = _tag(h)
    for _ in range(slots):
        e = index[ibase + i]
        if e == 0:
            return -1, i
        if (e >> POS_BITS) == tag:
            off = (e & POS_MASK) - 1
            if np.uint64(off) > lim:  # also off < 0
                return BAD, -1
            w = (rbase + off) >> 3
            if ring64[w] == h:
                word = ring64[w + 1]
                ln = word & _LEN_MASK
                if (word >> 32) != F_LIVE or ln > maxv or off + _record_size(ks, ln) > ring:
                    return BAD, -1
                if _key_eq(ring8, ring64, rbase + off + RECORD_HEADER, keys8, keys64, koff, ks):
                    return i, -1
        i = (i + 1) & mask
    return -1, -1


@njit(inline="always")
def _prefetch_run_after(index, ibase, slots, ring64, rbase, ring, ks, i):
    """Prefetch the records of the run of slots after slot i (up to _AHEAD_RUN of them):
    removing slot i reads each one's hash to see whether it shifts back."""
    last = ring - RECORD_HEADER - ks
    mask = slots - 1
    for _ in range(min(slots - 1, _AHEAD_RUN)):
        i = (i + 1) & mask
        e = index[ibase + i]
        if e == 0:
            return
        off = (e & POS_MASK) - 1
        prefetch(ring64, (rbase + (off if 0 <= off <= last else last)) >> 3, 0)


@njit(inline="always")
def _remove_slot(index, ibase, slots, ring64, rbase, ring, ks, i):
    """Backward-shift deletion (linear probing needs no tombstones). False if a slot on the
    way points outside the ring or no slot is empty (damage: the caller rebuilds)."""
    mask = slots - 1
    lim = np.uint64(ring - RECORD_HEADER - ks)
    _prefetch_run_after(index, ibase, slots, ring64, rbase, ring, ks, i)  # fetched at once, not one by one
    j = i
    for _ in range(slots - 1):
        j = (j + 1) & mask
        e = index[ibase + j]
        if e == 0:
            index[ibase + i] = 0
            return True
        off = (e & POS_MASK) - 1
        if np.uint64(off) > lim:
            return False
        k = _home(ring64[(rbase + off) >> 3], slots)
        if (i < k <= j) if i <= j else (i < k or k <= j):
            continue  # its home lies in (i, j]: it stays reachable where it is
        index[ibase + i] = e  # copy first: until i is cleared or reused, e sits twice, never nowhere
        i = j
    return False


@njit(inline="always")
def _slot_of(index, ibase, slots, h, off, limit):
    """The slot, among the first `limit` of hash h's probe path, whose entry points at ring
    offset `off`; -1 if none (an empty slot ends the path)."""
    mask = slots - 1
    i = _home(h, slots)
    for _ in range(limit):
        e = index[ibase + i]
        if e == 0:
            return -1
        if (e & POS_MASK) - 1 == off:
            return i
        i = (i + 1) & mask
    return -1


@njit(inline="always")
def _evict_oldest(meta, mb, index, ibase, slots, ring64, rbase, ring, ks, maxv):
    """Reclaim the record at the tail; count it if it was live. 1 done, 0 the ring is
    empty, -1 the record at the tail is damaged."""
    tail = meta[mb + M_TAIL]
    if tail >= meta[mb + M_HEAD]:
        return 0
    off = tail % ring  # 16-aligned (checked at lock): the header lies in the ring
    w = (rbase + off) >> 3
    word = ring64[w + 1]
    flags = word >> 32
    if flags == F_PAD:
        size = ring - off
    else:
        vlen = word & _LEN_MASK
        size = _record_size(ks, vlen)
        if vlen > maxv or off + size > ring or (flags != F_LIVE and flags != F_DEAD):
            return -1
        if flags == F_LIVE:
            i = _slot_of(index, ibase, slots, ring64[w], off, slots)
            if i >= 0 and not _remove_slot(index, ibase, slots, ring64, rbase, ring, ks, i):
                return -1
            ring64[w + 1] = (F_DEAD << 32) | vlen
            meta[mb + M_LIVE] -= 1
            meta[mb + M_LIVE_BYTES] -= size
            meta[mb + M_EVICTIONS] += 1
    meta[mb + M_TAIL] = tail + size
    return 1


@njit(inline="always")
def _add(meta, mb, index, ibase, slots, ring8, ring64, rbase, ring, ks, maxv, max_live,
         h, keys8, keys64, koff, vdata, vstart, vlen):
    """Write the record at the head and point the key's slot at it; False on damage."""
    size = _record_size(ks, vlen)  # <= ring: vlen <= max value (checked by the caller)
    head = meta[mb + M_HEAD]
    off = head % ring
    if ring - off < size:  # no wrapping records: pad to the ring end and start over at 0
        pad = ring - off
        while head + pad - meta[mb + M_TAIL] > ring:
            r = _evict_oldest(meta, mb, index, ibase, slots, ring64, rbase, ring, ks, maxv)
            if r <= 0:
                if r < 0:
                    return False
                break
        ring64[((rbase + off) >> 3) + 1] = F_PAD << 32
        head += pad
        meta[mb + M_HEAD] = head
        off = 0
    while head + size - meta[mb + M_TAIL] > ring or meta[mb + M_LIVE] >= max_live:
        r = _evict_oldest(meta, mb, index, ibase, slots, ring64, rbase, ring, ks, maxv)
        if r <= 0:
            if r < 0:
                return False
            break
    w = (rbase + off) >> 3
    p = rbase + off + RECORD_HEADER
    ring64[w] = h
    _copy(ring8, p, keys8, koff, ks)
    _copy(ring8, p + ks, vdata, vstart, vlen)
    ring64[w + 1] = (F_LIVE << 32) | vlen
    meta[mb + M_HEAD] = head + size
    entry = (_tag(h) << POS_BITS) | (off + 1)
    found, empty = _find(index, ibase, slots, ring8, ring64, rbase, ring, maxv, h, keys8, keys64, koff, ks)
    if found >= 0:
        old = index[ibase + found]
        ow = (rbase + (old & POS_MASK) - 1) >> 3
        olen = ring64[ow + 1] & _LEN_MASK
        index[ibase + found] = entry
        ring64[ow + 1] = (F_DEAD << 32) | olen
        meta[mb + M_LIVE_BYTES] += size - _record_size(ks, olen)
    elif empty >= 0:  # always so in an undamaged bucket: live < max_live < slots
        index[ibase + empty] = entry
        meta[mb + M_LIVE] += 1
        meta[mb + M_LIVE_BYTES] += size
    else:
        return False
    return True


@njit(inline="always")
def _delete(meta, mb, index, ibase, slots, ring8, ring64, rbase, ring, ks, maxv, h, keys8, keys64, koff):
    """1 deleted, 0 not there, -1 damage met."""
    found, _ = _find(index, ibase, slots, ring8, ring64, rbase, ring, maxv, h, keys8, keys64, koff, ks)
    if found < 0:
        return -1 if found == BAD else 0
    w = (rbase + (index[ibase + found] & POS_MASK) - 1) >> 3
    vlen = ring64[w + 1] & _LEN_MASK
    ring64[w + 1] = (F_DEAD << 32) | vlen  # dead first: a crash before the slot goes cannot resurrect it
    if not _remove_slot(index, ibase, slots, ring64, rbase, ring, ks, found):
        return -1
    meta[mb + M_LIVE] -= 1
    meta[mb + M_LIVE_BYTES] -= _record_size(ks, vlen)
    return 1


# Software pipelining: while key i is looked up, the record of key i + _AHEAD_RECORD
# and the bucket of key i + _AHEAD_BUCKET are on their way into the cache. A few
# dozen misses in flight is what the core can track; more only queue up. A full
# cache evicts its oldest record on nearly every add, a chain of three misses (the
# record's header, its index slot, the records after that slot that removing it
# shifts back): the header comes with _AHEAD_RECORD, the slot's line at
# _AHEAD_EVICT, and the run's records at _AHEAD_RUN_STAGE, each stage reading what
# the one before fetched. Steady state cost ~1.5x the time per add without them at 1M
# entries (bench/test_full_cache.py); a cache whose rings fit in the CPU's caches
# skips them.
_AHEAD_BUCKET = 16
_AHEAD_RECORD = 8
_AHEAD_EVICT = 4
_AHEAD_RUN_STAGE = 2
_PROBE_AHEAD = 16  # slots a record prefetch follows from the key's home slot
_STAGED_FROM = 8 << 20  # ring bytes: below, the rings stay in cache and the stages only cost (~13 % at 4 MiB)


@njit(inline="always")
def _prefetch_bucket(meta, index, slots, h):
    b = h & _BUCKET_MASK
    prefetch(meta, b * ROW_WORDS, 0)
    prefetch(index, b * slots + _home(h, slots), 0)


@njit(inline="always")
def _tagged_entry(index, ibase, slots, h):
    """For prefetching: the first slot on the key's probe path (up to _PROBE_AHEAD slots)
    that carries its tag, else 0. In a full bucket (3/4 of its slots used) a key sits
    past its home slot about half the time: the home slot's record is someone else's."""
    mask = slots - 1
    tag = _tag(h)
    s = _home(h, slots)
    for _ in range(min(slots, _PROBE_AHEAD)):
        e = index[ibase + s]
        if e == 0 or (e >> POS_BITS) == tag:
            return e
        s = (s + 1) & mask
    return 0


@njit(inline="always")
def _prefetch_write(meta, index, ring8, ring64, slots, ring, ks, h, vlen):
    """Prefetch, for writing, every line the key's new record will fill (its size is known:
    whole lines from the head missed the tail of a record 25 % of the time), the header
    and key of the record it may replace (the first with its tag: a new key's usually
    has none), and the oldest record (a full ring evicts it
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
    e = _tagged_entry(index, b * slots, slots, h)
    if e != 0:
        r = base + (e & POS_MASK) - 1
        prefetch(ring8, min(r, end), 1)
        prefetch(ring8, min(r + RECORD_HEADER + ks - 1, end), 1)
    prefetch(ring8, base + meta[b * ROW_WORDS + M_TAIL] % ring, 1)


@njit(inline="always")
def _evicts(meta, ring, ks, max_live, h, vlen):
    """Adding this key's record would likely evict the bucket's oldest (a hint from words
    read without the lock: steady state in a full cache, rare while it fills)."""
    mb = (h & _BUCKET_MASK) * ROW_WORDS
    return (meta[mb + M_LIVE] >= max_live - 1
            or meta[mb + M_HEAD] - meta[mb + M_TAIL] + 2 * _record_size(ks, vlen) > ring)


@njit(inline="always")
def _prefetch_evict(meta, index, ring64, slots, ring, h):
    """The second stage for the oldest record (its header was prefetched _AHEAD_RECORD keys
    ago): the index line where its slot is found, the first place an eviction waits on."""
    b = h & _BUCKET_MASK
    t = b * ring + meta[b * ROW_WORDS + M_TAIL] % ring  # in the bucket's ring whatever the word says
    prefetch(index, b * slots + _home(ring64[t >> 3], slots), 1)


@njit(inline="always")
def _prefetch_run(meta, index, ring64, slots, ring, ks, h):
    """The third stage (its index line was prefetched _AHEAD_EVICT keys ago): the records of
    the run after the oldest record's slot, which removing that slot reads to shift them."""
    b = h & _BUCKET_MASK
    ibase = b * slots
    rbase = b * ring
    toff = meta[b * ROW_WORDS + M_TAIL] % ring
    i = _slot_of(index, ibase, slots, ring64[(rbase + toff) >> 3], toff, min(slots, 2 * _AHEAD_RUN))
    if i >= 0:  # else not in the index (a dead or padding record): nothing to remove
        _prefetch_run_after(index, ibase, slots, ring64, rbase, ring, ks, i)


@njit(nogil=True, cache=True, _nrt=False)
def apply_entries(meta, index, ring8, ring64, geo, keys8, keys64, hashes, hashed, actions,
                  vstarts, vlens, vdata, start, me, spin_limit, counters):
    """Hash and apply entries start.. in order, each under its bucket's lock and seqlock.

    hashes[i] receives each key's xxh64, unless `hashed` says the caller filled them in
    already (a wire v2 batch's verified hashes; they are trusted); `counters` is the writer's own row of the
    segment's writer table (layout W_*), counted in place as entries are applied.
    Returns the index of the first entry not applied: n when all were, or an entry
    whose bucket lock stayed held by another owner for spin_limit tries (the caller
    checks that owner's liveness, takes the lock over if it is dead, and calls again
    from there).
    """
    slots, ring, ks, maxv, max_live = geo[G_SLOTS], geo[G_RING], geo[G_KEY], geo[G_MAXV], geo[G_MAXLIVE]
    kst = geo[G_KSTRIDE]
    n = hashes.shape[0]
    staged = NBUCKETS * ring > _STAGED_FROM
    if not hashed:
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
        j = i + _AHEAD_EVICT
        if staged and j < n and _evicts(meta, ring, ks, max_live, hashes[j], vlens[j]):
            _prefetch_evict(meta, index, ring64, slots, ring, hashes[j])
        j = i + _AHEAD_RUN_STAGE
        if staged and j < n and _evicts(meta, ring, ks, max_live, hashes[j], vlens[j]):
            _prefetch_run(meta, index, ring64, slots, ring, ks, hashes[j])
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
        odd = v + 2 if v & 1 else v + 1  # odd under a free lock: damage, made to move on
        store_release(meta, mb + M_VERSION, odd)
        fence_release()
        if v & 1 or not _bucket_ok(meta, mb, ring, max_live):
            counters[W_CORRUPTIONS] += 1
            _rebuild(meta, index, ring8, ring64, slots, ring, ks, maxv, max_live, b)
        ibase = b * slots
        rbase = b * ring
        act = actions[i]
        for _attempt in range(2):  # damage met mid-entry: rebuild, apply again once, else drop it
            ok = True
            if act == ADD:
                ok = _add(meta, mb, index, ibase, slots, ring8, ring64, rbase, ring, ks, maxv, max_live,
                          h, keys8, keys64, i * kst, vdata, vstarts[i], vlens[i])
                if ok:
                    counters[W_SETS] += 1
            elif act == DELETE:
                r = _delete(meta, mb, index, ibase, slots, ring8, ring64, rbase, ring, ks, maxv, h, keys8, keys64,
                            i * kst)
                ok = r >= 0
                if r > 0:
                    counters[W_DELETES] += 1
                elif r == 0:
                    counters[W_DELETE_MISSES] += 1
            else:
                counters[W_UNKNOWN] += 1
            if ok:
                break
            counters[W_CORRUPTIONS] += 1
            _rebuild(meta, index, ring8, ring64, slots, ring, ks, maxv, max_live, b)
        store_release(meta, mb + M_VERSION, odd + 1)
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


@njit(nogil=True, cache=True, _nrt=False)  # not inlined: a cold path, kept out of apply's loop
def _rebuild(meta, index, ring8, ring64, slots, ring, ks, maxv, max_live, b):
    """Rebuild bucket b's index and counts from its ring, whatever its bytes hold.

    The caller holds the lock and has made the version odd. Head and tail that no
    writer could have left restart the bucket empty; the ring is walked from tail to
    head, each record checked before use (flags, length, extent, its key's xxh64 and
    bucket). A damaged record with no whole LIVE record after it (what a writer killed
    mid-write leaves, or a head moved forward) ends the walk: the head is set there and
    what came before it stays. One with a whole LIVE record after it is damage in the
    middle: everything before it is dropped (the tail moves to that record), since a
    record there may be an older value of a key whose newer record was lost or lies after
    it, and a reader must never get an older value than one already written; the walk
    goes on from there. A record whose flags alone are damaged (its key and length check
    out, and a whole record starts where it ends) costs only its own key's records.
    Later records of a key win; LIVE records that do not check out become DEAD."""
    mb = b * ROW_WORDS
    ibase = b * slots
    rbase = b * ring
    _clear_index(index, ibase, slots)
    head = meta[mb + M_HEAD]
    tail = meta[mb + M_TAIL]
    if head & _POS_BAD:
        head = tail if (tail & _POS_BAD) == 0 else 0
    if tail & _POS_BAD or tail > head or head - tail > ring:
        tail = head
    meta[mb + M_HEAD] = head
    meta[mb + M_TAIL] = tail
    live = 0
    live_bytes = 0
    pos = tail
    while pos < head:  # at most ring / 16 records: each is >= 16 bytes
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
            nxt = _next_live(ring8, ring64, rbase, ring, ks, maxv, b, pos + RECORD_ALIGN, head)
            if nxt < 0:  # no whole LIVE record after it: a writer killed mid-write, a head moved on
                head = pos  # keep what came before it: its key's older record is still the current one
                meta[mb + M_HEAD] = head
                break
            if (vlen <= maxv and off + size <= ring and pos + size < head
                    and _key_checks(ring8, ring64[w], rbase + off + RECORD_HEADER, ks, b)
                    and _whole_at(ring8, ring64, rbase, ring, ks, maxv, b, pos + size, False)):
                # only its flags are damaged: its key and length check out, and a whole record
                # starts where its length ends. It is that key's record, live or not: the key's
                # older records are dropped with it, and nothing else.
                ring64[w + 1] = (F_DEAD << 32) | vlen
                found, _ = _find(index, ibase, slots, ring8, ring64, rbase, ring, maxv, ring64[w], ring8, ring64,
                                 rbase + off + RECORD_HEADER, ks)
                if found >= 0:
                    ow = (rbase + (index[ibase + found] & POS_MASK) - 1) >> 3
                    olen = ring64[ow + 1] & _LEN_MASK
                    ring64[ow + 1] = (F_DEAD << 32) | olen
                    _remove_slot(index, ibase, slots, ring64, rbase, ring, ks, found)
                    live -= 1
                    live_bytes -= _record_size(ks, olen)
                pos += size
                continue
            # a whole LIVE record after it: damage in the middle. The records before it may be
            # older values of keys whose newest record it was, or orphans a damaged index left
            # LIVE (their newer records follow): none of them can be proven current. Drop them
            # all (the tail moves past the damage) and go on from that record.
            _clear_index(index, ibase, slots)
            live = 0
            live_bytes = 0
            tail = nxt
            meta[mb + M_TAIL] = tail
            pos = nxt
            continue
        if flags == F_LIVE:
            h = ring64[w]
            kp = rbase + off + RECORD_HEADER
            if not _key_checks(ring8, h, kp, ks, b):
                ring64[w + 1] = (F_DEAD << 32) | vlen
            else:
                found, empty = _find(index, ibase, slots, ring8, ring64, rbase, ring, maxv, h, ring8, ring64, kp, ks)
                entry = (_tag(h) << POS_BITS) | (off + 1)
                if found >= 0:
                    old = index[ibase + found]
                    ow = (rbase + (old & POS_MASK) - 1) >> 3
                    olen = ring64[ow + 1] & _LEN_MASK
                    ring64[ow + 1] = (F_DEAD << 32) | olen
                    index[ibase + found] = entry
                    live_bytes += size - _record_size(ks, olen)
                elif found != BAD and live < max_live and empty >= 0:
                    index[ibase + empty] = entry
                    live += 1
                    live_bytes += size
                else:
                    ring64[w + 1] = (F_DEAD << 32) | vlen
        pos += size
    meta[mb + M_LIVE] = live
    meta[mb + M_LIVE_BYTES] = live_bytes


@njit(inline="always")
def _clear_index(index, ibase, slots):
    for s in range(slots):
        index[ibase + s] = 0


@njit(inline="always")
def _key_checks(ring8, h, kp, ks, b):
    """True if a record's stored hash h is in bucket b and is its key's (at kp) xxh64."""
    return (h & _BUCKET_MASK) == b and np.int64(xxh64_span(ring8, kp, ks, np.uint64(0))) == h


@njit(inline="always")
def _next_live(ring8, ring64, rbase, ring, ks, maxv, b, pos, head):
    """The position of the first LIVE record from pos (16-aligned, < head) that checks out
    whole (its length and extent in bounds, its hash in bucket b and equal to its key's
    xxh64); -1 if none. At most (head - pos) / 16 steps. Only a LIVE record can hold a
    newer value than one before it: DEAD ones after a damaged record (a head moved
    forward onto an older lap) leave what came before it current."""
    while pos < head:
        if _whole_at(ring8, ring64, rbase, ring, ks, maxv, b, pos, True):
            return pos
        pos += RECORD_ALIGN
    return -1


@njit(inline="always")
def _whole_at(ring8, ring64, rbase, ring, ks, maxv, b, pos, live_only):
    """A whole record starts at pos: flagged LIVE (or DEAD, unless live_only), its length
    and extent in bounds, its hash in bucket b and equal to its key's xxh64."""
    off = pos % ring
    if off + RECORD_HEADER + ks > ring:
        return False
    w = (rbase + off) >> 3
    word = ring64[w + 1]
    flags = word >> 32
    vlen = word & _LEN_MASK
    return ((flags == F_LIVE or (flags == F_DEAD and not live_only)) and vlen <= maxv
            and off + _record_size(ks, vlen) <= ring and _key_checks(ring8, ring64[w], rbase + off + RECORD_HEADER, ks, b))


@njit(nogil=True, cache=True, _nrt=False)
def repair_bucket(meta, index, ring8, ring64, geo, b):
    """Rebuild bucket b after its lock was taken over from a dead writer, then unlock.

    The caller holds the lock (CAS from the dead owner's word). The version is
    moved to a new odd value first, so a reader that was reading the dead
    writer's bucket as it stood sees the change and retries.
    """
    mb = b * ROW_WORDS
    v = meta[mb + M_VERSION]
    nv = v + 2 if v & 1 else v + 1
    store_release(meta, mb + M_VERSION, nv)
    fence_release()
    _rebuild(meta, index, ring8, ring64, geo[G_SLOTS], geo[G_RING], geo[G_KEY], geo[G_MAXV], geo[G_MAXLIVE], b)
    meta[mb + M_TAKEOVERS] += 1
    store_release(meta, mb + M_VERSION, nv + 1)
    store_release(meta, mb + M_LOCK, 0)
