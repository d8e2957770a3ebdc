"""At 20x the data (issue 13, part 4): the same lookups on tables of several sizes, in
one run, shmcache only.

    SHMCACHE_SCALE_N=1000000,20000000 .venv/bin/python -m pytest bench/test_scale.py -p no:cacheprovider -s
    SHMCACHE_SCALE_N=1000000,20000000,50000000 ...   # where memory and /dev/shm allow (~10.6 GiB segment)

SHMCACHE_SCALE_N: comma-separated table sizes (default: SHMCACHE_BENCH_N alone, the
suite's smoke size). For each size N: create a segment sized as bench/test_table.py
sizes its own (N x 512 B, at least 64 MiB: every key re-set keeps its room) and time
the creation (per GiB: sizing the file, the move to 2 MiB pages, the header); fill
N entries (32-byte random keys, 61-141-byte values) in batches of 1024; time
`get_many_packed` over all N keys in batches of 1024 in a random order (the median of
SHMCACHE_BENCH_ROUNDS passes, default 3); report keys/s, the rate relative to the
first size, creation seconds per GiB and segment bytes per live entry (and "sized":
the smallest segment holding N mean records over N, by the layout's plan).

Beside each pass, what the machine itself gives at that size: a kernel that reads
LINES random 64-byte lines of the same segment, mapped as a reader maps it (2 MiB
pages), each prefetched 16 reads ahead as the lookup prefetches its records, and
nothing else ("lines/s", "machine vs first"). A lookup's ~4 lines per hit are two
random places (index slot; record and value), so where the machine's random reads
fall with the size, so must lookups: that ratio is the bound the table works under.
Every size's table is built first and kept; the timed passes then go round the sizes
in turn, so each round's ratio to the first size is taken under the same load (this
2-core machine's speed drifts by tens of percent over seconds: ratios of sizes timed
minutes apart meant nothing). The ratio reported is the median of the rounds'. A size
whose segment does not fit in /dev/shm's free space is skipped and said so.
Asserted: every live key found, values right; never speed.
"""

from __future__ import annotations

import gc
import os
import statistics
import sys
import time

import numpy as np
from numba import njit

from shmtest.bench import peers as P
from shmtest.bench import summary as S
import shmcache
from shmcache.engine import layout as L
from shmcache.engine import units
from shmcache.engine._intrinsics import prefetch
from shmcache.ipc.segment import Segment, shm_free_bytes

POOL = 1 << 20  # values are slices of one random pool: contents repeat, lengths do not
HEADROOM = 1.25  # over the smallest segment holding N mean records: buckets fill unevenly
LINES = 2_000_000  # random lines read per pass by the machine's reference kernel
AHEAD = 16


@njit(nogil=True)
def _random_lines(mem, words):
    """Sum mem[w] over words (each a random line's first word), prefetching AHEAD ahead."""
    s = np.uint64(0)
    n = words.shape[0]
    for j in range(min(n, AHEAD)):
        prefetch(mem, words[j], 0)
    for i in range(n):
        if i + AHEAD < n:
            prefetch(mem, words[i + AHEAD], 0)
        s += mem[words[i]]
    return s


def _sizes() -> list[int]:
    v = os.environ.get("SHMCACHE_SCALE_N")
    return [int(x.replace("_", "")) for x in v.split(",")] if v else [P.bench_n()]


def _values(pool: np.ndarray, lens: np.ndarray, s: int, e: int) -> tuple[np.ndarray, np.ndarray]:
    offs = np.zeros(e - s + 1, np.int64)
    np.cumsum(lens[s:e], out=offs[1:])
    start = (s * 131) % (POOL - int(offs[-1]))
    return offs, pool[start:start + int(offs[-1])]


class _Table:
    """One size's cache, filled, and its keys in query order."""

    def __init__(self, n: int, memory: int):
        rng = np.random.default_rng(n)
        self.n = n
        keys = rng.integers(0, 256, (n, P.KEY_SIZE), np.uint8)
        self.lens = rng.integers(P.VALUE_MIN, P.VALUE_MAX + 1, n)
        self.pool = rng.integers(0, 256, POOL, np.uint8)
        self.name = f"bench-{os.getpid()}-scale-{n}"
        t0 = time.perf_counter()
        self.w = shmcache.create(self.name, memory=memory)
        self.create_s = time.perf_counter() - t0
        self.r = self.seg = self.mem = None
        try:
            t0 = time.perf_counter()
            for s in range(0, n, P.BATCH):
                e = min(s + P.BATCH, n)
                self.w.set_many(keys[s:e], _values(self.pool, self.lens, s, e))
            self.fill_s = time.perf_counter() - t0
            self.live = self.w.stats()["entries"]  # a few may be evicted: a bucket fuller than its share
            self.perm = rng.permutation(n)
            self.qkeys = keys[self.perm]  # query order, gathered before timing
            del keys
            self.r = shmcache.attach(self.name)
            self.check(rng)
            self.seg = Segment(self.name, writable=False)  # mapped as a reader maps it
            self.mem = np.frombuffer(self.seg.mm, np.uint64)
            self.words = rng.integers(0, self.seg.size // 64, LINES) * 8
        except BaseException:
            self.close()
            raise
        self.times: list[float] = []
        self.line_times: list[float] = []

    def check(self, rng) -> None:
        get, n = self.r.get_many_packed, self.n
        found = 0
        for s in range(0, n, P.BATCH):
            found += int(np.count_nonzero(get(self.qkeys[s:s + P.BATCH]).found))
        assert found == self.live  # every live key, once
        for j in rng.integers(0, n, 100).tolist():  # values of a sample, against the formula
            i = int(self.perm[j])
            b = (i // P.BATCH) * P.BATCH
            offs, data = _values(self.pool, self.lens, b, min(b + P.BATCH, n))
            p = get(self.qkeys[j:j + 1])
            assert not p.found[0] or bytes(p.data) == bytes(data[offs[i - b]:offs[i - b + 1]])

    def timed_pass(self) -> float:
        get, q = self.r.get_many_packed, self.qkeys
        t0 = time.perf_counter()
        for s in range(0, self.n, P.BATCH):
            get(q[s:s + P.BATCH])
        dt = time.perf_counter() - t0
        self.times.append(dt)
        return self.n / dt

    def lines_pass(self) -> float:
        t0 = time.perf_counter()
        _random_lines(self.mem, self.words)
        dt = time.perf_counter() - t0
        self.line_times.append(dt)
        return LINES / dt

    def close(self) -> None:
        self.mem = None  # the segment's buffer must not be exported when it closes
        if self.seg is not None:
            self.seg.close()
        if self.r is not None:
            self.r.close()
        self.w.close()
        shmcache.destroy(self.name)


def test_scale():
    rounds = max(1, int(os.environ.get("SHMCACHE_BENCH_ROUNDS", "3")))
    tables: list[_Table] = []
    try:
        for n in _sizes():
            memory = max(64 << 20, int(P.memory_for(n) * HEADROOM))
            free = shm_free_bytes()
            if free is not None and memory > free * 0.9:
                print(f"scale: N={n:,} skipped: a {units.format_bytes(memory)} segment does not fit in /dev/shm "
                      f"({units.format_bytes(free)} free)", file=sys.stderr)
                continue
            tables.append(_Table(n, memory))
            gc.collect()
        for t in tables:
            t.timed_pass()  # warm-up: pages and kernels
            t.lines_pass()
            t.times.clear()
            t.line_times.clear()
        ratios: list[list[float]] = [[] for _ in tables]
        line_ratios: list[list[float]] = [[] for _ in tables]
        gc.collect()
        gc.disable()
        try:
            for k in range(rounds):
                order = tables if k % 2 == 0 else tables[::-1]  # which size goes first alternates
                rates = {t.n: t.timed_pass() for t in order}
                lines = {t.n: t.lines_pass() for t in order}
                for i, t in enumerate(tables):
                    ratios[i].append(rates[t.n] / rates[tables[0].n])
                    line_ratios[i].append(lines[t.n] / lines[tables[0].n])
        finally:
            gc.enable()
        rows = [dict(n=t.n, size=t.w.geometry.size, create_s=t.create_s, fill_s=t.fill_s,
                     rate=t.n / statistics.median(t.times), vs_first=statistics.median(ratios[i]),
                     lines=LINES / statistics.median(t.line_times), lines_vs_first=statistics.median(line_ratios[i]),
                     per_entry=t.w.geometry.size / t.live, hits=t.live / t.n,
                     tight=L.Geometry.plan(P.memory_for(t.n), P.KEY_SIZE, L.DEFAULT_MAX_VALUE).size / t.n)
                for i, t in enumerate(tables)]
    finally:
        for t in tables:
            t.close()
    print(f"\nscale: get_many_packed hit, batches of {P.BATCH}, random order, {rounds} rounds over the sizes in turn; "
          f"'vs first' is the median of the rounds' ratios ({os.cpu_count()} CPUs shared, load average "
          f"{os.getloadavg()[0]:.1f})", file=sys.stderr)
    print(f"  {'N':>12} {'segment':>10} {'create s/GiB':>12} {'fill keys/s':>12} {'get keys/s':>11} "
          f"{'vs first':>9} {'lines/s':>9} {'machine vs first':>16} {'hits':>6} {'B/entry':>8} {'sized':>6}",
          file=sys.stderr)
    for r in rows:
        print(f"  {r['n']:>12,} {units.format_bytes(r['size']):>10} {r['create_s'] / (r['size'] / 2**30):>12.2f} "
              f"{S.fmt_rate(r['n'] / r['fill_s']):>12} {S.fmt_rate(r['rate']):>11} "
              f"{r['vs_first']:>8.2f}x {S.fmt_rate(r['lines']):>9} {r['lines_vs_first']:>15.2f}x {r['hits']:>6.3f} "
              f"{r['per_entry']:>8.0f} {r['tight']:>6.0f}", file=sys.stderr)
