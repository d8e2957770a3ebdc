"""ipc/atomics.py, the only primitives the lock and seqlock kernels touch shared words with.

Pinned here: what each intrinsic returns (cas: the value seen, == expected on success;
fetch_add: the previous value; load_acquire/store_release round trip every int64), that
the writing intrinsics refuse a read-only array at typing time with the named
TypingError (a CAS on a PROT_READ mapping would be a SIGSEGV) while an acquire load
works on it; and across real processes on one file in /dev/shm: a CAS spin lock keeps a
plain counter exact (procs x N, every increment made inside the lock), and a seqlock
reader never accepts a torn set of words its writer is changing.

SHMCACHE_ATOMICS_N sets the lock increments per process and the seqlock reads (200,000 by
default: with fewer the processes rarely overlap on 2 busy cores; 5000000 for a long run).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid

import numpy as np
import pytest
from numba import njit
from numba.core.errors import TypingError

from shmcache.ipc.atomics import (
    cas,
    cas_word,
    fence_acquire,
    fence_release,
    fetch_add,
    load_acquire,
    load_word,
    store_release,
    store_word,
)

CHILD = ["-P", "-m", "shmtest.atomics_child"]  # tests/lib/shmtest/atomics_child.py
N = int(os.environ.get("SHMCACHE_ATOMICS_N", "200000"))
CHILD_TIMEOUT = 180.0  # each child compiles its kernels (no disk cache: see shmtest/atomics_child.py)
WORDS = 64
COUNT, PAIR = 8, 40  # as in shmtest/atomics_child.py


@njit
def _cas(a, i, expected, desired):
    return cas(a, i, expected, desired)


@njit
def _fetch_add(a, i, d):
    return fetch_add(a, i, d)


@njit
def _round_trip(a, i, v):
    store_release(a, i, v)
    fence_release()
    fence_acquire()
    return load_acquire(a, i)


@njit
def _load(a, i):
    return load_acquire(a, i)


@njit
def _store(a, i, v):
    store_release(a, i, v)


def test_cas_returns_the_value_seen_and_swaps_only_on_a_match():
    a = np.array([0, 7, -1], np.int64)
    assert _cas(a, 1, 7, 42) == 7 and a.tolist() == [0, 42, -1]  # success: returns expected
    assert _cas(a, 1, 7, 99) == 42 and a.tolist() == [0, 42, -1]  # failure: returns what is there, no store
    assert _cas(a, 2, -1, 1 << 62) == -1 and a[2] == 1 << 62
    assert cas_word(a, 0, 0, -5) == 0 and a[0] == -5  # the Python-callable form
    assert cas_word(a, 0, 1, 3) == -5 and a[0] == -5


def test_fetch_add_returns_the_previous_value():
    a = np.zeros(4, np.int64)
    assert [_fetch_add(a, 3, 5) for _ in range(3)] == [0, 5, 10] and a.tolist() == [0, 0, 0, 15]
    assert _fetch_add(a, 3, -20) == 15 and a[3] == -5
    a[0] = np.iinfo(np.int64).max
    assert _fetch_add(a, 0, 1) == np.iinfo(np.int64).max and a[0] == np.iinfo(np.int64).min  # wraps


@pytest.mark.parametrize("value", [0, 1, -1, 2**63 - 1, -(2**63), 0x5555AAAA5555AAAA])
def test_store_release_then_load_acquire_round_trips(value):
    a = np.zeros(3, np.int64)
    assert _round_trip(a, 1, value) == value and a.tolist() == [0, value, 0]
    store_word(a, 2, value)
    assert load_word(a, 2) == value and a[2] == value


def _read_only(n: int = 4) -> np.ndarray:
    a = np.frombuffer(bytes(8 * n), np.int64)
    assert not a.flags.writeable
    return a


@pytest.mark.parametrize("call,who", [
    (lambda a: _cas(a, 0, 0, 1), "cas"),
    (lambda a: _fetch_add(a, 0, 1), "fetch_add"),
    (lambda a: _store(a, 0, 1), "store_release"),
    (lambda a: cas_word(a, 0, 0, 1), "cas"),
    (lambda a: store_word(a, 0, 1), "store_release"),
])
def test_writing_intrinsics_refuse_a_read_only_array_at_typing_time(call, who):
    a = _read_only()
    with pytest.raises(TypingError, match=f"{who}: the array is read-only \\(a reader's mapping cannot be written\\)"):
        call(a)
    assert a.tolist() == [0, 0, 0, 0]


def test_an_acquire_load_works_on_a_read_only_array():
    a = np.frombuffer(np.array([3, -9], np.int64).tobytes(), np.int64)
    assert _load(a, 1) == -9 and load_word(a, 0) == 3


@pytest.mark.parametrize("arr", [np.zeros(4, np.int32), np.zeros((2, 2), np.int64), np.zeros(4, np.uint64)],
                         ids=["int32", "2-d", "uint64"])
def test_the_intrinsics_take_only_a_1d_int64_array(arr):
    for fn, args in ((_cas, (0, 0, 1)), (_load, (0,))):
        with pytest.raises(TypingError, match="expected a 1-d int64 array"):
            fn(arr, *args)


# -- across processes -------------------------------------------------------------------------


@pytest.fixture
def shm_file():
    """A plain file of WORDS zeroed int64 words in /dev/shm, removed after."""
    path = f"/dev/shm/t-atomics-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    with open(path, "wb") as f:
        f.write(bytes(WORDS * 8))
    yield path
    os.unlink(path)


def _run_children(argvs: list[list[str]]) -> list[dict]:
    """Start every child, wait for all (bounded), stop any left by pid; their JSON results."""
    procs = [subprocess.Popen([sys.executable, *CHILD, *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True) for argv in argvs]
    try:
        outs = []
        for p in procs:
            out, err = p.communicate(timeout=CHILD_TIMEOUT)
            assert p.returncode == 0, err[-3000:]
            outs.append(json.loads(out.strip().splitlines()[-1]))
        return outs
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
            p.wait(timeout=30)
            for s in (p.stdout, p.stderr):
                s.close()


@pytest.mark.parametrize("nprocs", [3])
def test_a_cas_spin_lock_keeps_a_plain_counter_exact_across_processes(shm_file, nprocs):
    _run_children([["lock", shm_file, str(N), str(nprocs)] for _ in range(nprocs)])
    words = np.fromfile(shm_file, np.int64)
    assert words[COUNT] == nprocs * N, f"{nprocs} x {N} increments under the lock, counted {words[COUNT]}"
    assert words[0] == 0  # the lock is free at the end


def test_a_seqlock_reader_never_accepts_a_torn_write(shm_file):
    writer, reader = _run_children([["writer", shm_file, str(N)], ["reader", shm_file, "0"]])
    assert reader["accepted"] >= N, (writer, reader)  # the writer ran until the reader had read enough
    assert reader["torn"] == 0, f"the reader accepted {reader['torn']} torn reads of {reader['accepted']}: {writer}"
    words = np.fromfile(shm_file, np.int64)
    assert words[24] % 2 == 0 and (words[PAIR:PAIR + 8] == writer["rounds"]).all()
