"""Wire v2's verified hashes go to the table (consumer/worker/loop.py apply_batch): every v2 key
is hashed once, by the decoder, and the table that results is the very one the engine
makes hashing the keys itself. Who is trusted: the writer takes hashes as given; only the
decoder's, each checked against its key, are passed (a message with a wrong one is not
taken as v2). No broker: messages are encoded, decoded and applied in this process."""

import uuid

import numpy as np
import pytest

import shmcache
from shmcache.formats import wire
from shmcache.consumer.worker.loop import apply_batch


@pytest.fixture
def caches():
    names = [f"t-hashes-{uuid.uuid4().hex[:10]}" for _ in range(3)]
    handles = [shmcache.create(n, memory="40MiB", max_value=256) for n in names]
    try:
        yield handles
    finally:
        for h in handles:
            h.close()
        for n in names:
            shmcache.destroy(n)


def _table_bytes(w) -> bytes:
    """The table itself (bucket meta, index, rings): everything after the control area."""
    with open(f"/dev/shm/{w.name}", "rb") as f:
        f.seek(w.geometry.meta_off)
        return f.read()


def _batch(rng, n: int, deletes: bool):
    keys = rng.integers(0, 256, (n, 32), np.uint8)
    if deletes:  # some keys come back as DELETEs later in the same message
        keys[n // 2:n // 2 + n // 8] = keys[:n // 8]
    actions = np.zeros(n, np.uint8)
    if deletes:
        actions[n // 2:n // 2 + n // 8] = wire.DELETE
    lens = np.where(actions == wire.ADD, rng.integers(0, 200, n), 0)
    values = [rng.bytes(int(x)) for x in lens]
    return keys, actions, values


def test_a_v2_batch_applied_with_its_hashes_makes_the_identical_table(caches):
    with_hashes, without = caches[:2]
    keys, actions, values = _batch(np.random.default_rng(7), 6000, deletes=True)
    batch = wire.decode(wire.encode_v2(keys, actions, values), max_value=256)
    assert batch.version == 2 and batch.error is None and len(batch.actions) == 6000
    # the claim: v2's hash is the table's key hash (xxh64, seed 0, of the 32-byte key)
    assert (batch.hashes == wire.xxh64_keys(batch.keys)).all()
    apply_batch(with_hashes, batch)  # what a worker does
    without.apply(batch.keys, batch.actions, (batch.value_starts, batch.value_lens, batch.data))
    assert with_hashes.stats()["entries"] == without.stats()["entries"] > 0
    assert _table_bytes(with_hashes) == _table_bytes(without)
    present = batch.actions == wire.ADD
    present[:6000 // 8] = False  # deleted again later in the message
    assert with_hashes.contains_many(keys[present]).all()
    assert not with_hashes.contains_many(keys[:6000 // 8]).any()


def test_a_message_with_one_wrong_hash_passes_no_hashes_and_files_every_key_where_it_is_found(caches):
    w = caches[2]
    n = 500
    keys, actions, values = _batch(np.random.default_rng(8), n, deletes=False)
    msg = bytearray(wire.encode_v2(keys, actions, values))
    i = 317  # an entry in the middle: its xxh64 field flipped
    at = wire.V2_HEADER + sum(wire.V2_ENTRY_HEADER + len(v) for v in values[:i])
    assert int.from_bytes(msg[at:at + 8], "little") == int(wire.xxh64_keys(keys[i:i + 1])[0])
    msg[at] ^= 0xFF
    batch = wire.decode(bytes(msg), max_value=256)
    assert batch.version != 2 and batch.hashes is None  # not v2: nothing unverified reaches the table
    apply_batch(w, batch)  # the worker's path: the engine hashes whatever this parse yielded
    adds = batch.keys[batch.actions == wire.ADD]
    assert w.contains_many(adds).all()  # each key in the bucket its own hash names


def test_hashes_of_the_wrong_shape_or_type_are_refused(caches):
    w = caches[0]
    keys = np.random.default_rng(9).integers(0, 256, (4, 32), np.uint8)
    good = wire.xxh64_keys(keys)
    for bad in (good[:3], good.astype(np.float64), list(good), good.reshape(2, 2)):
        with pytest.raises(ValueError, match=rf"cache '{w.name}': hashes must be a uint64 array of shape \(4,\)"):
            w.apply(keys, np.zeros(4, np.uint8), [b"x"] * 4, hashes=bad)
    assert not w.contains_many(keys).any()
    w.apply(keys, np.zeros(4, np.uint8), [b"x"] * 4, hashes=good)
    assert w.get_many(keys) == [b"x"] * 4
