"""How every client of the project talks to the broker: librdkafka's settings that keep it
quiet (its log to the `shmcache.kafka` logger, its errors to a callback), the settings a
client of the same broker takes whatever its kind (how to reach and authenticate to it),
AdminClients made that way, and the words of a KafkaException.

librdkafka reports an unreachable broker by logging every failed connect (about 20 lines
a second per client) and through its error callback. Every consumer of ours routes its
log to `shmcache.kafka` at `log_level` 2 (critical only; `--set log_level=7` shows
everything for debugging) and its errors to `error_cb`: the supervisor turns them into one
state (kafka/broker.py), a producer or a job into the one error it raises.
"""

from __future__ import annotations

import logging

kafka_log = logging.getLogger("shmcache.kafka")


def client_settings(on_error=None) -> dict:
    """The settings that keep librdkafka quiet; the caller's error callback sees its errors."""
    return {"logger": kafka_log, "error_cb": on_error or _log_error}


# librdkafka settings an AdminClient takes from the run's [kafka] table (how to reach and
# authenticate to the broker); consumer settings would only draw warnings from it
_ADMIN_PREFIXES = ("security.", "sasl.", "ssl.", "socket.", "broker.", "client.dns")
# and the run's debugging ones: `--set log_level=7` (or debug=...) reaches every client of its
_DEBUG_SETTINGS = ("log_level", "debug")


def error_text(e: BaseException) -> str:
    """What a KafkaException says (its KafkaError's own words), else the exception's text."""
    err = e.args[0] if e.args else None
    return err.str() if hasattr(err, "str") else str(e)


def error_code(e: BaseException):
    """A KafkaException's KafkaError code, else None."""
    err = e.args[0] if e.args else None
    return err.code() if hasattr(err, "code") else None


def connection_settings(kafka: dict) -> dict:
    """Of librdkafka settings `kafka`, those that say how to reach and authenticate to the
    broker: what any client of the same broker takes, whatever its kind."""
    return {k: v for k, v in kafka.items() if k.startswith(_ADMIN_PREFIXES)}


def quiet_admin(bootstrap: str, kafka: dict | None = None, client_id: str | None = None):
    """An AdminClient for `bootstrap`, with the connection and authentication settings of
    `kafka` (librdkafka settings), named `client_id` if given, and quiet: librdkafka's log to
    the shmcache.kafka logger at log_level 2 (critical only; `kafka`'s own log_level and
    debug, if it sets them), its errors to error_cb. Its chatter as a short-lived client is
    destroyed ("Purging 1 unserved events"), and a failed connect 20 times a second while
    the broker is away, are not for a user's terminal: the caller's error says it once."""
    from confluent_kafka.admin import AdminClient

    kafka = kafka or {}
    conf = {"log_level": 2, **{k: kafka[k] for k in _DEBUG_SETTINGS if k in kafka}, **connection_settings(kafka),
            "bootstrap.servers": bootstrap, **client_settings()}
    if client_id:
        conf["client.id"] = client_id
    return AdminClient(conf)


def admin_client(cfg, role: str = ""):
    """An AdminClient for the run's broker (cfg: a consumer/config.py RunConfig, or any object with its bootstrap, kafka and client_id), with its
    connection and authentication settings, as quiet as the consumers, and named as the
    supervisor's consumer is (cfg.client_id), then "/" and its `role` if given: the
    supervisor's requests all carry its name, and a broker's logs tell its clients apart."""
    return quiet_admin(cfg.bootstrap, cfg.kafka, f"{cfg.client_id}/{role}" if role else cfg.client_id)


def isolation_level(cfg):
    """The run's isolation level (librdkafka's default, read_committed, unless its [kafka]
    table says otherwise) as an AdminClient.list_offsets argument: the consumers' own, so a
    high watermark asked there is the one their fetches reach and get_watermark_offsets
    gives (the last stable offset under read_committed, below an open transaction)."""
    from confluent_kafka import IsolationLevel

    if cfg.kafka.get("isolation.level", "read_committed") == "read_committed":
        return IsolationLevel.READ_COMMITTED
    return IsolationLevel.READ_UNCOMMITTED


def _log_error(err) -> None:
    """A worker's errors: the supervisor reports the broker's state, so these are debug only."""
    kafka_log.debug("%s", err)


def is_down(err) -> bool:
    from confluent_kafka import KafkaError

    return err.code() == KafkaError._ALL_BROKERS_DOWN
