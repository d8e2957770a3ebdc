"""Where an assignment's partitions start (consumer/supervisor/start_offsets.py LookUp.offsets): the
watermarks of all partitions asked at once (AdminClient.list_offsets, earliest and
latest) must be exactly what one get_watermark_offsets a partition gave, with the group's
committed offsets beside them (AdminClient.list_consumer_group_offsets) exactly what the
consumer's committed() gave, against the session's real broker.

The topic has an empty partition, one with records, one whose start was deleted
(AdminClient.delete_records: its low watermark is above 0), and one with a committed
transaction and an open one after it: get_watermark_offsets follows the consumer's
isolation level (under read_committed, librdkafka's default, the high watermark is the
last stable offset, below the open transaction), and so must the batch, for both levels.
"""

import time
import uuid

import numpy as np

import shmcache

from shmcache.consumer.config import RunConfig
from shmcache.consumer.supervisor.start_offsets import LookUp

from shmtest.topic_model import produce_entries

EMPTY, PLAIN, DELETED, TRANSACTIONS = range(4)


def _per_partition(consumer, topic: str, parts: list[int]) -> dict[int, tuple[int, int, int]]:
    """The look-up as it was: committed(), then get_watermark_offsets one partition at a time."""
    from confluent_kafka import TopicPartition

    committed = {tp.partition: tp.offset for tp in consumer.committed([TopicPartition(topic, p) for p in parts],
                                                                      timeout=10)}
    return {p: (*consumer.get_watermark_offsets(TopicPartition(topic, p), timeout=10), committed[p]) for p in parts}


def test_the_batched_lookup_equals_the_per_partition_one(kafka_broker, kafka_topic, kafka_admin):
    from confluent_kafka import Consumer, Producer, TopicPartition

    bootstrap = kafka_broker.bootstrap
    topic = kafka_topic(4)
    produce_entries(bootstrap, topic, {PLAIN: 10, DELETED: 10}, np.random.default_rng(41))
    for f in kafka_admin.delete_records([TopicPartition(topic, DELETED, 4)]).values():
        f.result(timeout=30)
    tx = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"{topic}-tx"})
    tx.init_transactions(30)
    tx.begin_transaction()
    for _ in range(3):
        tx.produce(topic, b"committed", partition=TRANSACTIONS)
    tx.commit_transaction(30)
    tx.begin_transaction()
    for _ in range(5):
        tx.produce(topic, b"open", partition=TRANSACTIONS)
    assert tx.flush(30) == 0  # written, not committed: above the last stable offset
    parts = list(range(4))
    group = f"{topic}-group"
    cache = shmcache.create(f"t-lookup-{uuid.uuid4().hex[:10]}", memory="64MiB")  # offsets() beats in it
    try:
        for level, high in (("read_committed", 4), ("read_uncommitted", 9)):  # 3 + a marker; + 5 open
            cfg = RunConfig(name="t-lookup", bootstrap=bootstrap, topic=topic, group=group,
                            kafka={} if level == "read_committed" else {"isolation.level": level})
            consumer = Consumer(cfg.consumer_settings(**cfg.group_settings()))
            try:
                consumer.commit(offsets=[TopicPartition(topic, PLAIN, 6)], asynchronous=False)
                expected = _per_partition(consumer, topic, parts)
                got = LookUp(cfg, cache.control, None).offsets(parts, time.monotonic() + 30)
            finally:
                consumer.close()
            assert got == expected, (level, got, expected)
            assert got[EMPTY][:2] == (0, 0) and got[PLAIN] == (0, 10, 6) and got[DELETED][:2] == (4, 10), got
            assert got[TRANSACTIONS][1] == high and got[EMPTY][2] < 0, got
    finally:
        tx.abort_transaction(30)
        cache.close()
        shmcache.destroy(cache.name)
