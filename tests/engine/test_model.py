"""The table against a dict model under random interleavings (hypothesis).

The cache is the smallest allowed, and most keys share two buckets, so probing,
backward-shift deletes, ring wrap-around and FIFO evictions happen all the time.
With evictions the model is "what the table may hold": every hit must be the
model's current value (never a stale or deleted one), a deleted key always
misses, and a model key missing from the table must have been evicted.
"""

from __future__ import annotations

import os
import uuid

import numpy as np
import pytest
import xxhash
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

import shmcache
from shmcache.engine import layout as L


def _keys_in_bucket(bucket: int, count: int, seed: int) -> list[bytes]:
    """count random 32-byte keys whose xxh64 (the independent library's) puts them in bucket."""
    rng = np.random.default_rng(seed)
    out: list[bytes] = []
    while len(out) < count:
        block = rng.bytes(32 << 16)  # drawn 65,536 keys at a time: one draw a key is most of the cost
        out += [k for k in (block[i:i + 32] for i in range(0, len(block), 32))
                if xxhash.xxh64_intdigest(k) % L.NBUCKETS == bucket]
    return out[:count]


_rng = np.random.default_rng(3)
POOL = _keys_in_bucket(5, 24, 1) + _keys_in_bucket(77, 12, 2) + [_rng.bytes(32) for _ in range(12)]
assert len(set(POOL)) == len(POOL)
key_st = st.sampled_from(POOL)
value_st = st.binary(min_size=0, max_size=1500)


class TableModel(RuleBasedStateMachine):
    def __init__(self):
        super().__init__()
        self.name = f"model-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        self.w = shmcache.create(self.name, memory="34MiB", max_value=2048)
        self.r = shmcache.attach(self.name)
        self.model: dict[bytes, bytes] = {}

    def teardown(self):
        self.r.close()
        self.w.close()
        shmcache.destroy(self.name)

    @rule(key=key_st, value=value_st)
    def set_one(self, key, value):
        self.w.set(key, value)
        self.model[key] = value

    @rule(items=st.lists(st.tuples(key_st, value_st), min_size=1, max_size=30))
    def set_many(self, items):
        self.w.set_many([k for k, _ in items], [v for _, v in items])
        for k, v in items:  # later entries of a batch win, as on the wire
            self.model[k] = v

    @rule(key=key_st)
    def delete_one(self, key):
        self.w.delete(key)
        self.model.pop(key, None)

    @rule(ops=st.lists(st.tuples(key_st, st.sampled_from([0, 1]), value_st), min_size=1, max_size=30))
    def apply_mixed(self, ops):
        keys = [k for k, _, _ in ops]
        actions = np.array([a for _, a, _ in ops], np.uint8)
        values = [v if a == 0 else b"" for _, a, v in ops]
        self.w.apply(keys, actions, values)
        for k, a, v in ops:
            if a == 0:
                self.model[k] = v
            else:
                self.model.pop(k, None)

    @precondition(lambda self: self.model)
    @rule(data=st.data())
    def get_present(self, data):
        key = data.draw(st.sampled_from(sorted(self.model)))
        got = self.r.get(key)
        assert got is None or got == self.model[key]

    @invariant()
    def table_agrees_with_model(self):
        packed = self.r.get_many_packed(POOL)
        values = packed.to_list()
        evicted = 0
        for k, v in zip(POOL, values):
            if k not in self.model:
                assert v is None, "a deleted or never-set key was found"
            elif v is None:
                evicted += 1
            else:
                assert v == self.model[k], "a hit returned a stale value"
        s = self.r.stats()
        assert s["entries"] == int(packed.found.sum())
        assert evicted == 0 or s["evictions"] > 0
        assert np.array_equal(self.r.contains_many(POOL), packed.found)


TableModel.TestCase.settings = settings(
    max_examples=int(os.environ.get("SHMCACHE_MODEL_EXAMPLES", "60")),
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
test_table_model = TableModel.TestCase


def test_no_eviction_table_equals_model(cache_name):
    rng = np.random.default_rng(7)
    n = 50_000
    keys = rng.integers(0, 256, (n, 32), dtype=np.uint8)
    lens = rng.integers(0, 300, n)
    offsets = np.concatenate([[0], np.cumsum(lens)])
    data = rng.integers(0, 256, offsets[-1], dtype=np.uint8)
    with shmcache.create(cache_name, memory="128MiB") as w, shmcache.attach(cache_name) as r:
        w.set_many(keys, (offsets, data))
        w.delete_many(keys[::3])
        packed = r.get_many_packed(keys)
        assert not packed.found[::3].any()
        keep = np.ones(n, bool)
        keep[::3] = False
        assert packed.found[keep].all()
        for i in np.flatnonzero(keep)[:2000]:
            assert packed.data[packed.offsets[i]:packed.offsets[i + 1]].tobytes() == data[offsets[i]:offsets[i + 1]].tobytes()
        s = r.stats()
        assert s["entries"] == keep.sum() and s["evictions"] == 0 and s["deletes"] == n - keep.sum()


def test_apply_twice_is_idempotent(cache_name):
    """Invariant 6: re-applying a message (at-least-once delivery) leaves the same table."""
    rng = np.random.default_rng(11)
    keys = [rng.bytes(32) for _ in range(500)]
    ops_keys = keys + keys[:200] + keys[100:150]
    actions = np.array([0] * 500 + [1] * 200 + [0] * 50, np.uint8)
    values = [rng.bytes(int(rng.integers(1, 200))) for _ in ops_keys]
    with shmcache.create(cache_name, memory="64MiB") as w:
        w.apply(ops_keys, actions, values)
        once = w.get_many(keys)
        w.apply(ops_keys, actions, values)
        assert w.get_many(keys) == once
        assert w.stats()["entries"] == sum(v is not None for v in once) == 300 + 50


def test_order_within_a_batch(cache_name):
    k = b"k" * 32
    with shmcache.create(cache_name, memory="40MiB") as w:
        w.apply([k, k, k], np.array([0, 1, 0], np.uint8), [b"a", b"", b"c"])
        assert w.get(k) == b"c"
        w.apply([k, k], np.array([0, 1], np.uint8), [b"x", b""])
        assert w.get(k) is None


@pytest.mark.parametrize("key_size", [1, 7, 20, 32, 33, 64])
def test_key_sizes(cache_name, key_size):
    rng = np.random.default_rng(key_size)
    universe = list(dict.fromkeys(rng.bytes(key_size) for _ in range(600)))  # distinct keys
    keys, absent = universe[: len(universe) // 2], universe[len(universe) // 2:]
    values = [rng.bytes(int(rng.integers(0, 100))) for _ in keys]
    with shmcache.create(cache_name, memory="40MiB", key_size=key_size) as w, shmcache.attach(cache_name) as r:
        w.set_many(keys, values)
        assert r.get_many(keys) == values
        assert r.get_many(absent) == [None] * len(absent)


def test_eviction_is_fifo_and_counted(cache_name):
    """One bucket filled far past its ring: the newest entries survive, the oldest go."""
    keys = _keys_in_bucket(9, 120, 99)
    with shmcache.create(cache_name, memory="34MiB", max_value=4096) as w:
        for k in keys:
            w.set(k, k * 30)  # 960 B values: a handful fit in one bucket's ring
        found = w.contains_many(keys)
        assert found[-1] and not found[0]
        first_kept = int(np.argmax(found))
        assert found[first_kept:].all(), "survivors must be the most recent keys"
        s = w.stats()
        assert s["evictions"] == len(keys) - found.sum() > 0
        assert s["bytes_used"] <= w.geometry.ring


def test_memory_is_fixed(cache_name):
    with shmcache.create(cache_name, memory="40MiB") as w:
        size = os.stat(f"/dev/shm/{cache_name}").st_size
        rng = np.random.default_rng(0)
        for _ in range(5):
            w.set_many(rng.integers(0, 256, (20_000, 32), dtype=np.uint8), [b"v" * 200] * 20_000)
        assert os.stat(f"/dev/shm/{cache_name}").st_size == size == w.geometry.size
        assert size <= 40 * 2**20
        assert w.stats()["evictions"] > 0


def test_packed_to_arrow(cache_name):
    pa = pytest.importorskip("pyarrow")
    keys = [bytes([i]) * 32 for i in range(10)]
    with shmcache.create(cache_name, memory="40MiB") as w:
        w.set_many(keys[::2], [b"v%d" % i for i in range(5)])
        arr = w.get_many_packed(keys).to_arrow()
        assert isinstance(arr, pa.BinaryArray)
        assert arr.to_pylist() == [b"v0", None, b"v1", None, b"v2", None, b"v3", None, b"v4", None]
        assert arr.null_count == 5
