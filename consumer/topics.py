"""Kafka topic administration: create a topic and wait for its leaders, delete it with its groups.

Used by the load generator (`shmcache produce --create-topic`), the demo and the tests."""

from __future__ import annotations

import time


def _admin_settings(bootstrap: str) -> dict:
    # log_level 4: librdkafka's informational chatter when a short-lived admin client
    # is destroyed ("Purging 1 unserved events") is not for the user's terminal
    return {"bootstrap.servers": bootstrap, "log_level": 4}


def create_topic(bootstrap: str, topic: str, partitions: int, timeout: float = 30.0,
                 config: dict[str, str] | None = None) -> bool:
    """Create `topic` with `partitions` partitions (replication 1) and wait until each has a
    leader. Returns False if it already existed with that many partitions; raises if it
    exists with another count."""
    from confluent_kafka import KafkaError, KafkaException
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient(_admin_settings(bootstrap))
    created = True
    try:
        admin.create_topics([NewTopic(topic, num_partitions=partitions, replication_factor=1, config=config or {})],
                            operation_timeout=timeout)[topic].result(timeout=timeout)
    except KafkaException as e:
        if e.args[0].code() != KafkaError.TOPIC_ALREADY_EXISTS:
            raise RuntimeError(f"creating topic {topic!r} on {bootstrap}: {e.args[0].str()}") from None
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
                return created
        if time.monotonic() > deadline:
            raise TimeoutError(f"topic {topic!r}: not every partition has a leader after {timeout:.0f} s")
        time.sleep(0.1)


def delete_topic(bootstrap: str, topic: str, groups: tuple[str, ...] = (), timeout: float = 30.0) -> None:
    """Delete `topic`, and the consumer `groups` that read it (their committed offsets)."""
    from confluent_kafka.admin import AdminClient

    admin = AdminClient(_admin_settings(bootstrap))
    admin.delete_topics([topic], operation_timeout=timeout)[topic].result(timeout=timeout)
    if groups:
        for f in admin.delete_consumer_groups(list(groups), request_timeout=timeout).values():
            f.result(timeout=timeout)
