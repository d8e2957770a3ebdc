"""Keys as a Python list of bytes (issue 13, part 3): the conversions side by side in one run.

    .venv/bin/python -m pytest bench/test_keylist.py -p no:cacheprovider -s

Three conversions of the same 1024 keys of 32 bytes (and of 1024 values of 61-141
bytes), rounds interleaved, the median of the per-round ratios printed: "issue" is
what table._join_bytes did up to commit 4caa28e (np.fromiter(map(len, items)) and
b"".join), "previous" the one-pass proof of one length (set(map(len, items)) and
b"".join) that _keylist.py (its list pass is engine/_input.py's now) held up to commit b119198, both copied here; "now"
engine/_input.py fixed (keys) and join_bytes (values), the compiled pass of
engine/_pyobjects.py. The items are taken from a pool of 1,000,000 (SHMCACHE_BENCH_N, at least 100,000) in a random order,
so that they lie scattered over the heap as a caller's objects do (items made one
after the other sit side by side and hide the cache misses). Also get_many_packed of
1024 keys from a 200,000-entry cache with the keys as an (n, 32) array and as a list
(the issue's measurement), and set_many with arrays against lists, interleaved.
Asserted: every conversion gives the same lengths and bytes; never speed.
"""

from __future__ import annotations

import os
import statistics
import sys
import time

import numpy as np

from shmtest.bench import peers as P
import shmcache
from shmcache.engine import _input

ROUNDS = 41
REPEAT = 200


def _issue(items):
    lens = np.fromiter(map(len, items), np.int64, len(items))
    return lens, b"".join(items)


def _previous(items):
    joined = b"".join(items)
    n = len(items)
    if n and len(items[0]) == len(items[-1]):
        sizes = set(map(len, items))
        if len(sizes) == 1 and next(iter(sizes)) * n == len(joined):
            return np.full(n, len(items[0]), np.int64), joined
    return np.fromiter(map(len, items), np.int64, n), joined


def _per_call(fn, arg) -> float:
    t0 = time.perf_counter()
    for _ in range(REPEAT):
        fn(arg)
    return (time.perf_counter() - t0) / REPEAT


def _interleaved(a, b, arg) -> tuple[float, float, float]:
    """(median seconds per call of a, of b, median of the per-round ratios b / a)."""
    ta, tb = [], []
    for r in range(ROUNDS):
        if r % 2:
            tb.append(_per_call(b, arg))
            ta.append(_per_call(a, arg))
        else:
            ta.append(_per_call(a, arg))
            tb.append(_per_call(b, arg))
    return statistics.median(ta), statistics.median(tb), statistics.median(y / x for x, y in zip(ta, tb))


def test_keylist():
    rng = np.random.default_rng(7)
    pool = max(100_000, min(1_000_000, P.bench_n()))  # scattered objects: a batch drawn at random from many
    key_pool = [bytes(k) for k in rng.integers(0, 256, (pool, P.KEY_SIZE), np.uint8)]
    value_pool = [bytes(rng.integers(0, 256, int(n), np.uint8))
                  for n in rng.integers(P.VALUE_MIN, P.VALUE_MAX + 1, pool // 10)]
    keys = [key_pool[i] for i in rng.integers(0, pool, P.BATCH)]
    values = [value_pool[i] for i in rng.integers(0, len(value_pool), P.BATCH)]
    assert _input.fixed(keys, P.KEY_SIZE).tobytes() == b"".join(keys)
    for items in (keys, values):
        (l0, j0), (l1, j1), (l2, j2) = _issue(items), _previous(items), _input.join_bytes(items)
        assert np.array_equal(l0, l1) and np.array_equal(l0, l2) and j0 == j1 == bytes(j2)
    lines = [f"\nkeylist ({os.cpu_count()} CPUs shared, load average {os.getloadavg()[0]:.1f}); "
             f"median of {ROUNDS} interleaved rounds of {REPEAT} calls"]
    now_keys = lambda items: _input.fixed(items, P.KEY_SIZE)  # noqa: E731
    for what, items, now in (("1024 keys of 32 B", keys, now_keys), ("1024 values of 61-141 B", values,
                                                                    _input.join_bytes)):
        a, b, ratio = _interleaved(now, _issue, items)
        _, c, ratio_prev = _interleaved(now, _previous, items)
        lines.append(f"  convert {what}: issue {b * 1e6:.1f} us, previous {c * 1e6:.1f} us, now {a * 1e6:.1f} us: "
                     f"{ratio:.2f}x faster than the issue's, {ratio_prev:.2f}x than the previous")
    n = min(200_000, P.bench_n())
    name = f"bench-{os.getpid()}-keylist"
    w = shmcache.create(name, memory=P.cache_memory(n))
    try:
        ks = rng.integers(0, 256, (n, P.KEY_SIZE), np.uint8)
        for s in range(0, n, P.BATCH):
            e = min(s + P.BATCH, n)
            w.set_many(ks[s:e], [b"v" * 100] * (e - s))
        key_objects = [bytes(k) for k in ks]
        with shmcache.attach(name) as r:
            pick = rng.integers(0, n, P.BATCH)
            q = np.ascontiguousarray(ks[pick])
            ql = [key_objects[i] for i in pick]  # drawn from many objects, as a caller's keys are
            assert r.get_many_packed(ql).found.all() and r.get_many_packed(q).found.all()
            a, b, ratio = _interleaved(r.get_many_packed, lambda _: r.get_many_packed(ql), q)
            lines.append(f"  get_many_packed of 1024 hits in a {n:,}-entry cache: array {P.BATCH / a / 1e6:.2f} M keys/s, "
                         f"list {P.BATCH / b / 1e6:.2f} M keys/s: the list form takes {ratio:.2f}x the array form's time")
            wl = values
            offs = np.zeros(P.BATCH + 1, np.int64)
            np.cumsum([len(v) for v in wl], out=offs[1:])
            data = np.frombuffer(b"".join(wl), np.uint8)
            a, b, ratio = _interleaved(lambda k: w.set_many(k, (offs, data)), lambda _: w.set_many(ql, wl), q)
            lines.append(f"  set_many of 1024: arrays {P.BATCH / a / 1e6:.2f} M keys/s, lists {P.BATCH / b / 1e6:.2f} "
                         f"M keys/s: the list form takes {ratio:.2f}x the array form's time")
    finally:
        w.close()
        shmcache.destroy(name)
    print("\n".join(lines), file=sys.stderr)
