"""A retention gap that opens while a worker runs is flagged as one found at assignment
(issue 39 item 5). A worker that falls behind the log's start (a long stall, --max-rate)
is moved to it by librdkafka's auto.offset.reset without a word: the cache then said
ready without the entries it skipped, against the promise that ready means the whole
topic (the gap was checked only at assignment). Here a worker throttled to a few
messages a second is behind when the topic's start is moved past it (DeleteRecords, what
retention does to a partition's log start), against the real broker."""


import numpy as np
import pytest
from confluent_kafka import TopicPartition

from shmtest.supervisors import harness  # noqa: F401
from shmtest.topic_model import produce_entries
from shmtest.waits import applied, poll_until

import shmcache

MESSAGES, DELETED_TO = 600, 500
# small fetches and queue, so that what the worker holds fetched is little; a few messages a second
SLOW = ("max.partition.fetch.bytes=2048", "queued.max.messages.kbytes=16",
        "enable.partition.eof=true")  # and an event of partition 0 at the end: its log line names it 0, not -1


def test_a_gap_opened_under_a_slow_worker_is_flagged(harness, kafka_topic, kafka_admin):
    h = harness
    topic = kafka_topic(1)
    produce_entries(h.bootstrap, topic, {0: MESSAGES}, np.random.default_rng(31))
    name = h.cache_name("gaprun")
    sup = h.supervisor(name, topic, h.group("gaprun"), workers=1, memory="64MiB", max_rate=20, sets=SLOW,
                       config={"batch_messages": 8})
    r = h.attach(name, sup=sup)
    at = poll_until(lambda: sup.check_running() and 0 < applied(r, 1)[0] < DELETED_TO // 2 and applied(r, 1)[0], 120,
                    lambda: f"the worker fetching, behind: {r.status()}")
    assert r.status()["gap_partitions"] == []  # none at assignment
    for f in kafka_admin.delete_records([TopicPartition(topic, 0, DELETED_TO)]).values():
        f.result(timeout=30)
    poll_until(lambda: sup.check_running() and applied(r, 1)[0] == MESSAGES, 120,
               lambda: f"the worker at the end: {r.status()}\n{sup.log_text()[-2000:]}")
    st = poll_until(lambda: (lambda s: s if s["caught_up"] else None)(r.status()), 60,
                    lambda: f"caught up: {r.status()}")
    assert st["gap_partitions"] == [0], (st, sup.log_text()[-3000:])
    assert 0 < st["gap_offsets"] <= DELETED_TO - at, st
    assert not st["ready"], "ready without the entries the worker skipped"
    with pytest.raises(shmcache.CacheNotReadyError, match="retention gap"):
        r.wait_ready(timeout=0)
    assert r.stats()["entries"] == MESSAGES - st["gap_offsets"]  # one entry a message: exactly what it skipped
    log = sup.log_text()
    assert "were deleted by the topic's retention before this worker fetched them" in log, log[-3000:]
    poll_until(lambda: f"{topic} [0]: " in sup.log_text(), 30, "the worker's line about partition 0's end")
    assert f"{topic} [-1]" not in sup.log_text()
    assert sup.terminate() == 0
