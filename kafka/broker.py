"""Whether the Kafka broker answers: the supervisor's view, published in the segment.

The supervisor turns librdkafka's errors (kafka/client.py routes them to it) and the
outcome of its own metadata requests into one state, in two header words it alone writes
through its cache's control area (engine/control/area.py: broker_connecting,
broker_waiting, broker_up):

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
from shmcache.kafka.client import is_down, kafka_log

log = logging.getLogger("shmcache.supervisor")

RETRY_FIRST_S = 0.5
RETRY_MAX_S = 5.0
PROBE_TIMEOUT_S = 1.0  # each metadata request: short, so a stop request is seen at once


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

