"""Whether the Kafka broker answers: the supervisor's view, published in the segment.

librdkafka reports an unreachable broker by logging every failed connect (about
20 lines a second per client) and through its error callback. Every consumer of
ours routes librdkafka's log to the `shmcache.kafka` logger at `log_level` 2
(critical only; `--set log_level=7` shows everything for debugging) and its
errors to `error_cb`; the supervisor turns them into one state, in two header
words it alone writes (through the cache's engine/control/area.py ControlArea):

    H_BROKER_STATE    BROKER_UNKNOWN (no answer yet), BROKER_UP, BROKER_WAITING
    H_BROKER_SINCE    time.monotonic_ns() the current wait started (0 when up)

and one log line per retry, with backoff (RETRY_FIRST_S doubling up to
RETRY_MAX_S). status(), `shmcache status`, `top` and the metrics read them.

Down means a metadata request failed (at start, or while running after
librdkafka said all brokers are down, _ALL_BROKERS_DOWN); up means one answered. A single
failed connection (_TRANSPORT) is not down: the broker closes idle connections.
"""

from __future__ import annotations

import logging
import time

from shmcache.engine.control import layout as C

log = logging.getLogger("shmcache.supervisor")
kafka_log = logging.getLogger("shmcache.kafka")

RETRY_FIRST_S = 0.5
RETRY_MAX_S = 5.0
PROBE_TIMEOUT_S = 1.0  # each metadata request: short, so a stop request is seen at once

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
    """An AdminClient for the run's broker (cfg: consumer/config.py RunConfig), with its
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


class BrokerWatch:
    """The supervisor's record of the broker's state: its header words, backoff and log."""

    def __init__(self, control, bootstrap: str, wait_limit: float):
        self.control = control  # the cache's ControlArea (engine/control/area.py)
        self.bootstrap = bootstrap
        self.wait_limit = wait_limit  # seconds; 0 = wait for ever
        self.since = 0.0  # time.monotonic() the current wait began; 0 while up
        self.delay = RETRY_FIRST_S
        self.next_try = 0.0
        self.last_error = ""
        self.since_ns = 0  # the same start, on the segment's age clock (time.monotonic_ns())
        self.control.broker_connecting()

    @property
    def down(self) -> bool:
        return self.control.broker_state != C.BROKER_UP

    def on_error(self, err) -> None:
        """librdkafka's error callback (served by poll): all brokers down asks for a probe at
        once (the error may be stale: one queued while waiting is served after the broker
        answered); the probe's failure starts the wait."""
        if is_down(err):
            if not self.since:  # once a wait began, the retries report it
                self.next_try = time.monotonic()
        else:
            self.last_error = str(err.str())
            kafka_log.debug("%s", err)

    def failed(self, why: str) -> None:
        now = time.monotonic()
        if not self.since:
            self.since = now
            self.since_ns = time.monotonic_ns()
            self.delay = RETRY_FIRST_S
            self.next_try = now + self.delay
            self.control.broker_waiting(self.since_ns)
            log.warning("the Kafka broker at %s does not answer (%s); waiting for it", self.bootstrap, why)
            return
        self.control.broker_waiting(self.since_ns)
        waited = now - self.since
        self.delay = min(self.delay * 2, RETRY_MAX_S)
        self.next_try = now + self.delay
        log.info("still waiting for the Kafka broker at %s after %.0f s (%s); next try in %.1f s",
                 self.bootstrap, waited, why, self.delay)

    def answered(self) -> None:
        if self.since:
            log.info("the Kafka broker at %s answers again after %.1f s", self.bootstrap, time.monotonic() - self.since)
        self.since = 0.0
        self.next_try = 0.0
        self.since_ns = 0
        self.control.broker_up()

    def due(self) -> bool:
        """Time to ask the broker: librdkafka said it is down, the wait's next retry, or the
        wait's bound, whichever comes first (one last probe then decides: the retries back off
        to RETRY_MAX_S, and a bound judged only at the next retry would be overshot by up to that)."""
        return bool(self.next_try) and self.pause_s() <= 0

    def pause_s(self) -> float:
        """Seconds until the next try, or until the wait's bound if that comes first."""
        end = self.next_try
        if self.wait_limit and self.since:
            end = min(end, self.since + self.wait_limit)
        return max(0.0, end - time.monotonic())

    def over_limit(self) -> bool:
        return bool(self.wait_limit and self.since and time.monotonic() - self.since >= self.wait_limit)

    def waited(self) -> float:
        return time.monotonic() - self.since if self.since else 0.0

