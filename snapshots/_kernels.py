"""Compiled kernels of snapshots (snapshots/writing.py, restoring.py): copy buckets out of a live
segment, copy them into a new one, and list a copied bucket's live records.

Invariants:
- Copying out is a reader's job: no lock is taken and no writer waits for it. A
  bucket is copied between two acquire loads of its seqlock version; the copy is
  kept only if the version was even and had not moved, else it is taken again
  (at most `spin_limit` tries, then the kernel hands the bucket back to Python,
  which yields and calls again, or copies a bucket a dead writer left mid-write as
  it stands, `force`). So a copied bucket is one state a writer left, never torn,
  and a writer is never held, not even for the one bucket being copied.
- Only the live part of a ring is copied: the bytes from its tail to its head (two
  pieces when they wrap). Head, tail and counts read from the segment are checked
  against the geometry before they index anything (the segment is untrusted); a
  bucket whose words no writer could leave is copied empty and counted.
- Copying in is a writer's job on a segment the restorer just created: each bucket
  under its lock, between an odd and the next even version, so a reader that
  attached early retries rather than read half a bucket.
- Every loop is bounded by the geometry, never by a word read from memory.

A copied chunk of `nb` buckets is four arrays: meta rows (nb * ROW_WORDS int64),
index slots (nb * slots int64), ring span lengths (nb int64, each head - tail) and
the spans back to back (uint8), each span starting at its tail's ring offset.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from shmcache.engine.layout import F_LIVE, F_PAD, M_HEAD, M_LOCK, M_TAIL, M_VERSION, RECORD_ALIGN, RECORD_HEADER, ROW_WORDS
from shmcache.ipc.atomics import cas, fence_acquire, load_acquire, store_release

_LEN_MASK = 0xFFFFFFFF


@njit(inline="always")
def _copy(dst, d, src, s, n):
    """dst[d:d + n] = src[s:s + n]: bucket-sized spans (a ring, an index row), which vectorise."""
    # an explicit loop (numba's slice assignment checks overlap and may copy twice), with
    # unsigned indices (no negative-index fix-up per byte, which stops it vectorising)
    ud = np.uint64(d)
    us = np.uint64(s)
    for j in range(np.uint64(n)):
        dst[ud + j] = src[us + j]


@njit(nogil=True, cache=True, _nrt=False)
def copy_out(meta, index, ring8, slots, ring, b0, i0, nb, pos, out_meta, out_index, out_lens, out_ring, spin_limit,
             force, counts):
    """Copy buckets b0 + i0 .. b0 + nb - 1 into the out arrays (at row i - b0, ring bytes
    from `pos`), each consistently; returns the row reached (< nb when that bucket kept
    changing: call again from there, with pos advanced by the lengths copied).
    `force` = a bucket number to copy as it stands whatever its version. counts[0] +=
    retries, counts[1] += buckets whose words were damaged (copied empty)."""
    for i in range(i0, nb):
        b = b0 + i
        mb = b * ROW_WORDS
        ok = False
        for _ in range(spin_limit):
            v1 = load_acquire(meta, mb + M_VERSION)
            if v1 & 1 and b != force:
                counts[0] += 1
                continue
            for w in range(ROW_WORDS):
                out_meta[i * ROW_WORDS + w] = meta[mb + w]
            head = out_meta[i * ROW_WORDS + M_HEAD]
            tail = out_meta[i * ROW_WORDS + M_TAIL]
            n = head - tail
            damaged = tail < 0 or n < 0 or n > ring or tail % RECORD_ALIGN != 0 or head % RECORD_ALIGN != 0
            if damaged:
                n = 0
            _copy(out_index, i * slots, index, b * slots, slots)
            t = tail % ring if not damaged else 0
            first = min(n, ring - t)
            _copy(out_ring, pos, ring8, b * ring + t, first)
            _copy(out_ring, pos + first, ring8, b * ring, n - first)
            fence_acquire()
            if b == force or load_acquire(meta, mb + M_VERSION) == v1:
                if damaged:  # a state no writer leaves: the bucket goes empty
                    counts[1] += 1
                    for s in range(slots):
                        out_index[i * slots + s] = 0
                    for w in range(2, ROW_WORDS):
                        out_meta[i * ROW_WORDS + w] = 0
                out_meta[i * ROW_WORDS + M_LOCK] = 0
                out_lens[i] = n
                pos += n
                ok = True
                break
            counts[0] += 1
        if not ok:
            return i
    return nb


@njit(nogil=True, cache=True, _nrt=False)
def copy_in(meta, index, ring8, slots, ring, b0, nb, in_meta, in_index, in_lens, in_ring, me):
    """Put copied buckets b0.. into a segment (the same geometry), each under its lock
    and an odd version. Returns -1, or the first bucket whose lock was held (nobody
    else should write a segment being restored) or whose copy does not fit."""
    pos = 0
    for i in range(nb):
        b = b0 + i
        mb = b * ROW_WORDS
        n = in_lens[i]
        head = in_meta[i * ROW_WORDS + M_HEAD]
        tail = in_meta[i * ROW_WORDS + M_TAIL]
        if n < 0 or n > ring or head - tail != n or tail < 0 or pos + n > len(in_ring):
            return b
        if cas(meta, mb + M_LOCK, 0, me) != 0:
            return b
        v = meta[mb + M_VERSION]
        v = v + 1 if (v & 1) == 0 else v
        store_release(meta, mb + M_VERSION, v)
        for w in range(ROW_WORDS):
            if w != M_LOCK and w != M_VERSION:
                meta[mb + w] = in_meta[i * ROW_WORDS + w]
        _copy(index, b * slots, in_index, i * slots, slots)
        t = tail % ring
        first = min(n, ring - t)
        _copy(ring8, b * ring + t, in_ring, pos, first)
        _copy(ring8, b * ring, in_ring, pos + first, n - first)
        pos += n
        store_release(meta, mb + M_VERSION, v + 1)
        store_release(meta, mb + M_LOCK, 0)
    return -1


@njit(nogil=True, cache=True, _nrt=False)
def live_records(in_meta, in_lens, in_ring, nb, ring, ks, maxv, out_key_at, out_val_at, out_lens):
    """The LIVE records of copied buckets, oldest first: the position in in_ring of each
    one's key and value, and its value length. Returns how many (out arrays are sized by
    the caller for the most records the spans can hold). A record that does not check
    out (flags, length, extent) ends its bucket's walk."""
    k = 0
    pos = 0
    for i in range(nb):
        n = in_lens[i]
        t = in_meta[i * ROW_WORDS + M_TAIL] % ring
        p = 0
        while p < n:
            off = (t + p) % ring
            at = pos + p
            word = in_ring[at + 8] | (np.int64(in_ring[at + 9]) << 8) | (np.int64(in_ring[at + 10]) << 16) \
                | (np.int64(in_ring[at + 11]) << 24) | (np.int64(in_ring[at + 12]) << 32) \
                | (np.int64(in_ring[at + 13]) << 40)
            flags = word >> 32
            vlen = word & _LEN_MASK
            if flags == F_PAD:
                p += ring - off
                continue
            size = (RECORD_HEADER + ks + vlen + RECORD_ALIGN - 1) // RECORD_ALIGN * RECORD_ALIGN
            if vlen > maxv or off + size > ring or p + size > n:
                break
            if flags == F_LIVE:
                out_key_at[k] = at + RECORD_HEADER
                out_val_at[k] = at + RECORD_HEADER + ks
                out_lens[k] = vlen
                k += 1
            p += size
        pos += n
    return k


@njit(nogil=True, cache=True, _nrt=False)
def gather_keys(in_ring, key_at, n, ks, out):
    """out[i * ks: (i + 1) * ks] = the key at key_at[i]."""
    for i in range(n):
        _copy(out, i * ks, in_ring, key_at[i], ks)
