"""A partition row's applied time and its one supervisor word (engine/control/rows.py): the
committed offset and the assignment's generation share P_COMMITTED's word, so that
P_APPLIED_TIME, the Kafka time of the last message applied, has a word of its own; status
shows how far behind the topic the table is in seconds (`behind_s`), and only while the
supervisor that keeps those times is the cache's."""

from __future__ import annotations

import time
import uuid

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import shmcache
from shmcache.engine.control import layout as C
from shmcache.engine.control.rows import committed_of, generation_of


@pytest.fixture
def handles():
    """(writer, reader) on one fresh small cache, this process its supervisor."""
    name = f"t-ptimes-{uuid.uuid4().hex[:10]}"
    w = shmcache.create(name, memory="4MiB", max_value=64)
    try:
        r = shmcache.attach(name)
        try:
            c = w.control
            c.set_topic("t", 2)
            assert c.claim_supervisor() == 0
            c.disown_partitions()
            yield w, r
        finally:
            r.close()
    finally:
        w.close()
        shmcache.destroy(name)


@settings(deadline=None, max_examples=200)
@given(st.lists(st.one_of(st.just("bump"), st.integers(-1, 2**48 - 2)), max_size=40),
       st.integers(0, 3 * C.GENERATION_MOD))
def test_the_committed_offset_and_the_generation_share_a_word(steps, bumps):
    """Every commit reads back as committed, every bump moves the generation by one
    (modulo GENERATION_MOD), and neither disturbs the other."""
    import numpy as np

    from shmcache.engine.control.rows import PartitionRows

    rows = PartitionRows(np.zeros((1, 8), np.int64))
    rows.reset()
    gen, committed = 0, -1
    for _ in range(bumps % 50):
        rows.reassign(0)
        gen += 1
    for s in steps:
        if s == "bump":
            rows.reassign(0)
            gen += 1
        else:
            rows.record_commit(0, s)
            committed = s
        assert (rows.committed(0), rows.generation(0)) == (committed, gen % C.GENERATION_MOD)
    assert committed_of(0) == -1 and generation_of(0) == 0


def test_an_offset_past_the_words_bits_is_shown_as_none():
    import numpy as np

    from shmcache.engine.control.rows import PartitionRows

    rows = PartitionRows(np.zeros((1, 8), np.int64))
    rows.record_commit(0, 2**48 - 1)
    assert rows.committed(0) == -1


def _part(r, p: int) -> dict:
    return next(x for x in r.status()["assigned"] if x["partition"] == p)


def test_behind_is_the_age_of_the_last_message_applied_while_there_is_lag(handles):
    w, r = handles
    rows = w.control.partition_rows
    gen = rows.assign(0, 10, 50, -1, 0)
    rows.assign(1, 7, 7, -1, 0)
    assert gen == rows.generation(0)
    assert _part(r, 0)["behind_s"] is None  # lagging, no message applied yet: unknown
    assert _part(r, 1)["behind_s"] == 0.0  # no lag: not behind
    rows.publish(0, 20, 50, int(time.time() * 1000) - 3_600_000)  # an hour-old message applied
    behind = _part(r, 0)["behind_s"]
    assert 3600 <= behind < 3600 + 600, behind
    rows.publish(0, 50, 50, int(time.time() * 1000))
    assert _part(r, 0)["behind_s"] == 0.0 and _part(r, 0)["lag"] == 0


def test_times_of_another_supervisor_are_not_trusted(handles):
    """An older supervisor kept its generations in P_APPLIED_TIME's word: while the word of
    the supervisor keeping times is not the cache's supervisor, behind_s is unknown."""
    w, r = handles
    rows = w.control.partition_rows
    rows.assign(0, 10, 50, -1, 0)
    rows.publish(0, 20, 50, int(time.time() * 1000) - 60_000)
    assert _part(r, 0)["behind_s"] >= 60
    keeper = w.control.word(C.H_PARTITION_TIMES)
    w.control._h[C.H_PARTITION_TIMES] = 0  # as on a segment an older supervisor runs
    assert _part(r, 0)["behind_s"] is None
    w.control._h[C.H_PARTITION_TIMES] = keeper
    w.control.disown_partitions()  # a new supervisor's start: no time known
    rows.assign(0, 20, 50, -1, 0)
    assert _part(r, 0)["behind_s"] is None


def test_a_log_started_over_or_forgotten_has_no_time(handles):
    w, r = handles
    rows = w.control.partition_rows
    rows.assign(0, 10, 50, -1, 0)
    rows.publish(0, 20, 50, int(time.time() * 1000))
    rows.start_over(0, 0, 40)
    assert _part(r, 0)["behind_s"] is None
    rows.publish(0, 5, 40, int(time.time() * 1000))
    rows.forget_applied()
    assert w.control.partitions[0, C.P_APPLIED_TIME] == 0
