"""shmcache.follow (engine/reattach.py): a handle that follows a cache's name never serves a
destroyed cache: what is at the name now answers, whatever it is (docs/reader-contract.md)."""

from __future__ import annotations

import os

import pytest

import shmcache

K = b"k" * 32


def test_a_follower_serves_only_what_is_at_the_name_now(cache_name):
    f = shmcache.follow(cache_name)
    try:
        assert f.reader() is None  # nothing there yet
        with shmcache.create(cache_name, memory="34MiB") as w:
            w.set(K, b"v1")
        assert f.reader().get(K) == b"v1"
        shmcache.destroy(cache_name)
        with open(f"/dev/shm/{cache_name}", "wb") as junk:  # random bytes at the name
            junk.write(os.urandom(1 << 20))
        for _ in range(2):  # refused each time, the old mapping never served
            with pytest.raises(shmcache.NotACacheError, match=cache_name):
                f.reader()
        os.unlink(f"/dev/shm/{cache_name}")
        assert f.reader() is None
        with shmcache.create(cache_name, memory="34MiB") as w:
            w.set(K, b"v2")
        assert f.reader().get(K) == b"v2"
    finally:
        f.close()


def test_a_bad_name_or_owner_is_refused_at_once():
    with pytest.raises(ValueError, match="not valid"):
        shmcache.follow("../x")
    with pytest.raises(ValueError, match="no such user"):
        shmcache.follow("x", owner="no-such-user-shmcache")
