"""The test broker from scripts/kafka is a real Kafka: keyed messages produced with
the Java-compatible partitioner round-trip through a consumer group intact."""

import time
import uuid
from collections import Counter, defaultdict

from confluent_kafka import Consumer, Producer

PARTITIONS = 4
KEYS = [f"tx-{i:04d}".encode() for i in range(50)]
MESSAGES = 400


def murmur2(data: bytes) -> int:
    """Kafka's org.apache.kafka.common.utils.Utils.murmur2, as an unsigned 32-bit int."""
    m, length = 0x5BD1E995, len(data)
    h = (0x9747B28C ^ length) & 0xFFFFFFFF
    for i in range(0, length - length % 4, 4):
        k = int.from_bytes(data[i:i + 4], "little")
        k = (k * m) & 0xFFFFFFFF
        k ^= k >> 24
        k = (k * m) & 0xFFFFFFFF
        h = ((h * m) & 0xFFFFFFFF) ^ k
    tail = data[length - length % 4:]
    if len(tail) >= 3:
        h ^= tail[2] << 16
    if len(tail) >= 2:
        h ^= tail[1] << 8
    if tail:
        h = ((h ^ tail[0]) * m) & 0xFFFFFFFF
    h ^= h >> 13
    h = (h * m) & 0xFFFFFFFF
    return h ^ (h >> 15)


def java_partition(key: bytes, partitions: int) -> int:
    return (murmur2(key) & 0x7FFFFFFF) % partitions


def test_murmur2_matches_java():
    # Values from Kafka's UtilsTest.testMurmur2 (signed Java ints).
    for text, expected in [("21", -973932308), ("foobar", -790332482),
                           ("a-little-bit-long-string", -985981536), ("abc", 479470107)]:
        assert murmur2(text.encode()) == expected & 0xFFFFFFFF


def test_keyed_messages_round_trip(kafka_broker, kafka_topic):
    topic = kafka_topic(PARTITIONS)
    sent = [(KEYS[i % len(KEYS)], f"v{i}".encode()) for i in range(MESSAGES)]

    producer = Producer({
        "bootstrap.servers": kafka_broker.bootstrap,
        "partitioner": "murmur2_random",  # same placement as the Java client
        "enable.idempotence": True,
        "linger.ms": 5,
    })
    delivered, errors = Counter(), []

    def on_delivery(err, msg):
        if err is not None:
            errors.append(err)
        else:
            delivered[msg.partition()] += 1

    for key, value in sent:
        producer.produce(topic, key=key, value=value, on_delivery=on_delivery)
    assert producer.flush(30) == 0
    assert not errors
    assert sum(delivered.values()) == MESSAGES

    consumer = Consumer({
        "bootstrap.servers": kafka_broker.bootstrap,
        "group.id": f"test-{uuid.uuid4().hex[:8]}",
        "auto.offset.reset": "earliest",
        "enable.auto.commit": False,
    })
    received = []
    try:
        consumer.subscribe([topic])
        deadline = time.monotonic() + 60
        while len(received) < MESSAGES and time.monotonic() < deadline:
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            assert msg.error() is None, msg.error()
            received.append((msg.key(), msg.value(), msg.partition(), msg.offset()))
        time.sleep(0.5)  # anything beyond what was produced would show up here
        while (msg := consumer.poll(0.1)) is not None:
            received.append((msg.key(), msg.value(), msg.partition(), msg.offset()))
    finally:
        consumer.close()

    assert len(received) == MESSAGES
    assert sorted((k, v) for k, v, _, _ in received) == sorted(sent)
    per_partition = Counter(p for _, _, p, _ in received)
    assert per_partition == delivered
    assert set(per_partition) == set(range(PARTITIONS))

    partitions_of_key, offsets = defaultdict(set), defaultdict(list)
    values_of_key = defaultdict(list)
    for key, value, partition, offset in received:
        partitions_of_key[key].add(partition)
        offsets[partition].append(offset)
        values_of_key[key].append(value)
    for key, parts in partitions_of_key.items():
        assert parts == {java_partition(key, PARTITIONS)}, key
    for partition, offs in offsets.items():
        assert offs == list(range(len(offs))), partition  # in order, no gaps
    for key, values in values_of_key.items():  # one partition => per-key order kept
        assert values == [v for k, v in sent if k == key], key
