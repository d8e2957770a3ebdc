"""The producer's account of what it sent (produce/producer.py TxmetaProducer), read
against what the real broker's topic holds.

librdkafka acknowledges some messages without their offset (Message.offset() is None):
- a retry of a batch the broker had already written (a duplicate): it is in the topic;
- a message it never wrote: its request was refused, as a new partition's leader refuses
  one for a moment (kafka/topics.py), while a later request of the same partition was
  in flight and then succeeded; librdkafka then acks the refused message "implicitly".
  That lost a message in a test of this suite. Here the refusal is made on demand: the
  broker sits behind a gate (tests/lib/shmtest/kafka_gate.py refuse_produce) that answers
  the producer's first request itself, once its second one is in flight.

The producer must tell the two apart and fail on the second, naming the partition. The
first test hands the producer a report as librdkafka builds it (confluent_kafka.Message
with offset -1) for a message a second producer really wrote; the delivery report once
did `offset + 1` on it, a TypeError inside the callback that confluent-kafka 2.16 on
Python 3.11 turned into a SystemError out of flush() naming nothing.
"""

import contextlib
import logging
import os
import signal
import threading

import numpy as np
import pytest

from shmcache.kafka import client as kafka_client
from shmcache.formats import wire
from shmcache.produce.producer import TxmetaProducer
from shmcache.kafka.topics import create_topic, end_offsets
from shmcache.errors import KafkaRequestError

from shmtest.private_broker import broker_run
from shmtest.topic_model import KafkaProbe, Model
from shmtest.waits import poll_until


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
    msgs = [wire.encode_v1(keys[i:i + 1], np.full(1, wire.ADD, np.uint8), values[i:i + 1]) for i in range(3)]
    for m in msgs:
        raw.produce(topic, m, partition=other)
    assert raw.flush(30) == 0
    del raw
    # the report is checked: its message is looked for in the partition, and found
    prod.delivered(None, Message(topic=topic, partition=other, offset=-1, value=msgs[-1]))
    prod.flush()
    probe = KafkaProbe(kafka_broker.bootstrap, topic, 2)
    try:
        ends = probe.end_offsets()
    finally:
        probe.close()
    assert ends[other] == 3 and ends[mine] == 1, ends
    assert [prod.end_offsets.get(p, 0) for p in range(2)] == ends
    assert prod.delivered_messages == 2


# -- a message acknowledged that the topic does not hold ------------------------------------------

REFUSED_CLIENT = "t-refused-producer"


def _one_batch(model: Model):
    return model.batch(n_new=3, n_update=0, n_delete=0, n_twice=0)


def _refused_then_acked(run, topic: str, sole_writer: bool, caplog) -> TxmetaProducer:
    """A producer's first request to `topic` refused as a new partition's leader refuses it,
    while its second request of the same partition is in flight and then written: librdkafka
    acknowledges the first message too, without an offset, though the broker never wrote it."""
    prod = TxmetaProducer(run.bootstrap, topic, format="v1", sole_writer=sole_writer,
                          settings={"client.id": REFUSED_CLIENT, "debug": "eos,msg", "log_level": 7})
    model = Model("v1", 1, seed=41)
    run.gate.refuse_produce(REFUSED_CLIENT)
    with caplog.at_level(logging.DEBUG, logger="shmcache.kafka"):
        prod.send(*_one_batch(model))
        poll_until(lambda: prod.poll(0.05) or run.gate.refused.is_set(), 30, "the first request held at the gate")
        prod.send(*_one_batch(model))
        with pytest.raises(KafkaRequestError) as e:
            prod.flush(60)
    assert run.gate.refused_partitions == [(topic, 0)]
    # librdkafka's own word for what happened: the refused message acknowledged by the next one's success
    assert any("implicitly acked by subsequent batch success" in r.getMessage() for r in caplog.records), \
        "librdkafka did not ack the refused message implicitly"
    assert f"{topic!r}" in str(e.value) and "[0]" in str(e.value), e.value
    probe = KafkaProbe(run.bootstrap, topic, 1)
    try:
        assert probe.end_offsets() == [1]  # the second message only: the first was never written
    finally:
        probe.close()
    return e.value


def test_a_message_acknowledged_but_never_written_fails_the_flush(tmp_path, caplog):
    with broker_run(tmp_path, "refused", 1, seed=43, gated=True) as run:
        # the sole writer of a new topic: the partition grew by 1, 2 were acknowledged
        err = _refused_then_acked(run, run.topic, True, caplog)
        assert "[0] 2 acknowledged, but it grew by 1 (0 -> 1)" in str(err), err
        # one writer among others: the message acknowledged without an offset is looked for, and missing
        other = "t-refused-shared"
        create_topic(run.bootstrap, other, 1)
        err = _refused_then_acked(run, other, False, caplog)
        assert "[0] 1 of 1 acknowledged without an offset are not in offsets 0..1" in str(err), err


# -- a topic made on a slow broker ------------------------------------------------------------------

@contextlib.contextmanager
def _slowed(pid: int, stopped_s: float = 0.04, running_s: float = 0.01):
    """The broker runs a fifth of the time (SIGSTOP / SIGCONT in turn), as on a loaded machine:
    it makes a new topic's partitions one by one, long after it names their leader."""
    done = threading.Event()

    def duty() -> None:
        while not done.is_set():
            os.kill(pid, signal.SIGSTOP)
            done.wait(stopped_s)
            os.kill(pid, signal.SIGCONT)
            done.wait(running_s)
    t = threading.Thread(target=duty, daemon=True, name="slow-broker")
    t.start()
    try:
        yield
    finally:
        done.set()
        t.join()
        os.kill(pid, signal.SIGCONT)


def test_a_topic_made_on_a_slow_broker_answers_for_every_partition_before_it_is_produced_to(tmp_path):
    partitions, batches = 64, 192
    with broker_run(tmp_path, "slow-create", 1, seed=47) as run:
        topic = "t-slow-create-64"
        model = Model("v1", partitions, seed=53)
        with _slowed(run.broker.pid):
            create_topic(run.bootstrap, topic, partitions, timeout=240)
            # at once, the broker still slow: every partition's leader answers for it (its
            # metadata named every leader long before it had made the last partition's log)
            ends = end_offsets(kafka_client.quiet_admin(run.bootstrap), topic, range(partitions), 60)
            assert ends == {p: 0 for p in range(partitions)}, {p: e for p, e in ends.items() if e != 0}
            # produced to at once, every partition, as the tests' models and the demo do
            prod = TxmetaProducer(run.bootstrap, topic, format="v1", sole_writer=True)
            for _ in range(batches):
                prod.send(*model.batch(n_new=2, n_update=1, n_delete=1, n_twice=0))
            prod.flush(240)  # accounts for every message: raises naming a partition short of its count
        probe = KafkaProbe(run.bootstrap, topic, partitions)
        try:
            assert probe.end_offsets() == [batches // partitions] * partitions
        finally:
            probe.close()
        assert prod.delivered_messages == prod.sent_messages == batches
