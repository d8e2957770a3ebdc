"""The wire format a cache was filled in, as its segment's word (H_WIRE_FORMAT, a code) and a
snapshot's header (a name) keep it, with the proto format added: a proto cache's snapshot
says proto and restores as proto (and refuses to be a v1 cache's), and the names and codes
written before it (v1, v2, kv, none) read and restore as they did."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest
import xxhash

import shmcache
from shmcache.formats import registry
from shmcache.engine.control import layout as C
from shmcache import snapshots as S
from shmcache.snapshots.format import FORMAT_VERSION, HEAD, MAGIC
from shmcache.engine.table import open_writer
from shmcache.errors import SnapshotCorruptError, SnapshotMismatchError

# A segment keeps a code, a snapshot a name: neither may change meaning once written.
CODES = {"": 0, "v1": 1, "v2": 2, "kv": 3, "proto": 4}


def test_the_codes_written_before_keep_their_meaning():
    assert {f: C.WIRE_FORMATS.index(f) + 1 for f in C.WIRE_FORMATS} == {k: v for k, v in CODES.items() if k}



def _snapshot_of(name: str, path: Path, code: int) -> S.SnapshotInfo:
    with shmcache.create(name, memory="40MiB") as w:
        w.set_many([i.to_bytes(32, "big") for i in range(500)], [b"v" * 70] * 500)
        w.control.set_topic("txmeta-wfmt", 2)
        w.segment_arrays().header[C.H_WIRE_FORMAT] = code  # the word as a shmcache of that format left it
        return S.write(w, path)


def test_a_proto_caches_snapshot_restores_as_proto(cache_names, tmp_path):
    info = _snapshot_of(cache_names("src"), tmp_path / "proto.snap", CODES["proto"])
    assert info.wire_format == "proto" and S.read_header(info.path).wire_format == "proto"
    back = cache_names("back")
    S.restore(info.path, back, wire_format="proto")
    with shmcache.attach(back) as r:
        assert r.get_many([(7).to_bytes(32, "big")]) == [b"v" * 70]
    with open_writer(back) as w:  # the word says proto, and a snapshot of the restored cache does too
        assert w.control.word(C.H_WIRE_FORMAT) == CODES["proto"]
        assert S.write(w, tmp_path / "again.snap").wire_format == "proto"
    with pytest.raises(SnapshotMismatchError, match="wire format 'proto'; this cache's wire format is 'v1'"):
        S.restore(info.path, cache_names("wrong"), wire_format="v1")


def _rewrite(src: Path, dst: Path, wire_format: str) -> Path:
    """The snapshot at src with its header's wire_format as given, under a checksum that holds."""
    data = src.read_bytes()
    _, _, n = HEAD.unpack_from(data)
    head = json.loads(data[HEAD.size:HEAD.size + n])
    raw = json.dumps({**head, "wire_format": wire_format}, separators=(",", ":")).encode()
    dst.write_bytes(HEAD.pack(MAGIC, FORMAT_VERSION, len(raw)) + raw + struct.pack("<Q", xxhash.xxh3_64_intdigest(raw))
                    + data[HEAD.size + n + 8:])
    return dst


@pytest.mark.parametrize("fmt", ["", *registry.NAMES], ids=lambda f: f or "none")
def test_a_snapshot_of_an_earlier_format_reads_and_restores_as_before(cache_names, tmp_path, fmt):
    src = _snapshot_of(cache_names("src"), tmp_path / "src.snap", 0)
    path = _rewrite(Path(src.path), tmp_path / f"{fmt or 'none'}.snap", fmt)
    assert S.read_header(path).wire_format == fmt
    back = cache_names("back")
    S.restore(path, back, wire_format=fmt or None)
    with open_writer(back) as w:
        assert w.control.word(C.H_WIRE_FORMAT) == CODES[fmt]
        assert S.write(w, tmp_path / "again.snap").wire_format == fmt


def test_a_name_no_shmcache_wrote_is_still_corrupt(cache_names, tmp_path):
    src = _snapshot_of(cache_names("src"), tmp_path / "src.snap", 0)
    path = _rewrite(Path(src.path), tmp_path / "v3.snap", "v3")
    with pytest.raises(SnapshotCorruptError, match="header field wire_format is"):
        S.read_header(path)
