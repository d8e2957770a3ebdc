"""A snapshot's header crafted by hand (issue 39 item 6). Its checksum is not keyed, so
anyone can write a header that passes it: every field must be checked for its type and
bounds, and the geometry's figures against each other as a segment's are, before any of
them is used. Any failure is SnapshotCorruptError naming the field (SnapshotMismatchError
for a valid geometry that does not fit the memory asked for or /dev/shm); never
OverflowError, MemoryError, RecursionError or ValueError, which aborted a supervisor's
start instead of trying the older snapshot and made `shmcache restore` print a
traceback. A fuzz of header fields, the cases that broke it, the start's fallback and
the command line."""

from __future__ import annotations

import json
import logging
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest
import xxhash
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import shmcache
from shmcache.consumer.supervisor import snapshot_dir as snapdir
from shmcache.consumer.supervisor import snapshot_policy as policy
from shmcache.consumer.config import RunConfig
from shmcache.engine.control import layout as C
from shmcache.engine import layout as L
from shmcache import snapshots as S
from shmcache.snapshots.format import FORMAT_VERSION, HEAD, MAGIC
from shmcache.errors import SnapshotCorruptError, SnapshotError

REPO = Path(__file__).resolve().parents[2]
TOPIC = "txmeta-hdr"


@pytest.fixture(scope="module")
def good(tmp_path_factory) -> tuple[dict, bytes, Path]:
    """A real snapshot of a small cache with entries and three partitions' offsets:
    (its header's fields, the bytes after the header, its path)."""
    d = tmp_path_factory.mktemp("snaps")
    name = f"t-hdr-src-{os.getpid()}"
    with shmcache.create(name, memory="40MiB") as w:
        w.set_many([i.to_bytes(32, "big") for i in range(3000)], [b"v" * 90] * 3000)
        w.control.set_topic(TOPIC, 3)
        w.control.partitions[:3, C.P_APPLIED] = (10, 20, 30)
        info = S.write(w, d / "good.snap")
    shmcache.destroy(name)
    data = Path(info.path).read_bytes()
    _, _, n = HEAD.unpack_from(data)
    return json.loads(data[HEAD.size:HEAD.size + n]), data[HEAD.size + n + 8:], Path(info.path)


def _craft(path: Path, raw: bytes, rest: bytes) -> Path:
    """A snapshot file with header text `raw` under a checksum that holds, then the good chunks."""
    path.write_bytes(HEAD.pack(MAGIC, FORMAT_VERSION, len(raw)) + raw + struct.pack("<Q", xxhash.xxh3_64_intdigest(raw))
                     + rest)
    return path


def _with(head: dict, field: str, value, literal: str | None = None) -> bytes:
    """The header with `field` set to `value` (or to the JSON text `literal`, as written)."""
    h = {**head, field: "@@" if literal is not None else value}
    raw = json.dumps(h, separators=(",", ":"))
    return (raw.replace('"@@"', literal) if literal is not None else raw).encode()


def _derived(slots: int, ring: int) -> int:
    return L.align(L.FIXED_BYTES + L.NBUCKETS * slots * L.WORD, L.PAGE) + L.NBUCKETS * ring


def _restore_fails_cleanly(path: Path, name: str, match: str | None = None) -> SnapshotError:
    with pytest.raises(SnapshotError, match=match) as e:
        S.restore(path, name)
    assert not shmcache.exists(name)
    return e.value


# (field, value, JSON literal or None, the error before this change)
CASES = [
    ("size", None, "1e400", "OverflowError: int(inf)"),
    ("taken_ns", None, "Infinity", "OverflowError: int(inf)"),
    ("entries", None, "NaN", "ValueError from int(nan)"),
    ("taken_ns", 1 << 64, None, "OverflowError: int64 control word"),
    ("offsets", [1 << 64, 0, 0], None, "OverflowError: int64 partition word"),
    ("offsets", None, "[" * 100_000 + "]" * 100_000, "RecursionError in json.loads"),
    ("slots", 1 << 30, None, "MemoryError or CacheSpaceError: 64 TiB of index"),
    ("topic", "t" * 300, None, "ValueError from set_topic, not a SnapshotError"),
    ("topic", "\ud800", None, "UnicodeEncodeError from set_topic"),
    ("key_size", True, None, "a bool taken for 1"),
    ("partitions", 7, None, "not checked"),
    ("wire_format", {"v": 1}, None, "not checked"),
]


@pytest.mark.parametrize("field,value,literal,before", CASES, ids=[f"{c[0]}-{c[3][:20]}" for c in CASES])
def test_a_crafted_field_is_snapshot_corrupt_naming_it(good, tmp_path, cache_name, field, value, literal, before):
    head, rest, _ = good
    if field == "slots":  # the size derived from it: only the file's size says it is wrong
        head = {**head, "size": _derived(value, head["ring"])}
    path = _craft(tmp_path / "crafted.snap", _with(head, field, value, literal), rest)
    if field == "offsets" and literal:
        with pytest.raises(SnapshotCorruptError, match="header is not JSON"):
            S.read_header(path)
    else:
        with pytest.raises(SnapshotCorruptError, match=rf"{path}: header field {field} is .*; it should be"):
            S.read_header(path)
    _restore_fails_cleanly(path, cache_name)


def test_a_geometry_that_agrees_but_does_not_fit_is_a_mismatch(good, tmp_path, cache_name):
    """Rings of 64 GiB a bucket: figures that agree with each other (size derived from
    them, under 1 PiB) for a cache no /dev/shm holds. The chunk buffers are never that
    large (a chunk is not longer than the file), and the create's refusal is the snapshot's
    SnapshotMismatchError, as is a memory= too small for its key size and values."""
    head, rest, _ = good
    ring = 1 << 36
    raw = json.dumps({**head, "ring": ring, "size": _derived(head["slots"], ring)}).encode()
    path = _craft(tmp_path / "huge.snap", raw, rest)
    assert S.read_header(path).geometry.ring == ring
    e = _restore_fails_cleanly(path, cache_name, match="does not fit")
    assert str(path) in str(e)
    ring = L.record_size(head["key_size"], 60_000)
    small = _craft(tmp_path / "big-values.snap", json.dumps({**head, "max_value": 60_000, "ring": ring,
                                                              "size": _derived(head["slots"], ring)}).encode(), rest)
    with pytest.raises(SnapshotError, match=f"snapshot {small}: .* do not fit: memory=40.0 MiB is too small"):
        S.restore(small, cache_name, memory="40MiB")
    assert not shmcache.exists(cache_name)


HOSTILE = st.one_of(
    st.integers(min_value=-(1 << 70), max_value=1 << 70), st.sampled_from([0, 1, -1, 8, 16, 1 << 47, 1 << 63, 1 << 64]),
    st.floats(allow_nan=True, allow_infinity=True), st.booleans(), st.none(), st.text(max_size=40),
    st.text(min_size=250, max_size=400), st.lists(st.integers(min_value=-(1 << 65), max_value=1 << 65), max_size=5),
    st.recursive(st.integers(0, 3), lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=3), c,
                                                                                        max_size=3), max_leaves=8),
)


@settings(max_examples=int(os.environ.get("SHMCACHE_FUZZ_HEADERS", "300")), deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=st.data())
def test_fuzzed_headers_are_read_or_refused_as_corrupt(good, tmp_path, cache_name, data):
    """One to three fields replaced by hostile values (or removed), or the geometry made to
    agree with itself at other figures: the header is read, or refused with
    SnapshotCorruptError naming a field; a restore succeeds or raises a SnapshotError and
    leaves no cache. Anything else (OverflowError, MemoryError, RecursionError, ValueError,
    TypeError) fails the test."""
    head, rest, _ = good
    h = dict(head)
    geometry = data.draw(st.booleans(), "geometry")
    if geometry:  # figures that agree with each other: deeper into the restore
        slots = 1 << data.draw(st.integers(3, 12), "log2 slots")
        ring = 16 * data.draw(st.integers(1, 512), "ring / 16")  # caches of 64 MiB at most
        h.update(slots=slots, ring=ring, size=_derived(slots, ring),
                 max_value=data.draw(st.integers(0, max(0, ring - 16 - h["key_size"])), "max_value"))
    for _ in range(data.draw(st.integers(0 if geometry else 1, 3), "fields")):
        field = data.draw(st.sampled_from(sorted(head) + ["extra"]), "field")
        if data.draw(st.integers(0, 9), "remove?") == 0:
            h.pop(field, None)
        else:
            h[field] = data.draw(HOSTILE, field)
    path = _craft(tmp_path / "fuzz.snap", json.dumps(h).encode(), rest)  # NaN and Infinity as Python writes them
    try:
        S.read_header(path)
    except SnapshotCorruptError as e:
        assert str(path) in str(e) and ("header field " in str(e) or "header is" in str(e)), e
    try:
        S.restore(path, cache_name)
    except SnapshotError as e:
        assert str(path) in str(e), e
        assert not shmcache.exists(cache_name)
    else:
        shmcache.destroy(cache_name)


def test_the_start_falls_back_to_the_older_snapshot(good, tmp_path, cache_name, caplog):
    """restore_at_start with a crafted newest snapshot (an offset past int64, which raised
    OverflowError and aborted the start) and a good older one: the older is restored, and
    the log names the crafted file and its field."""
    head, rest, good_path = good
    d = tmp_path / "snaps"
    d.mkdir()
    older = snapdir.path_for(d, cache_name, 1_000)
    older.write_bytes(good_path.read_bytes())
    newer = _craft(snapdir.path_for(d, cache_name, 2_000), _with(head, "offsets", [1 << 64, 0, 0]), rest)
    cfg = RunConfig(name=cache_name, bootstrap="127.0.0.1:1", topic=TOPIC, snapshot_dir=str(d))
    with caplog.at_level(logging.WARNING, "shmcache.snapshots"):
        out = policy.SnapshotPolicy(cfg).restore_at_start()
    assert out is not None and out["snapshot"]["path"] == str(older) and out["entries"] == 3000
    assert f"skipping snapshot {newer}: SnapshotCorruptError" in caplog.text and "header field offsets" in caplog.text
    with shmcache.attach(cache_name) as r:
        assert r.control.partitions[:3, C.P_APPLIED].tolist() == [10, 20, 30] and r.stats()["entries"] == 3000


def test_shmcache_restore_of_a_crafted_snapshot_is_one_line(good, tmp_path, cache_name):
    head, rest, _ = good
    path = _craft(tmp_path / "crafted.snap", _with(head, "size", None, "1e400"), rest)
    p = subprocess.run([sys.executable, "-m", "shmcache", "restore", str(path), cache_name], cwd=REPO,
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
    assert len(p.stderr.strip().splitlines()) == 1 and "header field size is inf" in p.stderr, p.stderr
    assert not shmcache.exists(cache_name)
