"""The supervisor's AdminClients (kafka/client.py admin_client: the look-up's, the
topic-id look's) take the run's debugging settings as its consumers do, against the
real broker: `--set log_level=7` (and debug=...) makes librdkafka's debug lines reach the
shmcache.kafka logger. They were held at log_level 2 whatever the run said, so a
problem only a look-up met (a slow OffsetFetch, a refused ListOffsets) could not be
debugged from librdkafka's side. Without the settings, they stay quiet."""

import logging

from shmcache.kafka import client as kafka_client
from shmcache.consumer.config import RunConfig

from shmtest.waits import poll_until


def _debug_lines(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "shmcache.kafka" and r.levelno == logging.DEBUG]


def _look(cfg) -> None:
    """What a look-up's client does first: ask the broker for the cluster's metadata, and
    serve its queued log lines."""
    admin = kafka_client.admin_client(cfg, "look-up")
    assert admin.list_topics(timeout=30).brokers
    admin.poll(0.5)


def test_a_runs_debug_settings_reach_its_admin_clients(kafka_broker, caplog):
    with caplog.at_level(logging.DEBUG, logger="shmcache.kafka"):
        _look(RunConfig(name="t-admin-quiet", bootstrap=kafka_broker.bootstrap, topic="t-admin"))
        assert _debug_lines(caplog) == []  # the default: critical lines only

        cfg = RunConfig(name="t-admin-debug", bootstrap=kafka_broker.bootstrap, topic="t-admin",
                        kafka={"log_level": 7, "debug": "broker,admin"})

        def said() -> bool:
            _look(cfg)
            return any("t-admin-debug" in line for line in _debug_lines(caplog))  # its own client.id's lines
        poll_until(said, 60, lambda: f"a debug line of the look-up's client; got {_debug_lines(caplog)[:5]}")
