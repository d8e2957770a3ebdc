"""The compiled apply kernel (writers): ADD and DELETE entries, each under its bucket's
lock and seqlock, with eviction of the bucket's oldest record and the software
prefetching that keeps a batch's cache misses in flight.

The rules every kernel keeps, and the bucket helpers apply shares with repair and
lookup, are in _bucket.py; the rebuild of a damaged bucket is in _repair.py, lookup
(readers) in _lookup.py.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from shmcache.engine._bucket import (
    _AHEAD_RUN,
    _BUCKET_MASK,
    _LEN_MASK,
    BAD,
    G_KEY,
    G_KSTRIDE,
    G_MAXLIVE,
    G_MAXV,
    G_RING,
    G_SLOTS,
    _bucket_ok,
    _find,
    _home,
    _mark_dead,
    _prefetch_bucket,
    _prefetch_run_after,
    _record_size,
    _remove_slot,
    _slot_of,
    _slot_record,
    _tag,
    _tagged_entry,
)
from shmcache.engine._intrinsics import copy_bytes, prefetch
from shmcache.engine._repair import _rebuild
from shmcache.engine.xxh64 import hash_keys
from shmcache.engine.layout import (
    ADD,
    DELETE,
    W_CORRUPTIONS,
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
    M_VERSION,
    NBUCKETS,
    POS_BITS,
    POS_MASK,
    RECORD_ALIGN,
    RECORD_HEADER,
    ROW_WORDS,
)
from shmcache.ipc.atomics import cas, fence_release, load_acquire, store_release


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
            _mark_dead(ring64, w)
            meta[mb + M_LIVE] -= 1
            meta[mb + M_LIVE_BYTES] -= size
            meta[mb + M_EVICTIONS] += 1
    meta[mb + M_TAIL] = tail + size
    return 1


@njit(inline="always")
def _add(meta, mb, index, ibase, slots, ring8, ring64, rbase, ring, ks, maxv, max_live,
         h, keys8, keys64, koff, vdata, vstart, vlen):
    """Write the record at the head and point the key's slot at it; False on damage.

    The key's slot is found before the record is written (and _find takes only a record
    between tail and head for the key's): a damaged slot of the key's tag pointing where
    the new record goes (or at an old record behind the tail) would otherwise be taken
    for the key's slot, the new record marked DEAD through it, and the key's real slot,
    further on, left to give readers its older value."""
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
    found, empty = _find(meta, mb, index, ibase, slots, ring8, ring64, rbase, ring, maxv, h, keys8, keys64, koff, ks)
    if found < 0 and empty < 0:  # BAD, or no empty slot (never so in an undamaged bucket: live < max_live < slots)
        return False
    w = (rbase + off) >> 3
    p = rbase + off + RECORD_HEADER
    ring64[w] = h
    copy_bytes(ring8, p, keys8, koff, ks)  # bounds: the record fits in the ring (evicted for above)
    copy_bytes(ring8, p + ks, vdata, vstart, vlen)  # vstart + vlen: checked by the caller (_input)
    ring64[w + 1] = (F_LIVE << 32) | vlen
    meta[mb + M_HEAD] = head + size
    entry = (_tag(h) << POS_BITS) | (off + 1)
    if found >= 0:
        ow = _slot_record(index, ibase, rbase, found)
        index[ibase + found] = entry  # the slot moves before the old record dies: readers find one LIVE
        olen = _mark_dead(ring64, ow)
        meta[mb + M_LIVE_BYTES] += size - _record_size(ks, olen)
    else:
        index[ibase + empty] = entry
        meta[mb + M_LIVE] += 1
        meta[mb + M_LIVE_BYTES] += size
    return True


@njit(inline="always")
def _delete(meta, mb, index, ibase, slots, ring8, ring64, rbase, ring, ks, maxv, h, keys8, keys64, koff):
    """1 deleted, 0 not there, -1 damage met."""
    found, _ = _find(meta, mb, index, ibase, slots, ring8, ring64, rbase, ring, maxv, h, keys8, keys64, koff, ks)
    if found < 0:
        return -1 if found == BAD else 0
    # dead first: a crash before the slot goes cannot resurrect it
    vlen = _mark_dead(ring64, _slot_record(index, ibase, rbase, found))
    if not _remove_slot(index, ibase, slots, ring64, rbase, ring, ks, found):
        return -1
    meta[mb + M_LIVE] -= 1
    meta[mb + M_LIVE_BYTES] -= _record_size(ks, vlen)
    return 1


# Software pipelining (the writers'; lookups keep their own distances in _lookup.py):
# while key i is applied, the record of key i + _AHEAD_RECORD and the bucket of key
# i + _AHEAD_BUCKET are on their way into the cache. A few dozen misses in flight is
# what the core can track; more only queue up (bench/README.md "What bounds a lookup").
# A full cache evicts its oldest record on nearly every add, a chain of three misses (the
# record's header, its index slot, the records after that slot that removing it
# shifts back): the header comes with _AHEAD_RECORD, the slot's line at
# _AHEAD_EVICT, and the run's records at _AHEAD_RUN_STAGE, each stage reading what
# the one before fetched (bench/README.md "A full cache"); a cache whose rings fit in
# the CPU's caches skips them. A DEAD oldest record (replaced or deleted) has no slot,
# and the second and third stages skip it (bench/README.md, "What the bounds checks cost").
_AHEAD_BUCKET = 16
_AHEAD_RECORD = 8
_AHEAD_EVICT = 4
_AHEAD_RUN_STAGE = 2
_STAGED_FROM = 8 << 20  # ring bytes: below, the rings stay in cache and the stages only cost


@njit(inline="always")
def _prefetch_write(meta, index, ring8, ring64, slots, ring, ks, h, vlen):
    """Prefetch, for writing, every line the key's new record will fill (its size is known:
    whole lines from the head would miss the tail of a record), the header and key of
    the record it may replace (the first with its tag: a new key's usually has none),
    and the oldest record (a full ring evicts it first: every add in steady state). Each
    miss left to the write itself stalls it (bench/README.md "What bounds a lookup")."""
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
def _live_tail(meta, ring64, ring, b):
    """The ring64 word of bucket b's oldest record if it is LIVE (only a live record has an
    index slot for an eviction to remove), else -1: a dead or padding record, which the
    eviction stages skip. A hint read without the lock, kept in the bucket's ring whatever
    the tail word says (aligned down to a record's 16 bytes, its header's two words fit)."""
    t = b * ring + (meta[b * ROW_WORDS + M_TAIL] % ring & ~(RECORD_ALIGN - 1))
    return t >> 3 if (ring64[(t >> 3) + 1] >> 32) == F_LIVE else -1


@njit(inline="always")
def _prefetch_evict(meta, index, ring64, slots, ring, h):
    """The second stage for the oldest record (its header was prefetched _AHEAD_RECORD keys
    ago): the index line where its slot is found, the first place an eviction waits on.
    Only for a LIVE record: a dead one (replaced or deleted) has no slot to remove."""
    b = h & _BUCKET_MASK
    w = _live_tail(meta, ring64, ring, b)
    if w >= 0:
        prefetch(index, b * slots + _home(ring64[w], slots), 1)


@njit(inline="always")
def _prefetch_run(meta, index, ring64, slots, ring, ks, h):
    """The third stage (its index line was prefetched _AHEAD_EVICT keys ago): the records of
    the run after the oldest record's slot, which removing that slot reads to shift them."""
    b = h & _BUCKET_MASK
    ibase = b * slots
    rbase = b * ring
    w = _live_tail(meta, ring64, ring, b)
    if w < 0:
        return
    i = _slot_of(index, ibase, slots, ring64[w], w * 8 - rbase, min(slots, 2 * _AHEAD_RUN))
    if i >= 0:  # else its slot lies past the first slots of its probe path: not prefetched
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
        _prefetch_bucket(meta, index, slots, hashes[np.uint64(j)])
    for j in range(start, min(n, start + _AHEAD_RECORD)):
        _prefetch_write(meta, index, ring8, ring64, slots, ring, ks, hashes[np.uint64(j)], vlens[np.uint64(j)])
    for i in range(start, n):
        if i + _AHEAD_BUCKET < n:
            _prefetch_bucket(meta, index, slots, hashes[np.uint64(i + _AHEAD_BUCKET)])
        if i + _AHEAD_RECORD < n:
            _prefetch_write(meta, index, ring8, ring64, slots, ring, ks, hashes[np.uint64(i + _AHEAD_RECORD)], vlens[np.uint64(i + _AHEAD_RECORD)])
        j = i + _AHEAD_EVICT
        if staged and j < n and _evicts(meta, ring, ks, max_live, hashes[np.uint64(j)], vlens[np.uint64(j)]):
            _prefetch_evict(meta, index, ring64, slots, ring, hashes[np.uint64(j)])
        j = i + _AHEAD_RUN_STAGE
        if staged and j < n and _evicts(meta, ring, ks, max_live, hashes[np.uint64(j)], vlens[np.uint64(j)]):
            _prefetch_run(meta, index, ring64, slots, ring, ks, hashes[np.uint64(j)])
        h = hashes[np.uint64(i)]
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
        act = actions[np.uint64(i)]
        for _attempt in range(2):  # damage met mid-entry: rebuild, apply again once, else drop it
            ok = True
            if act == ADD:
                ok = _add(meta, mb, index, ibase, slots, ring8, ring64, rbase, ring, ks, maxv, max_live,
                          h, keys8, keys64, i * kst, vdata, vstarts[np.uint64(i)], vlens[np.uint64(i)])
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

