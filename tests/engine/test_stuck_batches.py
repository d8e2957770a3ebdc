"""A lookup call's one bound on buckets held mid-write, at every batch size (issue 53, item
5): with every bucket held by a live process, a call of N keys took 3.1 s at 20,000 keys,
13.9 s at 50,000, 50.6 s at 100,000 and 224.5 s at 200,000 (quadratic: each key given up
went back to Python, and each return hashed the rest of the batch again). The contract is
about STUCK_GIVE_UP a call, whatever its size: past the bound, the kernel gives each held
bucket up once and every key of it is a miss, in one pass."""

from __future__ import annotations

import time
import uuid

import numpy as np

import shmcache
from shmcache.engine import reader as R

from shmtest.procs import hold_every_bucket

KEYS = 200_000


def test_a_batch_of_200000_keys_over_held_buckets_returns_after_one_bound():
    name = f"t-stuck-{uuid.uuid4().hex[:8]}"
    keys = np.random.default_rng(53).integers(0, 256, (KEYS, 32), dtype=np.uint8)
    with shmcache.create(name, memory="64MiB", max_value=64) as w:
        w.set_many(keys[:1000], [b"v"] * 1000)  # present keys too: held, they are misses all the same
    with shmcache.attach(name) as r:
        assert r.get_many_packed(keys[:1000]).found.all()  # the kernel loaded (or compiled) before the clock
    holder = hold_every_bucket(f"/dev/shm/{name}")
    try:
        with shmcache.attach(name) as r:
            corrupt0 = r.stats()["corruptions"]
            t0 = time.monotonic()
            packed = r.get_many_packed(keys)
            took = time.monotonic() - t0
            assert not packed.found.any() and (np.diff(packed.offsets) == 0).all()
            assert r.stats()["corruptions"] - corrupt0 == KEYS, "one corruption counted a key given up"
        print(f"{KEYS:,} keys over 8,192 held buckets: {took:.2f} s (bound {R.STUCK_GIVE_UP} s)")
        # about one bound: the wait, then one pass that spins on each held bucket once
        assert took < R.STUCK_GIVE_UP + 5, f"a batch of {KEYS:,} keys took {took:.1f} s"
    finally:
        holder.kill()
        holder.wait()
        shmcache.destroy(name)
