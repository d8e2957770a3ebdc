"""engine/_input.py (lists of bytes): the one-pass proof that all items share one length must never accept a
list whose lengths only sum right, nor count a multi-byte memoryview by items; the compiled
path (engine/_pyobjects.py) reads lists of bytes exactly as b"".join would (a set_many's
two lists too, in one pass), and hands anything else to the general path, which names
what is wrong."""

from __future__ import annotations

import array

import numpy as np
import pytest

import shmcache
from shmcache.engine import _input, _pyobjects
from shmcache.errors import KeySizeError


def test_lengths_that_only_sum_right_are_not_one_size():
    lens, joined = _input.join_bytes([b"a" * 31, b"b" * 33])
    assert lens.tolist() == [31, 33] and len(joined) == 64
    lens, _ = _input.join_bytes([b"a" * 32, b"b" * 31, b"c" * 33, b"d" * 32])  # first and last agree
    assert lens.tolist() == [32, 31, 33, 32]


def test_multibyte_memoryviews_count_bytes():
    wide = memoryview(array.array("H", range(32)))  # len 32 items, 64 bytes
    lens, joined = _input.join_bytes([b"x" * 32, wide, b"y" * 32])
    assert lens.tolist() == [32, 64, 32] and len(joined) == 128
    eight = memoryview(array.array("i", range(8)))  # len 8, 32 bytes
    lens, _ = _input.join_bytes([eight, b"z" * 32, eight])
    assert lens.tolist() == [32, 32, 32]


def test_not_bytes_is_none_and_strided_views_are_copied():
    assert _input.join_bytes([b"a" * 4, "text"]) is None
    strided = memoryview(bytes(range(64)))[::2]
    lens, joined = _input.join_bytes([strided, b"q" * 32])
    assert lens.tolist() == [32, 32] and joined[:32] == bytes(range(0, 64, 2))
    lens, joined = _input.join_bytes([])
    assert len(lens) == 0 and bytes(joined) == b""
    assert isinstance(_input.join_bytes([b"k" * 8] * 3)[0], np.ndarray)


class _Bytes(bytes):
    pass


def test_compiled_path_reads_lists_of_bytes_as_join_does():
    assert _pyobjects.available()  # CPython 3.11-3.13 with the GIL: the path this repo runs
    rng = np.random.default_rng(3)
    keys = [bytes(k) for k in rng.integers(0, 256, (1000, 32), np.uint8)]
    got = _input.fixed(keys, 32)
    assert isinstance(got, np.ndarray) and got.shape == (1000, 32) and got.tobytes() == b"".join(keys)
    values = [bytes(rng.integers(0, 256, int(n), np.uint8)) for n in rng.integers(0, 300, 1000)]
    lens, joined = _input.join_bytes(values)
    assert isinstance(joined, np.ndarray)  # the compiled path, not b"".join
    assert lens.tolist() == [len(v) for v in values] and joined.tobytes() == b"".join(values)
    assert _input.fixed([], 32).shape == (0, 32)
    # values longer than the buffer's first guess (it grows mid-list), and a list long enough
    # that the guess comes from its first items (which are short here, the rest long)
    for values in ([bytes([i % 256]) * (500 + i) for i in range(300)],
                   [b"s"] * 5000 + [bytes([i % 256]) * 4096 for i in range(200)]):
        lens, joined = _input.join_bytes(values)
        assert isinstance(joined, np.ndarray) and lens.tolist() == [len(v) for v in values]
        assert joined.tobytes() == b"".join(values)


@pytest.mark.parametrize("where", [0, 500, 999])
@pytest.mark.parametrize("odd", [b"s" * 31, b"l" * 33, b"", bytearray(b"b" * 32), _Bytes(b"u" * 32),
                                 memoryview(b"m" * 32), "s" * 32, None])
def test_compiled_path_hands_anything_else_to_the_general_path(where, odd):
    keys = [bytes([i % 256]) * 32 for i in range(1000)]
    keys[where] = odd
    assert _input.fixed(keys, 32) is None
    assert _input.fixed(tuple(k for k in keys if k is not odd), 32) is None  # not a list: general path
    packed = _input.join_bytes(keys)
    if not isinstance(odd, (bytes, bytearray, memoryview)):
        assert packed is None
    else:
        assert packed[0][where] == len(odd) and bytes(packed[1]) == b"".join(keys)


def test_wrong_key_in_a_list_names_it(cache_name):
    with shmcache.create(cache_name, memory=64 << 20) as w:
        keys = [bytes([i]) * 32 for i in range(200)]
        w.set_many(keys, [b"v" * (i % 50) for i in range(200)])
        assert w.get_many_packed(keys).found.all() and w.get_many(keys)[7] == b"v" * 7
        for bad, what in ((b"x" * 31, "31 bytes"), (b"x" * 33, "33 bytes"), ("x" * 32, "str")):
            keys[123] = bad
            with pytest.raises(KeySizeError, match=f"key 123 is {what}; this cache's keys are 32 bytes"):
                w.get_many_packed(keys)
            with pytest.raises(KeySizeError, match=f"key 123 is {what}"):
                w.set_many(keys, [b"v"] * 200)


def test_pairs_read_keys_and_values_as_the_two_passes_do():
    """The one pass over a set_many's two lists gives the keys fixed() gives and the values
    join_bytes() gives: values longer than the buffer's first guess (it grows mid-list, and
    goes on from the pair it stopped at) and a list long enough that the guess comes from its
    first items (short here, the rest long)."""
    rng = np.random.default_rng(5)
    for n, sizes in ((1000, rng.integers(0, 300, 1000)), (300, [500 + i for i in range(300)]),
                     (5200, [1] * 5000 + [4096] * 200), (0, [])):
        keys = [bytes(k) for k in rng.integers(0, 256, (n, 32), np.uint8)]
        values = [bytes(rng.integers(0, 256, int(s), np.uint8)) for s in sizes]
        k, starts, lens, data, longest = _input.pairs(keys, values, 32)
        assert k.shape == (n, 32) and k.tobytes() == _input.fixed(keys, 32).tobytes()
        lens1, joined = _input.join_bytes(values)
        assert lens.tolist() == lens1.tolist() and data.tobytes() == bytes(joined)
        assert starts.tolist() == (np.cumsum(lens) - lens).tolist()
        assert longest == max(sizes, default=0)


_NOT_BYTES = [bytearray(b"b" * 32), _Bytes(b"u" * 32), memoryview(b"m" * 32), "s" * 32, None]


@pytest.mark.parametrize("where", [0, 500, 999])
@pytest.mark.parametrize("side, odd", [("key", b"s" * 31), ("key", b"l" * 33)] + [("key", o) for o in _NOT_BYTES]
                         + [("value", o) for o in _NOT_BYTES])
def test_pairs_hand_anything_else_to_the_general_path(where, side, odd):
    keys = [bytes([i % 256]) * 32 for i in range(1000)]
    values = [bytes([i % 256]) * (i % 150) for i in range(1000)]
    (keys if side == "key" else values)[where] = odd
    assert _input.pairs(keys, values, 32) is None
    keys[where], values[where] = b"k" * 32, b"v"
    assert _input.pairs(keys, values, 32) is not None
    assert _input.pairs(tuple(keys), values, 32) is None and _input.pairs(keys, tuple(values), 32) is None


def test_pairs_of_unequal_lists_or_a_bad_item_store_nothing_and_say_what(cache_name):
    """set_many and apply of two lists: a count mismatch, a key of another size, a value that
    is not bytes or one over max_value is named, and nothing of the batch is stored."""
    with shmcache.create(cache_name, memory=64 << 20, max_value=100) as w:
        keys = [bytes([i]) * 32 for i in range(200)]
        values = [bytes([i]) * (i % 90) for i in range(200)]
        for bad_keys, bad_values, error, match in (
                (keys, values[:199], ValueError, "200 keys but 199 values"),
                (keys[:150] + [b"k" * 31] + keys[151:], values, KeySizeError, "key 150 is 31 bytes"),
                (keys, values[:150] + ["v"] + values[151:], TypeError, "value 150 is str, not bytes"),
                (keys, values[:150] + [b"v" * 101] + values[151:], shmcache.ValueTooLargeError,
                 r"value 150 is 101 bytes; the limit is 100 \(max_value\)")):
            with pytest.raises(error, match=match):
                w.set_many(bad_keys, bad_values)
            with pytest.raises(error, match=match):
                w.apply(bad_keys, np.zeros(len(bad_keys), np.uint8), bad_values)
            assert not w.get_many_packed(keys).found.any()
        w.set_many(keys, values)
        assert w.get_many(keys) == values
