"""Invariant 4 with real processes: a writer SIGKILLed inside set_many leaves no lock held
forever and no bucket unreadable.

A child (tests/lib/shmtest/procs.py crash_writer) loops set_many over 60k keys in two big
batches, so it is almost always inside the apply kernel, holding some bucket's lock; the
parent SIGKILLs it at a random moment and reaps it. Then a reader reads every bucket
(before any repair), another writer process writes one key into every bucket (taking
over the dead writer's lock), and the reader checks again.
"""

from __future__ import annotations

import json
import os
import random
import time

import numpy as np
import pytest

import shmcache
from shmcache.engine import layout as L

from shmtest.procs import Proc, check_table, key_pool, probe_keys, verify

START_TIMEOUT = 60.0  # a cold numba cache compiles the kernels in each child
BOUND = 5.0  # a reader's or writer's pass over all 8192 buckets must end within this
SEED, NKEYS = 21, 60_000


def _locks(r) -> np.ndarray:
    return r._meta.reshape(L.NBUCKETS, L.ROW_WORDS)[:, L.M_LOCK].copy()


def _indexed_keys(r, b: int, candidates: np.ndarray) -> int:
    """White-box: how many of these keys bucket b's index points at, through LIVE records."""
    g = r.geometry
    seen = set()
    for e in r._index[b * g.slots:(b + 1) * g.slots].tolist():
        if e:
            off = b * g.ring + (e & L.POS_MASK) - 1
            if int(r._ring64[off // 8 + 1]) >> 32 == L.F_LIVE:
                seen.add(r._ring8[off + L.RECORD_HEADER:off + L.RECORD_HEADER + g.key_size].tobytes())
    return len(seen & {k.tobytes() for k in candidates})


def _ints(a: np.ndarray) -> str:
    return json.dumps(a.tolist(), separators=(",", ":"))  # no spaces: one word of a command line


def _kill_inside(procs, name, ver, rng) -> tuple[Proc, dict]:
    """Start a crash writer, let it run a random while, SIGKILL and reap it."""
    c = procs("crash_writer", name, SEED, NKEYS, ver)
    hello = c.recv(START_TIMEOUT)
    time.sleep(rng.uniform(0.05, 0.35))
    assert c.p.poll() is None, c.stderr()
    c.sigkill()
    assert c.p.returncode == -9
    return c, hello


@pytest.mark.slow  # a long fault run: writers killed mid-write again and again
def test_sigkill_mid_set_many_never_blocks_readers_or_writers(cache_name, procs):
    rng = random.Random(os.getpid())
    shmcache.create(cache_name, memory="40MiB").close()
    r = shmcache.attach(cache_name)
    reader = procs("service_reader", cache_name, SEED, NKEYS)
    writer = procs("service_writer", cache_name, SEED)
    assert "ready" in reader.recv(START_TIMEOUT) and "ready" in writer.recv(START_TIMEOUT)
    kills, held_total, figures = 12, 0, []
    try:
        for k in range(kills):
            victim, hello = _kill_inside(procs, cache_name, 1_000_000 + 2 * k, rng)
            locks = _locks(r)
            held = np.flatnonzero(locks)
            assert all(int(locks[b]) == hello["owner"] for b in held), \
                f"locks held by someone other than the dead writer: {[hex(int(locks[b])) for b in held]}"
            assert len(held) <= 1, "a writer holds one bucket lock at a time"
            odd = [int(r._meta[b * L.ROW_WORDS + L.M_VERSION]) & 1 for b in held]
            held_total += len(held)
            takeovers_before = r.stats()["lock_takeovers"]

            # (ii) before any repair: every bucket reads, within the bound, and every hit is whole
            before = reader.ask("read -1 8000", BOUND)
            assert before["bad"] == 0, before["problem"]
            assert before["elapsed"] < BOUND

            # (i) another writer writes a key into every bucket, taking over the dead lock
            t0 = time.monotonic()
            wrote = writer.ask(f"write {k + 1}", BOUND)
            assert time.monotonic() - t0 < BOUND
            assert not _locks(r).any(), "a lock is still held after a writer passed every bucket"
            assert r.stats()["lock_takeovers"] - takeovers_before == len(held)
            after = reader.ask(f"read {k + 1} 8000", BOUND)
            assert after["bad"] == 0, after["problem"]
            assert after["probe_missing"] == 0 and after["probe_wrong_version"] == 0, after
            figures.append((len(held), odd, round(before["elapsed"], 3), round(wrote["elapsed"], 3),
                            before["read_retries"]))
            check_table(r)
        st = r.stats()
        print(f"\n{kills} kills, {held_total} left a lock held; lock_takeovers={st['lock_takeovers']}; "
              f"per kill (held, odd version, read s, write s, reader retries so far): {figures}")
        assert held_total > 0, f"none of {kills} kills landed inside a bucket lock"
        assert st["lock_takeovers"] == held_total
        # after the run: every key ever written reads back absent or whole; the probes are all there
        keys, hdr, _ = key_pool(SEED, NKEYS)
        pk, ph = probe_keys(SEED)
        p = r.get_many_packed(np.concatenate([keys, pk]))
        nbad, vers, problem = verify(p, np.concatenate([hdr, ph]))
        assert nbad == 0, problem
        assert (vers[NKEYS:] == kills).all()
        assert check_table(r)["entries"] == st["entries"] == int(p.found.sum())
    finally:
        r.close()


def test_reader_reads_a_dead_writers_bucket_unrepaired(cache_name, procs):
    """A kill that leaves a lock held (and the bucket mid-write): a fresh reader process reads
    that bucket and every other one, without waiting for a repair that nobody does; then
    repair_dead_locks() repairs exactly that bucket and the table is consistent."""
    rng = random.Random(os.getpid() + 1)
    shmcache.create(cache_name, memory="40MiB").close()
    r = shmcache.attach(cache_name)
    try:
        keys, hdr, bucket = key_pool(SEED, NKEYS)
        for attempt in range(20):
            victim, hello = _kill_inside(procs, cache_name, 2 * attempt, rng)
            held = np.flatnonzero(_locks(r))
            if len(held):
                break
        else:
            pytest.fail("20 kills and none landed inside a bucket lock")
        b = int(held[0])
        assert int(_locks(r)[b]) == hello["owner"] and hello["owner"] >> 32 == victim.pid
        version = int(r._meta[b * L.ROW_WORDS + L.M_VERSION])
        mine = np.flatnonzero(bucket == b)
        assert len(mine) > 0
        expect = _indexed_keys(r, b, keys[mine])
        # the bucket's keys, then one key in every bucket (those were never written: misses)
        fresh = procs("service_reader", cache_name, SEED, NKEYS, "cold")
        assert "ready" in fresh.recv(START_TIMEOUT)
        t0 = time.monotonic()
        # the first lookup in a process also loads the kernels (compiles if the cache is cold)
        res = fresh.ask("read -1 " + _ints(mine), START_TIMEOUT)
        wall = time.monotonic() - t0
        assert res["bad"] == 0, res["problem"]
        assert res["n"] == len(mine) + L.NBUCKETS
        assert res["hits"] == expect, "the reader must find what the dead writer's bucket holds, as it stands"
        again = fresh.ask("read -1 " + _ints(mine), BOUND)
        assert again["bad"] == 0, again["problem"]
        assert again["elapsed"] < 1.0, f"reading a dead writer's bucket took {again['elapsed']:.2f} s"
        # nobody repaired it: the dead writer still holds it, the version did not move
        assert int(_locks(r)[b]) == hello["owner"]
        assert int(r._meta[b * L.ROW_WORDS + L.M_VERSION]) == version
        print(f"\nkill #{attempt + 1} left bucket {b} locked (version {'odd: mid-write' if version & 1 else 'even'}); "
              f"fresh reader: {res['n']} keys (all buckets) in {res['elapsed']:.3f} s ({wall:.2f} s round trip), "
              f"{expect} of its {len(mine)} keys found, "
              f"the dead bucket's {len(mine)} keys again in {again['elapsed'] * 1e3:.1f} ms, "
              f"{again['read_retries']} retries")

        w = shmcache.open(cache_name)
        try:
            assert w.repair_dead_locks() == 1
            assert w.repair_dead_locks() == 0
        finally:
            w.close()
        assert not _locks(r).any()
        assert r.stats()["lock_takeovers"] == 1
        assert int(r._meta[b * L.ROW_WORDS + L.M_VERSION]) > version
        check_table(r)
        p = r.get_many_packed(keys)
        nbad, _, problem = verify(p, hdr)
        assert nbad == 0, problem
        assert int(p.found.sum()) == r.stats()["entries"]
    finally:
        r.close()


def test_stuck_bucket_never_accepts_a_live_lock(cache_name):
    """A reader accepts a mid-write bucket as it stands only while no live process holds it:
    held by a live process, it retries; held by a dead writer, it reads it as it stands; odd
    under a free lock (no writer makes that: a writer takes the lock before the version goes
    odd and unlocks after it goes even), it reads it as it stands and counts a corruption."""
    import shmcache
    from shmcache.engine import layout as L

    w = shmcache.create(cache_name, memory="40MiB")
    r = shmcache.attach(cache_name)
    try:
        row = 5 * L.ROW_WORDS
        w._meta[row + L.M_VERSION] = 7  # odd, lock free: damage
        assert r._stuck_bucket(5, -1, -1) == (5, 7)
        assert r.stats()["corruptions"] == 1
        w._meta[row + L.M_LOCK] = w._me  # odd, held by this live process
        assert r._stuck_bucket(5, -1, -1) == (-1, -1)
        dead = (2**22 + 12345) << 32 | 1  # a pid above pid_max: never alive
        w._meta[row + L.M_LOCK] = dead
        assert r._stuck_bucket(5, -1, -1) == (5, 7)
    finally:
        w._meta[5 * L.ROW_WORDS + L.M_LOCK] = 0
        w._meta[5 * L.ROW_WORDS + L.M_VERSION] = 8
        r.close()
        w.close()
