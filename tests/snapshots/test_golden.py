"""Snapshots stay readable: the golden snapshot of every format version (golden/snapshots/,
made by tests/lib/shmtest/golden_snapshots.py with the shmcache of that version) is read and restored by
today's code, header and every key as it was written; a snapshot of a version this shmcache
does not read is refused with one message naming both versions, and nothing is made."""

from __future__ import annotations

import gzip
import json
import re
import struct
from pathlib import Path

import pytest

import shmcache
from shmcache import snapshots as S
from shmcache.errors import SnapshotCorruptError
from shmcache.snapshots.format import FORMAT_VERSION, HEAD, MAGIC

GOLDEN = Path(__file__).resolve().parents[2] / "golden" / "snapshots"
EXPECT = json.loads((GOLDEN / "expect.json").read_text())
VERSIONS = sorted(EXPECT, key=lambda v: int(v[1:]))


def _golden(version: str, tmp_path: Path) -> Path:
    path = tmp_path / f"{version}.snap"
    path.write_bytes(gzip.decompress((GOLDEN / f"{version}.snap.gz").read_bytes()))
    return path


def test_every_format_version_up_to_todays_has_its_golden_snapshot():
    """A new FORMAT_VERSION comes with its golden file (tests/lib/shmtest/golden_snapshots.py), and the older ones stay."""
    assert VERSIONS == [f"v{n}" for n in range(1, FORMAT_VERSION + 1)], VERSIONS
    assert sorted(p.name for p in GOLDEN.glob("*.snap.gz")) == sorted(f"{v}.snap.gz" for v in VERSIONS)


@pytest.mark.parametrize("version", VERSIONS)
def test_a_golden_snapshot_reads_and_restores_as_it_was_written(version, tmp_path, cache_name):
    path = _golden(version, tmp_path)
    want = EXPECT[version]
    info = S.verify(path).to_dict()
    info.pop("path")
    assert info == want["header"]
    done = S.restore(path, cache_name)
    assert done["entries"] == want["header"]["entries"] and done["evictions"] == 0
    with shmcache.attach(cache_name) as r:
        keys = [bytes.fromhex(k["key"]) for k in want["keys"]]
        got = r.get_many(keys)
        assert [None if v is None else v.hex() for v in got] == [k["value"] for k in want["keys"]]
        st = r.status()
    assert st["topic"] == want["header"]["topic"]


@pytest.mark.parametrize("other", [0, FORMAT_VERSION + 1, 2**32 - 1])
def test_a_snapshot_of_a_version_this_shmcache_does_not_read_is_refused_naming_both(other, tmp_path, cache_name):
    """Today's golden with its version word changed (the header's checksum covers the JSON,
    not the version, so the file is otherwise whole): refused by verify, read_header and
    restore alike, with the versions named, and no cache made."""
    data = bytearray(_golden(VERSIONS[-1], tmp_path).read_bytes())
    magic, _, n = HEAD.unpack_from(data)
    assert magic == MAGIC
    struct.pack_into("<I", data, len(MAGIC), other)
    path = tmp_path / "other.snap"
    path.write_bytes(bytes(data))
    said = re.escape(f"has format version {other}; this shmcache reads version {FORMAT_VERSION}")
    for read in (S.verify, S.read_header, lambda p: S.restore(p, cache_name)):
        with pytest.raises(SnapshotCorruptError, match=said):
            read(path)
    assert not shmcache.exists(cache_name)
