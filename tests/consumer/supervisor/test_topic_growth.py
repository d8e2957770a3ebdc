"""Partitions added to a running supervisor's topic, against the real broker: the cache
stops saying ready within seconds, the new partitions are assigned here and applied, and
it is ready again with every entry of them. Before, the supervisor saw the growth only
at librdkafka's metadata refresh, every 300 s by default: five minutes of "ready" with
the new partitions' entries missing (consumer/config.py TOPIC_REFRESH_MS)."""


import numpy as np
from confluent_kafka.admin import NewPartitions

from shmcache.kafka.topics import wait_answering

from shmtest.supervisors import Harness
from shmtest.topic_model import produce_entries
from shmtest.waits import poll_until

BOUND = 60.0  # far below the 300 s of librdkafka's default refresh, far above the 5 s of ours


def test_partitions_added_to_the_topic_end_ready_until_they_are_applied(tmp_path, kafka_broker, kafka_topic,
                                                                        kafka_admin):
    rng = np.random.default_rng(7)
    topic = kafka_topic(2)
    h = Harness(tmp_path, kafka_broker.bootstrap)
    try:
        before = produce_entries(h.bootstrap, topic, {0: 50, 1: 50}, rng)
        name = h.cache_name("grow")
        sup = h.supervisor(name, topic, h.group("grow"))
        r = h.attach(name, sup=sup)
        assert r.wait_ready(60)["partitions"] == 2
        assert all(v is not None for v in r.get_many(list(before)))

        kafka_admin.create_partitions([NewPartitions(topic, 4)])[topic].result(30)
        wait_answering(kafka_admin, topic, range(4), 30)  # produced to only once the new leaders answer
        added = produce_entries(h.bootstrap, topic, {2: 100, 3: 100}, rng)
        poll_until(lambda: r.status()["partitions"] == 4, BOUND, "the supervisor to see the topic's 4 partitions")
        st = r.wait_ready(BOUND)
        assert sorted(p["partition"] for p in st["assigned"]) == [0, 1, 2, 3]
        # produced before the growth was seen, or just after its assignment: applied either way
        poll_until(lambda: r.get_many(list(added)) == list(added.values()), BOUND,
                   "every entry of the new partitions in the cache")
        assert sup.terminate() == 0
    finally:
        h.close()
