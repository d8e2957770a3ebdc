"""The sizing rule (engine/sizing.py, `shmcache size`) against real caches: the memory it
gives holds its entries without an eviction, at 1,024 entries and at 200,000, with the
headroom it claims spent on dead records; its bound on the fullest bucket holds, and is
not loose, at every size up to 1,000,000 keys; bad input is refused naming what was wrong."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

import shmcache
from shmcache.engine import layout as L
from shmcache.engine import sizing


def _values(rng, n: int, mean: int) -> tuple[np.ndarray, np.ndarray]:
    """n values of mean..mean+40 bytes, half each side of the mean's record size."""
    lens = rng.integers(mean - 20, mean + 21, n)
    offsets = np.zeros(n + 1, np.int64)
    np.cumsum(lens, out=offsets[1:])
    return offsets, rng.integers(0, 256, int(offsets[-1]), np.uint8)


def _live_per_bucket(name: str) -> np.ndarray:
    """Each bucket's live entries, read from the segment's bucket meta (M_LIVE)."""
    meta = np.memmap(f"/dev/shm/{name}", np.int64, "r", L.Geometry.meta_off, (L.NBUCKETS, L.ROW_WORDS))
    return np.array(meta[:, L.M_LIVE])


@pytest.mark.parametrize("entries", [1_024, 200_000])
def test_the_memory_it_gives_holds_every_entry_with_its_headroom_spent(cache_name, entries):
    plan = sizing.memory_for(entries, 100, max_value=256)
    rng = np.random.default_rng(entries)
    keys = rng.integers(0, 256, (entries, 32), np.uint8)
    offsets, data = _values(rng, entries, 100)
    with shmcache.create(cache_name, memory=plan.memory, max_value=256) as w:
        assert w.geometry == plan.geometry
        w.set_many(keys, (offsets, data))
        live = _live_per_bucket(cache_name)
        assert live.max() <= plan.fullest_bucket, (live.max(), plan)
        # a quarter of the entries written again: their old records are dead in the rings
        again = rng.choice(entries, entries // 4, replace=False)
        w.set_many(keys[again], [b"w" * 100] * len(again))
        st = w.stats()
    assert (st["entries"], st["evictions"]) == (entries, 0), (st, plan.as_dict())


@pytest.mark.parametrize("entries", [1_024, 50_000, 1_000_000])
def test_its_bound_on_the_fullest_bucket_holds_and_is_not_loose(cache_name, entries):
    """Keys in a real cache land in buckets by the layout's hash; the fullest holds at most
    the bound, and at least 70 % of it (at 1,024 keys, a bucket holds one or two)."""
    plan = sizing.memory_for(entries, 60, max_value=64, headroom=0.0)
    keys = np.random.default_rng(7).integers(0, 256, (entries, 32), np.uint8)
    with shmcache.create(cache_name, memory=plan.memory, max_value=64) as w:
        for i in range(0, entries, 250_000):
            w.set_many(keys[i:i + 250_000], [b"v" * 60] * len(keys[i:i + 250_000]))
        assert w.stats()["evictions"] == 0
        fullest = int(_live_per_bucket(cache_name).max())
    assert fullest <= plan.fullest_bucket
    if entries >= 50_000:
        assert fullest >= 0.7 * plan.fullest_bucket, (fullest, plan.fullest_bucket)


def test_too_little_memory_evicts(cache_name):
    """The rule's memory is near what is needed: two thirds of it, no headroom, evicts."""
    entries = 200_000
    plan = sizing.memory_for(entries, 100, max_value=256, headroom=0.0)
    rng = np.random.default_rng(5)
    keys = rng.integers(0, 256, (entries, 32), np.uint8)
    with shmcache.create(cache_name, memory=plan.memory * 2 // 3, max_value=256) as w:
        w.set_many(keys, [b"v" * 100] * entries)
        assert w.stats()["evictions"] > 0


def test_the_fullest_bucket_bound_grows_slower_than_the_entries():
    mean = [n / L.NBUCKETS for n in (10**6, 10**7, 10**8)]
    bound = [sizing.fullest_bucket(n) for n in (10**6, 10**7, 10**8)]
    assert [round(b / m, 2) for b, m in zip(bound, mean)] == sorted((round(b / m, 2) for b, m in zip(bound, mean)),
                                                                     reverse=True)
    assert bound[-1] / mean[-1] < 1.06 and sizing.fullest_bucket(1) >= 1


@pytest.mark.parametrize("kwargs, word", [
    ({"entries": 0, "value_bytes": 100}, "entries=0"),
    ({"entries": 10, "value_bytes": 5000}, "value_bytes=5000"),
    ({"entries": 10, "value_bytes": 100, "headroom": 1.0}, "headroom=1.0"),
    ({"entries": 10, "value_bytes": 100, "key_size": 0}, "key_size=0"),
])
def test_bad_input_is_refused_naming_it(kwargs, word):
    with pytest.raises(ValueError, match=word):
        sizing.memory_for(**kwargs)


def test_the_command_says_the_same_as_the_rule():
    out = subprocess.run([sys.executable, "-m", "shmcache", "size", "--entries", "1000000", "--value-bytes", "100",
                          "--json"], capture_output=True, text=True, check=True).stdout
    assert json.loads(out) == sizing.memory_for(1_000_000, 100).as_dict()
    text = subprocess.run([sys.executable, "-m", "shmcache", "size", "--entries", "1000000", "--value-bytes", "100"],
                          capture_output=True, text=True, check=True).stdout
    assert text.startswith(f"--memory {sizing.memory_for(1_000_000, 100).memory >> 20}MiB")
    bad = subprocess.run([sys.executable, "-m", "shmcache", "size", "--entries", "-5", "--value-bytes", "100"],
                         capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.strip() == "shmcache: entries=-5: a positive number of entries", bad
