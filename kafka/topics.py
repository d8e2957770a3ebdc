"""Kafka topic administration: create a topic and wait until every partition answers,
read a topic's end offsets, delete a topic with its groups.

Used by the load generator (`shmcache produce --create-topic`), the demo and the tests.

A partition is usable when its leader answers for it, not when the metadata names a
leader: a broker publishes a new partition's leader in its metadata before it has made
the partition's log, and a produce request in between is refused (NOT_LEADER_OR_FOLLOWER).
An idempotent librdkafka producer (2.x) then loses messages without a word: the refused
request's messages wait for a retry, a later request of the same partition already in
flight succeeds (the broker takes any first sequence from a producer it has no state
for), and librdkafka acknowledges every earlier message of the partition as delivered,
without an offset ("implicit ack", rdkafka_request.c). So a new topic is produced to only
once each of its partitions answers a ListOffsets request, which its leader serves from
the partition's log."""

from __future__ import annotations

import time

from shmcache.kafka import client as kafka_client
from shmcache.errors import BrokerUnavailableError, KafkaRequestError


def create_topic(bootstrap: str, topic: str, partitions: int, timeout: float = 30.0,
                 config: dict[str, str] | None = None, broker_wait: float | None = None) -> bool:
    """Create `topic` with `partitions` partitions (replication 1) and wait until each has a
    leader that answers for it (its end offset), `timeout` seconds at most. Returns False if
    it already existed with that many partitions; raises if it exists with another count. A
    broker that does not answer the creation within `broker_wait` (default: timeout) is
    BrokerUnavailableError."""
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import NewTopic

    broker_wait = timeout if broker_wait is None else broker_wait
    admin = kafka_client.quiet_admin(bootstrap)
    created = True
    try:
        admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1, config=config or {})],
                            operation_timeout=timeout, request_timeout=broker_wait)[topic].result(timeout=broker_wait + 5)
    except TimeoutError:  # librdkafka did not even time the request out
        raise BrokerUnavailableError(f"creating topic {topic!r}: no Kafka broker answered at {bootstrap} within "
                                     f"{broker_wait:g} s") from None
    except KafkaException as e:
        err = e.args[0]
        if err.code() in (KafkaError._TIMED_OUT, KafkaError._TRANSPORT, KafkaError._ALL_BROKERS_DOWN):
            raise BrokerUnavailableError(f"creating topic {topic!r}: no Kafka broker answered at {bootstrap} "
                                         f"within {broker_wait:g} s ({err.str()})") from None
        if err.code() != KafkaError.TOPIC_ALREADY_EXISTS:
            raise KafkaRequestError(f"creating topic {topic!r} on {bootstrap}: {err.str()}") from None
        created = False
    deadline = time.monotonic() + timeout
    while True:
        try:
            t = admin.list_topics(topic=topic, timeout=5).topics.get(topic)
        except KafkaException:  # the broker catching up after the create: asked again until the deadline
            t = None
        if t is not None and t.error is None and t.partitions:
            if len(t.partitions) != partitions:
                raise ValueError(f"topic {topic!r} exists with {len(t.partitions)} partitions, not {partitions}")
            if all(p.leader >= 0 and p.error is None for p in t.partitions.values()):
                break
        if time.monotonic() > deadline:
            raise TimeoutError(f"topic {topic!r}: not every partition has a leader after {timeout:.0f} s")
        time.sleep(0.1)
    wait_answering(admin, topic, range(partitions), deadline - time.monotonic())
    return created


def wait_answering(admin, topic: str, partitions, timeout: float) -> dict[int, int]:
    """Wait until the leader of each of `partitions` answers for it (its end offset), asked
    through AdminClient `admin`, `timeout` seconds at most (TimeoutError naming those that
    do not); returns their end offsets."""
    deadline = time.monotonic() + timeout
    while True:
        ends = end_offsets(admin, topic, partitions, max(1.0, min(5.0, deadline - time.monotonic())))
        silent = {p: e for p, e in ends.items() if isinstance(e, str)}
        if not silent:
            return ends
        if time.monotonic() > deadline:
            raise TimeoutError(f"topic {topic!r}: partitions {sorted(silent)} have no leader that answers for them "
                               f"after {timeout:.0f} s ({next(iter(silent.values()))})")
        time.sleep(0.1)
        # the leaders as the broker says them now: librdkafka's ListOffsets takes them from the
        # client's metadata, which kept "no leader" from a moment a broker was fenced (thawed
        # after its session timed out) for all of a 15 s wait, the broker leading again
        try:
            admin.list_topics(topic, timeout=max(1.0, min(5.0, deadline - time.monotonic())))
        except Exception:  # noqa: BLE001 - the next look says what is wrong
            pass


def end_offsets(admin, topic: str, partitions, timeout: float) -> dict[int, int | str]:
    """Each partition's end offset (its high watermark) as its leader answers it, asked all
    at once through AdminClient `admin`; a partition whose leader did not answer has the
    error's text instead."""
    from confluent_kafka import KafkaException, TopicPartition
    from confluent_kafka.admin import OffsetSpec

    futures = admin.list_offsets({TopicPartition(topic, p): OffsetSpec.latest() for p in partitions},
                                 request_timeout=timeout)
    out: dict[int, int | str] = {}
    for tp, fut in futures.items():
        try:
            end = fut.result(timeout + 5).offset
            out[tp.partition] = end if end >= 0 else f"no end offset within {timeout:g} s"
        except KafkaException as e:
            out[tp.partition] = kafka_client.error_text(e)
    return out


def delete_topic(bootstrap: str, topic: str, groups: tuple[str, ...] = (), timeout: float = 30.0) -> None:
    """Delete `topic`, and the consumer `groups` that read it (their committed offsets)."""
    admin = kafka_client.quiet_admin(bootstrap)
    admin.delete_topics([topic], operation_timeout=timeout)[topic].result(timeout=timeout)
    if groups:
        for f in admin.delete_consumer_groups(list(groups), request_timeout=timeout).values():
            f.result(timeout=timeout)
