"""Golden test of the segment layout (engine/layout.py), the one contract every process
agrees on: for three concrete geometries the byte offset and size of every section and
the total size, the header word indices (H_*) and the row word indices (W_/K_/P_/M_),
written out as literal numbers; that no two header words or word ranges overlap and all
lie inside the header page; record sizes; the index slot encoding; and that a segment
made by shmcache.create holds exactly these figures, read from its file in /dev/shm.

Golden: these numbers are the contract. A change to the layout must change this file
AND engine/layout.py's LAYOUT_VERSION (a segment of the old layout is then refused, not
misread)."""

from __future__ import annotations

import os

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
import xxhash

import shmcache
from shmcache.engine.control import layout as C
from shmcache.engine import layout as L
from shmcache.engine import units

# (memory, key_size, max_value) -> slots, ring, and per section (offset, size) in bytes, total size
GOLDEN_GEOMETRIES = {
    ("64MiB", 32, 4096): {  # the default create, at 64 MiB
        "slots": 128, "ring": 7088, "size": 67055616,
        "header": (0, 4096), "writers": (4096, 4096), "workers": (8192, 4096),
        "partitions": (12288, 65536), "meta": (77824, 524288), "index": (602112, 8388608),
        "rings": (8990720, 58064896),
    },
    ("16MiB", 64, 1024): {  # longer keys, shorter values
        "slots": 32, "ring": 1712, "size": 16723968,
        "header": (0, 4096), "writers": (4096, 4096), "workers": (8192, 4096),
        "partitions": (12288, 65536), "meta": (77824, 524288), "index": (602112, 2097152),
        "rings": (2699264, 14024704),
    },
    ("36MiB", 32, 4096): {  # small: the index gives room back (64 -> 32 slots) so a 4 KiB value fits
        "slots": 32, "ring": 4272, "size": 37695488,
        "header": (0, 4096), "writers": (4096, 4096), "workers": (8192, 4096),
        "partitions": (12288, 65536), "meta": (77824, 524288), "index": (602112, 2097152),
        "rings": (2699264, 34996224),
    },
}

GOLDEN_HEADER = {
    "H_MAGIC": 0, "H_VERSION": 1, "H_KEY_SIZE": 2, "H_MAX_VALUE": 3, "H_NBUCKETS": 4, "H_SLOTS": 5,
    "H_RING": 6, "H_SIZE": 7, "H_CREATION_ID": 8, "H_CREATED_NS": 9, "H_SUPERVISOR": 10,
    "H_OWNER_LOCKS": 11, "H_TOPIC_LEN": 12, "H_PARTITIONS": 13, "H_SUPERVISOR_HEARTBEAT": 14, "H_AGE_CLOCK": 15, "H_TOPIC": 16,
    "H_COMMITS": 48, "H_COMMIT_FAILURES": 49, "H_REBALANCES": 50, "H_PARTITIONS_LOST": 51,
    "H_SUPERVISOR_STARTED": 52, "H_METRICS_PORT": 53, "H_ASSIGNING": 54, "H_WIRE_FORMAT": 55,
    "H_COMMIT_PENDING_SINCE": 56, "H_ACCEPT_GAPS": 57, "H_WORKER_STALE_NS": 58,
    "H_STALE_KILLS": 59, "H_BROKER_STATE": 60, "H_BROKER_SINCE": 61,
    "H_START_KILLS": 62, "H_PARTITION_TIMES": 63,
    "H_RESIZE_ASK": 64, "H_RESIZE_ANSWERED": 65, "H_RESIZES": 66, "H_RESIZE_FROM": 67, "H_RESIZE_AT_NS": 68,
    "H_RESIZE_PAUSE_NS": 69, "H_RESIZE_COPY_NS": 70, "H_RESIZE_ENTRIES": 71, "H_RESIZE_TEXT_LEN": 72,
    "H_RESIZE_TEXT": 73, "H_MEMORY_MAX": 95,
    "H_GROUP_MEMBERS": 96, "H_GROUP_CHECKED": 97, "H_COMMITS_DEFERRED": 98, "H_GROUP_TEXT_LEN": 99,
    "H_GROUP_TEXT": 128, "H_WORKER_HANDLES": 192, "H_ELSEWHERE": 256,
    "H_RESTORE_STATE": 400, "H_RESTORE_ENTRIES": 401, "H_RESTORE_NS": 402, "H_RESTORE_EVICTIONS": 403,
    "H_RESTORE_TAKEN_NS": 404, "H_SNAPSHOT_TAKEN_NS": 405, "H_SNAPSHOT_BYTES": 406, "H_SNAPSHOT_NS": 407,
    "H_SNAPSHOTS": 408, "H_SNAPSHOT_FAILURES": 409, "H_GAP_OFFSETS": 410, "H_TOPIC_ID": 411,
    "H_LOOKUP_FAILING_SINCE": 100, "H_LOOKUP_TEXT_LEN": 101, "H_LOOKUP_TEXT": 104,
    "H_GAP_BITS": 448,
}
GOLDEN_ROWS = {
    "W_": {"W_OWNER": 0, "W_SETS": 1, "W_DELETES": 2, "W_DELETE_MISSES": 3, "W_BATCHES": 4, "W_WAIT": 5, "W_UNKNOWN": 6,
           "W_CORRUPTIONS": 7},
    "K_": {"K_OWNER": 0, "K_HEARTBEAT": 1, "K_STARTS": 2, "K_ADDS": 3, "K_DELETES": 4, "K_MALFORMED": 5,
           "K_UNKNOWN": 6, "K_MESSAGES": 7},
    "P_": {"P_APPLIED": 0, "P_HIGH_WATERMARK": 1, "P_OWNER": 2, "P_CAUGHT_UP": 3, "P_COMMITTED": 4,
           "P_ASSIGNED": 5, "P_APPLIED_TIME": 6, "P_LATEST": 7},
    "M_": {"M_LOCK": 0, "M_VERSION": 1, "M_HEAD": 2, "M_TAIL": 3, "M_LIVE": 4, "M_LIVE_BYTES": 5,
           "M_EVICTIONS": 6, "M_TAKEOVERS": 7},
}


def _named(prefix: str) -> dict[str, int]:
    """The segment's words of this prefix: the table's (layout) and the control area's."""
    return {k: getattr(m, k) for m in (L, C) for k in dir(m) if k.startswith(prefix) and isinstance(getattr(m, k), int)}


def _sections(geo: L.Geometry) -> dict[str, tuple[int, int]]:
    return {
        "header": (0, L.HEADER_WORDS * L.WORD),
        "writers": (geo.writers_off, geo.workers_off - geo.writers_off),
        "workers": (geo.workers_off, geo.partitions_off - geo.workers_off),
        "partitions": (geo.partitions_off, geo.meta_off - geo.partitions_off),
        "meta": (geo.meta_off, geo.index_off - geo.meta_off),
        "index": (geo.index_off, L.NBUCKETS * geo.slots * L.WORD),
        "rings": (geo.ring_off, geo.capacity_bytes),
    }


def test_the_constants_of_layout_version_1():
    assert L.LAYOUT_VERSION == 1  # the figures below are version 1's: a new layout is a new version
    assert L.MAGIC == 0x31484341434D4853 and L.MAGIC.to_bytes(8, "little") == b"SHMCACH1"
    assert (L.PAGE, L.WORD, L.HEADER_WORDS, L.ROW_WORDS) == (4096, 8, 512, 8)
    assert (L.BUCKET_BITS, L.NBUCKETS, L.MAX_WRITERS, L.MAX_WORKERS, L.MAX_PARTITIONS) == (13, 8192, 64, 64, 1024)
    assert (L.TOPIC_MAX, C.GROUP_TEXT_MAX) == (256, 512)
    assert (L.RECORD_ALIGN, L.RECORD_HEADER, L.F_LIVE, L.F_DEAD, L.F_PAD) == (16, 16, 1, 2, 3)
    assert (L.POS_BITS, L.TAG_SHIFT, L.MIN_SLOTS, L.SLOT_RING_BYTES) == (47, 48, 8, 48)
    assert (L.MAX_LOAD_NUM, L.MAX_LOAD_DEN) == (3, 4)
    assert L.FIXED_BYTES == 602112
    assert C.WORKER_STATES == ("stopped", "starting", "up", "stopping", "backing-off")
    assert C.WIRE_FORMATS == ("v1", "v2", "kv", "proto")  # append only: segments and snapshots keep the codes


@pytest.mark.parametrize("shape", list(GOLDEN_GEOMETRIES), ids=lambda s: "-".join(map(str, s)))
def test_section_offsets_and_sizes_are_golden(shape):
    memory, ks, maxv = shape
    want = GOLDEN_GEOMETRIES[shape]
    geo = L.Geometry.plan(units.parse_bytes(memory), ks, maxv)
    assert (geo.key_size, geo.max_value, geo.slots, geo.ring, geo.size) == (ks, maxv, want["slots"], want["ring"],
                                                                            want["size"])
    got = _sections(geo)
    assert got == {k: want[k] for k in got}
    # consecutive, page-aligned, nothing between them but the ring section's alignment
    spans = list(got.values())
    for (off, size), (nxt, _) in zip(spans, spans[1:]):
        assert off % L.PAGE == 0 and nxt % L.PAGE == 0
        assert nxt - (off + size) == (nxt - (off + size)) % L.PAGE  # at most the alignment pad
        assert nxt >= off + size
    assert spans[-1][0] + spans[-1][1] == geo.size <= units.parse_bytes(memory)
    assert geo.max_live == want["slots"] * 3 // 4
    assert L.bucket_spans(geo, 0) == ((want["meta"][0], 64), (want["index"][0], want["slots"] * 8),
                                      (want["rings"][0], want["ring"]))
    last = L.NBUCKETS - 1
    assert L.bucket_spans(geo, last) == ((want["meta"][0] + last * 64, 64),
                                         (want["index"][0] + last * want["slots"] * 8, want["slots"] * 8),
                                         (want["rings"][0] + last * want["ring"], want["ring"]))


def test_header_word_indices_are_golden():
    assert _named("H_") == GOLDEN_HEADER


def test_header_words_and_ranges_do_not_overlap_and_fit_the_header():
    ranges = {  # the multi-word fields, their extent derived from the layout's own limits
        "H_TOPIC": L.TOPIC_MAX // L.WORD,
        "H_GROUP_TEXT": C.GROUP_TEXT_MAX // L.WORD,
        "H_ELSEWHERE": L.MAX_PARTITIONS // L.WORD,  # a byte per partition
        "H_WORKER_HANDLES": L.MAX_WORKERS,  # a word per worker slot
        "H_GAP_BITS": L.MAX_PARTITIONS // 64,  # a bit per partition
        "H_TOPIC_ID": 2,  # a UUID's two halves
        "H_LOOKUP_TEXT": C.LOOKUP_TEXT_MAX // L.WORD,
        "H_RESIZE_TEXT": C.RESIZE_TEXT_MAX // L.WORD,
    }
    owner: dict[int, str] = {}
    for name, start in _named("H_").items():
        for w in range(start, start + ranges.get(name, 1)):
            assert 0 <= w < L.HEADER_WORDS, (name, w)
            assert w not in owner, f"{name} and {owner.get(w)} share header word {w}"
            owner[w] = name
    assert L.TOPIC_MAX % L.WORD == 0 and C.GROUP_TEXT_MAX % L.WORD == 0
    assert L.MAX_PARTITIONS % 64 == 0


@pytest.mark.parametrize("prefix", list(GOLDEN_ROWS))
def test_row_word_indices_are_golden_and_fit_a_row(prefix):
    got = _named(prefix)
    assert got == GOLDEN_ROWS[prefix]
    assert all(0 <= w < L.ROW_WORDS for w in got.values())
    assert len(set(got.values())) == len(got)  # one word, one meaning


@pytest.mark.parametrize("key_size,value_len,size", [
    (32, 0, 48), (32, 1, 64), (32, 16, 64), (32, 17, 80), (32, 100, 160), (32, 4096, 4144),
    (1, 0, 32), (33, 15, 64), (64, 1024, 1104), (1024, 0xFFFFFFFF, 4294968336),
])
def test_record_size_is_golden(key_size, value_len, size):
    assert L.record_size(key_size, value_len) == size
    assert size % L.RECORD_ALIGN == 0 and size - L.RECORD_ALIGN < L.RECORD_HEADER + key_size + value_len <= size


@pytest.mark.parametrize("shape", list(GOLDEN_GEOMETRIES), ids=lambda s: "-".join(map(str, s)))
def test_a_created_segment_holds_the_golden_figures(cache_name, shape):
    """The header words, the first record of a bucket, its index slot (tag << 47 | offset + 1)
    and its meta row, read from the file in /dev/shm at the golden offsets."""
    memory, ks, maxv = shape
    want = GOLDEN_GEOMETRIES[shape]
    key = bytes(range(1, ks + 1)) if ks < 256 else os.urandom(ks)
    value = b"golden value"
    with shmcache.create(cache_name, memory=memory, key_size=ks, max_value=maxv) as w:
        w.set(key, value)
        stats = w.stats()
    assert (stats["memory"], stats["key_size"], stats["max_value"], stats["layout_version"]) == (want["size"], ks,
                                                                                                   maxv, 1)
    path = os.path.join("/dev/shm", cache_name)
    assert os.path.getsize(path) == want["size"]
    seg = np.memmap(path, np.uint8, mode="r")
    try:
        h = seg[:4096].view(np.int64)
        assert h[:8].tolist() == [L.MAGIC, 1, ks, maxv, 8192, want["slots"], want["ring"], want["size"]]
        assert h[8] != 0 and h[9] > 0  # creation id, creation time
        hsh = xxhash.xxh64_intdigest(key)
        b = hsh % 8192
        home = (hsh >> 13) % want["slots"]
        meta = seg[want["meta"][0] + b * 64:][:64].view(np.int64)
        size = L.record_size(ks, len(value))
        assert meta.tolist() == [0, 2, size, 0, 1, size, 0, 0]  # unlocked, one write, one live record
        slot_at = want["index"][0] + (b * want["slots"] + home) * 8
        slot = int(seg[slot_at:slot_at + 8].view(np.int64)[0])
        assert slot == (hsh >> 48) << 47 | (0 + 1)  # tag << POS_BITS | (ring offset 0) + 1
        rec = seg[want["rings"][0] + b * want["ring"]:][:size]
        assert int(rec[:8].view(np.uint64)[0]) == hsh
        assert int(rec[8:16].view(np.int64)[0]) == L.F_LIVE << 32 | len(value)
        assert rec[16:16 + ks].tobytes() == key and rec[16 + ks:16 + ks + len(value)].tobytes() == value
        others = seg[want["index"][0]:want["rings"][0]].view(np.int64)
        assert np.count_nonzero(others) == 1  # the one slot, nowhere else in the index section
    finally:
        del seg


@given(st.integers(-(1 << 63), (1 << 63) - 1), st.integers(-(1 << 63), (1 << 63) - 1))
def test_a_topic_id_reads_back_as_kafka_writes_it(msb, lsb):
    """The two words of H_TOPIC_ID and the text Kafka's tools show (URL-safe base64 of the
    UUID's 16 bytes, unpadded) are one another's inverse; librdkafka's own text (standard
    base64) is read too; 0, 0 is "" (unknown)."""
    text = C.topic_id_text(msb, lsb)
    assert C.topic_id_words(text) == (msb, lsb)
    assert (text == "") == (msb == lsb == 0)
    if text:
        assert len(text) == 22 and C.topic_id_words(text.replace("-", "+").replace("_", "/")) == (msb, lsb)


@pytest.mark.parametrize("bad", ["x", "AAAA", "A" * 23, "not base64 at all!!!!!"])
def test_a_topic_id_that_is_none_is_refused_by_name(bad):
    with pytest.raises(ValueError, match="topic id"):
        C.topic_id_words(bad)
