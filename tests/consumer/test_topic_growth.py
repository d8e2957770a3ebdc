"""Partitions added to a running supervisor's topic, against the real broker: the cache
stops saying ready within seconds, the new partitions are assigned here and applied, and
it is ready again with every entry of them. Before, the supervisor saw the growth only
at librdkafka's metadata refresh, every 300 s by default: five minutes of "ready" with
the new partitions' entries missing (consumer/config.py TOPIC_REFRESH_MS)."""

import os
import sys

import numpy as np
from confluent_kafka import Producer
from confluent_kafka.admin import NewPartitions

from shmcache.consumer import wire

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _pipeline import harness, poll_until  # noqa: E402,F401

BOUND = 60.0  # far below the 300 s of librdkafka's default refresh, far above the 5 s of ours


def _produce(bootstrap: str, topic: str, counts: dict[int, int], rng) -> dict[bytes, bytes]:
    """One-entry v1 messages, counts[p] of them to partition p; {key: value} sent."""
    prod = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    sent = {}
    for p, n in counts.items():
        for _ in range(n):
            key, value = rng.bytes(32), rng.bytes(80)
            prod.produce(topic, wire.encode_v1([key], [wire.ADD], [value]), partition=p)
            sent[key] = value
    assert prod.flush(30) == 0
    return sent


def test_partitions_added_to_the_topic_end_ready_until_they_are_applied(harness, kafka_topic, kafka_admin):
    rng = np.random.default_rng(7)
    topic = kafka_topic(2)
    before = _produce(harness.bootstrap, topic, {0: 50, 1: 50}, rng)
    name = harness.cache_name("grow")
    sup = harness.supervisor(name, topic, harness.group("grow"))
    r = harness.attach(name, sup=sup)
    assert r.wait_ready(60)["partitions"] == 2
    assert all(v is not None for v in r.get_many(list(before)))

    kafka_admin.create_partitions([NewPartitions(topic, 4)])[topic].result(30)
    added = _produce(harness.bootstrap, topic, {2: 100, 3: 100}, rng)
    poll_until(lambda: r.status()["partitions"] == 4, BOUND, "the supervisor to see the topic's 4 partitions")
    st = r.wait_ready(BOUND)
    assert sorted(p["partition"] for p in st["assigned"]) == [0, 1, 2, 3]
    # produced before the growth was seen, or just after its assignment: applied either way
    poll_until(lambda: r.get_many(list(added)) == list(added.values()), BOUND,
               "every entry of the new partitions in the cache")
    assert sup.terminate() == 0
