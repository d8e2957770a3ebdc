"""Invariant 9: the segment's bytes are untrusted. A damaged or hostile header is refused at
attach and open with CorruptCacheError naming the field; damaged bucket state inside the
table costs a counted miss (readers) or a counted repair (writers), never a signal or a hang.

Everything that could crash or hang on the code before these checks runs in a child
process (tests/engine/_fuzz_child.py) with a timeout, so a regression fails the test
instead of killing or hanging the suite.
"""

from __future__ import annotations

import os
import sys

import numpy as np
import pytest

import shmcache
from shmcache.engine import layout as L

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _procs import check_table, key_pool, make_values, verify  # noqa: E402

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
