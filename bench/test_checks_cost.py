"""What the bounds checks of invariant 9 cost: the lookup and apply kernels of the commit
before them (BASE, loaded from git) against today's, interleaved on one segment.

    SHMCACHE_BENCH_N=1000000 SHMCACHE_BENCH_ROUNDS=15 .venv/bin/python -m pytest bench/test_checks_cost.py -p no:cacheprovider -s

The dataset and batches are bench/test_table.py's (N keys of 32 B, values of 61-141 B,
batches of 1024 in a random order). Each round times one pass of each kernel over all
N keys, the two in alternating order, and keeps their ratio: get (hits, values copied),
get miss, and set (re-set every key with its value: the steady-state overwrite path).
The kernels are called as Reader/Writer call them, minus the Python around each batch
(the same for both), so the ratio overstates the checks' share of a get_many_packed.
The summary gives the median ratio per operation (today / base: above 1 = slower).
Skipped where git or the BASE commit is not at hand. Asserts nothing about speed.
"""

from __future__ import annotations

import gc
import importlib.util
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest

import _peers as P  # bench/ is put on sys.path by bench/conftest.py

BASE = "a6b975c"  # the last commit before the checks
REPO = Path(__file__).resolve().parent.parent


def _base_kernels():
    try:
        src = subprocess.run(["git", "-C", str(REPO), "show", f"{BASE}:engine/_kernels.py"], capture_output=True,
                             check=True, text=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        pytest.skip(f"the base kernels ({BASE}) are not in git here: {e}")
    d = Path(tempfile.gettempdir()) / f"shmcache-bench-base-{BASE}"  # numba's cache lives beside it
    d.mkdir(exist_ok=True)
    path = d / "_kernels_base.py"
    if not path.exists() or path.read_text() != src:
        path.write_text(src)
    spec = importlib.util.spec_from_file_location("_shmcache_kernels_base", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_checks_cost_interleaved():
    import shmcache
    from shmcache.engine import _kernels as K
    from shmcache.engine import _lookup as LK

    base = _base_kernels()
    n = P.bench_n()
    rounds = P.bench_rounds() if os.environ.get("SHMCACHE_BENCH_ROUNDS") else 9
    ds = P.make_dataset(n, with_bytes=False)
    name = f"bench-{os.getpid()}-checks"
    w = shmcache.create(name, memory=P.cache_memory(n))
    try:
        for s in range(0, n, P.BATCH):
            e = min(s + P.BATCH, n)
            w.set_many(ds.keys[s:e], (ds.offsets[s:e + 1] - ds.offsets[s], ds.data[ds.offsets[s]:ds.offsets[e]]))
        r = w  # a Writer reads too; the kernels take the same arrays
        args = (r._meta, r._index, r._ring8, r._ring64, r._geo)
        skip = np.zeros(0, np.uint8)
        counts = np.zeros(2, np.int64)
        me = w._me
        prepared = []
        for keys, (offs, data) in zip(ds.hit_batches, ds.value_batches):
            k8, k64 = r._words(keys)
            m = len(keys)
            prepared.append((k8, k64, np.empty(m, np.int64), np.zeros(m, np.bool_), np.zeros(m + 1, np.int64),
                             np.empty(m * 200, np.uint8), np.zeros(m, np.uint8), offs[:-1].copy(), np.diff(offs),
                             np.ascontiguousarray(data)))
        misses = [r._words(k) for k in ds.miss_batches]

        def get(new: bool, which: str) -> float:
            found = 0
            t0 = time.perf_counter()
            for j, p in enumerate(prepared):
                k8, k64, hashes, fnd, offsets, out = p[:6]
                if which == "miss":
                    k8, k64 = misses[j]
                if new:
                    LK.lookup(*args, k8, k64, hashes, 0, fnd, offsets, out, 0, True, 160, -1, -1, 2000, skip, counts)
                else:
                    base.lookup(*args, k8, k64, hashes, 0, fnd, offsets, out, 0, True, 160, -1, -1, 2000, counts)
                found += int(fnd[-1])
            dt = time.perf_counter() - t0
            return dt

        def put(new: bool) -> float:
            fn = K.apply_entries if new else base.apply_entries
            row = w._counters
            t0 = time.perf_counter()
            for k8, k64, hashes, _, _, _, actions, starts, lens, data in prepared:
                fn(*args, k8, k64, hashes, actions, starts, lens, data, 0, me, 2000, row)
            return time.perf_counter() - t0

        ops = {"get hit": lambda new: get(new, "hit"), "get miss": lambda new: get(new, "miss"), "set": put}
        ratios = {op: [] for op in ops}
        for op, fn in ops.items():
            fn(True), fn(False)  # compile / warm up, untimed
        gc.collect()
        gc.disable()
        try:
            for rnd in range(rounds):
                for op, fn in ops.items():
                    if rnd % 2:
                        b, a = fn(False), fn(True)
                    else:
                        a, b = fn(True), fn(False)
                    ratios[op].append(a / b)
        finally:
            gc.enable()
        lines = [f"checks cost, N={n}, {rounds} interleaved rounds, kernel time today / before ({BASE}):"]
        for op, got in ratios.items():
            lines.append(f"  {op:9s} median {np.median(got):.3f}  (rounds: {' '.join(f'{x:.3f}' for x in got)})")
        print("\n" + "\n".join(lines), file=sys.stderr)
        assert w.stats()["corruptions"] == 0
        found = r.contains_many(ds.keys)
        assert found.all()
    finally:
        w.close()
        shmcache.destroy(name)
