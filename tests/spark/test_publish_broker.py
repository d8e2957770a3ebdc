"""What the publisher asks the broker (spark/publish.py): before Spark runs a task, a broker
that is not there is one error naming it and the wait, raised within that wait, with none
of librdkafka's connect errors on the terminal (it printed ~20 a second, then a
KafkaException out of `shmcache spark publish`); after the sink has written, whether the
topic holds what it wrote."""

import os
import socket
import subprocess
import sys

import pytest

from shmcache.errors import BrokerUnavailableError
from shmtest.private_broker import broker_run  # tests/consumer, on the path by tests/spark/conftest.py
from shmtest.topic_model import KafkaProbe

CHILD = """
import sys
from shmcache.spark.publish import topic_partitions
from shmcache.errors import BrokerUnavailableError
try:
    topic_partitions(sys.argv[1], "t-nowhere", timeout=2)
except BrokerUnavailableError as e:
    print(e)
"""


def test_publish_without_a_broker_says_so_once():
    assert issubclass(BrokerUnavailableError, ConnectionError)
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        bootstrap = f"127.0.0.1:{s.getsockname()[1]}"
    # a process of its own: what reaches its stderr is what a user's terminal would show
    p = subprocess.run([sys.executable, "-c", CHILD, bootstrap], capture_output=True, text=True, timeout=60,
                       env=os.environ)
    assert p.returncode == 0 and p.stderr == "", p.stderr[-3000:]
    assert f"no Kafka broker answered at {bootstrap} within 2 s" in p.stdout, p.stdout


def test_a_message_the_sink_wrote_but_the_topic_lacks_fails_the_publish(spark, tmp_path):
    """Spark's Kafka sink (Java's producer), told acks=0 by the caller, never hears of a request
    lost on the way (the gate drops its first one): the publish checks the topic's growth against
    what the tasks wrote, per partition, and fails naming the partition."""
    from shmcache.errors import KafkaRequestError
    from shmcache.spark import datagen, publish

    client = "t-dropped-spark"
    datagen.write(tmp_path / "src", 20000, seed=5)
    with broker_run(tmp_path, "sink-dropped", 1, seed=59, gated=True) as run:
        run.gate.refuse_produce(client, answer=False)
        with pytest.raises(KafkaRequestError) as e:
            publish.publish(spark, str(tmp_path / "src"), run.bootstrap, run.topic,
                            kafka_options={"client.id": client, "acks": "0", "enable.idempotence": "false"})
        assert run.gate.refused.is_set() and run.gate.refused_partitions == [(run.topic, 0)]
        probe = KafkaProbe(run.bootstrap, run.topic, 1)
        try:
            end = probe.end_offsets()[0]
        finally:
            probe.close()
        assert f"topic {run.topic!r} does not hold every message" in str(e.value), e.value
        assert f"[0] {end + 1} written, grew by {end} (0 -> {end})" in str(e.value), e.value


def test_acks_0_messages_still_on_their_way_are_waited_for(spark, tmp_path):
    """Under acks=0 a task ends once its requests are on the socket, not once the broker has
    appended them: every Produce request of the sink is held a second by the gate, so the
    job ends with the topic still empty. The publish looks again until the topic holds
    all it wrote (a CI run on a loaded machine failed here before it did)."""
    from shmcache.spark import datagen, publish
    from shmtest.kafka_gate import PRODUCE

    client = "t-late-spark"
    datagen.write(tmp_path / "src", 20000, seed=5)
    with broker_run(tmp_path, "sink-late", 1, seed=61, gated=True) as run:
        run.gate.slow_down([PRODUCE], client, 1.0)
        report = publish.publish(spark, str(tmp_path / "src"), run.bootstrap, run.topic,
                                 kafka_options={"client.id": client, "acks": "0", "enable.idempotence": "false"})
        assert run.gate.slowed >= 1
        probe = KafkaProbe(run.bootstrap, run.topic, 1)
        try:
            assert probe.end_offsets()[0] == report.messages
        finally:
            probe.close()
