"""engine/_keylist.join_bytes: the one-pass proof that all items share one length must never
accept a list whose lengths only sum right, nor count a multi-byte memoryview by items."""

from __future__ import annotations

import array

import numpy as np

from shmcache.engine import _keylist


def test_lengths_that_only_sum_right_are_not_one_size():
    lens, joined = _keylist.join_bytes([b"a" * 31, b"b" * 33])
    assert lens.tolist() == [31, 33] and len(joined) == 64
    lens, _ = _keylist.join_bytes([b"a" * 32, b"b" * 31, b"c" * 33, b"d" * 32])  # first and last agree
    assert lens.tolist() == [32, 31, 33, 32]


def test_multibyte_memoryviews_count_bytes():
    wide = memoryview(array.array("H", range(32)))  # len 32 items, 64 bytes
    lens, joined = _keylist.join_bytes([b"x" * 32, wide, b"y" * 32])
    assert lens.tolist() == [32, 64, 32] and len(joined) == 128
    eight = memoryview(array.array("i", range(8)))  # len 8, 32 bytes
    lens, _ = _keylist.join_bytes([eight, b"z" * 32, eight])
    assert lens.tolist() == [32, 32, 32]


def test_not_bytes_is_none_and_strided_views_are_copied():
    assert _keylist.join_bytes([b"a" * 4, "text"]) is None
    strided = memoryview(bytes(range(64)))[::2]
    lens, joined = _keylist.join_bytes([strided, b"q" * 32])
    assert lens.tolist() == [32, 32] and joined[:32] == bytes(range(0, 64, 2))
    lens, joined = _keylist.join_bytes([])
    assert len(lens) == 0 and joined == b""
    assert isinstance(_keylist.join_bytes([b"k" * 8] * 3)[0], np.ndarray)
