"""Readers' hits and misses, summed across processes through the companion segment."""

import multiprocessing as mp
import os
import uuid

import numpy as np
import pytest

import shmcache
from shmcache.engine import reader_stats


@pytest.fixture
def cache_name():
    name = f"t-rstats-{uuid.uuid4().hex[:10]}"
    yield name
    for n in (name,):
        try:
            shmcache.destroy(n)
        except FileNotFoundError:
            pass
    assert not os.path.exists(reader_stats.path_of(name))


def _look(name: str, keys: np.ndarray, rounds: int) -> None:
    with shmcache.attach(name) as r:
        for _ in range(rounds):
            r.get_many_packed(keys)


def test_hits_and_misses_of_every_reader_process_are_summed(cache_name):
    rng = np.random.default_rng(3)
    keys = rng.integers(0, 256, (300, 32), np.uint8)
    with shmcache.create(cache_name, memory="64MiB") as w:
        w.set_many(keys[:200], [b"v" * 70] * 200)  # 200 present, 100 absent
        assert os.stat(reader_stats.path_of(cache_name)).st_mode & 0o777 == 0o600
        ctx = mp.get_context("spawn")
        procs = [ctx.Process(target=_look, args=(cache_name, keys, 3)) for _ in range(2)]
        for p in procs:
            p.start()
        for p in procs:
            p.join(60)
            assert p.exitcode == 0
        s = w.stats()  # the writer never looked anything up itself
        assert (s["hits"], s["misses"]) == (0, 0)
        assert (s["reader_hits"], s["reader_misses"]) == (2 * 3 * 200, 2 * 3 * 100)
        assert s["readers"] == 0  # both reader processes have exited
        with shmcache.attach(cache_name) as r:
            r.contains_many(keys[:10])
            s = r.stats()
            assert (s["hits"], s["reader_hits"]) == (10, 1210)
            assert s["readers"] == 1  # this process


def test_companion_mode_follows_the_cache(cache_name):
    with shmcache.create(cache_name, memory="64MiB", mode=0o640):
        pass
    assert os.stat(reader_stats.path_of(cache_name)).st_mode & 0o777 == 0o660


def test_a_cache_without_companion_still_reads(cache_name):
    key = bytes(range(32))
    with shmcache.create(cache_name, memory="64MiB") as w:
        w.set(key, b"x")
    os.unlink(reader_stats.path_of(cache_name))
    with shmcache.attach(cache_name) as r:
        assert r.get(key) == b"x"
        s = r.stats()
        assert (s["hits"], s["reader_hits"], s["readers"]) == (1, 0, 0)


def test_a_stale_companion_is_replaced_and_ignored(cache_name):
    with shmcache.create(cache_name, memory="64MiB") as w:
        w.set(bytes(32), b"x")
        with shmcache.attach(cache_name) as r:
            r.get(bytes(32))
    os.unlink(f"/dev/shm/{cache_name}")  # removed by hand: the companion stays behind
    with shmcache.create(cache_name, memory="64MiB") as w:
        assert w.stats()["reader_hits"] == 0  # the old counts belong to the old cache
