"""What bounds a lookup: today's lookup kernel against copies of itself with one part of
its work taken away, interleaved on one table (issue 13, part 3).

    SHMCACHE_BENCH_N=1000000 .venv/bin/python -m pytest bench/test_lookup_bounds.py -p no:cacheprovider -s

The dataset and batches are bench/test_table.py's (N keys of 32 B, values of 61-141 B,
hits in batches of 1024 in a random order). Each variant is engine/_lookup.py's source
with one edit, loaded as its own module (none of them is correct as a lookup; they
measure what a part costs):

- "no prefetch": the software pipeline's prefetches of buckets and records removed;
- "hashes given": the kernel does not hash the keys (the hashes of a previous call are
  left in place): the cost of xxh64 over the batch;
- "no value copy": the value's bytes are not copied to the output (one byte is);
- "one version line": every key's seqlock version is read from the same few cache
  lines: at most what a version word on the index slot's line would save;
- "half as far ahead": the software pipeline's distances halved (buckets 16 keys ahead,
  records 8, as they were up to 2026-11-26): what more misses in flight buy on this host.
- "index only": no record is read (a tag match is taken for a hit, and nothing is
  prefetched for records): the bucket's version and index lines alone, so the rest of
  the time is what the records cost (at 20M entries, the part that grows).

Each round gives each kernel in turn one pass over all N keys (the order alternating by
round), and keeps each variant's rate over today's in that round, in the thread's CPU time
(time.thread_time; see bench/test_checks_cost.py for why). Passes, not short chunks handed
round the kernels: kernels taking turns on chunks of 16 batches (16K keys, ~4 MB of lines)
found the lines the one before had fetched still in this host's 32 MiB L3, and every
variant but the first of a chunk ran as if its table were in cache (each read 1.36-1.46x
today's, a prefetch distance that is no change included).
Also the same kernel on a table of 20,000 entries, whose lines all stay in cache: what
remains when no line comes from memory. Asserts only that the variants were built.
"""

from __future__ import annotations

import gc
import os
import sys
import time

import numpy as np
import pytest

from shmtest.bench import peers as P

from shmtest.bench.kernel_variants import VARIANTS, lookup_variant


def _table(n: int, tables: list) -> tuple:
    """A filled table of n entries, appended to tables (destroyed by the caller) as soon as it exists."""
    import shmcache
    from shmcache.engine import _input

    ds = P.make_dataset(n, with_bytes=False)
    name = f"bench-{os.getpid()}-bounds-{len(tables)}"
    w = shmcache.create(name, memory=P.cache_memory(n))
    tables.append((name, w, []))
    P.fill(w, ds)
    for keys in ds.hit_batches:
        k8, k64 = _input.words(keys, w.segment_arrays().geo[5])
        m = len(keys)
        tables[-1][2].append((k8, k64, np.empty(m, np.int64), np.zeros(m, np.bool_), np.zeros(m + 1, np.int64),
                              np.empty(m * 200, np.uint8)))
    return tables[-1]


def test_lookup_bounds():
    import shmcache
    from shmcache.engine import _lookup as LK

    if os.environ.get("CI") == "true":  # compiling four more kernels costs a minute of the suite's time
        pytest.skip("what bounds a lookup is measured on demand (see bench/README.md), not in CI")
    kernels = {"today": LK, **{label: lookup_variant(label) for label in VARIANTS}}
    n = P.bench_n()
    rounds = P.bench_rounds()
    counts = np.zeros(2, np.int64)
    none_given_up = np.zeros(8192, np.bool_)  # the lookup kernel's given_up (engine/layout.py NBUCKETS)
    tables: list = []
    try:
        _table(n, tables)
        _table(min(n, 20_000), tables)
        def run(kernel, table, lo, hi) -> int:
            arrays = table[1].segment_arrays()
            args = (arrays.meta, arrays.index, arrays.ring8, arrays.ring64, arrays.geo)
            for k8, k64, hashes, found, offsets, out in table[2][lo:hi]:
                kernel.lookup(*args, k8, k64, hashes, 0, found, offsets, out, 0, True, 160, -1, -1, 2000, counts,
                              none_given_up, False)
            return sum(len(b[2]) for b in table[2][lo:hi])

        for table in tables:
            for kernel in kernels.values():  # compile, warm up, untimed
                run(kernel, table, 0, len(table[2]))
            assert all(b[3].all() for b in table[2])  # today's kernel ran last: every hit found
        rates = {label: [] for label in kernels}
        cached = []
        nb = len(tables[0][2])
        gc.collect()
        gc.disable()
        try:
            for rnd in range(rounds):
                for label in list(kernels) if rnd % 2 else list(kernels)[::-1]:
                    t0 = time.thread_time()
                    k = run(kernels[label], tables[0], 0, nb)
                    rates[label].append(k / (time.thread_time() - t0))
                t0 = time.thread_time()
                k = run(LK, tables[1], 0, len(tables[1][2]))
                cached.append(k / (time.thread_time() - t0))
        finally:
            gc.enable()
        today = np.array(rates["today"])
        lines = [f"lookup bounds, N={n}, {rounds} interleaved rounds (load average {os.getloadavg()[0]:.1f}); "
                 f"kernel only, CPU time:",
                 f"  today            {np.median(today) / 1e6:6.2f} M keys/s"]
        for label in VARIANTS:
            got = np.array(rates[label])
            lines.append(f"  {label:16s} {np.median(got) / 1e6:6.2f} M keys/s  {np.median(got / today):.2f}x today "
                         f"(rounds: {' '.join(f'{x:.2f}' for x in got / today)})")
        lines.append(f"  today, {min(n, 20_000):,} entries (in cache): {np.median(cached) / 1e6:.2f} M keys/s")
        print("\n" + "\n".join(lines), file=sys.stderr)
    finally:
        for name, w, _ in tables:
            w.close()
            shmcache.destroy(name)


@pytest.mark.parametrize("label", sorted(VARIANTS))
def test_each_lookup_variant_still_applies_to_todays_kernel(label):
    """The measurement above runs on demand; its variants are held to today's source in every
    run, so that an edit of engine/_lookup.py that one no longer matches fails here, not on
    the day someone measures ('hashes given' did, unseen, from the kernel's start argument on)."""
    assert lookup_variant(label).lookup is not None
