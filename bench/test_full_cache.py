"""A full cache: what a write and a lookup cost once every add evicts the oldest record
and the index runs at its full load, today's kernels against the kernels before their
full-cache prefetches, interleaved on one segment.

    SHMCACHE_BENCH_N=1000000 .venv/bin/python -m pytest bench/test_full_cache.py -p no:cacheprovider -s

A cache fed from Kafka lives full: its topic holds more than it does. Here a cache
sized for N entries (bench/test_churn.py's sizing, max_value 256) receives unique keys
(32 B, values of 61-141 B) in batches of 1024: N/2 into the empty cache ("filling":
nothing is evicted), then N*3/2 untimed, then 4 N more ("full": the rings have
wrapped, nearly every add evicts the bucket's oldest record first, and buckets hold
up to 3/4 of their index slots). Then lookups of the N/2 keys written last, all hits,
in a random order, in that full cache and in a roomy one (bench/test_table.py's
sizing, where keys sit in their home slots) filled with the same last N keys.

"Before" is today's source with the full-cache prefetches taken out, built as modules
of their own (engine/_kernels.py: the eviction stages and the tag-matched record
prefetch of a write; engine/_bucket.py: the prefetch of a removed slot's run; engine/_lookup.py: the
tag-matched record prefetch of a lookup, back to the home slot's record). Chunks of
batches go to today's and before's kernel in turn (which one first alternates by
round); times are the thread's CPU time (see bench/test_checks_cost.py), the kernels
called as Writer and Reader call them, minus the Python around each batch. Both keep
the table's invariants (only prefetches differ), so they share the segments. Asserts
that the keys written last read back with their values and that no corruption was
met; never the speed.
"""

from __future__ import annotations

import gc
import os
import sys
import time
from pathlib import Path

import numpy as np

from shmtest.bench import peers as P

REPO = Path(__file__).resolve().parent.parent
MAX_VALUE = 256
CHUNK = 16  # batches per turn (fewer at smoke sizes)
ROUNDS = 4
BEFORE = {  # today's source -> the kernels before their full-cache prefetches
    "_bucket": [
        ("    _prefetch_run_after(index, ibase, slots, ring64, rbase, ring, ks, i)  # fetched", "    pass  #"),
    ],
    "_kernels": [
        ("    staged = NBUCKETS * ring > _STAGED_FROM", "    staged = False"),
        ("    e = _tagged_entry(index, b * slots, slots, h)\n    if e != 0:\n        r = base",
         "    e = index[b * slots + _home(h, slots)]\n    if e != 0:\n        r = base"),
    ],
    "_lookup": [
        ("    e = _tagged_entry(index, b * slots, slots, h)\n    if e != 0:\n        end",
         "    e = index[b * slots + _home(h, slots)]\n    if e != 0:\n        end"),
    ],
}


def _before(module: str):
    """engine/`module` with BEFORE's edits, importing the edited _bucket (built first)."""
    src = (REPO / "engine" / f"{module}.py").read_text().replace("from __future__ import annotations", "")
    for old, new in BEFORE[module]:
        assert src.count(old) == 1, f"'before': {old!r} is no longer in engine/{module}.py once"
        src = src.replace(old, new)
    if module != "_bucket":
        _before("_bucket")
        src = src.replace("from shmcache.engine._bucket import", "from _bucket_before_full_cache import")
    return P.import_source(src, f"{module}_before_full_cache", "shmcache-bench-full-cache")


def _interleaved(run, lo: int, hi: int, step: int, rnd: int) -> tuple[float, float]:
    """CPU ns per key of today's and before's kernel over items lo..hi, `run(today, s, e)`
    doing items s..e, in turns of at most CHUNK batches (8 turns at least, where it can)."""
    t, done = [0.0, 0.0], [0, 0]
    turn = max(1, min(CHUNK, (hi - lo) // (8 * step))) * step
    for c, s in enumerate(range(lo, hi, turn)):
        side = (c + rnd) % 2  # 1 = today
        e = min(s + turn, hi)
        t0 = time.thread_time()
        run(side == 1, s, e)
        t[side] += time.thread_time() - t0
        done[side] += e - s
    return t[1] / done[1] * 1e9, t[0] / done[0] * 1e9


def _line(label: str, got: list[tuple[float, float]]) -> str:
    today, before = np.median([g[0] for g in got]), np.median([g[1] for g in got])
    return (f"  {label:38s} today {today:4.0f}, before {before:4.0f} ns/key: today {before / today:.2f}x as fast "
            f"(rounds: {' '.join(f'{b / t:.2f}' for t, b in got)})")


def test_full_cache():
    import shmcache
    from shmcache.engine import _input
    from shmcache.engine import _kernels as K
    from shmcache.engine import _lookup as LK
    from shmcache.engine import units

    KB, LKB = _before("_kernels"), _before("_lookup")
    n = P.bench_n()
    rng = np.random.default_rng(P.SEED)
    total = 6 * n
    keys = rng.integers(0, 256, (total, P.KEY_SIZE), np.uint8)  # unique with overwhelming probability
    lens = rng.integers(P.VALUE_MIN, P.VALUE_MAX + 1, total).astype(np.int64)
    data = rng.integers(0, 256, int(lens.sum()), np.uint8)
    starts = np.zeros(total, np.int64)
    np.cumsum(lens[:-1], out=starts[1:])
    actions = np.zeros(P.BATCH, np.uint8)
    hashes = np.empty(P.BATCH, np.int64)
    found = np.zeros(P.BATCH, np.bool_)
    offsets = np.zeros(P.BATCH + 1, np.int64)
    out = np.empty(P.BATCH * P.VALUE_MAX, np.uint8)
    counts = np.zeros(2, np.int64)
    none_given_up = np.zeros(8192, np.bool_)  # the lookup kernel's given_up (engine/layout.py NBUCKETS)
    names, handles, sizes = [], [], {}
    report = [f"a full cache, N={n:,}: CPU ns per key (thread time), median of {ROUNDS} interleaved rounds; "
              f"load average {os.getloadavg()[0]:.1f}"]

    def make(label: str, memory: int):
        names.append(f"bench-{os.getpid()}-full-cache-{label}")
        w = shmcache.create(names[-1], memory=memory, max_value=MAX_VALUE)
        handles.append(w)
        sizes[label] = units.format_bytes(w.geometry.size)
        a = w.segment_arrays()
        return w, (a.meta, a.index, a.ring8, a.ring64, a.geo), int(a.geo[5])

    def writes(w, args, kst):
        me, counters = w.kernel_identity()

        def run(today: bool, s: int, e: int) -> None:
            for b in range(s, e, P.BATCH):
                be = min(b + P.BATCH, e)
                k8, k64 = _input.words(keys[b:be], kst)
                m = be - b
                got = (K if today else KB).apply_entries(*args, k8, k64, hashes[:m], False, actions[:m], starts[b:be],
                                                          lens[b:be], data, 0, me, 2000, counters)
                assert got == m, "a bucket lock stayed held in a single-writer benchmark"
        return run

    def lookups(args, kst, batches):
        def run(today: bool, s: int, e: int) -> None:
            for k8, k64 in batches[s // P.BATCH:(e + P.BATCH - 1) // P.BATCH]:
                m = len(k8) // kst
                (LK if today else LKB).lookup(*args, k8, k64, hashes[:m], 0, found[:m], offsets[:m + 1], out, 0, True,
                                               160, -1, -1, 2000, counts, none_given_up, False)
        return run

    try:
        w, args, kst = make("full", P.memory_for(n, MAX_VALUE))
        put = writes(w, args, kst)
        put(True, 0, P.BATCH), put(False, P.BATCH, 2 * P.BATCH)  # compile / load both, untimed
        gc.collect()
        gc.disable()
        try:
            fill = [_interleaved(put, 2 * P.BATCH, n // 2, P.BATCH, 0)]
            put(True, n // 2, 2 * n)
            step = (4 * n) // ROUNDS // P.BATCH * P.BATCH
            full = [_interleaved(put, 2 * n + r * step, 2 * n + (r + 1) * step, P.BATCH, r) for r in range(ROUNDS)]
        finally:
            gc.enable()
        end = 2 * n + ROUNDS * step  # keys 0..end-1 were added
        evictions = w.stats()["evictions"]
        report += [f"  writes ({evictions:,} evictions of {end:,} adds):",
                   _line("filling (nothing evicted)", fill), _line("full (every add evicts)", full)]

        recent = np.arange(end - n // 2, end)[rng.permutation(n // 2)]
        got = w.get_many_packed(keys[recent])  # all in at 1M; ~0.9 at the smoke size (~2 records a bucket)
        assert got.found.mean() > 0.8, "the keys written last are not in the cache"
        for j in np.flatnonzero(got.found)[::97].tolist():
            i = int(recent[j])
            assert bytes(got.data[got.offsets[j]:got.offsets[j + 1]]) == bytes(data[starts[i]:starts[i] + lens[i]])
        assert w.stats()["corruptions"] == 0
        hits = recent[got.found]
        batches = [_input.words(keys[hits[s:s + P.BATCH]], kst) for s in range(0, len(hits), P.BATCH)]
        rw, rargs, rkst = make("roomy", P.cache_memory(n))
        for s in range(end - n, end, P.BATCH):  # the same last N keys
            e = min(s + P.BATCH, end)
            rw.set_many(keys[s:e], (starts[s:e], lens[s:e], data))
        for label, la, lk in (("full", args, kst), ("roomy", rargs, rkst)):
            get = lookups(la, lk, batches)
            get(True, 0, P.BATCH), get(False, 0, P.BATCH)
            gc.collect()
            gc.disable()
            try:
                res = [_interleaved(get, 0, len(batches) * P.BATCH, P.BATCH, r) for r in range(ROUNDS)]
            finally:
                gc.enable()
            report.append(_line(f"lookups, hits, {label} cache ({sizes[label]})", res))
    finally:
        for h in handles:
            h.close()
        for name in names:
            shmcache.destroy(name)
    print("\n" + "\n".join(report), file=sys.stderr)

