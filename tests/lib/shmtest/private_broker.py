"""A broker of a test's own (scripts/kafka on fixed free ports, in the test's tmp dir) that
the test can stop and start again with its data, for broker-outage tests: the session
broker of tests/conftest.py is shared and must stay up.

Always stopped at the end (by the pid scripts/kafka reports), even if the test fails;
--watch-pid stops it too if pytest itself dies. The process handling is
dev/local_kafka.py's.

`broker_run` is the stage of a test on such a broker: the broker (behind a KafkaGate,
tests/lib/shmtest/kafka_gate.py, if asked), a topic, a Harness, a cache name and a group,
a Model and what it produced first; torn down in full, the broker thawed, however the
test ends."""

from __future__ import annotations

import contextlib
import os
import signal
from pathlib import Path

from shmtest.kafka_gate import SUPERVISOR_CLIENT, KafkaGate
from shmtest.supervisors import Harness, SupervisorProc
from shmtest.topic_model import Model, produce_and_wait
from shmtest.waits import poll_until, threads_stopped
from shmcache.dev.local_kafka import LocalBroker, LocalKafkaError, free_ports  # noqa: F401 (free_ports: tests)
from shmcache.kafka.topics import create_topic


class PrivateBroker(LocalBroker):
    def __init__(self, run_dir: Path, advertised_port: int = 0):
        """`advertised_port`: clients are told to connect there (tests/lib/shmtest/kafka_gate.py's proxy)."""
        super().__init__(run_dir, *free_ports(2), advertised_port=advertised_port)
        self.starts = 0

    def start(self, timeout: float = 300.0) -> None:
        """Start (again, keeping the topics and offsets of the previous run) and wait until it serves."""
        try:
            super().start(timeout=timeout, keep_data=bool(self.starts))
        except LocalKafkaError as e:
            raise AssertionError(f"scripts/kafka start failed:\n{e.stderr[-3000:]}") from None
        self.starts += 1

    def stop(self) -> None:
        super().stop()
        self.pid = None


class BrokerRun:
    """What `broker_run` sets up: `broker`, `gate` (None if not gated), `bootstrap` (the
    gate's, if gated), `topic` (t-<tag>, `partitions` of them), the Harness `h`, the
    cache's `name` and `group`, the v1 `model` and `ends` (the topic's end offsets after
    the batches produced at set-up)."""

    def __init__(self, tmp_path: Path, tag: str, partitions: int, seed: int, gated: bool):
        self.gate = KafkaGate(0) if gated else None
        self.broker = PrivateBroker(tmp_path / "kafka", advertised_port=self.gate.port if gated else 0)
        if gated:
            self.gate.broker_port = self.broker.port
        self.bootstrap = f"127.0.0.1:{self.gate.port}" if gated else self.broker.bootstrap
        self.topic, self.partitions = f"t-{tag}", partitions
        self.h = Harness(tmp_path, self.bootstrap)
        self.name, self.group = self.h.cache_name(tag), self.h.group(tag)
        self.model = Model("v1", partitions, seed=seed)
        self.ends: list[int] = []

    def produce(self, batches: int) -> list[int]:
        """`batches` more Model batches; the topic's end offsets once all are acknowledged."""
        return produce_and_wait(self.h, self.topic, self.model, self.partitions, rate=1000, max_batches=batches)

    def supervisor(self, *args: str, **kw) -> SupervisorProc:
        """A supervisor of the run's cache, topic and group; `args`: more flags."""
        return self.h.supervisor(self.name, self.topic, self.group, args=args, **kw)

    def attach(self, sup: SupervisorProc):
        return self.h.attach(self.name, sup=sup)

    def freeze(self, frozen: bool) -> None:
        """SIGSTOP the broker and return once every thread of it is stopped; or SIGCONT it and
        return once it leads every partition of the topic again (a KRaft broker stopped past
        its session timeout is fenced by its controller: until it registers again, a new
        client finds no leader, and a producer started then gave up after 15 s)."""
        os.kill(self.broker.pid, signal.SIGSTOP if frozen else signal.SIGCONT)
        if frozen:
            poll_until(lambda: threads_stopped(self.broker.pid), 10, "the broker's threads to stop")
        else:
            poll_until(self._leading, 120, "the broker to lead every partition again after SIGCONT")

    def _leading(self) -> bool:
        from shmcache.kafka.client import quiet_admin

        try:  # straight to the broker, not through the gate
            md = quiet_admin(self.broker.bootstrap).list_topics(self.topic, timeout=5)
        except Exception:  # noqa: BLE001 - not answering yet
            return False
        t = md.topics.get(self.topic)
        if t is None or t.error is not None:  # no such topic (yet): the broker answers, nothing to lead
            return t is None or t.error.code() == 3  # UNKNOWN_TOPIC_OR_PART
        return all(p.leader >= 0 for p in t.partitions.values())

    def start_frozen_at(self, api_key: int, *args: str) -> SupervisorProc:
        """Start a supervisor (flags `args`) with the gate armed at its first `api_key`
        request; freeze the broker while that request waits at the gate, then let it
        through to the frozen broker."""
        self.gate.hold_at({api_key}, SUPERVISOR_CLIENT)
        sup = self.supervisor(*args)

        def at_gate():
            assert sup.running(), sup.log_text()[-3000:]
            return self.gate.held.is_set()
        poll_until(at_gate, 120, "the supervisor's lookup to reach the gate")
        self.freeze(True)
        self.gate.release()
        return sup


@contextlib.contextmanager
def broker_run(tmp_path: Path, tag: str, partitions: int, *, seed: int, batches: int = 0, gated: bool = False):
    """A BrokerRun: the broker started, its topic made, `batches` Model batches produced
    (`ends`). At the end, however the test ends: the gate opened (a connection held alone
    would slow the supervisor's stop), the broker thawed, every process, reader and segment
    of the harness gone, the broker stopped, the gate closed."""
    run = BrokerRun(tmp_path, tag, partitions, seed, gated)
    try:
        run.broker.start()
        create_topic(run.bootstrap, run.topic, partitions)
        if batches:
            run.ends = run.produce(batches)
        yield run
    finally:
        if run.gate is not None:
            run.gate.release()
        if run.broker.pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(run.broker.pid, signal.SIGCONT)
        try:
            run.h.close()
        finally:
            run.broker.stop()
            if run.gate is not None:
                run.gate.close()
