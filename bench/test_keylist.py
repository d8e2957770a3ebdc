"""Keys as a Python list of bytes (issue 13, part 3): the conversion before and after, side
by side in one run.

    .venv/bin/python -m pytest bench/test_keylist.py -p no:cacheprovider -s

"before" is the conversion table._join_bytes did up to commit 4caa28e (copied here:
np.fromiter(map(len, items)) and b"".join), "after" engine/_keylist.join_bytes; both
on the same 1024 keys of 32 bytes and on 1024 values of 61-141 bytes, rounds
interleaved, the median of the per-round ratios printed. Also get_many_packed of
1024 keys from a 200,000-entry cache with the keys as an (n, 32) array and as a list
(the issue's measurement), interleaved. Asserted: both conversions give the same
lengths and bytes; never speed.
"""

from __future__ import annotations

import os
import statistics
import sys
import time

import numpy as np

import _peers as P
import shmcache
from shmcache.engine import _keylist

ROUNDS = 41
REPEAT = 200


def _before(items):
    lens = np.fromiter(map(len, items), np.int64, len(items))
    return lens, b"".join(items)


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
    keys = [bytes(k) for k in rng.integers(0, 256, (P.BATCH, P.KEY_SIZE), np.uint8)]
    values = [bytes(rng.integers(0, 256, int(n), np.uint8)) for n in rng.integers(P.VALUE_MIN, P.VALUE_MAX + 1, P.BATCH)]
    for items in (keys, values):
        (l0, j0), (l1, j1) = _before(items), _keylist.join_bytes(items)
        assert np.array_equal(l0, l1) and j0 == j1
    lines = [f"\nkeylist ({os.cpu_count()} CPUs shared, load average {os.getloadavg()[0]:.1f}); "
             f"median of {ROUNDS} interleaved rounds of {REPEAT} calls"]
    for what, items in (("1024 keys of 32 B", keys), ("1024 values of 61-141 B", values)):
        a, b, ratio = _interleaved(_keylist.join_bytes, _before, items)
        lines.append(f"  join {what}: before {b * 1e6:.1f} us, after {a * 1e6:.1f} us: "
                     f"{ratio:.2f}x faster")
    n = min(200_000, P.bench_n())
    name = f"bench-{os.getpid()}-keylist"
    w = shmcache.create(name, memory=P.cache_memory(n))
    try:
        ks = rng.integers(0, 256, (n, P.KEY_SIZE), np.uint8)
        for s in range(0, n, P.BATCH):
            e = min(s + P.BATCH, n)
            w.set_many(ks[s:e], [b"v" * 100] * (e - s))
        with shmcache.attach(name) as r:
            q = np.ascontiguousarray(ks[rng.integers(0, n, P.BATCH)])
            ql = [bytes(k) for k in q]
            assert r.get_many_packed(ql).found.all() and r.get_many_packed(q).found.all()
            a, b, ratio = _interleaved(r.get_many_packed, lambda _: r.get_many_packed(ql), q)
            lines.append(f"  get_many_packed of 1024 hits in a {n:,}-entry cache: array {P.BATCH / a / 1e6:.2f} M keys/s, "
                         f"list {P.BATCH / b / 1e6:.2f} M keys/s: the list form takes {ratio:.2f}x the array form's time")
            wl = [b"v" * 100] * P.BATCH
            offs = np.arange(P.BATCH + 1, dtype=np.int64) * 100
            data = np.frombuffer(b"v" * 100 * P.BATCH, np.uint8)
            a, b, ratio = _interleaved(lambda k: w.set_many(k, (offs, data)), lambda _: w.set_many(ql, wl), q)
            lines.append(f"  set_many of 1024: arrays {P.BATCH / a / 1e6:.2f} M keys/s, lists {P.BATCH / b / 1e6:.2f} "
                         f"M keys/s: the list form takes {ratio:.2f}x the array form's time")
    finally:
        w.close()
        shmcache.destroy(name)
    print("\n".join(lines), file=sys.stderr)
