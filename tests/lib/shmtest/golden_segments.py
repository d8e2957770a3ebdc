"""The golden segments (docs/segment-format.md, section 12): small caches with a known
answer per key, shared by every reader's tests (Python here, go/, the JVM reader).

`build()` makes them, deterministically: a real Writer (shmcache.create in /dev/shm,
then set/delete in a fixed order) fills one cache with keys derived from a counter;
its file is read back, the two words that differ between runs (creation id and time)
fixed, and the cache destroyed. Cases a writer cannot be asked for (a dead writer's
half-done state, a held lock, damage) are words patched into copies of that file.
The expected answers come from how each case was built, never from reading the file.

    .venv/bin/python -m shmtest.golden_segments     # rewrite golden/ (then run test_golden.py)

Files: golden/<case>.shm.gz (gzip of the segment) and golden/expect.json: per case,
`attach_error` (not_a_cache | version | corrupt, and the header field for corrupt) or
`keys`: [{key, value (hex, null = miss), corrupt (the lookup counts a corruption),
why}], and for `live_holder` the file offset of the lock word a test fills with a live
process's owner word before it attaches (the keys are then misses after the reader's
give-up bound).
"""

from __future__ import annotations

import gzip
import hashlib
import os
import struct
import uuid
from pathlib import Path

import xxhash

import shmcache

from shmtest import REPO
from shmcache.engine import layout as L

GOLDEN = REPO / "golden"
KEY_SIZE, MAX_VALUE = 32, 100
MEMORY = L.FIXED_BYTES + L.PAGE + 384 * L.NBUCKETS  # 8 slots and a 320-byte ring per bucket
CREATION_ID = 0x0123456789ABCDEF
CREATED_NS = 1_700_000_000_000_000_000
DEAD_OWNER = 0x7FFFFFFF << 32 | 1  # pid 2^31-1: above any pid_max, never a live process


def key_of(i: int) -> bytes:
    return hashlib.sha256(b"shmcache golden key %d" % i).digest()


def value_of(i: int, n: int) -> bytes:
    return (hashlib.sha256(b"shmcache golden value %d" % i).digest() * 4)[:n]


def parts(key: bytes) -> tuple[int, int, int, int]:
    """(hash, bucket, home slot, tag) of a key in the golden geometry (8 slots)."""
    h = xxhash.xxh64_intdigest(key)
    return h, h & (L.NBUCKETS - 1), (h >> L.BUCKET_BITS) % 8, h >> L.TAG_SHIFT


class Keys:
    """Keys from one counter, so no two cases share one."""

    def __init__(self):
        self.i = 0

    def any(self) -> bytes:
        self.i += 1
        return key_of(self.i)

    def in_bucket(self, b: int) -> bytes:
        while True:
            k = self.any()
            if parts(k)[1] == b:
                return k

    def colliding(self, fields) -> tuple[bytes, bytes]:
        """Two keys equal in `fields` of parts() (birthday search)."""
        seen: dict[tuple, bytes] = {}
        while True:
            k = self.any()
            p = parts(k)
            sig = tuple(p[f] for f in fields)
            if sig in seen:
                return seen[sig], k
            seen[sig] = k


def _script(keys: Keys):
    """(ops, expected, notes): ops in order, ("set", key, value) or ("delete", key);
    expected {key: value or None}; notes {key: why}; buckets {case: bucket}."""
    ops, exp, why, buckets = [], {}, {}, {}

    def put(k, v, note):
        ops.append(("set", k, v))
        exp[k], why[k] = v, note

    for n in (0, 1, 15, 16, 17, MAX_VALUE):
        put(keys.any(), value_of(n + 1000, n), f"value of {n} bytes")
    k = keys.any()
    put(k, value_of(1, 20), "deleted")
    ops.append(("delete", k))
    exp[k] = None
    k = keys.any()
    put(k, value_of(2, 30), "overwritten")
    put(k, value_of(3, 9), "overwritten: the newer value")
    fifo = keys.any()
    buckets["fifo"] = b = parts(fifo)[1]
    ring_keys = [fifo] + [keys.in_bucket(b) for _ in range(11)]
    for j, k in enumerate(ring_keys):  # 96-byte records: the ring holds 3; it wraps 3 times
        put(k, value_of(100 + j, 48), "ring wrapped: among the last 3 of 12")
    for k in ring_keys[:-3]:
        exp[k], why[k] = None, "evicted: ring wrapped, oldest overwritten first"
    full = keys.any()
    buckets["full"] = b = parts(full)[1]
    full_keys = [full] + [keys.in_bucket(b) for _ in range(7)]
    for j, k in enumerate(full_keys):  # 48-byte records: 6 live (slots * 3/4) fill the bucket
        put(k, b"", "full bucket: among the last 6 of 8")
    for k in full_keys[:2]:
        exp[k], why[k] = None, "evicted from a full bucket"
    a, c = keys.colliding((1, 3, 2))  # same bucket, tag and home slot
    put(a, value_of(4, 40), "tag, bucket and home slot collide with the next key")
    put(c, value_of(5, 41), "tag, bucket and home slot collide with the previous key")
    a, c = keys.colliding((1, 3))
    put(a, value_of(6, 42), "tag and bucket collide with an absent key")
    exp[c], why[c] = None, "absent; its tag and bucket collide with a present key"
    for _ in range(4):
        k = keys.any()
        exp[k], why[k] = None, "never set"
    busy = set(buckets.values())
    for k in exp:  # a case's bucket holds only that case's keys
        if parts(k)[1] in busy:
            assert k in ring_keys or k in full_keys, "a key of another case landed in a case's bucket"
    return ops, exp, why, buckets, ring_keys, full_keys


def _make_segment(ops) -> bytearray:
    name = f"golden-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    w = shmcache.create(name, memory=MEMORY, key_size=KEY_SIZE, max_value=MAX_VALUE)
    try:
        for op in ops:
            if op[0] == "set":
                w.set(op[1], op[2])
            else:
                w.delete(op[1])
        w.close()
        with open(f"/dev/shm/{name}", "rb") as f:
            seg = bytearray(f.read())
    finally:
        w.close()
        shmcache.destroy(name, force=True)
    return seg


class Segment:
    """Word-level access to a golden segment's bytes (layout.py's figures)."""

    def __init__(self, data: bytearray):
        self.data = data
        self.geo = L.Geometry.from_header("golden", struct.unpack_from("<64q", data), len(data))

    def word(self, off: int) -> int:
        return struct.unpack_from("<q", self.data, off)[0]

    def set(self, off: int, value: int) -> None:
        struct.pack_into("<q", self.data, off, value)

    def meta(self, b: int, w: int) -> int:
        return self.geo.meta_off + (b * L.ROW_WORDS + w) * L.WORD

    def slot_of(self, key: bytes) -> tuple[int, int]:
        """(file offset of the key's index slot, ring offset of its record)."""
        h, b, s, tag = parts(key)
        for _ in range(self.geo.slots):
            off = self.geo.index_off + (b * self.geo.slots + s) * L.WORD
            e = self.word(off)
            assert e != 0, "the key is not in the segment"
            pos = (e & L.POS_MASK) - 1
            rec = self.geo.ring_off + b * self.geo.ring + pos
            if e >> L.POS_BITS == tag and self.word(rec) == struct.unpack("<q", struct.pack("<Q", h))[0]:
                return off, pos
            s = (s + 1) % self.geo.slots
        raise AssertionError("the key is not in the segment")

    def record(self, key: bytes) -> int:
        """File offset of the key's record."""
        return self.geo.ring_off + parts(key)[1] * self.geo.ring + self.slot_of(key)[1]


def write_cases(directory: Path, cases: dict, expect: str) -> None:
    """A directory of golden files made anew: each case's bytes as NAME.shm.gz (gzip with no
    time in it, so a file changes only with its bytes), the old ones removed, and expect.json."""
    directory.mkdir(exist_ok=True)
    for old in directory.glob("*.shm.gz"):
        old.unlink()
    for name, (data, _) in cases.items():
        (directory / f"{name}.shm.gz").write_bytes(gzip.compress(data, compresslevel=9, mtime=0))
    (directory / "expect.json").write_text(expect)


if __name__ == "__main__":
    from shmtest.golden_cases import write_all

    write_all()
