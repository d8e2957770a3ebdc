"""A bucket's compiled helpers, shared by apply (_kernels.py), repair (_repair.py) and
lookup (_lookup.py): hash to slot and tag, key compare, the probe (_find),
backward-shift removal, the check of a bucket's words, and the prefetches of a key's
bucket and record that the writers' and the readers' pipelines both issue.

Invariants every kernel of the table keeps (layout in layout.py):
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
  _remove_slot) and each record it reclaims (_evict_oldest). A slot's offset must be
  a record's (in the ring, 16-aligned: _slot_off_bad), and the key's record _find
  returns must lie between tail and head (_live_at): else a damaged slot elsewhere,
  taken for the key's slot, would make a set mark its own new record DEAD and leave
  the key's older one to the readers. A failed check is a
  corruption: counted in the writer's row (W_CORRUPTIONS), the bucket is rebuilt
  from its ring (_rebuild, safe on any bytes), and the entry applied again, once;
  damage met again (another process scribbling meanwhile) drops the entry.
- Every loop is bounded by the geometry (slots, ring bytes), never by a word read
  from shared memory; a lock spin returns to the caller after spin_limit tries.
- Readers never write (see _lookup.py for the reader's side of these rules).

Array subscripts in the hot loops (apply's and lookup's per-key path, the probe) are
cast to unsigned, `index[np.uint64(ibase + s)]`: numba then skips its fix-up for
negative indices (a shift, an and and an add per load, and a register each;
bench/test_instructions.py counts them). Only values already known to be >= 0 are
cast (a negative one would index far outside the array).

The kernels are compiled without numba's reference counting (`_nrt=False`): they
allocate nothing, and with it every inlined helper taking arrays pays an atomic
incref/decref pair per array per call (8 per key in the key compare alone).

Arrays are 1-d views of the segment: meta/index/ring64 int64, ring8 uint8.
`geo` = [slots, ring bytes, key size, max value, max live entries, key stride].
Keys come as one flat uint8 array and an int64 view of the same memory, rows
`key stride` (key size rounded up to 8) bytes apart, so keys compare a word at a
time. Hashes are passed as int64 (the bits of the uint64 xxh64).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from shmcache.engine import layout as L
from shmcache.engine._intrinsics import prefetch
from shmcache.engine.layout import (
    BUCKET_BITS,
    F_DEAD,
    F_LIVE,
    M_HEAD,
    M_LIVE,
    M_LIVE_BYTES,
    M_TAIL,
    NBUCKETS,
    POS_BITS,
    POS_MASK,
    RECORD_ALIGN,
    RECORD_HEADER,
    ROW_WORDS,
    TAG_SHIFT,
)

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


# -- writer side: the caller holds the bucket lock; the bytes are still untrusted -------
# Every helper that reads a position or length from the bucket checks it first and
# returns a failure (BAD, False, -1) instead of using it; apply_entries then counts a
# corruption, rebuilds the bucket from its ring (_rebuild) and applies the entry again.

BAD = -2  # _find: a slot or record on the key's probe path is damaged


@njit(inline="always")
def _slot_off_bad(off, lim):
    """True if an index slot's ring offset, (entry & POS_MASK) - 1, is no record's: past
    lim (the last offset a record header and key fit from; negative ones too) or not
    16-aligned. An unaligned offset read its record through the words it truncates to:
    the hash and key of the record there matched while its length and value were read
    from the wrong bytes. One unsigned compare and one mask, no branch between them."""
    return (np.uint64(off) > lim) | ((off & (RECORD_ALIGN - 1)) != 0)


@njit(inline="always")
def _slot_record(index, ibase, rbase, s):
    """The ring64 word of the record that slot s points at (an offset _find has checked)."""
    return (rbase + (index[ibase + s] & POS_MASK) - 1) >> 3


@njit(inline="always")
def _mark_dead(ring64, w):
    """Flag the record at ring64 word w DEAD, keeping its length; returns that length."""
    vlen = ring64[w + 1] & _LEN_MASK
    ring64[w + 1] = (F_DEAD << 32) | vlen
    return vlen


@njit(inline="always")
def _live_at(meta, mb, ring, off):
    """The ring offset lies between the bucket's tail and head, where its live records are
    (head and tail checked at lock). Space behind the tail holds old records, some of them
    LIVE-flagged by damage, and the head's next record is written there."""
    tail = meta[mb + M_TAIL]
    d = off - tail % ring
    if d < 0:
        d += ring
    return d < meta[mb + M_HEAD] - tail


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
def _find(meta, mb, index, ibase, slots, ring8, ring64, rbase, ring, maxv, h, keys8, keys64, koff, ks):
    """(slot holding the key or -1, first empty slot on its probe path or -1); (BAD, -1) if a
    slot of the key's tag has no record's offset, or its record is not a whole LIVE one, or
    the key's record found lies outside the live records (_live_at: a damaged slot's,
    which a set or delete must not take for the key's; the key's real slot may follow)."""
    mask = slots - 1
    lim = np.uint64(ring - RECORD_HEADER - ks)  # >= 0: the geometry holds a largest record
    i = _home(h, slots)
    tag = _tag(h)
    for _ in range(slots):
        e = index[np.uint64(ibase + i)]
        if e == 0:
            return -1, i
        if (e >> POS_BITS) == tag:
            off = (e & POS_MASK) - 1
            if _slot_off_bad(off, lim):
                return BAD, -1
            w = (rbase + off) >> 3
            if ring64[np.uint64(w)] == h:
                word = ring64[np.uint64(w + 1)]
                ln = word & _LEN_MASK
                if (word >> 32) != F_LIVE or ln > maxv or off + _record_size(ks, ln) > ring:
                    return BAD, -1
                if _key_eq(ring8, ring64, rbase + off + RECORD_HEADER, keys8, keys64, koff, ks):
                    return (i, -1) if _live_at(meta, mb, ring, off) else (BAD, -1)
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
        if _slot_off_bad(off, lim):
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


# -- prefetching, shared by the writers' and the readers' software pipelines ----------------

_PROBE_AHEAD = 16  # slots a record prefetch follows from the key's home slot


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
        e = index[np.uint64(ibase + s)]
        if e == 0 or (e >> POS_BITS) == tag:
            return e
        s = (s + 1) & mask
    return 0
