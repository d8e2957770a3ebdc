"""Writes into a full cache: what an add costs once every add evicts the oldest record,
and what the eviction's prefetch stages (engine/_kernels.py) win there, against today's
kernel without them, interleaved on one segment.

    SHMCACHE_BENCH_N=1000000 .venv/bin/python -m pytest bench/test_full_writes.py -p no:cacheprovider -s

A cache sized for N entries (bench/test_churn.py's sizing, max_value 256) receives
unique keys (32 B, values of 61-141 B) in batches of 1024: N/2 into the empty cache
("filling": nothing is evicted), then N*3/2 untimed, then 4 N more ("full": the rings
have wrapped, and nearly every add evicts the bucket's oldest record first). A cache
fed from Kafka lives in the second state: its topic holds more than it does.

In both phases chunks of 16 batches go to today's kernel and to "no eviction stages"
in turn (which one goes first alternates by round): engine/_kernels.py's source with
its two eviction stages taken out, and the prefetch of the run in _remove_slot, i.e.
the kernel as it was before them. Both keep the table's invariants (only prefetches
differ), so they share the segment. Times are the thread's CPU time (see
bench/test_checks_cost.py), the kernels called as Writer.apply calls them, minus the
Python around each batch. Asserts that the keys written last read back with their
values and that no corruption was met; never the speed.
"""

from __future__ import annotations

import gc
import os
import sys
import time
from pathlib import Path

import numpy as np

import _peers as P  # bench/ is put on sys.path by bench/conftest.py

REPO = Path(__file__).resolve().parent.parent
MAX_VALUE = 256
CHUNK = 16  # batches per turn (fewer at smoke sizes)
NO_STAGES = [  # today's source -> the kernel without the eviction stages
    ("    staged = NBUCKETS * ring > _STAGED_FROM", "    staged = False"),
    ("    _prefetch_run_after(index, ibase, slots, ring64, rbase, ring, ks, i)  # fetched", "    pass  #"),
]


def _no_stages():
    src = (REPO / "engine" / "_kernels.py").read_text().replace("from __future__ import annotations", "")
    for old, new in NO_STAGES:
        assert src.count(old) == 1, f"'no eviction stages': {old!r} is no longer in engine/_kernels.py once"
        src = src.replace(old, new)
    return P.import_source(src, "_kernels_no_eviction_stages", "shmcache-bench-full-writes")


def test_full_writes():
    import shmcache
    from shmcache.engine import _input
    from shmcache.engine import _kernels as K

    base = _no_stages()
    n = P.bench_n()
    rng = np.random.default_rng(P.SEED)
    total = 6 * n
    keys = rng.integers(0, 256, (total, P.KEY_SIZE), np.uint8)  # unique with overwhelming probability
    lens = rng.integers(P.VALUE_MIN, P.VALUE_MAX + 1, total).astype(np.int64)
    data = rng.integers(0, 256, int(lens.sum()), np.uint8)
    starts = np.zeros(total, np.int64)
    np.cumsum(lens[:-1], out=starts[1:])
    name = f"bench-{os.getpid()}-full-writes"
    w = shmcache.create(name, memory=P.memory_for(n, MAX_VALUE), max_value=MAX_VALUE)
    try:
        arrays = w.segment_arrays()
        args = (arrays.meta, arrays.index, arrays.ring8, arrays.ring64, arrays.geo)
        kst = int(arrays.geo[5])
        actions = np.zeros(P.BATCH, np.uint8)
        hashes = np.empty(P.BATCH, np.int64)

        def put(kernel, s: int) -> None:
            e = min(s + P.BATCH, total)
            k8, k64 = _input.words(keys[s:e], kst)
            m = e - s
            got = kernel.apply_entries(*args, k8, k64, hashes[:m], False, actions[:m], starts[s:e], lens[s:e], data,
                                       0, w._me, 2000, w._counters)
            assert got == m, "a bucket lock stayed held in a single-writer benchmark"

        def phase(lo: int, hi: int, rnd: int) -> tuple[float, float]:
            """ns per key of today's kernel and the one without stages over keys lo..hi."""
            t, done = [0.0, 0.0], [0, 0]
            turn = max(1, min(CHUNK, (hi - lo) // (8 * P.BATCH))) * P.BATCH  # 8 turns at least, where it can
            for c, s in enumerate(range(lo, hi, turn)):
                side = (c + rnd) % 2  # 1 = today
                e = min(s + turn, hi)
                t0 = time.thread_time()
                for b in range(s, e, P.BATCH):
                    put(K if side else base, b)
                t[side] += time.thread_time() - t0
                done[side] += e - s
            return t[1] / done[1] * 1e9, t[0] / done[0] * 1e9

        put(K, 0), put(base, P.BATCH)  # compile / load both, untimed
        gc.collect()
        gc.disable()
        try:
            fill = phase(2 * P.BATCH, n // 2, 0)
            for s in range(n // 2, 2 * n, P.BATCH):
                put(K, s)
            rounds = 4
            step = (4 * n) // rounds // P.BATCH * P.BATCH
            full = [phase(2 * n + r * step, 2 * n + (r + 1) * step, r) for r in range(rounds)]
        finally:
            gc.enable()
        s = w.stats()
        end = 2 * n + rounds * step  # keys 0..end-1 were added
        got = w.get_many_packed(keys[end - n // 4:end])  # most are in (all at 1M; ~0.9 at the smoke size,
        assert got.found.mean() > 0.8, "the keys written last are not in the cache"  # with ~2 records a bucket)
        for j in np.flatnonzero(got.found)[::97].tolist():
            i = end - n // 4 + j
            assert bytes(got.data[got.offsets[j]:got.offsets[j + 1]]) == bytes(data[starts[i]:starts[i] + lens[i]])
        assert s["corruptions"] == 0
    finally:
        w.close()
        shmcache.destroy(name)
    today, before = np.median([f[0] for f in full]), np.median([f[1] for f in full])
    lines = [f"writes into a full cache, N={n:,}, {s['evictions']:,} evictions of {end:,} adds; "
             f"load average {os.getloadavg()[0]:.1f}; CPU ns per key (thread time), median of {rounds} rounds:",
             f"  filling (no evictions): today {fill[0]:.0f}, without the eviction stages {fill[1]:.0f} "
             f"({fill[0] / fill[1]:.2f}x the time)",
             f"  full (every add evicts): today {today:.0f}, without the eviction stages {before:.0f} "
             f"({before / today:.2f}x faster today; rounds: {' '.join(f'{b / t:.2f}' for t, b in full)})",
             f"  full / filling, today: {today / fill[0]:.2f}x the time per add"]
    print("\n" + "\n".join(lines), file=sys.stderr)
