"""What the bounds checks of invariant 9 cost: the lookup and apply kernels of the commit
before them (BASE, loaded from git) against today's, interleaved on one segment.

    SHMCACHE_BENCH_N=1000000 SHMCACHE_BENCH_ROUNDS=15 .venv/bin/python -m pytest bench/test_checks_cost.py -p no:cacheprovider -s

The dataset and batches are bench/test_table.py's (N keys of 32 B, values of 61-141 B,
batches of 1024 in a random order). Each round goes once over all N keys, giving chunks of
16 batches to today's kernel and the base one in turn, and keeps the ratio of their
CPU time per key: get (hits, values copied),
get miss, and set (re-set every key with its value: the steady-state overwrite path).
Times are the thread's CPU time (time.thread_time): on this shared 2-core machine the
wall time of a pass includes whatever other processes took from it, which moved single
ratios from 0.4 to 2.1 at a load average of 10; CPU time leaves mostly the cache misses
other processes cause. The kernels are called as Reader/Writer call them, minus the Python around each batch
(the same for both), so the ratio overstates the checks' share of a get_many_packed.
The summary gives the median ratio per operation (today / base: above 1 = slower).
SHMCACHE_CHECKS_AA=1 runs the base against a second copy of itself: the bias and spread
of the method on the machine of the day. Skipped where git or the BASE commit is not at hand. Asserts nothing about speed.
"""

from __future__ import annotations

import gc
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from shmtest.bench import peers as P

BASE = "a6b975c"  # the last commit before the checks
REPO = Path(__file__).resolve().parent.parent


def _base_kernels(module: str = "_kernels_base"):
    try:
        src = subprocess.run(["git", "-C", str(REPO), "show", f"{BASE}:engine/_kernels.py"], capture_output=True,
                             check=True, text=True).stdout
    except (OSError, subprocess.CalledProcessError) as e:
        pytest.skip(f"the base kernels ({BASE}) are not in git here: {e}")
    return P.import_source(src, module, f"shmcache-bench-base-{BASE}")


def test_checks_cost_interleaved():
    import shmcache
    from shmcache.engine import _input
    from shmcache.engine import _kernels as K
    from shmcache.engine import _lookup as LK

    if os.environ.get("CI") == "true":  # compiling a second set of kernels costs a minute of the suite's ten
        pytest.skip("the checks' cost is measured on demand (see bench/README.md), not in CI")
    base = _base_kernels()
    aa = bool(os.environ.get("SHMCACHE_CHECKS_AA"))
    if aa:  # calibration: the base against a second copy of itself
        K = LK = _base_kernels("_kernels_base_copy")
        print("A/A calibration: 'today' is a second copy of the base kernels", file=sys.stderr)
    n = P.bench_n()
    rounds = P.bench_rounds() if os.environ.get("SHMCACHE_BENCH_ROUNDS") else 15
    ds = P.make_dataset(n, with_bytes=False)
    name = f"bench-{os.getpid()}-checks"
    w = shmcache.create(name, memory=P.cache_memory(n))
    try:
        P.fill(w, ds)
        a = w.segment_arrays()  # a Writer reads too; the kernels take the same arrays
        args = (a.meta, a.index, a.ring8, a.ring64, a.geo)
        kst = int(a.geo[5])  # key stride
        counts = np.zeros(2, np.int64)
        me, counters = w.kernel_identity()
        prepared = []
        for keys, (offs, data) in zip(ds.hit_batches, ds.value_batches):
            k8, k64 = _input.words(keys, kst)
            m = len(keys)
            prepared.append((k8, k64, np.empty(m, np.int64), np.zeros(m, np.bool_), np.zeros(m + 1, np.int64),
                             np.empty(m * 200, np.uint8), np.zeros(m, np.uint8), offs[:-1].copy(), np.diff(offs),
                             np.ascontiguousarray(data)))
        misses = [_input.words(k, kst) for k in ds.miss_batches]

        chunk = 16  # batches per turn: the sides alternate every ~2 ms, so a drift of the machine's speed hits both

        def get_batch(new: bool, which: str, j: int) -> None:
            k8, k64, hashes, fnd, offsets, out = prepared[j][:6]
            if which == "miss":
                k8, k64 = misses[j]
            if new:
                LK.lookup(*args, k8, k64, hashes, 0, fnd, offsets, out, 0, True, 160, -1, -1, 2000, counts,
                          np.zeros(8192, np.bool_), False)
            else:
                base.lookup(*args, k8, k64, hashes, 0, fnd, offsets, out, 0, True, 160, -1, -1, 2000, counts)

        def put_batch(new: bool, j: int) -> None:
            k8, k64, hashes, _, _, _, actions, starts, lens, data = prepared[j]
            if new and not aa:  # today's kernel hashes the keys itself unless told they are hashed already
                K.apply_entries(*args, k8, k64, hashes, False, actions, starts, lens, data, 0, me, 2000, counters)
            else:  # the base's signature, which the A/A copy has too
                (K if new else base).apply_entries(*args, k8, k64, hashes, actions, starts, lens, data, 0, me, 2000,
                                                   counters)

        ops = {"get hit": lambda new, j: get_batch(new, "hit", j), "get miss": lambda new, j: get_batch(new, "miss", j),
               "set": put_batch}

        def one_round(fn, rnd: int) -> float:
            """Chunks of batches go to today's and the base kernel in turn (which one gets the
            even chunks alternates by round); returns today's CPU time per key over base's."""
            t = [0.0, 0.0]
            keys = [0, 0]
            nb = len(prepared)
            for c in range(0, nb, chunk):
                side = (c // chunk + rnd) % 2  # 1 = today
                t0 = time.thread_time()
                for j in range(c, min(c + chunk, nb)):
                    fn(side == 1, j)
                t[side] += time.thread_time() - t0
                keys[side] += sum(len(prepared[j][2]) for j in range(c, min(c + chunk, nb)))
            return (t[1] / keys[1]) / (t[0] / keys[0])

        ratios = {op: [] for op in ops}
        for op, fn in ops.items():
            for j in range(len(prepared)):  # compile / warm up, untimed
                fn(True, j), fn(False, j)
        gc.collect()
        gc.disable()
        try:
            for rnd in range(rounds):
                for op, fn in ops.items():
                    ratios[op].append(one_round(fn, rnd))
        finally:
            gc.enable()
        lines = [f"checks cost, N={n}, {rounds} interleaved rounds, kernel time today / before ({BASE}):"]
        for op, got in ratios.items():
            lines.append(f"  {op:9s} median {np.median(got):.3f}  (rounds: {' '.join(f'{x:.3f}' for x in got)})")
        print("\n" + "\n".join(lines), file=sys.stderr)
        assert w.stats()["corruptions"] == 0
        found = w.contains_many(ds.keys)
        assert found.all()
    finally:
        w.close()
        shmcache.destroy(name)
