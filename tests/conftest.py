"""Fixtures that run a real single-node Kafka broker (scripts/kafka) for every test
directory that needs one (tests/consumer, tests/spark): no Docker, no mocks. The broker is started once per session,
bound to 127.0.0.1 only, and always stopped at the end."""

import os
import subprocess
import time
import uuid
from dataclasses import dataclass

import pytest

from shmcache.consumer.localkafka import LocalBroker, LocalKafkaError

# The first run on a fresh machine fetches ~45 MB of jars with Maven.
START_TIMEOUT = float(os.environ.get("SHMCACHE_KAFKA_START_TIMEOUT", "900"))


@dataclass(frozen=True)
class KafkaBroker:
    bootstrap: str
    pid: int
    dir: str
    log: str
    version: str


@pytest.fixture(scope="session")
def kafka_broker(tmp_path_factory) -> KafkaBroker:
    run_dir = tmp_path_factory.mktemp("kafka")
    # --watch-pid (consumer/localkafka.py): a watchdog stops the broker if this pytest
    # process dies without running its teardown (SIGKILL, a CI job timeout).
    local = LocalBroker(run_dir)
    try:
        info = local.start(timeout=START_TIMEOUT)
    except subprocess.TimeoutExpired:
        local.stop()  # the broker may be up without having answered yet
        pytest.fail(f"scripts/kafka start took over {START_TIMEOUT:.0f}s", pytrace=False)
    except LocalKafkaError as e:
        pytest.fail(f"scripts/kafka start failed:\n{e.stderr}", pytrace=False)
    broker = KafkaBroker(bootstrap=info["bootstrap"], pid=info["pid"], dir=info["dir"],
                         log=info["log"], version=info["version"])
    try:
        yield broker
    finally:
        local.stop()


@pytest.fixture(scope="session")
def kafka_admin(kafka_broker):
    from confluent_kafka.admin import AdminClient

    return AdminClient({"bootstrap.servers": kafka_broker.bootstrap})


def wait_for_topic(admin, name: str, partitions: int, timeout: float = 30.0) -> None:
    """Block until metadata shows `partitions` partitions of `name`, each with a leader."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            topic = admin.list_topics(topic=name, timeout=5).topics.get(name)
        except Exception:  # KafkaException while the broker catches up
            topic = None
        if (topic is not None and topic.error is None and len(topic.partitions) == partitions
                and all(p.leader >= 0 and p.error is None for p in topic.partitions.values())):
            return
        if time.monotonic() > deadline:
            raise TimeoutError(f"topic {name} has no leader for all {partitions} partitions")
        time.sleep(0.1)


@pytest.fixture
def kafka_topic(kafka_admin):
    """Factory: kafka_topic(partitions=1, config=None) -> a new, uniquely named topic,
    ready to use; the topics it made are deleted after the test."""
    from confluent_kafka.admin import NewTopic

    created: list[str] = []

    def create(partitions: int = 1, *, config: dict[str, str] | None = None,
               prefix: str = "test") -> str:
        name = f"{prefix}-{uuid.uuid4().hex[:12]}"
        new = NewTopic(name, num_partitions=partitions, replication_factor=1, config=config or {})
        kafka_admin.create_topics([new], operation_timeout=30)[name].result(timeout=30)
        created.append(name)
        wait_for_topic(kafka_admin, name, partitions)
        return name

    yield create
    if created:  # best effort: a broker that is going away anyway needs no cleanup
        for future in kafka_admin.delete_topics(created, operation_timeout=10).values():
            try:
                future.result(timeout=15)
            except Exception:
                pass
