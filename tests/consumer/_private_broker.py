"""A broker of a test's own (scripts/kafka on fixed free ports, in the test's tmp dir) that
the test can stop and start again with its data, for broker-outage tests: the session
broker of tests/conftest.py is shared and must stay up.

Always stopped at the end (by the pid scripts/kafka reports), even if the test fails;
--watch-pid stops it too if pytest itself dies. The process handling is
consumer/localkafka.py's."""

from __future__ import annotations

from pathlib import Path

from shmcache.consumer.localkafka import LocalBroker, LocalKafkaError, free_ports  # noqa: F401 (free_ports: tests)


class PrivateBroker(LocalBroker):
    def __init__(self, run_dir: Path, advertised_port: int = 0):
        """`advertised_port`: clients are told to connect there (tests/consumer/_kafka_gate.py's proxy)."""
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
