"""A child process of tests/ipc/test_atomics.py: `python -m shmtest.atomics_child ROLE PATH N`.

It maps PATH (a plain file in /dev/shm the test made, WORDS int64 words) read-write and
runs one njit kernel built on shmcache.ipc.atomics, then prints one JSON line with its
result. Kernels are compiled here without numba's disk cache: a cached caller keeps the
code of an intrinsic it inlined even after the intrinsic's module changed.

Words of the file:
    LOCK      the spin lock: 0 free, else the holder's id
    COUNT     a plain counter, incremented (non-atomically) under the lock
    STARTED   children that have mapped the file (fetch_add), the start line for all
    VERSION   the seqlock's version: odd while the writer changes the pair
    ACCEPTED  reads of written values the reader accepted (the writer goes on until enough
              are, and for at least as many rounds)
    DONE      set by the writer when it stops
    PAIR..    PAIR_WORDS data words the writer sets together, all to the same value
"""

from __future__ import annotations

import ctypes
import json
import mmap
import os
import sys

import numpy as np
from numba import njit

from shmcache.ipc.atomics import cas, fence_acquire, fence_release, fetch_add, load_acquire, store_release

WORDS = 64
LOCK, COUNT, STARTED, VERSION, ACCEPTED, DONE = 0, 8, 16, 24, 32, 33
PAIR, PAIR_WORDS = 40, 8
INSIDE = 16  # atomic adds inside the lock per increment: most of a holder's time is in there

_sched_yield = ctypes.CDLL(None).sched_yield  # spinners give the core to a descheduled holder
_sched_yield.restype = ctypes.c_int
_sched_yield.argtypes = []


@njit(nogil=True)
def _wait_for(arr, idx, n):
    while load_acquire(arr, idx) < n:
        pass


@njit(nogil=True)
def locked_increments(arr, me, n, procs):
    fetch_add(arr, STARTED, 1)
    _wait_for(arr, STARTED, procs)  # every child has compiled and mapped: they contend from here
    spins = 0
    for _ in range(n):
        while cas(arr, LOCK, 0, me) != 0:
            spins += 1
            if spins % 64 == 0:
                _sched_yield()
        c = arr[COUNT]  # plain load and store: only the lock makes them safe
        for _ in range(INSIDE):  # a wide critical section (atomic adds: not optimised away), so
            fetch_add(arr, PAIR, 1)  # that a holder preempted is mostly preempted in here
        arr[COUNT] = c + 1
        store_release(arr, LOCK, 0)
    return spins


@njit(nogil=True)
def seqlock_writer(arr, want_accepted, max_rounds):
    fetch_add(arr, STARTED, 1)
    _wait_for(arr, STARTED, 2)
    rounds = 0
    while (rounds < want_accepted or load_acquire(arr, ACCEPTED) < want_accepted) and rounds < max_rounds:
        rounds += 1
        v = arr[VERSION]
        store_release(arr, VERSION, v + 1)  # odd: being written
        fence_release()
        for k in range(PAIR_WORDS):
            arr[PAIR + k] = rounds
        fence_release()
        store_release(arr, VERSION, v + 2)
        for _ in range(64):  # give the reader a window (a writer that never pauses starves it)
            load_acquire(arr, DONE)
    store_release(arr, DONE, 1)
    return rounds


@njit(nogil=True)
def seqlock_reader(arr, out):
    """out: [reads accepted while the writer wrote, torn reads accepted, retries]."""
    fetch_add(arr, STARTED, 1)
    _wait_for(arr, STARTED, 2)
    vals = np.empty(PAIR_WORDS, np.int64)
    while True:
        done = load_acquire(arr, DONE)
        v1 = load_acquire(arr, VERSION)
        if v1 & 1:
            out[2] += 1
            continue
        for k in range(PAIR_WORDS):
            vals[k] = arr[PAIR + k]  # plain loads, as the lookup kernel's
        fence_acquire()
        v2 = load_acquire(arr, VERSION)
        if v1 != v2:
            out[2] += 1
            continue
        for k in range(1, PAIR_WORDS):
            if vals[k] != vals[0]:
                out[1] += 1
                break
        if done:
            return
        if vals[0] > 0:  # counted once the writer has begun: reads made while it writes
            out[0] += 1
            if out[0] % 1024 == 0:
                store_release(arr, ACCEPTED, out[0])


def main() -> None:
    role, path, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    fd = os.open(path, os.O_RDWR)
    try:
        mm = mmap.mmap(fd, WORDS * 8)
    finally:
        os.close(fd)
    arr = np.frombuffer(mm, np.int64)
    if role == "lock":
        procs = int(sys.argv[4])
        spins = locked_increments(arr, os.getpid(), n, procs)
        print(json.dumps({"spins": int(spins)}), flush=True)
    elif role == "writer":
        rounds = seqlock_writer(arr, n, 1 << 40)
        print(json.dumps({"rounds": int(rounds)}), flush=True)
    elif role == "reader":
        out = np.zeros(3, np.int64)
        seqlock_reader(arr, out)
        print(json.dumps({"accepted": int(out[0]), "torn": int(out[1]), "retries": int(out[2])}), flush=True)
    else:
        raise SystemExit(f"unknown role {role!r}")
    del arr
    mm.close()


if __name__ == "__main__":
    main()
