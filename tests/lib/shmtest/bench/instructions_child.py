"""The measured process of bench/test_instructions.py, run once natively (numba compiles the
kernels into its cache) and once under callgrind with collection off, switched on
and off by a 3-line C helper (TOGGLE, a shared library) around the measured calls only.

    python -m shmtest.bench.instructions_child lookup LABEL N BATCHES TOGGLE
    python -m shmtest.bench.instructions_child add LABEL N BATCHES TOGGLE

lookup: BATCHES batches of 1024 hits in a table of N entries (bench/test_table.py's
dataset), with today's kernel or one of bench/test_lookup_bounds.py's variants.
add: BATCHES batches of N fresh ADDs (32-byte keys, 61-141-byte values, hashes given)
into an empty 512 MiB cache, with today's apply kernel or one of bench/test_instructions.py's
ADD_VARIANTS. Prints the number of keys measured.
"""

from __future__ import annotations

import ctypes
import os
import sys

import numpy as np


def _lookup(label: str, n: int, batches: int, toggle) -> int:
    from shmtest.bench import peers as P
    import shmcache
    from shmtest.bench import kernel_variants
    from shmcache.engine import _input, _lookup
    from shmcache.engine.xxh64 import xxh64_rows

    LK = _lookup if label == "today" else kernel_variants.lookup_variant(label)  # noqa: N806 - a module
    ds = P.make_dataset(n, with_bytes=False)
    name = f"bench-{os.getpid()}-instructions"
    w = shmcache.create(name, memory=P.cache_memory(n))
    try:
        P.fill(w, ds)
        a = w.segment_arrays()
        counts = np.zeros(2, np.int64)
        calls = []
        none_given_up = np.zeros(8192, np.bool_)  # the kernel's given_up (engine/layout.py NBUCKETS)
        for keys in ds.hit_batches[:batches + 1]:
            k8, k64 = _input.words(keys, a.geo[5])
            m = len(keys)
            hashes = xxh64_rows(keys).view(np.int64)  # in place for the "hashes given" variant
            calls.append((k8, k64, hashes, 0, np.zeros(m, np.bool_), np.zeros(m + 1, np.int64),
                          np.empty(m * 200, np.uint8), 0, True, 160, -1, -1, 2000, counts, none_given_up, False))
        LK.lookup(a.meta, a.index, a.ring8, a.ring64, a.geo, *calls[0])  # loaded and warm, not counted
        toggle()
        for c in calls[1:]:
            LK.lookup(a.meta, a.index, a.ring8, a.ring64, a.geo, *c)
        toggle()
        if label == "today":
            assert all(c[4].all() for c in calls), "a hit was missed"
        return sum(len(c[2]) for c in calls[1:])
    finally:
        w.close()
        shmcache.destroy(name)


def _add(label: str, n: int, batches: int, toggle) -> int:
    import shmcache
    from shmtest.bench import kernel_variants
    from shmcache.engine import _input, _kernels
    from shmcache.engine.xxh64 import xxh64_rows
    from shmcache.engine.reader import SPIN_LIMIT

    K = _kernels if label == "today" else kernel_variants.add_variant(label)  # noqa: N806 - a module

    rng = np.random.default_rng(7)
    name = f"bench-{os.getpid()}-instructions"
    w = shmcache.create(name, memory="512MiB")
    try:
        a = w.segment_arrays()
        calls = []
        for _ in range(batches + 1):
            keys = rng.integers(0, 256, (n, 32), dtype=np.uint8)
            lens = rng.integers(61, 142, n).astype(np.int64)
            starts = np.zeros(n, np.int64)
            starts[1:] = np.cumsum(lens)[:-1]
            data = rng.integers(0, 256, int(lens.sum()), dtype=np.uint8)
            k8, k64 = _input.words(keys, a.geo[5])
            calls.append((k8, k64, xxh64_rows(keys).view(np.int64), True, np.zeros(n, np.uint8), starts, lens, data))

        me, counters = w.kernel_identity()

        def apply(c) -> None:
            done = K.apply_entries(a.meta, a.index, a.ring8, a.ring64, a.geo, *c, 0, me, SPIN_LIMIT, counters)
            assert done == n, done

        apply(calls[0])
        toggle()
        for c in calls[1:]:
            apply(c)
        toggle()
        return n * batches
    finally:
        w.close()
        shmcache.destroy(name)


def main() -> None:
    kind, label, n, batches, lib = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
    toggle = ctypes.CDLL(lib).cg_toggle
    keys = _lookup(label, n, batches, toggle) if kind == "lookup" else _add(label, n, batches, toggle)
    print(keys)


if __name__ == "__main__":
    main()
