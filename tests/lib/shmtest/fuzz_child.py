"""Child roles of test_corrupt.py and test_fuzz.py (run through shmtest/procs.py: `shmtest/procs.py ROLE ...`).

table NAME SEED NKEYS: on "get V" looks every pool key up (get_many_packed in batches of
  1024, then contains_many), verifies every hit (a hit must be whole, of its own key) and
  answers with hits, hits at version V, values that failed verification, the slowest call
  and the handle's stats; on "set V" sets every pool key at version V (batches of 1024),
  on "del K" deletes the first K keys; "quit" ends it.
hold NAME BUCKET MODE: takes bucket BUCKET's lock with its own owner word and keeps its
  version odd and moving (MODE "odd"), or bumps an even version without the lock
  (MODE "even"), until "quit": a writer stopped mid-write or a hostile process.
probe NAME: on "probe", attaches and opens the cache: answers {"refused": error type,
  "message"} or runs one lookup and one set of a few keys and answers {"ok": ...}.
"""

from __future__ import annotations

import os
import sys
import threading
import time

import numpy as np

from shmtest.procs import _say, key_pool, make_values, verify

BATCH = 1024


def _stats(h) -> dict:
    s = h.stats()
    # .get: the same child runs against the code before the counters existed (to see a test fail there)
    return {k: s.get(k, 0) for k in ("corruptions", "reader_corruptions", "read_retries", "entries", "lock_takeovers",
                                     "evictions")}


def role_table(name, seed, nkeys):
    import shmcache

    keys, hdr, _ = key_pool(int(seed), int(nkeys))
    r = shmcache.attach(name)
    w = None
    _say(ready=os.getpid())
    for line in sys.stdin:
        cmd = line.split()
        if cmd[0] == "quit":
            break
        slowest, out = 0.0, {}
        if cmd[0] == "get":
            want = int(cmd[1])
            hits = at_version = bad = 0
            problem = ""
            for s in range(0, len(keys), BATCH):
                t0 = time.monotonic()
                p = r.get_many_packed(keys[s:s + BATCH])
                slowest = max(slowest, time.monotonic() - t0)
                nb, vers, prob = verify(p, hdr[s:s + BATCH])
                hits += int(p.found.sum())
                at_version += int((vers == want).sum())
                bad += nb
                problem = problem or prob
            t0 = time.monotonic()
            contained = int(r.contains_many(keys).sum())
            slowest = max(slowest, time.monotonic() - t0)
            out = dict(hits=hits, at_version=at_version, bad=bad, problem=problem, contained=contained)
            h = r
        else:
            w = w or shmcache.open(name)
            if cmd[0] == "set":
                ver = int(cmd[1])
                for s in range(0, len(keys), BATCH):
                    v = make_values(hdr[s:s + BATCH], ver)
                    t0 = time.monotonic()
                    w.set_many(keys[s:s + BATCH], v)
                    slowest = max(slowest, time.monotonic() - t0)
            elif cmd[0] == "del":
                t0 = time.monotonic()
                w.delete_many(keys[:int(cmd[1])])
                slowest = time.monotonic() - t0
            h = w
        _say(slowest=slowest, **out, **_stats(h))
    r.close()
    if w is not None:
        w.close()


def role_hold(name, bucket, mode):
    import shmcache
    from shmcache.engine import layout as L
    from shmcache.ipc.atomics import store_word

    b = int(bucket)
    w = shmcache.open(name)
    meta = w._meta  # white-box: this role plays a broken or hostile writer
    lock, ver = b * L.ROW_WORDS + L.M_LOCK, b * L.ROW_WORDS + L.M_VERSION
    stop = threading.Event()
    threading.Thread(target=lambda: (sys.stdin.readline(), stop.set()), daemon=True).start()
    if mode == "odd":
        store_word(meta, lock, w._me)
        store_word(meta, ver, int(meta[ver]) | 1)
    _say(ready=os.getpid(), owner=w._me)
    while not stop.is_set():
        for _ in range(10_000):
            store_word(meta, ver, int(meta[ver]) + 2)
    if mode == "odd":
        store_word(meta, ver, int(meta[ver]) + 1)
        store_word(meta, lock, 0)
    del meta
    w.close()


def role_probe(name):
    import shmcache

    rng = np.random.default_rng(os.getpid())
    _say(ready=os.getpid())
    for line in sys.stdin:
        if line.split()[0] == "quit":
            break
        try:
            r = shmcache.attach(name)
        except (shmcache.ShmcacheError, OSError) as e:
            _say(refused=type(e).__name__, message=str(e))
            continue
        try:
            w = shmcache.open(name)
        except (shmcache.ShmcacheError, OSError) as e:
            r.close()
            _say(refused=type(e).__name__, message=str(e), writer_only=True)
            continue
        k = rng.integers(0, 256, (64, r.key_size), dtype=np.uint8)
        t0 = time.monotonic()
        r.get_many_packed(k)
        w.set_many(k, [b"x" * min(8, r.max_value)] * len(k))
        got = int(r.contains_many(k).sum())
        _say(ok=got, seconds=time.monotonic() - t0, corruptions=w.stats()["corruptions"])
        w.close()
        r.close()


ROLES = {"table": role_table, "hold": role_hold, "probe": role_probe}
