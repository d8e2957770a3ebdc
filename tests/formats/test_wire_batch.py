"""wire_batch.decode_many: a whole consume() batch decoded at once must give exactly what
wire.decode gives message by message, or None (then the worker decodes one by one)
whenever a message is damaged, is not what its header claims, or the versions mix."""

import numpy as np
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from shmcache.formats import wire, wire_batch

PROPERTY = settings(deadline=None, max_examples=150, suppress_health_check=[HealthCheck.too_slow])


def _entries(rng, n, unknown=False):
    keys = rng.integers(0, 256, (n, 32), np.uint8)
    actions = rng.choice([wire.ADD, wire.DELETE, 7] if unknown else [wire.ADD, wire.DELETE], n).astype(np.uint8)
    values = [b"" if a == wire.DELETE else rng.bytes(int(rng.integers(0, 150))) for a in actions]
    return keys, actions, values


def _v1_767_whose_v2_framing_holds(rng) -> bytes:
    """A clean v1 message of 767 entries (header FF 02 00 00) whose bytes also frame as a
    v2 message of one entry ending exactly at the end: only the sent xxh64 tells them apart."""
    keys = rng.integers(0, 256, (767, 32), np.uint8)
    keys[0, :4] = np.frombuffer((1).to_bytes(4, "little"), np.uint8)
    contents = [b"c" * 16] * 767
    n = len(wire.encode_v1(keys, np.zeros(767, np.uint8), contents))
    first = bytearray(b"c" * 16)
    first[48 - 41] = 0
    first[49 - 41:53 - 41] = (n - 53).to_bytes(4, "little")
    contents[0] = bytes(first)
    return wire.encode_v1(keys, np.zeros(767, np.uint8), contents)


KINDS = ["v1", "v1-unknown", "v2", "v2-unknown", "v1-empty", "v2-empty", "v1-767-v2-framing", "truncated",
         "trailing", "v2-wrong-hash", "none", "short", "over-max-value"]


def _message(kind: str, seed: int):
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 40))
    if kind in ("v1", "v1-unknown", "truncated", "trailing", "over-max-value"):
        msg = wire.encode_v1(*_entries(rng, n, unknown=kind == "v1-unknown"))
        if kind == "truncated":
            msg = msg[:int(rng.integers(4, len(msg)))]
        elif kind == "trailing":
            msg += b"\x00"
        elif kind == "over-max-value":
            keys = rng.integers(0, 256, (1, 32), np.uint8)
            msg = wire.encode_v1(keys, [wire.ADD], [bytes(300)])
        return msg
    if kind in ("v2", "v2-unknown", "v2-wrong-hash"):
        msg = bytearray(wire.encode_v2(*_entries(rng, n, unknown=kind == "v2-unknown")))
        if kind == "v2-wrong-hash":
            msg[wire.V2_HEADER] ^= 1  # the first entry's sent xxh64
        return bytes(msg)
    if kind == "v1-empty":
        return wire.encode_v1(np.zeros((0, 32), np.uint8), [], [])
    if kind == "v2-empty":
        return wire.encode_v2(np.zeros((0, 32), np.uint8), [], [])
    if kind == "v1-767-v2-framing":
        return _v1_767_whose_v2_framing_holds(rng)
    if kind == "short":
        return b"\x01\x00"
    return None  # a tombstone on a txmeta topic


def _rows(b):
    return [(bytes(b.keys[i]), int(b.actions[i]), b.value(i)) for i in range(len(b))]


@PROPERTY
@given(st.lists(st.tuples(st.sampled_from(KINDS), st.integers(0, 2**31)), min_size=1, max_size=8))
def test_decode_many_equals_decoding_one_by_one_or_declines(spec):
    msgs = [_message(kind, seed) for kind, seed in spec]
    one = [wire.decode(m if m is not None else b"", max_value=256) for m in msgs]
    got = wire_batch.decode_many(msgs, wire_batch.Scratch(), max_value=256)
    clean = all(b.error is None for b in one) and len({b.version for b in one}) == 1
    if not clean:
        assert got is None
        return
    if got is None:  # declined a clean batch: only a clean v1 that frames as v2 may cause that
        assert any(kind == "v1-767-v2-framing" for kind, _ in spec)
        return
    assert got.error is None and got.version == one[0].version
    assert _rows(got) == [r for b in one for r in _rows(b)]
    assert got.unknown_actions == sum(b.unknown_actions for b in one)
    assert got.delete_payloads == sum(b.delete_payloads for b in one)
    assert got.declared == sum(b.declared for b in one)
    if got.version == 2:
        assert np.array_equal(got.hashes, np.concatenate([b.hashes for b in one]))
        assert np.array_equal(got.hashes, wire.xxh64_keys(got.keys))
    else:
        assert got.hashes is None


def test_a_bad_message_anywhere_declines_the_whole_batch():
    rng = np.random.default_rng(1)
    good = [wire.encode_v1(*_entries(rng, 50)) for _ in range(5)]
    for i in range(len(good) + 1):
        bad = good[:i] + [good[0][:-1]] + good[i:]  # truncated by one byte
        assert wire_batch.decode_many(bad, wire_batch.Scratch()) is None
    assert len(wire_batch.decode_many(good, wire_batch.Scratch())) == 250


def test_v1_and_v2_mixed_decline_and_wrong_hash_declines():
    rng = np.random.default_rng(2)
    v1, v2 = wire.encode_v1(*_entries(rng, 5)), wire.encode_v2(*_entries(rng, 5))
    assert wire_batch.decode_many([v1, v2], wire_batch.Scratch()) is None
    assert wire_batch.decode_many([v2, v2], wire_batch.Scratch()).version == 2
    wrong = bytearray(v2)
    wrong[wire.V2_HEADER + 3] ^= 0x40
    assert wire.decode(bytes(wrong)).error is not None
    assert wire_batch.decode_many([v2, bytes(wrong)], wire_batch.Scratch()) is None


def test_the_scratch_is_reused_and_grows():
    rng = np.random.default_rng(3)
    s = wire_batch.Scratch()
    small = [wire.encode_v1(*_entries(rng, 3))]
    big = [wire.encode_v1(*_entries(rng, 30)) for _ in range(4)]
    a = wire_batch.decode_many(small, s)
    assert _rows(a) == _rows(wire.decode(small[0]))
    b = wire_batch.decode_many(big, s)
    assert _rows(b) == [r for m in big for r in _rows(wire.decode(m))]
    assert s.buf.shape[0] >= sum(map(len, big)) and not b.data.flags.writeable


def test_entries_of_the_smallest_size_fill_the_rows_exactly():
    """The Scratch sizes its rows for one entry per 37 bytes (a v1 entry with no content):
    messages made only of such entries need every row, and a fresh Scratch grows to them."""
    rng = np.random.default_rng(5)
    msgs = []
    for n in (1, 37, 1000):
        keys = rng.integers(0, 256, (n, 32), np.uint8)
        msgs.append(wire.encode_v1(keys, rng.choice([wire.ADD, wire.DELETE], n).astype(np.uint8), [b""] * n))
    s = wire_batch.Scratch()
    for batch in (msgs, msgs[2:], msgs[:1], msgs):
        got = wire_batch.decode_many(batch, s)
        assert _rows(got) == [r for m in batch for r in _rows(wire.decode(m))]
    assert s.actions.shape[0] == sum(map(len, msgs)) // 37 == 1038


def test_a_v2_batch_carries_its_verified_hashes_to_the_table():
    """The worker's path end to end without a broker: a consume() batch of v2 messages,
    decoded at once, reaches the writer with every key's verified xxh64 (so the table
    does not hash them again) and makes the very table that decoding and applying the
    messages one by one makes."""
    import uuid

    import shmcache
    from shmcache.consumer.worker.loop import apply_batch

    rng = np.random.default_rng(4)
    msgs = [wire.encode_v2(*_entries(rng, 300)) for _ in range(6)]
    names = [f"t-wirebatch-{uuid.uuid4().hex[:10]}" for _ in range(2)]
    at_once, one_by_one = (shmcache.create(n, memory="40MiB", max_value=256) for n in names)
    try:
        b = wire_batch.decode_many(msgs, wire_batch.Scratch(), max_value=256)
        assert b.version == 2 and np.array_equal(b.hashes, wire.xxh64_keys(b.keys))
        apply_batch(at_once, b)
        for m in msgs:
            apply_batch(one_by_one, wire.decode(m, max_value=256))
        tables = []
        for w in (at_once, one_by_one):
            with open(f"/dev/shm/{w.name}", "rb") as f:
                f.seek(w.geometry.meta_off)
                tables.append(f.read())
        assert at_once.stats()["entries"] > 0 and tables[0] == tables[1]
    finally:
        for w in (at_once, one_by_one):
            w.close()
        for n in names:
            shmcache.destroy(n)


def test_a_released_scratch_decodes_the_same_again():
    """A worker releases its scratch when it goes idle (consumer/worker/loop.py): what it
    held is given back, and the next burst decodes into it as before."""
    rng = np.random.default_rng(3)
    msgs = [wire.encode_v1(*_entries(rng, 200)) for _ in range(20)]
    s = wire_batch.Scratch()
    before = _rows(wire_batch.decode_many(msgs, s))
    held = s.release()
    assert held >= sum(len(m) for m in msgs) and s.buf.nbytes == s.keys.nbytes == 0
    assert _rows(wire_batch.decode_many(msgs, s)) == before and s.buf.nbytes > 0
