"""Invariant 9: the segment's bytes are untrusted. A damaged or hostile header is refused at
attach and open with CorruptCacheError naming the field; damaged bucket state inside the
table costs a counted miss (readers) or a counted repair (writers), never a signal or a hang.

Everything that could crash or hang on the code before these checks runs in a child
process (tests/lib/shmtest/fuzz_child.py) with a timeout, so a regression fails the test
instead of killing or hanging the suite.
"""

from __future__ import annotations


import numpy as np
import pytest

import shmcache
from shmcache.engine import layout as L

from shmtest.procs import check_table, key_pool, make_values

START_TIMEOUT = 60.0  # a cold numba cache compiles the kernels in each child
BOUND = 20.0  # any one command of a child (a few batch calls over the keys) must answer within this
SEED, NKEYS = 31, 20_000


def _geometry_cases():
    g = L.Geometry.plan(40 * 2**20, L.DEFAULT_KEY_SIZE, L.DEFAULT_MAX_VALUE)
    return [
        ("slots", L.H_SLOTS, 0), ("slots", L.H_SLOTS, -8), ("slots", L.H_SLOTS, 1), ("slots", L.H_SLOTS, 4),
        ("slots", L.H_SLOTS, g.slots + 8), ("size", L.H_SLOTS, g.slots * 2), ("ring", L.H_RING, -16),
        ("ring", L.H_RING, 8), ("ring", L.H_RING, g.ring + 8), ("ring", L.H_RING, 4096),
        ("size", L.H_RING, g.ring + 16), ("key_size", L.H_KEY_SIZE, 0), ("key_size", L.H_KEY_SIZE, 2000),
        ("max_value", L.H_MAX_VALUE, -1), ("max_value", L.H_MAX_VALUE, 2**32), ("ring", L.H_MAX_VALUE, 2**32 - 1),
        ("nbuckets", L.H_NBUCKETS, 4096), ("size", L.H_SIZE, g.size + L.PAGE), ("size", L.H_SIZE, 0),
        ("topic_len", L.H_TOPIC_LEN, 10_000), ("topic_len", L.H_TOPIC_LEN, -1),
        ("partitions", L.H_PARTITIONS, L.MAX_PARTITIONS + 1),
    ]


@pytest.mark.parametrize("field,word,value", _geometry_cases(),
                         ids=[f"{c[0]}-w{c[1]}={c[2]}" for c in _geometry_cases()])
def test_damaged_header_is_refused_naming_the_field(cache_name, field, word, value):
    w = shmcache.create(cache_name, memory="40MiB")
    try:
        w.set(b"k" * 32, b"kept")
        good = int(w._header[word])
        w._header[word] = value
        for opener in (shmcache.attach, shmcache.open):
            with pytest.raises(shmcache.CorruptCacheError) as e:
                opener(cache_name).close()
            msg = str(e.value)
            assert repr(cache_name) in msg and f"header field {field} is " in msg and "should be" in msg, msg
            assert isinstance(e.value, ValueError)
        w._header[word] = good
        with shmcache.attach(cache_name) as r:  # restored: accepted again, nothing lost
            assert r.get(b"k" * 32) == b"kept"
    finally:
        w.close()


def _fill(name: str) -> tuple:
    w = shmcache.create(name, memory="64MiB")  # room for every key twice over: no eviction
    keys, hdr, bucket = key_pool(SEED, NKEYS)
    w.set_many(keys, make_values(hdr, 0))
    return w, keys, hdr, bucket


def test_index_offsets_at_their_maximum(cache_name, procs):
    """Every index slot's offset set to its maximum (tags kept, so every lookup follows
    them): readers miss and count, a writer repairs each bucket it meets and counts, and
    afterwards every key reads back whole at the version that writer set."""
    w, keys, hdr, bucket = _fill(cache_name)
    try:
        idx = w._index
        used = idx != 0
        idx[used] = (idx[used] & ~L.POS_MASK) | L.POS_MASK
        t = procs("table", cache_name, SEED, NKEYS)
        assert "ready" in t.recv(START_TIMEOUT)
        got = t.ask("get 0", START_TIMEOUT)  # the first lookup in a process also loads the kernels
        assert got["hits"] == 0 and got["bad"] == 0 and got["contained"] == 0, got
        assert got["corruptions"] >= NKEYS, got  # each key's lookup met its own damaged slot
        assert got["slowest"] < BOUND
        wrote = t.ask("set 1", START_TIMEOUT)
        assert wrote["corruptions"] > 0, wrote
        got = t.ask("get 1", BOUND)
        assert got["bad"] == 0, got["problem"]
        assert got["hits"] == got["at_version"] == got["entries"] >= NKEYS - got["evictions"], got
        check_table(w)
        print(f"\nreader corruptions {got['reader_corruptions']}, writer repairs {wrote['corruptions']}, "
              f"slowest call {got['slowest'] * 1e3:.1f} ms")
    finally:
        w.close()


def test_garbage_bucket_meta_and_odd_versions_under_free_locks(cache_name, procs):
    """Head, tail and counts no writer could leave (negative, unaligned, far apart, beyond
    2**62), and versions left odd with no lock holder: a reader returns within the bound
    (reading the odd buckets as they stand, counted), a writer repairs every one."""
    w, keys, hdr, bucket = _fill(cache_name)
    try:
        m = w._meta.reshape(L.NBUCKETS, L.ROW_WORDS)
        rng = np.random.default_rng(7)
        garbage = [-16, -1, 2**40 + 3, 2**62, 2**63 - 1, -(2**63), 10**9 * 16]  # wrong in any of the 4 words
        held = np.unique(bucket)  # buckets holding keys: the writer's pass meets every one
        for b in held[0::3]:
            m[b, L.M_HEAD + rng.integers(0, 4)] = garbage[rng.integers(len(garbage))]
        odd = held[1::3]
        m[odd, L.M_VERSION] |= 1
        t = procs("table", cache_name, SEED, NKEYS)
        assert "ready" in t.recv(START_TIMEOUT)
        got = t.ask("get 0", START_TIMEOUT)
        assert got["bad"] == 0, got["problem"]
        assert got["corruptions"] >= len(odd), got  # each odd bucket, counted once per call at least
        wrote = t.ask("set 1", BOUND)
        assert wrote["corruptions"] >= len(odd), wrote
        got = t.ask("get 1", BOUND)
        assert got["bad"] == 0, got["problem"]
        assert got["hits"] == got["at_version"] == got["entries"] >= NKEYS - got["evictions"], got
        check_table(w)
        t.ask("del 5000", BOUND)
        again = t.ask("get 1", BOUND)
        assert again["bad"] == 0 and again["hits"] == again["entries"] <= NKEYS - 5000, again
        assert not w.contains_many(keys[:5000]).any()
    finally:
        w.close()


@pytest.mark.parametrize("mode", ["odd", "even"])
def test_reader_returns_while_a_bucket_never_settles(cache_name, procs, mode):
    """A live process holds a bucket's lock with its version odd and moving (a writer stopped
    mid-write, or hostile), or bumps an even version without end: a lookup of keys in that
    bucket and elsewhere returns within the bound, the other keys found, that bucket's
    keys reported missing and counted. Then the holder lets go and everything reads."""
    w, keys, hdr, bucket = _fill(cache_name)
    try:
        b = int(np.bincount(bucket, minlength=L.NBUCKETS).argmax())
        mine = int((bucket == b).sum())
        hold = procs("hold", cache_name, b, mode)
        assert "ready" in hold.recv(START_TIMEOUT)
        t = procs("table", cache_name, SEED, NKEYS)
        assert "ready" in t.recv(START_TIMEOUT)
        got = t.ask("get 0", START_TIMEOUT)
        assert got["bad"] == 0, got["problem"]
        assert NKEYS - mine <= got["hits"] <= NKEYS, got
        if mode == "odd":  # a live holder with an odd version: never read as it stands
            assert got["hits"] == NKEYS - mine and got["corruptions"] >= 1, got
        assert got["slowest"] < BOUND
        hold.send("quit")
        hold.p.wait(BOUND)
        got = t.ask("get 0", BOUND)
        assert got["hits"] == got["at_version"] == NKEYS and got["bad"] == 0, got
    finally:
        w.close()


def test_stats_and_metrics_count_corruptions(cache_name):
    """stats()["corruptions"] sums the writers' rows and the readers' companion rows, and the
    Prometheus collector exports the same figure."""
    from prometheus_client import CollectorRegistry, generate_latest
    from prometheus_client.parser import text_string_to_metric_families

    from shmcache.consumer.supervisor.metrics import CacheCollector

    w, keys, hdr, bucket = _fill(cache_name)
    r = shmcache.attach(cache_name)
    registry = CollectorRegistry(auto_describe=False)
    collector = CacheCollector(cache_name)
    registry.register(collector)
    try:
        assert r.stats()["corruptions"] == 0
        b = int(bucket[0])
        e = w._index[b * w.geometry.slots:(b + 1) * w.geometry.slots]
        e[e != 0] |= L.POS_MASK  # every slot of one bucket points past its ring
        mine = keys[bucket == b]
        assert not r.contains_many(mine).any()
        s = r.stats()
        assert s["reader_corruptions"] == len(mine) == s["corruptions"]
        w.set_many(mine, make_values(hdr[bucket == b], 1))  # the first set repairs the bucket
        s = r.stats()
        assert s["corruptions"] == len(mine) + 1
        assert r.contains_many(mine).all()
        got = {smp.name: smp.value for fam in text_string_to_metric_families(generate_latest(registry).decode())
               for smp in fam.samples}
        assert got["shmcache_corruptions_total"] == s["corruptions"]
    finally:
        collector.close()
        r.close()
        w.close()


def _slot_of_tag(w, b: int, h: int) -> int:
    idx = w._index[b * w.geometry.slots:(b + 1) * w.geometry.slots]
    tag = (h >> L.TAG_SHIFT) & 0xFFFF
    (s,) = [s for s in range(len(idx)) if idx[s] != 0 and (int(idx[s]) >> L.POS_BITS) == tag]
    return b * w.geometry.slots + s


@pytest.mark.parametrize("damage_after", [True, False], ids=["whole-records-after", "damaged-head"])
@pytest.mark.parametrize("dead_after", [False, True], ids=["", "dead-record-after"])
@pytest.mark.parametrize("damaged", ["flags", "key"])
def test_a_rebuild_never_brings_back_an_older_value(cache_name, damage_after, dead_after, damaged):
    """The hardest order for a repair, two faults in one bucket: key K's index entry is
    damaged (a tag bit), so the next set of K cannot find it and appends a new record,
    leaving the old one flagged LIVE; then a record after both is damaged, and the bucket
    is rebuilt. A rebuild that stopped at the damage and kept what came before it
    indexed K's old record when the damage lay between the two: get(K) returned the value
    K had before its last set. Damage at the head with nothing whole after it (what a
    writer killed mid-write leaves, repaired when its lock is taken over) still keeps
    everything before it, also when DEAD records follow it (a deleted key's). A record
    whose flags alone are damaged (its key and length check out, a whole record follows
    it) costs its own key only: the bucket's other keys stay."""
    from shmcache.formats import wire
    from shmcache.engine import _repair

    keys = np.random.default_rng(7).integers(0, 256, (50_000, 32), np.uint8)
    hashes = wire.xxh64_keys(keys)
    b = int(hashes[0]) & (L.NBUCKETS - 1)
    same = np.flatnonzero((hashes & np.uint64(L.NBUCKETS - 1)) == b)
    (k, hk), (x, hx), (y, _), (z, _) = [(keys[i].tobytes(), int(hashes[i])) for i in same[:4]]
    w = shmcache.create(cache_name, memory="64MiB")
    try:
        g = w.geometry
        w.set_many([y], [b"y" * 80])  # another key's record before everything
        w.set_many([k], [b"1" * 80])
        w._index[_slot_of_tag(w, b, hk)] ^= np.int64(1 << L.POS_BITS)  # K's entry: one tag bit flipped
        if damage_after:
            w.set_many([x], [b"x" * 80])  # between K's two records
        w.set_many([k], [b"2" * 80])  # cannot find K's entry: a new record; the old one stays LIVE
        assert w.get_many([k]) == [b"2" * 80]
        if not damage_after:
            w.set_many([x], [b"x" * 80])  # the newest LIVE record of the bucket
        off = (int(w._index[_slot_of_tag(w, b, hx)]) & L.POS_MASK) - 1
        if dead_after:
            w.set_many([z], [b"z" * 80])
            w.delete_many([z])  # a DEAD record after X's
        if damaged == "flags":
            w._ring64[(b * g.ring + off) // 8 + 1] |= np.int64(7 << 32)  # neither LIVE, DEAD nor PAD
        else:  # one key byte and the flags: the record cannot say whose it was
            w._ring8[b * g.ring + off + L.RECORD_HEADER + 5] ^= 0x10
            w._ring64[(b * g.ring + off) // 8 + 1] |= np.int64(7 << 32)
        if damage_after:
            w.set_many([x], [b"X" * 80])  # meets X's damaged record: the bucket is rebuilt
            assert w.stats()["corruptions"] >= 1
            assert w.get_many([k]) == [b"2" * 80], "the rebuild brought back K's older value (or lost its newest)"
            assert w.get_many([x]) == [b"X" * 80]
            if damaged == "flags":
                assert w.get_many([y]) == [b"y" * 80], "a damaged flags word of X's record cost another key"
            else:
                assert w.get_many([y])[0] in (None, b"y" * 80)
        else:  # as a lock takeover from a writer killed while it wrote X repairs the bucket
            a = w.segment_arrays()
            a.meta[b * L.ROW_WORDS + L.M_LOCK] = w._me
            _repair.repair_bucket(a.meta, a.index, a.ring8, a.ring64, a.geo, b)
            assert w.get_many([k, y, x]) == [b"2" * 80, b"y" * 80, None]
    finally:
        w.close()
        shmcache.destroy(cache_name)


@pytest.mark.parametrize("orphan", ["at-head", "unaligned", "old-record-at-head", "delete"])
def test_a_damaged_slot_of_the_key_never_hides_its_newest_value(cache_name, orphan):
    """Found by test_fuzz at 4000 flips (3 runs in 8): a slot carrying key K's tag, left
    by damage, lies before K's real slot on K's probe path and points where K's next
    record is written (the head), or 7 bytes past it: an unaligned offset read the
    record through the words it truncates to. The writer wrote the new record first and
    looked for K's slot after: it took the damaged slot for K's, marked its own new
    record DEAD through it, and K's real slot kept giving readers the older value.
    "old-record-at-head": K's older record, LIVE-flagged by damage, lies at the head
    (space behind the tail, reused next): the slot found points outside the live records,
    a damage to repair, not K's record. "delete": the same slot met by a delete, which
    then removed it and left K readable."""
    from shmcache.formats import wire

    keys = np.random.default_rng(11).integers(0, 256, (50_000, 32), np.uint8)
    hashes = wire.xxh64_keys(keys)
    b = int(hashes[0]) & (L.NBUCKETS - 1)
    same = np.flatnonzero((hashes & np.uint64(L.NBUCKETS - 1)) == b)
    (k, hk), (y, _) = [(keys[i].tobytes(), int(hashes[i])) for i in same[:2]]
    w = shmcache.create(cache_name, memory="64MiB")
    try:
        g = w.geometry
        w.set_many([y, k], [b"y" * 80, b"1" * 80])
        real = _slot_of_tag(w, b, hk)
        home = b * g.slots + ((hk >> L.BUCKET_BITS) & (g.slots - 1))
        after = b * g.slots + (real - b * g.slots + 1) % g.slots
        assert real == home and w._index[after] == 0
        head = int(w._meta[b * L.ROW_WORDS + L.M_HEAD]) % g.ring
        if orphan in ("old-record-at-head", "delete"):  # K's record, as an earlier lap left it there
            ko = (int(w._index[real]) & L.POS_MASK) - 1
            size = L.record_size(g.key_size, 80)
            w._ring8[b * g.ring + head:b * g.ring + head + size] = w._ring8[b * g.ring + ko:b * g.ring + ko + size]
        w._index[after] = w._index[real]  # K's real slot one further on its probe path
        tag = (hk >> L.TAG_SHIFT) & 0xFFFF
        w._index[real] = np.int64((tag << L.POS_BITS) | (head + 1 + (7 if orphan == "unaligned" else 0)))
        if orphan == "delete":
            w.delete_many([k])
            assert w.get_many([k, y]) == [None, b"y" * 80], "the delete removed the damaged slot, not K"
        else:
            w.set_many([k], [b"2" * 80])
            assert w.get_many([k, y]) == [b"2" * 80, b"y" * 80], "K's older value (or none) after its last set"
        if orphan != "at-head":  # the others are damage a writer can see: counted and repaired
            assert w.stats()["corruptions"] >= 1
    finally:
        w.close()
        shmcache.destroy(cache_name)
