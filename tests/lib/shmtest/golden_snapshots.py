"""The golden snapshots: one file a snapshot format version (snapshots/format.py), written once
by the shmcache of that version and kept, so that every later shmcache is held to reading it
(tests/snapshots/test_golden.py). A new FORMAT_VERSION adds its file here; the older ones stay.

`build()` makes today's version's file, deterministically: a real Writer fills a small cache
with keys derived from a counter (some deleted, one value empty), sets a topic, its id, its wire
format and three partitions' offsets, and snapshots it; the header's three fields that differ between runs
(the time taken, the cache's name and creation id) are then fixed and its checksum made again. The
expected answers come from how the cache was filled, never from reading the file.

    .venv/bin/python -m shmtest.golden_snapshots     # write golden/snapshots/v<FORMAT_VERSION>.snap.gz

Files: golden/snapshots/v<N>.snap.gz (gzip of the snapshot) and golden/snapshots/expect.json:
per version, the header's fields as read_header() gives them (`header`) and `keys`: [{key,
value (hex, null = a miss)}].
"""

from __future__ import annotations

import gzip
import json
import os
import struct
import sys
import tempfile
import uuid
from pathlib import Path

import xxhash

from shmtest import REPO

GOLDEN = REPO / "golden" / "snapshots"
TOPIC, TOPIC_ID, FORMAT, OFFSETS = "txmeta-golden", "pZBhN2HnQ9uMYwLwjk0AWA", "v2", (10, 20, 30)
TAKEN_NS, NAME, CREATION_ID = 1_764_000_000_000_000_000, "golden-snapshot", 0x0123456789ABCDEF
NKEYS = 200


def _key(i: int) -> bytes:
    return xxhash.xxh3_128_digest(i.to_bytes(8, "little")) * 2  # 32 bytes, spread over the buckets


def _value(i: int) -> bytes:
    return b"" if i == 7 else bytes([i % 251]) * (1 + i % 90)


def expected() -> list[dict]:
    """Every key the golden cache was given, and its answer: keys divisible by 5 deleted, key 7's value empty."""
    return [{"key": _key(i).hex(), "value": None if i % 5 == 0 else _value(i).hex()} for i in range(NKEYS)] \
        + [{"key": _key(NKEYS + i).hex(), "value": None} for i in range(4)]  # never set


def _fixed(data: bytes) -> bytes:
    """The snapshot's bytes with the header's run-dependent fields fixed and its checksum made again."""
    from shmcache.snapshots.format import HEAD

    magic, version, n = HEAD.unpack_from(data)
    header = json.loads(data[HEAD.size:HEAD.size + n])
    header.update(taken_ns=TAKEN_NS, name=NAME, creation_id=CREATION_ID)
    raw = json.dumps(header, separators=(",", ":")).encode()
    return HEAD.pack(magic, version, len(raw)) + raw + struct.pack("<Q", xxhash.xxh3_64_intdigest(raw)) \
        + data[HEAD.size + n + 8:]


def build() -> tuple[int, bytes, dict]:
    """(today's FORMAT_VERSION, its golden snapshot's bytes, its expectations)."""
    import shmcache
    from shmcache import snapshots as S
    from shmcache.engine.control import layout as C
    from shmcache.snapshots.format import FORMAT_VERSION

    name = f"golden-snap-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    with tempfile.TemporaryDirectory() as d, shmcache.create(name, memory="4MiB", max_value=100) as w:
        try:
            w.set_many([_key(i) for i in range(NKEYS)], [_value(i) for i in range(NKEYS)])
            w.delete_many([_key(i) for i in range(0, NKEYS, 5)])
            w.control.set_topic(TOPIC, len(OFFSETS))
            w.control.set_topic_id(TOPIC_ID)
            w.control.set_wire_format(FORMAT)
            w.control.partitions[:len(OFFSETS), C.P_APPLIED] = OFFSETS
            S.write(w, os.path.join(d, "golden.snap"))
            data = _fixed(Path(d, "golden.snap").read_bytes())
            Path(d, "fixed.snap").write_bytes(data)
            header = S.read_header(os.path.join(d, "fixed.snap")).to_dict()
        finally:
            shmcache.destroy(name)
    header.pop("path")
    return FORMAT_VERSION, data, {"header": header, "keys": expected()}


def main() -> int:
    version, data, expect = build()
    GOLDEN.mkdir(parents=True, exist_ok=True)
    # mtime 0: the gzip's bytes depend on the snapshot's alone
    (GOLDEN / f"v{version}.snap.gz").write_bytes(gzip.compress(data, mtime=0))
    path = GOLDEN / "expect.json"
    doc = json.loads(path.read_text()) if path.exists() else {}
    doc[f"v{version}"] = expect
    path.write_text(json.dumps(doc, indent=1, sort_keys=True) + "\n")
    print(f"golden/snapshots/v{version}.snap.gz: {len(data):,} bytes, {expect['header']['entries']} entries")
    return 0


if __name__ == "__main__":
    sys.exit(main())
