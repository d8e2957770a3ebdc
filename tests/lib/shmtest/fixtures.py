"""The fixtures the tests and the benchmarks share (tests/conftest.py and bench/conftest.py
take them from here): a real single-node Kafka broker (scripts/kafka) for the session, bound
to 127.0.0.1 and always stopped, by pid; its topics; fresh cache names, destroyed after; the
engine's child processes, reaped after; a small tmpfs for disk-full tests."""

from __future__ import annotations

import contextlib
import os
import subprocess
import uuid
from dataclasses import dataclass
from pathlib import Path

import pytest

from shmcache.dev.local_kafka import LocalBroker, LocalKafkaError

# The first run on a fresh machine fetches ~45 MB of jars with Maven.
START_TIMEOUT = float(os.environ.get("SHMCACHE_KAFKA_START_TIMEOUT", "900"))


@dataclass(frozen=True)
class KafkaBroker:
    bootstrap: str
    pid: int
    dir: str
    log: str
    version: str


@pytest.fixture
def procs(tmp_path):
    """start(role, *args) -> a running child process of shmtest.procs' roles (the engine's and
    the snapshots' tests); every one is closed and reaped at teardown."""
    from shmtest.procs import Proc

    started: list[Proc] = []

    def start(role, *args):
        p = Proc(role, *args, log_dir=str(tmp_path))
        started.append(p)
        return p

    yield start
    for p in started:
        p.close()
    for p in started:
        assert p.p.poll() is not None


@pytest.fixture
def cache_name():
    """A fresh cache name, unique to this process; its segment is destroyed after the test."""
    import shmcache

    name = f"t-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    yield name
    if shmcache.exists(name):
        shmcache.destroy(name)


@pytest.fixture
def cache_names():
    """Factory: cache_names(tag) -> a fresh cache name, unique to this process, for a test
    that needs several; every cache so named is removed after the test, forced, so that
    what a failed test left (a half-restored file, a cache marked in use) goes too."""
    import shmcache

    made: list[str] = []

    def make(tag: str = "c") -> str:
        made.append(f"t-{tag}-{os.getpid()}-{uuid.uuid4().hex[:8]}")
        return made[-1]

    yield make
    for name in made:
        if shmcache.exists(name):
            shmcache.destroy(name, force=True)


@pytest.fixture(scope="session")
def kafka_broker(tmp_path_factory) -> KafkaBroker:
    run_dir = tmp_path_factory.mktemp("kafka")
    # --watch-pid (dev/local_kafka.py): a watchdog stops the broker if this pytest
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
    """An AdminClient of the session broker, quiet (kafka/client.py quiet_admin): one
    that outlived the broker at the interpreter's exit printed librdkafka's connect errors."""
    from shmcache.kafka.client import quiet_admin

    return quiet_admin(kafka_broker.bootstrap)


@pytest.fixture
def kafka_topic(kafka_broker, kafka_admin):
    """Factory: kafka_topic(partitions=1, config=None) -> a new, uniquely named topic,
    ready to use (kafka/topics.py create_topic: each partition has a leader); the
    topics it made are deleted after the test."""
    from shmcache.kafka.topics import create_topic

    created: list[str] = []

    def create(partitions: int = 1, *, config: dict[str, str] | None = None,
               prefix: str = "test") -> str:
        name = f"{prefix}-{uuid.uuid4().hex[:12]}"
        create_topic(kafka_broker.bootstrap, name, partitions, config=config)
        created.append(name)
        return name

    yield create
    if created:  # best effort: a broker that is going away anyway needs no cleanup
        for future in kafka_admin.delete_topics(created, operation_timeout=10).values():
            try:
                future.result(timeout=15)
            except Exception:
                pass


@pytest.fixture
def small_fs(tmp_path):
    """Factory: small_fs(nbytes) -> a directory on a tmpfs of its own of that size, for
    disk-full tests (mounted under tmp_path; needs root: skipped otherwise). Everything
    mounted is unmounted after the test, whatever happened."""
    mounted: list[Path] = []

    def mount(nbytes: int) -> Path:
        if os.geteuid() != 0:
            pytest.skip("a disk-full test mounts a small tmpfs: that needs root")
        d = tmp_path / f"small-fs-{len(mounted)}"
        d.mkdir()
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={int(nbytes)},mode=0700", "tmpfs", str(d)],
                           capture_output=True, text=True, timeout=30)
        if r.returncode != 0:
            pytest.skip(f"could not mount a tmpfs at {d}: {r.stderr.strip()}")
        mounted.append(d)
        return d

    yield mount
    for d in reversed(mounted):
        r = subprocess.run(["umount", str(d)], capture_output=True, text=True, timeout=30)
        if r.returncode != 0:  # still busy (a process of a failed test): detach it, it goes when unused
            subprocess.run(["umount", "-l", str(d)], capture_output=True, timeout=30)
        with contextlib.suppress(OSError):
            d.rmdir()
