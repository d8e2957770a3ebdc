"""At 20x the data (issue 13, part 4): the same lookups on tables of several sizes, in
one run, shmcache only.

    SHMCACHE_SCALE_N=1000000,20000000 .venv/bin/python -m pytest bench/test_scale.py -p no:cacheprovider -s
    SHMCACHE_SCALE_N=1000000,20000000,50000000 ...   # where memory and /dev/shm allow (~8 GiB segment)

SHMCACHE_SCALE_N: comma-separated table sizes (default: SHMCACHE_BENCH_N alone, the
suite's smoke size). For each size N: create a segment sized as bench/test_table.py
sizes its own (N x 512 B, at least 64 MiB: every key re-set keeps its room) and time
the creation (per GiB: sizing the file, the move to 2 MiB pages, the header); fill
N entries (32-byte random keys, 61-141-byte values) in batches of 1024; time
`get_many_packed` over all N keys in batches of 1024 in a random order (the median of
SHMCACHE_BENCH_ROUNDS passes, default 3); report keys/s, the rate relative to the
first size, creation seconds per GiB and segment bytes per live entry (and "sized":
the smallest segment holding N mean records over N, by the layout's plan).
Sizes are run one after the other, each segment destroyed before the next is made;
a size whose segment does not fit in /dev/shm's free space is skipped and said so.
Asserted: every live key found, values right; never speed.
"""

from __future__ import annotations

import gc
import os
import statistics
import sys
import time

import numpy as np

import _peers as P
import shmcache
from shmcache.engine import layout as L
from shmcache.ipc.segment import shm_free_bytes

POOL = 1 << 20  # values are slices of one random pool: contents repeat, lengths do not
HEADROOM = 1.25  # over the smallest segment holding N mean records: buckets fill unevenly


def _sizes() -> list[int]:
    v = os.environ.get("SHMCACHE_SCALE_N")
    return [int(x.replace("_", "")) for x in v.split(",")] if v else [P.bench_n()]


def _values(pool: np.ndarray, lens: np.ndarray, s: int, e: int) -> tuple[np.ndarray, np.ndarray]:
    offs = np.zeros(e - s + 1, np.int64)
    np.cumsum(lens[s:e], out=offs[1:])
    start = (s * 131) % (POOL - int(offs[-1]))
    return offs, pool[start:start + int(offs[-1])]


def test_scale():
    rows = []
    rounds = max(1, int(os.environ.get("SHMCACHE_BENCH_ROUNDS", "3")))
    for n in _sizes():
        rng = np.random.default_rng(n)
        memory = max(64 << 20, int(P.memory_for(n) * HEADROOM))
        free = shm_free_bytes()
        if free is not None and memory > free * 0.9:
            print(f"scale: N={n:,} skipped: a {L.format_bytes(memory)} segment does not fit in /dev/shm "
                  f"({L.format_bytes(free)} free)", file=sys.stderr)
            continue
        keys = rng.integers(0, 256, (n, P.KEY_SIZE), np.uint8)
        lens = rng.integers(P.VALUE_MIN, P.VALUE_MAX + 1, n)
        pool = rng.integers(0, 256, POOL, np.uint8)
        name = f"bench-{os.getpid()}-scale"
        t0 = time.perf_counter()
        w = shmcache.create(name, memory=memory)
        create_s = time.perf_counter() - t0
        try:
            size = w.geometry.size
            t0 = time.perf_counter()
            for s in range(0, n, P.BATCH):
                e = min(s + P.BATCH, n)
                w.set_many(keys[s:e], _values(pool, lens, s, e))
            fill_s = time.perf_counter() - t0
            live = w.stats()["entries"]  # a few may be evicted: a bucket fuller than its share
            perm = rng.permutation(n)
            qkeys = keys[perm]  # query order, gathered before timing
            del keys
            with shmcache.attach(name) as r:
                get = r.get_many_packed
                for s in range(0, min(n, 64 * P.BATCH), P.BATCH):
                    get(qkeys[s:s + P.BATCH])  # warm-up
                times = []
                gc.collect()
                gc.disable()
                try:
                    for _ in range(rounds):
                        t0 = time.perf_counter()
                        for s in range(0, n, P.BATCH):
                            get(qkeys[s:s + P.BATCH])
                        times.append(time.perf_counter() - t0)
                finally:
                    gc.enable()
                found = 0
                for s in range(0, n, P.BATCH):
                    found += int(np.count_nonzero(get(qkeys[s:s + P.BATCH]).found))
                assert found == live  # every live key, once
                for j in rng.integers(0, n, 100).tolist():  # values of a sample, against the formula
                    i = int(perm[j])
                    b = (i // P.BATCH) * P.BATCH
                    offs, data = _values(pool, lens, b, min(b + P.BATCH, n))
                    p = get(qkeys[j:j + 1])
                    assert not p.found[0] or bytes(p.data) == bytes(data[offs[i - b]:offs[i - b + 1]])
            rows.append(dict(n=n, size=size, create_s=create_s, fill_s=fill_s,
                             rate=n / statistics.median(times), per_entry=size / live, hits=live / n,
                             tight=L.Geometry.plan(P.memory_for(n), P.KEY_SIZE, L.DEFAULT_MAX_VALUE).size / n,
                             load=os.getloadavg()[0]))
        finally:
            w.close()
            shmcache.destroy(name)
        del qkeys
        gc.collect()
    print(f"\nscale: get_many_packed hit, batches of {P.BATCH}, random order, median of {rounds} passes "
          f"({os.cpu_count()} CPUs shared; load average after each size in the last column)", file=sys.stderr)
    print(f"  {'N':>12} {'segment':>10} {'create s/GiB':>12} {'fill keys/s':>12} {'get keys/s':>11} "
          f"{'vs first':>9} {'hits':>6} {'B/entry':>8} {'sized':>6} {'load':>5}", file=sys.stderr)
    for r in rows:
        print(f"  {r['n']:>12,} {L.format_bytes(r['size']):>10} {r['create_s'] / (r['size'] / 2**30):>12.2f} "
              f"{P.fmt_rate(r['n'] / r['fill_s']):>12} {P.fmt_rate(r['rate']):>11} "
              f"{r['rate'] / rows[0]['rate']:>8.2f}x {r['hits']:>6.3f} {r['per_entry']:>8.0f} {r['tight']:>6.0f} {r['load']:>5.1f}", file=sys.stderr)
