"""A topic deleted and re-created under the cache's name, against the real broker: the
cache's applied offsets (100 per partition) are above the new topic's end (10), or below
it (150: the hardest case, which offsets alone cannot tell from the old log).

Before, the supervisor started each partition at its applied offset: the cache said
ready at once without the new topic's entries, and commits of the old offsets landed on
the new topic (the restart test commits them there too). Now an applied or committed
offset above the high watermark is an error, logged naming topic, partition, offset and
watermark; the partition starts over at the new topic's low watermark and is not ready
until it has applied up to the high watermark; commits follow what was applied from the
new topic. The same while the
supervisor runs: its workers see the new log's first message below the offset they were
at (consumer/worker/log_replaced.py), or, when the group saw the topic gone, the next
assignment does. The old topic's entries stay in the cache (docs/design.md).

A new log longer than what the table applied looks like the old one by its offsets: a
supervisor started each partition at its applied offset, inside the new log, and the
cache said ready without the new log's first messages. The topic's Kafka id tells them
apart (consumer/supervisor/topic_id.py): the table keeps the id its offsets belong to, and a new one
starts every partition over, at a supervisor's start and under a running one (whose
workers, stopped here across the re-creation, resume fetching at offsets that are in
range of the new log).
"""

import contextlib
import logging
import time
import uuid

import numpy as np
import psutil
from confluent_kafka import TopicCollection

import shmcache
from shmcache.kafka import client as kafka_client
from shmcache.consumer.config import RunConfig
from shmcache.consumer.supervisor.topic_id import TopicIdentity
from shmcache.kafka.topics import create_topic

from shmtest.supervisors import Harness
from shmtest.topic_model import KafkaProbe, produce_entries
from shmtest.waits import applied, poll_until, wait_applied

PARTITIONS = 2
OLD, NEW, MORE = 100, 10, 150  # messages per partition: the old topic, the new one, then produced to it
LONG = 150  # messages per partition of a new topic longer than the table applied of the old one


def _topic_id(admin, topic: str) -> str:
    """The topic's id as the broker says it, in the form status() shows (engine/control/layout.py topic_id_text)."""
    from shmcache.engine.control import layout as C

    u = admin.describe_topics(TopicCollection([topic]), request_timeout=30)[topic].result(60).topic_id
    return C.topic_id_text(u.get_most_significant_bits(), u.get_least_significant_bits())


def _id_line(log: str, topic: str, old: str, new: str) -> str:
    said = f"topic {topic!r} was deleted and re-created (its id was {old}, is {new}): every partition starts over"
    return next((x for x in log.splitlines() if said in x and " ERROR " in x), "")


def _produce(bootstrap: str, topic: str, n: int, rng) -> dict[bytes, bytes]:
    return produce_entries(bootstrap, topic, {p: n for p in range(PARTITIONS)}, rng)


def _recreate(admin, bootstrap: str, topic: str) -> None:
    """Delete the topic and create it again at once (the broker may still be deleting it)."""
    admin.delete_topics([topic], operation_timeout=30)[topic].result(60)

    def created():
        try:
            create_topic(bootstrap, topic, PARTITIONS)
            return True
        except Exception as e:  # noqa: BLE001 - "marked for deletion" until the broker is done
            if "exist" not in str(e).lower() and "deletion" not in str(e).lower():
                raise
            return False
    poll_until(created, 60, f"topic {topic} to be created again", interval=0.1)


def _commit(bootstrap: str, topic: str, group: str, offsets: list[int]) -> None:
    """Commit `offsets` for `group` (no member: the group is empty), as a supervisor did before
    this fix: the old topic's offsets, onto the new topic."""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False})
    try:
        c.commit(offsets=[TopicPartition(topic, p, o) for p, o in enumerate(offsets)], asynchronous=False)
    finally:
        c.close()


def _committed(bootstrap: str, topic: str, group: str) -> list[int]:
    probe = KafkaProbe(bootstrap, topic, PARTITIONS, group=group)
    try:
        return probe.committed()
    finally:
        probe.close()


def _fill_old_topic(h, topic, name, group, rng):
    old = _produce(h.bootstrap, topic, OLD, rng)
    sup = h.supervisor(name, topic, group)
    r = h.attach(name, sup=sup)
    r.wait_ready(60)
    assert applied(r, PARTITIONS) == [OLD] * PARTITIONS
    poll_until(lambda: _committed(h.bootstrap, topic, group) == [OLD] * PARTITIONS, 60, "the old topic's commits")
    return sup, r, old


def _ready_only_with_the_new_topic(r, sup, new: dict, end: int = NEW) -> None:
    """The first time status says ready, every partition applied the new topic to its end."""
    def ready():
        assert sup.running(), sup.log_text()[-3000:]
        st = r.status()
        return st if st["ready"] else None
    st = poll_until(ready, 90, lambda: f"ready: {r.status()}\n{sup.log_text()[-3000:]}", interval=0.02)
    assert [(p["applied"], p["high_watermark"]) for p in st["assigned"]] == [(end, end)] * PARTITIONS, st
    missed = [k for k, v in zip(new, r.get_many(list(new))) if v != new[k]]
    assert not missed, f"ready without {len(missed)} of the new topic's {len(new)} entries"


def _everything_after_applied_and_committed(h, r, sup, topic, group, rng, old, new) -> None:
    more = _produce(h.bootstrap, topic, MORE, rng)  # offsets 10..159 of each partition
    wait_applied(r, [NEW + MORE] * PARTITIONS, 60, sup)
    assert r.get_many(list(new) + list(more)) == list(new.values()) + list(more.values())
    assert r.get_many(list(old)) == list(old.values())  # the old topic's entries stay (docs/design.md)
    poll_until(lambda: _committed(h.bootstrap, topic, group) == applied(r, PARTITIONS) == [NEW + MORE] * PARTITIONS,
               60, lambda: f"committed {_committed(h.bootstrap, topic, group)} == applied "
                           f"{applied(r, PARTITIONS)} == the new topic's end {NEW + MORE}")
    assert "Traceback" not in sup.log_text()
    assert sup.terminate() == 0


def test_a_topic_recreated_while_the_supervisor_was_stopped_starts_over(tmp_path, kafka_broker, kafka_topic,
                                                                       kafka_admin):
    rng = np.random.default_rng(31)
    topic = kafka_topic(PARTITIONS)
    h = Harness(tmp_path, kafka_broker.bootstrap)
    try:
        name, group = h.cache_name("recreated"), h.group("recreated")
        sup, r, old = _fill_old_topic(h, topic, name, group, rng)
        old_id = _topic_id(kafka_admin, topic)
        assert r.status()["topic_id"] == old_id
        assert sup.terminate() == 0

        _recreate(kafka_admin, h.bootstrap, topic)
        new = _produce(h.bootstrap, topic, NEW, rng)
        _commit(h.bootstrap, topic, group, [OLD] * PARTITIONS)  # the old offsets, committed on the new topic
        sup = h.supervisor(name, topic, group)
        _ready_only_with_the_new_topic(r, sup, new)
        log, new_id = sup.log_text(), _topic_id(kafka_admin, topic)
        assert new_id != old_id and r.status()["topic_id"] == new_id
        assert _id_line(log, topic, old_id, new_id), log[-3000:]
        for p in range(PARTITIONS):  # the old offsets the group still had are refused too
            said = f"{topic!r} partition {p}: the committed offset {OLD} is above"
            line = next((x for x in log.splitlines() if said in x), "")
            assert " ERROR " in line and f"high watermark {NEW}" in line and "starting the partition over" in line \
                and "keeps the entries" in line, log[-3000:]
        _everything_after_applied_and_committed(h, r, sup, topic, group, rng, old, new)
    finally:
        h.close()


@contextlib.contextmanager
def _old_topic_filled(tmp_path, kafka_broker, kafka_topic, label: str, seed: int):
    """A harness with a supervisor whose cache holds the old topic (OLD per partition) whole:
    (harness, topic, supervisor, reader, the old entries, the rng)."""
    rng = np.random.default_rng(seed)
    topic = kafka_topic(PARTITIONS)
    h = Harness(tmp_path, kafka_broker.bootstrap)
    try:
        sup, r, old = _fill_old_topic(h, topic, h.cache_name(label), h.group(label), rng)
        yield h, topic, sup, r, old, rng
    finally:
        h.close()


def _started_over_by_its_id(r, sup, admin, topic: str, old_id: str, old: dict, new: dict) -> None:
    """The supervisor said the topic's id changed, was ready only with the new (LONG) log
    whole, and the table keeps the new id and the old topic's entries (docs/design.md)."""
    new_id = _topic_id(admin, topic)
    assert new_id != old_id
    poll_until(lambda: _id_line(sup.log_text(), topic, old_id, new_id), 60,
               lambda: f"the re-created topic's line:\n{sup.log_text()[-3000:]}")
    _ready_only_with_the_new_topic(r, sup, new, LONG)
    assert r.status()["topic_id"] == new_id
    assert r.get_many(list(old)) == list(old.values())
    assert "Traceback" not in sup.log_text()
    assert sup.terminate() == 0


def test_a_topic_recreated_longer_than_the_table_while_the_supervisor_was_stopped_starts_over(
        tmp_path, kafka_broker, kafka_topic, kafka_admin):
    """The new log holds more messages (LONG) than the table applied of the old one (OLD):
    every offset the table has is in range of the new log. Before the topic id, the
    supervisor resumed each partition at OLD and was ready without the new log's first OLD
    messages of each partition."""
    with _old_topic_filled(tmp_path, kafka_broker, kafka_topic, "recreated-long", 41) as (h, topic, sup, r, old, rng):
        old_id = r.status()["topic_id"]
        name, group = sup.name, sup.group
        assert sup.terminate() == 0
        _recreate(kafka_admin, h.bootstrap, topic)
        new = _produce(h.bootstrap, topic, LONG, rng)
        sup = h.supervisor(name, topic, group)
        _started_over_by_its_id(r, sup, kafka_admin, topic, old_id, old, new)


def test_a_topic_recreated_longer_than_the_table_under_a_running_supervisor_starts_over(
        tmp_path, kafka_broker, kafka_topic, kafka_admin):
    """The same under a running supervisor, its workers stopped (SIGSTOP) from before the
    delete until the new log is longer than what they applied: resumed, they fetch at
    offsets in range of the new log, so neither they (consumer/worker/log_replaced.py) nor an
    assignment's offsets can tell; the supervisor's look at the topic's id does."""
    with _old_topic_filled(tmp_path, kafka_broker, kafka_topic, "recreated-long-live", 43) as (h, topic, sup, r, old,
                                                                                              rng):
        old_id = r.status()["topic_id"]
        workers = sup.workers()
        assert workers, sup.log_text()[-3000:]
        for w in workers:
            w.suspend()
        try:
            _recreate(kafka_admin, h.bootstrap, topic)
            new = _produce(h.bootstrap, topic, LONG, rng)
        finally:
            for w in workers:
                with contextlib.suppress(psutil.Error):
                    w.resume()
        _started_over_by_its_id(r, sup, kafka_admin, topic, old_id, old, new)


def test_a_topic_recreated_under_a_running_supervisor_starts_over(tmp_path, kafka_broker, kafka_topic, kafka_admin):
    rng = np.random.default_rng(37)
    topic = kafka_topic(PARTITIONS)
    h = Harness(tmp_path, kafka_broker.bootstrap)
    try:
        _recreated_under_a_running_supervisor(h, topic, kafka_admin, rng)
    finally:
        h.close()


def _recreated_under_a_running_supervisor(h, topic, admin, rng) -> None:
    name, group = h.cache_name("recreated-live"), h.group("recreated-live")
    sup, r, old = _fill_old_topic(h, topic, name, group, rng)

    _recreate(admin, h.bootstrap, topic)
    new = _produce(h.bootstrap, topic, NEW, rng)
    # a worker sees the new log's first message below its offset; or, if the group saw the
    # topic gone, the assignment that gives it back sees the applied offset above the end; or the
    # supervisor's look at the topic's id sees a new one (every partition at once)
    said = ("the partition's log was replaced", "above the partition's high watermark")
    old_id = r.status()["topic_id"]
    new_id = _topic_id(admin, topic)

    def logged():
        assert sup.running(), sup.log_text()[-3000:]
        if _id_line(sup.log_text(), topic, old_id, new_id):
            return True
        lines = [x for x in sup.log_text().splitlines() if " ERROR " in x and any(s in x for s in said)]
        return all(any(f"{topic!r} partition {p}: " in x for x in lines) for p in range(PARTITIONS))
    poll_until(logged, 60, lambda: f"an error line per partition:\n{sup.log_text()[-3000:]}")
    _ready_only_with_the_new_topic(r, sup, new)
    _everything_after_applied_and_committed(h, r, sup, topic, group, rng, old, new)


def test_a_periodic_look_asked_before_a_hand_out_saw_the_new_id_is_not_taken(kafka_broker, kafka_topic, kafka_admin):
    """consumer/supervisor/topic_id.py driven by hand, against the real broker and a real segment: a
    periodic look asked while the old topic was there is looked at only after a hand-out's
    check() recorded the re-created topic's id, and says the OLD id. Taken, it would start
    every partition over again and put the old id back in the table. (A whole supervisor
    cannot be made to keep this order: its looks share one client name, and the hand-out
    waits for a rebalance.)"""
    topic, name = kafka_topic(PARTITIONS), f"t-topic-id-{uuid.uuid4().hex[:10]}"
    cache = shmcache.create(name, memory="4MiB", max_value=64)
    try:
        cfg = RunConfig(name=name, bootstrap=kafka_broker.bootstrap, topic=topic)
        replaced = []
        identity = TopicIdentity(cfg, cache.control, lambda old, new: replaced.append((old, new)))
        old_id = _topic_id(kafka_admin, topic)
        poll_until(lambda: identity.tick() or cache.control.topic_id, 60, "the periodic look to record the id")
        assert cache.control.topic_id == old_id and not replaced
        # the next periodic look, answered while the old topic is there; not looked at yet
        poll_until(lambda: identity.tick() or identity.look.out, 60, "the next periodic look")
        poll_until(lambda: all(f.done() for f in identity.look.futures.values()), 60, "the broker's answer to it")
        _recreate(kafka_admin, kafka_broker.bootstrap, topic)
        new_id = _topic_id(kafka_admin, topic)
        identity.check(kafka_client.admin_client(cfg), time.monotonic() + 30, 10)  # the hand-out's own look
        assert replaced == [(old_id, new_id)] and cache.control.topic_id == new_id
        identity.tick()  # the periodic look's answer: the old id, asked before the new one was recorded
        assert not identity.look.out and replaced == [(old_id, new_id)] and cache.control.topic_id == new_id
    finally:
        cache.close()
        shmcache.destroy(name)


def test_a_start_over_that_fails_is_said_and_tried_again(kafka_broker, kafka_topic, kafka_admin, caplog):
    """consumer/supervisor/topic_id.py driven by hand: the periodic look finds the topic re-created, and
    starting every partition over (on_replaced) raises. It is logged as an error with its
    traceback, the table keeps the old id, and the next look tries again. Before, tick() took
    it for a failed look (a broker hiccup) and said it at debug only: unseen, for ever."""
    topic, name = kafka_topic(PARTITIONS), f"t-topic-id-{uuid.uuid4().hex[:10]}"
    cache = shmcache.create(name, memory="4MiB", max_value=64)
    try:
        cfg = RunConfig(name=name, bootstrap=kafka_broker.bootstrap, topic=topic)

        def start_over(old, new):
            raise RuntimeError(f"starting over from {old} to {new} failed")

        identity = TopicIdentity(cfg, cache.control, start_over)
        old_id = _topic_id(kafka_admin, topic)
        poll_until(lambda: identity.tick() or cache.control.topic_id, 60, "the periodic look to record the id")
        _recreate(kafka_admin, kafka_broker.bootstrap, topic)
        new_id = _topic_id(kafka_admin, topic)
        failed = f"starting every partition of topic {topic!r} over failed"

        def said(times: int) -> bool:
            identity.tick()
            errors = [r for r in caplog.records if r.levelno == logging.ERROR and r.getMessage().startswith(failed)]
            return len(errors) >= times and all(f"from {old_id} to {new_id} failed" in str(r.exc_info[1]) for r in errors)

        with caplog.at_level(logging.ERROR, logger="shmcache.supervisor"):
            poll_until(lambda: said(1), 60, "a periodic look to find the new id, and say the start-over failed")
            assert cache.control.topic_id == old_id  # the new id is not recorded: the next look tries again
            poll_until(lambda: said(2), 60, "the next look to try again")
    finally:
        cache.close()
        shmcache.destroy(name)
