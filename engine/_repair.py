"""Compiled repair of a bucket: rebuilt from its ring, whatever its bytes hold.

A writer rebuilds a bucket when it meets damage under the bucket's lock (apply_entries
in _kernels.py: an odd version under a free lock, words out of bounds, a slot or
record that does not check out), and when it takes a dead writer's lock over
(repair_bucket). The rules every kernel keeps are in _bucket.py; a rebuild keeps them
on any bytes: every record is checked before use, every loop is bounded by the ring.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from shmcache.engine._bucket import (
    _BUCKET_MASK,
    _LEN_MASK,
    _POS_BAD,
    BAD,
    G_KEY,
    G_MAXLIVE,
    G_MAXV,
    G_RING,
    G_SLOTS,
    _find,
    _mark_dead,
    _record_size,
    _remove_slot,
    _slot_record,
    _tag,
)
from shmcache.engine.xxh64 import xxh64_span
from shmcache.engine.layout import (
    F_DEAD,
    F_LIVE,
    F_PAD,
    M_HEAD,
    M_LIVE,
    M_LIVE_BYTES,
    M_LOCK,
    M_TAIL,
    M_TAKEOVERS,
    M_VERSION,
    POS_BITS,
    RECORD_ALIGN,
    RECORD_HEADER,
    ROW_WORDS,
)
from shmcache.ipc.atomics import fence_release, store_release


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
                _mark_dead(ring64, w)
                found, _ = _find(meta, mb, index, ibase, slots, ring8, ring64, rbase, ring, maxv, ring64[w], ring8,
                                 ring64, rbase + off + RECORD_HEADER, ks)
                if found >= 0:
                    olen = _mark_dead(ring64, _slot_record(index, ibase, rbase, found))
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
                _mark_dead(ring64, w)
            else:
                found, empty = _find(meta, mb, index, ibase, slots, ring8, ring64, rbase, ring, maxv, h, ring8, ring64,
                                     kp, ks)
                entry = (_tag(h) << POS_BITS) | (off + 1)
                if found >= 0:
                    olen = _mark_dead(ring64, _slot_record(index, ibase, rbase, found))
                    index[ibase + found] = entry
                    live_bytes += size - _record_size(ks, olen)
                elif found != BAD and live < max_live and empty >= 0:
                    index[ibase + empty] = entry
                    live += 1
                    live_bytes += size
                else:
                    _mark_dead(ring64, w)
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
