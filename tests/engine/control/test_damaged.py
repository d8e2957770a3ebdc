"""status() (engine/control/area.py) reads the segment as untrusted (DESIGN invariant 8): damaged control
words are named in status()["damaged"] and read as nothing, never raised on, and never
make a cache ready. No broker: the words are written into a real segment by hand."""

import uuid

import pytest

import shmcache
from shmcache.engine.control import layout as C
from shmcache.engine import layout as L
from shmcache.ipc import liveness


def poke(w, word: int, value: int) -> None:
    """Header word `word` of Writer w's segment, written by hand: a state the test plants
    (damage, a supervisor between two of its stores, words an earlier shmcache left) that
    no named write of ControlArea makes."""
    w.segment_arrays().header[word] = value


@pytest.fixture
def cache():
    name = f"t-damaged-{uuid.uuid4().hex[:10]}"
    w = shmcache.create(name, memory="4MiB", max_value=64)
    try:
        yield w
    finally:
        w.close()
        shmcache.destroy(name)


def _looks_ready(w, nparts: int = 2) -> None:
    """A live supervisor (this process) with every partition assigned and caught up."""
    w.control.set_topic("t", nparts)
    rows = w.control.partitions
    for p in range(nparts):
        rows[p, [C.P_APPLIED, C.P_HIGH_WATERMARK, C.P_OWNER, C.P_CAUGHT_UP, C.P_ASSIGNED]] = [5, 5, 1, 1, 1]
    w.control.worker_row(0).claim(liveness.owner_word())
    w.control.claim_supervisor()


def test_a_consistent_segment_is_ready(cache):
    _looks_ready(cache)
    st = cache.status()
    assert st["ready"] and st["damaged"] == [] and st["unassigned"] == []


@pytest.mark.parametrize("owner", [L.MAX_WORKERS + 1, 1 << 40, -5])
def test_owner_index_out_of_range(cache, owner):
    _looks_ready(cache)
    cache.control.partitions[1, C.P_OWNER] = owner
    st = cache.status()
    assert any("partition 1: owner" in d for d in st["damaged"]), st["damaged"]
    assert st["assigned"][1]["worker"] is None and st["assigned"][1]["worker_pid"] is None


@pytest.mark.parametrize("count", [L.MAX_PARTITIONS + 1, 1 << 62, -1])
def test_partition_count_out_of_range(cache, count):
    _looks_ready(cache)
    poke(cache, L.H_PARTITIONS, count)  # damage, by hand
    st = cache.status()
    assert any("partition count" in d for d in st["damaged"]), st["damaged"]
    assert st["partitions"] == 0 and st["assigned"] == [] and not st["ready"]
    with pytest.raises(shmcache.CacheNotReadyError, match=cache.name):
        cache.wait_ready(timeout=0.1)


@pytest.mark.parametrize("length", [L.TOPIC_MAX + 1, 1 << 50, -3])
def test_topic_length_out_of_range(cache, length):
    _looks_ready(cache)
    poke(cache, L.H_TOPIC_LEN, length)  # damage, by hand
    st = cache.status()
    assert any("topic length" in d for d in st["damaged"]), st["damaged"]
    assert isinstance(st["topic"], str) and len(st["topic"].encode()) <= L.TOPIC_MAX


def test_garbage_group_words(cache):
    _looks_ready(cache)
    cache.control.set_group(2, [{"client_id": "other", "host": "10.0.0.9", "instance_id": ""}], {1: 0})
    st = cache.status()
    assert st["shared_group"] and st["elsewhere"] == [] and st["group_others"][0]["partitions"] == [1]
    # damage, by hand
    poke(cache, C.H_GROUP_TEXT_LEN, -7)
    poke(cache, C.H_GROUP_TEXT, 0x7B7B7B7B)  # "{{{{"
    poke(cache, C.H_GROUP_TEXT_LEN, 4)
    st = cache.status()
    assert any("group members text" in d for d in st["damaged"]), st["damaged"]
    poke(cache, C.H_GROUP_TEXT_LEN, 1 << 40)
    st = cache.status()
    assert any("group text length" in d for d in st["damaged"]), st["damaged"]
    assert st["ready"] is True  # the group words name no partition of this cache's: nothing else changed


def test_rows_of_a_dead_supervisor_are_never_ready(cache):
    """Rows left by a supervisor that died are not ready, and a starting supervisor disowns
    them (keeping the applied offsets) before its own pid makes them count."""
    _looks_ready(cache)
    poke(cache, C.H_SUPERVISOR, (2 ** 22 + 1) << 32 | 1)  # no such process
    assert not cache.status()["ready"]
    rows = cache.control.partitions
    gen = [cache.control.partition_rows.generation(p) for p in range(2)]
    cache.control.disown_partitions()
    cache.control.claim_supervisor()
    st = cache.status()
    assert not st["ready"] and st["assigned"] == [] and st["unassigned"] == [0, 1]
    assert rows[:2, C.P_APPLIED].tolist() == [5, 5]
    assert [cache.control.partition_rows.generation(p) for p in range(2)] == [g + 1 for g in gen]


def test_a_live_supervisor_whose_heartbeat_stopped_is_shown_stale(cache):
    """H_SUPERVISOR_HEARTBEAT is read: status() gives its age, and past STALE_HEARTBEAT_S a
    supervisor that is alive but no longer goes round its loop is marked stale, and the
    cache is not ready (it restarts no worker, sees no new partition)."""
    import time

    from shmcache.engine.control.status import STALE_HEARTBEAT_S

    _looks_ready(cache)
    cache.control.beat()
    st = cache.status()
    assert st["supervisor_heartbeat_age_s"] < STALE_HEARTBEAT_S and not st["supervisor_stale"]
    poke(cache, C.H_SUPERVISOR_HEARTBEAT, time.monotonic_ns() - int((STALE_HEARTBEAT_S + 50) * 1e9))
    st = cache.status()
    assert st["supervisor_stale"] and st["supervisor_heartbeat_age_s"] >= STALE_HEARTBEAT_S + 50
    assert not st["ready"]
    with pytest.raises(shmcache.CacheNotReadyError, match=r"has not gone round its loop for 6\d s: stopped or hung"):
        cache.wait_ready(timeout=0)
    cache.control.beat()
    assert cache.status()["ready"]
    poke(cache, C.H_SUPERVISOR_HEARTBEAT, time.monotonic_ns() - int((STALE_HEARTBEAT_S + 50) * 1e9))
    poke(cache, C.H_SUPERVISOR, (2 ** 22 + 1) << 32 | 1)  # no such process: no age to show
    st = cache.status()
    assert st["supervisor_heartbeat_age_s"] is None and not st["supervisor_stale"]
