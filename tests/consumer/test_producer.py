"""The producer's account of what it sent (consumer/producer.py TxmetaProducer.end_offsets),
read against what the real broker's topic holds.

librdkafka can acknowledge a message without telling its offset (an idempotent producer's
retry of a batch the broker had already written: Message.offset() is None). The delivery
report did `offset + 1` on it: a TypeError inside librdkafka's callback, which
confluent-kafka 2.16 on Python 3.11 turned into a SystemError out of flush() naming
nothing ("exception <class 'str'> is not a BaseException subclass"; seen in a test's
producer on the loaded 2-core machine). Such a report cannot be made to happen on demand
against a broker, so the test hands the producer one as librdkafka builds it
(confluent_kafka.Message with offset -1), for a message a second producer really wrote.
"""

import os
import sys

import numpy as np

from shmcache.consumer import wire
from shmcache.consumer.producer import TxmetaProducer

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _topic_model import KafkaProbe  # noqa: E402


def test_a_delivery_acknowledged_without_its_offset_ends_at_the_brokers_end(kafka_broker, kafka_topic):
    from confluent_kafka import Message, Producer

    topic = kafka_topic(2)
    rng = np.random.default_rng(3)
    prod = TxmetaProducer(kafka_broker.bootstrap, topic, format="v1")
    keys = rng.integers(0, 256, (8, 32), dtype=np.uint8)
    values = [rng.integers(0, 256, 100, dtype=np.uint8).tobytes() for _ in range(8)]
    prod.send(keys, np.full(8, wire.ADD, np.uint8), values)  # one message, to murmur2's partition of keys[0]
    prod.flush()
    mine = next(iter(prod.end_offsets))
    other = 1 - mine
    # the other partition's last three messages, written for real; the last one's report
    # reaches our producer without its offset
    raw = Producer({"bootstrap.servers": kafka_broker.bootstrap})
    for i in range(3):
        raw.produce(topic, wire.encode_v1(keys[:1], np.full(1, wire.ADD, np.uint8), values[:1]), partition=other)
    assert raw.flush(30) == 0
    prod.delivered(None, Message(topic=topic, partition=other, offset=-1))
    prod.flush()
    probe = KafkaProbe(kafka_broker.bootstrap, topic, 2)
    try:
        ends = probe.end_offsets()
    finally:
        probe.close()
    assert ends[other] == 3 and ends[mine] == 1, ends
    assert [prod.end_offsets.get(p, 0) for p in range(2)] == ends
    assert prod.delivered_messages == 2
