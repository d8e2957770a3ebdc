"""Misuse at the edge raises an error naming the cache and what was wrong; nothing stored is lost."""

from __future__ import annotations

import os
import uuid

import numpy as np
import pytest

import shmcache
from shmcache.engine.units import parse_bytes


@pytest.fixture
def w():
    name = f"t-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    with shmcache.create(name, memory="40MiB", max_value=100) as writer:
        writer.set(b"k" * 32, b"kept")
        yield writer
    shmcache.destroy(name)


def test_wrong_key_length_names_cache_and_key(w):
    with pytest.raises(shmcache.KeySizeError, match=rf"cache '{w.name}': key 1 is 31 bytes; this cache's keys are 32 bytes"):
        w.set_many([b"a" * 32, b"b" * 31], [b"x", b"y"])
    with pytest.raises(shmcache.KeySizeError, match=r"\(n, 32\) uint8 array"):
        w.get_many_packed(np.zeros((3, 16), np.uint8))
    with pytest.raises(ValueError):  # KeySizeError is a ValueError
        w.get(b"short")
    assert w.get(b"k" * 32) == b"kept"


def test_value_over_limit(w):
    with pytest.raises(shmcache.ValueTooLargeError, match=r"value 1 is 101 bytes; the limit is 100 \(max_value\)"):
        w.set_many([b"a" * 32, b"b" * 32], [b"x", b"y" * 101])
    assert w.get(b"a" * 32) is None, "a rejected batch applies nothing"
    assert w.get(b"k" * 32) == b"kept"


def test_mismatched_lengths_and_types(w):
    with pytest.raises(ValueError, match="2 keys but 1 values"):
        w.set_many([b"a" * 32, b"b" * 32], [b"x"])
    with pytest.raises(TypeError, match="value 0 is str"):
        w.set_many([b"a" * 32], ["text"])
    with pytest.raises(TypeError, match="sequence of keys"):
        w.get_many(b"a" * 32)
    with pytest.raises(ValueError, match="offsets must have 3 entries"):
        w.set_many(np.zeros((2, 32), np.uint8), (np.array([0, 1]), np.zeros(1, np.uint8)))
    with pytest.raises(ValueError, match="actions of shape"):
        w.apply([b"a" * 32], np.array([0, 0], np.uint8), [b"x"])


def test_any_bytes_like_key_or_value_is_taken_by_its_bytes(w):
    """bytes, bytearray and memoryviews (multi-byte items, strided) all mean their bytes; a key of
    the right element count but the wrong byte count, or a non-bytes item, is refused by index."""
    rng = np.random.default_rng(5)
    raw = [rng.bytes(32) for _ in range(4)]
    vals = [rng.bytes(40) for _ in range(4)]
    keys = [raw[0], bytearray(raw[1]), memoryview(np.frombuffer(raw[2], np.int16)),  # 16 items, 32 bytes
            memoryview(np.frombuffer(raw[3] * 2, np.uint8))[::2]]  # strided: every other byte
    w.set_many(keys, [vals[0], bytearray(vals[1]), memoryview(np.frombuffer(vals[2], np.int32)), vals[3]])
    strided_key = bytes(raw[3] * 2)[::2]
    assert w.get_many([raw[0], raw[1], raw[2], strided_key]) == vals
    assert w.get_many(k for k in [raw[1], raw[0]]) == [vals[1], vals[0]]  # any iterable
    with pytest.raises(shmcache.KeySizeError, match="key 1 is 64 bytes"):
        w.get_many([raw[0], memoryview(np.zeros(32, np.uint16))])
    with pytest.raises(shmcache.KeySizeError, match="key 2 is str"):
        w.get_many([raw[0], raw[1], "x" * 32])
    with pytest.raises(TypeError, match="value 1 is int"):
        w.set_many(raw[:2], [b"v", 7])
    assert w.get(b"k" * 32) == b"kept"


def test_memory_too_small():
    with pytest.raises(shmcache.MemoryTooSmallError, match=r"memory=8.0 MiB is too small .* at least 3[0-9].0 MiB is needed"):
        shmcache.create(f"t-{os.getpid()}-small", memory="8MiB")
    assert not shmcache.exists(f"t-{os.getpid()}-small")


@pytest.mark.parametrize("bad", ["lots", "-5MiB", 0, "12 parsecs", True, "1" + "0" * 400, 1 << 63, "\u0661MiB"])
def test_bad_memory_values(bad):
    with pytest.raises(ValueError, match="memory="):
        parse_bytes(bad)


@pytest.mark.parametrize("kw, shown", [({"key_size": 0}, "key_size=0"), ({"key_size": True}, "key_size=True"),
                                       ({"key_size": 32.0}, "key_size=32.0"), ({"max_value": True}, "max_value=True"),
                                       ({"max_value": -1}, "max_value=-1"), ({"max_value": 100.5}, "max_value=100.5"),
                                       ({"mode": 0o777}, "mode=0o777"), ({"mode": True}, "mode=True")])
def test_bad_create_arguments(kw, shown):
    """key_size=True was a 1-byte-key cache: bools and floats are refused, not taken as ints."""
    name = f"t-{os.getpid()}-args"
    with pytest.raises(ValueError, match=f"cache '{name}': {shown} must"):
        shmcache.create(name, memory="34MiB", **kw)
    assert not shmcache.exists(name)


def test_numpy_integers_are_fine_arguments():
    name = f"t-{os.getpid()}-npargs"
    with shmcache.create(name, memory="34MiB", key_size=np.int64(20), max_value=np.uint16(100)) as w:
        assert (w.key_size, w.max_value) == (20, 100)
    shmcache.destroy(name)


def test_more_memory_than_dev_shm_has_is_refused_naming_both():
    name = f"t-{os.getpid()}-huge"
    with pytest.raises(shmcache.CacheSpaceError, match=rf"cache '{name}': memory=1000.0 TiB .* does not fit in "
                                                         r"/dev/shm, which has .* free") as e:
        shmcache.create(name, memory="1000TiB")
    assert isinstance(e.value, MemoryError)
    assert not shmcache.exists(name)


@pytest.mark.parametrize("actions", [np.array([0, 256]), [0, 256], np.array([0, 2], np.uint8), [0, -1]])
def test_an_action_other_than_add_or_delete_is_refused(w, actions):
    """256 was cast to uint8 and applied as an ADD; 2 was skipped silently."""
    keys = [b"a" * 32, b"b" * 32]
    with pytest.raises(ValueError, match=rf"cache '{w.name}': action 1 is -?[0-9]+; an action is 0 \(ADD\) or 1"):
        w.apply(keys, actions, [b"x", b"y"])
    data = np.frombuffer(b"xy", np.uint8)
    with pytest.raises(ValueError, match=r"action 1 is"):
        w.apply(np.frombuffer(b"".join(keys), np.uint8).reshape(2, 32), np.asarray(actions),
                (np.array([0, 1]), np.array([1, 1]), data))
    assert w.get_many(keys) == [None, None], "a refused batch applies nothing"
    assert w.stats()["sets"] == 1


@pytest.mark.parametrize("actions", [np.array([0.0, 1.0]), np.array([False, True]), [0.5, 1]])
def test_actions_of_another_type_are_refused(w, actions):
    with pytest.raises(TypeError, match=rf"cache '{w.name}': actions \(0 ADD, 1 DELETE\) must be integers"):
        w.apply([b"a" * 32, b"b" * 32], actions, [b"x", b"y"])
    assert w.get(b"a" * 32) is None


def test_float_value_offsets_are_refused_not_truncated(w):
    keys = [b"a" * 32, b"b" * 32]
    data = np.frombuffer(b"abcdef", np.uint8)
    with pytest.raises(TypeError, match=rf"cache '{w.name}': value offsets must be integers, got an array of float64"):
        w.set_many(keys, (np.array([0.0, 2.5, 6.0]), data))
    with pytest.raises(TypeError, match="value starts must be integers"):
        w.apply(np.frombuffer(b"".join(keys), np.uint8).reshape(2, 32), np.zeros(2, np.uint8),
                (np.array([0.0, 2.5]), np.array([2, 3]), data))
    with pytest.raises(TypeError, match="value lengths must be integers"):
        w.apply(np.frombuffer(b"".join(keys), np.uint8).reshape(2, 32), np.zeros(2, np.uint8),
                (np.array([0, 2]), np.array([2.5, 3.0]), data))
    with pytest.raises(TypeError, match="value data must be bytes"):
        w.set_many(keys, (np.array([0, 1, 2]), np.array([b"a", "b"], dtype=object)))
    assert w.get_many(keys) == [None, None]
    w.set_many(keys, (np.array([0, 2, 6], np.uint32), data))  # any integer dtype is fine
    assert w.get_many(keys) == [b"ab", b"cdef"]


_WRAPPING_SPAN = """
    import sys
    import numpy as np
    import shmcache
    w = shmcache.open(sys.argv[1])
    data = np.zeros(64, np.uint8)
    try:  # start + len wraps past 2**63 to a negative number, which looked inside data
        w.apply(np.zeros((1, 32), np.uint8), np.zeros(1, np.uint8), (np.array([2**63 - 10]), np.array([20]), data))
    except ValueError as e:
        print("refused", type(e).__name__, e)
    else:
        print("applied")
"""


def test_a_span_whose_end_wraps_around_is_refused(w):
    """In a child: before the fix, the kernel read 2**63 bytes past data (a segfault)."""
    import subprocess
    import sys
    import textwrap

    res = subprocess.run([sys.executable, "-c", textwrap.dedent(_WRAPPING_SPAN), w.name], capture_output=True,
                         text=True, timeout=90)
    assert res.returncode == 0, (res.returncode, res.stderr)
    assert res.stdout.startswith("refused ValueTooLargeError") and "outside data (of 64 bytes)" in res.stdout, res.stdout
    assert w.get(b"\0" * 32) is None


def test_exist_ok_with_other_geometry(w):
    with pytest.raises(shmcache.GeometryMismatchError, match="key_size=32, max_value=100"):
        shmcache.create(w.name, memory="40MiB", max_value=4096, exist_ok=True)
    with shmcache.create(w.name, memory="40MiB", max_value=100, exist_ok=True) as again:
        assert again.get(b"k" * 32) == b"kept"


def test_exist_ok_keeps_the_memory_and_max_value_there(w):
    """An existing cache is opened as it is: `memory` is for creating one, so a size too
    small for the max_value asked is no error, and max_value=None takes the cache's own."""
    size = w.stats()["memory"]
    with pytest.raises(shmcache.MemoryTooSmallError):  # what 1 MiB means for a new cache
        shmcache.create(f"{w.name}-new", memory="1MiB", exist_ok=True)
    for kw in ({"max_value": 100}, {"max_value": None}):
        with shmcache.create(w.name, memory="1MiB", exist_ok=True, **kw) as again:
            assert again.get(b"k" * 32) == b"kept" and again.max_value == 100 and again.stats()["memory"] == size
    with pytest.raises(shmcache.GeometryMismatchError, match="key_size=32, max_value=100"):
        shmcache.create(w.name, memory="1MiB", max_value=None, key_size=20, exist_ok=True)


def test_closed_handle(w):
    r = shmcache.attach(w.name)
    r.close()
    r.close()  # idempotent
    with pytest.raises(shmcache.ClosedError, match="closed"):
        r.get(b"k" * 32)

