"""The supervisor's policy as units, not through whole pipelines.

Restart backoff (consumer/supervisor/worker_handle.py RestartBackoff, on a clock the test drives):
0.5 s after a first death, doubling with each death in a row up to 10 s; a worker up
for 10 s has its deaths in a row count from zero again; a restart is due exactly at
its time. Commits (consumer/supervisor/commits.py Committer, on a real segment and the real
broker): a second periodic commit is not sent while one is in flight; the revoke
callback's commit is synchronous; a hold (rebalance) stops periodic commits until the
assignment, which sends the held one at once, or for REBALANCE_HOLD_S at most (on a
clock the test drives).
"""

from __future__ import annotations

import time
import uuid

import pytest

import shmcache
from shmcache.consumer.supervisor.commits import REBALANCE_HOLD_S
from shmcache.consumer.supervisor.backoff import BACKOFF_FIRST_S, BACKOFF_MAX_S, BACKOFF_RESET_S, RestartBackoff, backoff_s
from shmcache.engine.control import layout as C


def test_the_backoff_constants():
    assert (BACKOFF_FIRST_S, BACKOFF_MAX_S, BACKOFF_RESET_S) == (0.5, 10.0, 10.0)
    assert [backoff_s(n) for n in range(1, 9)] == [0.5, 1.0, 2.0, 4.0, 8.0, 10.0, 10.0, 10.0]
    assert backoff_s(10_000) == 10.0


def test_deaths_in_a_row_double_the_wait_up_to_the_cap():
    b, now, waits = RestartBackoff(), 1000.0, []
    for _ in range(7):  # dies at once after every restart
        wait = b.died(now)
        waits.append(wait)
        assert not b.due(now + wait - 0.01) and b.due(now + wait)
        now += wait
        b.up(now)
        assert not b.settle(now + 1.0)  # up a moment only: the count goes on
        now += 1.0
    assert waits == [0.5, 1.0, 2.0, 4.0, 8.0, 10.0, 10.0]
    assert b.failures == 7


def test_a_stay_up_of_the_reset_time_makes_the_next_death_a_first_one():
    b, now = RestartBackoff(), 50.0
    for _ in range(3):
        now += b.died(now)
    assert b.failures == 3
    b.up(now)
    assert not b.settle(now + BACKOFF_RESET_S - 0.1) and b.failures == 3
    assert b.settle(now + BACKOFF_RESET_S) and b.failures == 0
    assert not b.settle(now + BACKOFF_RESET_S + 1)  # nothing to reset any more
    assert b.died(now + 20) == BACKOFF_FIRST_S


def test_a_worker_that_never_died_has_nothing_to_settle():
    b = RestartBackoff()
    b.up(0.0)
    assert not b.settle(1e6) and b.failures == 0


# -- commits, against the real broker -------------------------------------------------------------


@pytest.fixture
def committer(kafka_broker, kafka_topic):
    """A Committer on a real segment's control area and a real consumer (assigned partition 0)."""
    from confluent_kafka import Consumer, TopicPartition

    from shmcache.kafka.broker import BrokerWatch
    from shmcache.consumer.supervisor.commits import Committer

    topic = kafka_topic(1)
    name = f"t-commits-{uuid.uuid4().hex[:10]}"
    w = shmcache.create(name, memory="4MiB", max_value=64)
    w.control.reset_partitions()
    broker = BrokerWatch(w.control, kafka_broker.bootstrap, 60.0)
    broker.answered()  # as the supervisor once the topic's metadata came: no commit while it is down
    c = Committer(w.control, topic, broker)
    consumer = Consumer({"bootstrap.servers": kafka_broker.bootstrap, "group.id": f"g-{uuid.uuid4().hex[:8]}",
                         "enable.auto.commit": False, "on_commit": c.on_commit})
    consumer.assign([TopicPartition(topic, 0)])
    consumer.pause([TopicPartition(topic, 0)])  # as the supervisor's: it commits, never fetches
    c.consumer = consumer
    try:
        yield c, w.control, topic
    finally:
        consumer.close()
        w.close()
        shmcache.destroy(name)


def _served(c, timeout: float = 60.0) -> None:
    """Poll the consumer until the commit in flight has its result."""
    deadline = time.monotonic() + timeout
    while c.inflight is not None and time.monotonic() < deadline:
        c.consumer.poll(0.1)
    assert c.inflight is None, "no commit result within the bound"


def _broker_committed(c, topic: str) -> int:
    from confluent_kafka import TopicPartition

    (tp,) = c.consumer.committed([TopicPartition(topic, 0)], timeout=30)
    return tp.offset


def test_a_second_periodic_commit_waits_for_the_one_in_flight(committer):
    c, control, topic = committer
    rows = control.partitions
    rows[0, C.P_APPLIED] = 5
    c.periodic([0])
    assert c.inflight == {0: 5} and control.word(C.H_COMMIT_PENDING_SINCE) > 0
    rows[0, C.P_APPLIED] = 7
    c.periodic([0])  # no poll in between: the first one's result cannot have come
    assert c.inflight == {0: 5}
    _served(c)
    assert control.partition_rows.committed(0) == 5 and control.word(C.H_COMMITS) == 1
    assert control.word(C.H_COMMIT_PENDING_SINCE) == 0
    assert _broker_committed(c, topic) == 5
    c.periodic([0])  # now the newer offset goes
    assert c.inflight == {0: 7}
    _served(c)
    assert control.partition_rows.committed(0) == 7 and control.word(C.H_COMMITS) == 2 and _broker_committed(c, topic) == 7
    c.periodic([0])  # nothing new applied: nothing sent
    assert c.inflight is None and control.word(C.H_COMMITS) == 2


def test_the_revoke_callbacks_commit_is_synchronous(committer):
    c, control, topic = committer
    control.partitions[0, C.P_APPLIED] = 11
    c.in_callback([0])
    assert c.inflight is None  # done on return, no poll needed
    assert control.partition_rows.committed(0) == 11 and control.word(C.H_COMMITS) == 1
    assert _broker_committed(c, topic) == 11


def test_a_hold_stops_periodic_commits_until_the_assignment(committer):
    c, control, topic = committer
    control.partitions[0, C.P_APPLIED] = 2
    # the caller's monotonic clock 5 s after boot (a supervisor started at boot), far less than
    # the interval: the first commit and the held one are due all the same (a CI run soon after
    # boot found both waiting for the clock to pass the interval)
    now = 5.0
    c.tick(now, [0], 1000.0)  # a periodic commit: the next is due in 1000 s
    assert c.inflight == {0: 2}
    _served(c)
    control.partitions[0, C.P_APPLIED] = 3
    c.hold(now)
    c.tick(now, [0], 1.0)
    c.tick(now + 5.0, [0], 1.0)  # due by the interval, but held
    assert c.inflight is None
    c.assigned()
    c.tick(now + 5.0, [0], 1000.0)  # the held commit goes at once, whatever the interval
    assert c.inflight == {0: 3}
    _served(c)
    assert _broker_committed(c, topic) == 3


def test_a_hold_with_no_assignment_ends_after_its_bound(committer):
    """A rebalance that never completes (no assignment comes) holds periodic commits for
    REBALANCE_HOLD_S at most, on the caller's clock; a second hold meanwhile does not extend it."""
    c, control, topic = committer
    control.partitions[0, C.P_APPLIED] = 4
    t = 1000.0
    c.hold(t)
    c.hold(t + 10.0)
    c.tick(t + REBALANCE_HOLD_S, [0], 1.0)  # due by the interval, still held
    assert c.inflight is None and c.rebalancing == t
    c.tick(t + REBALANCE_HOLD_S + 0.5, [0], 1.0)  # the bound from the first hold is over
    assert c.inflight == {0: 4} and c.rebalancing is None
    _served(c)
    assert _broker_committed(c, topic) == 4


def test_a_hold_at_clock_zero_still_holds(committer):
    """A hold's time is any monotonic reading, 0.0 included (a clock whose epoch is the
    caller's start): it was once the "no hold" sentinel, and such a hold held nothing."""
    c, control, topic = committer
    control.partitions[0, C.P_APPLIED] = 5
    c.hold(0.0)
    c.tick(1.0, [0], 0.5)  # due by the interval, but held
    assert c.inflight is None and c.rebalancing == 0.0
    c.tick(REBALANCE_HOLD_S + 0.5, [0], 0.5)
    assert c.inflight == {0: 5} and c.rebalancing is None
    _served(c)
    assert _broker_committed(c, topic) == 5
