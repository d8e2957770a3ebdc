"""A look at the broker from the supervisor's loop, never waited for: the pattern its
watches share (consumer/supervisor/topic_id.py TopicIdentity.tick, consumer/supervisor/watermarks.py
WatermarkWatch, consumer/supervisor/group.py GroupWatch).

One request is out at a time, sent through an AdminClient of the look's own (made at the
first look, kafka/client.py admin_client); its futures are looked at on a later tick,
so a broker that does not answer stops nothing. A request unanswered for twice its
timeout is given up, and the next look asks again.

An AdminClient made before the broker restarted timed out on every describe after it
(seen with librdkafka 2.x: the group's view then stayed as it was before the restart, and
a second member went unreported). So a look that fails or goes unanswered drops the
client, and the next look makes a new one.
"""

from __future__ import annotations

import contextlib
import logging
import time

from shmcache.kafka import client as kafka_client

log = logging.getLogger("shmcache.supervisor")


class AdminLook:
    """`ask()` sends a request, `answers()` gives its futures once answered; an answer
    judged failed in `failing()`, or said to be none by `drop()`, drops the client."""

    def __init__(self, cfg, timeout: float):
        self.cfg = cfg  # consumer/config.py RunConfig
        self.timeout = timeout  # each request's; one unanswered for twice this is given up
        self.admin = None
        self.futures: dict | None = None  # the request out: key -> future
        self.asked = 0.0  # monotonic time the last request was sent
        self.next = 0.0  # monotonic time the next periodic look is due (due()): at once

    @property
    def out(self) -> bool:
        return self.futures is not None

    def due(self, every: float) -> bool:
        """Whether a periodic look is due now; if so the next is due `every` seconds on."""
        now = time.monotonic()
        if now < self.next:
            return False
        self.next = now + every
        return True

    def soon(self, delay: float) -> None:
        """Have the next periodic look due within `delay` seconds."""
        self.next = min(self.next, time.monotonic() + delay)

    def ask(self, send, what: str) -> None:
        """Send a request: `send(admin, timeout)` makes it and gives its futures (key -> future);
        if it raises, `what` and the error are logged and the client is dropped."""
        asked = time.monotonic()
        try:
            if self.admin is None:
                self.admin = kafka_client.admin_client(self.cfg)
            self.futures = send(self.admin, self.timeout)
        except Exception as e:  # noqa: BLE001 - the next look tries again
            log.debug("%s: %s", what, e)
            self.admin = None
            return
        self.asked = asked

    def answers(self) -> dict | None:
        """The request out, once all its futures are done or it has waited twice its timeout:
        the done ones (key -> future; the client dropped if any is not). None while it waits,
        or with no request out."""
        if self.futures is None:
            return None
        if time.monotonic() - self.asked < 2 * self.timeout and not all(f.done() for f in self.futures.values()):
            return None
        futures, self.futures = self.futures, None
        done = {k: f for k, f in futures.items() if f.done()}
        if len(done) < len(futures):
            self.admin = None  # unanswered
        return done

    @contextlib.contextmanager
    def failing(self, what: str):
        """Judge an answer inside: what raises there is a failed look (a broker hiccup; the
        next look tries again), logged after `what` at debug, and the client is dropped."""
        try:
            yield
        except Exception as e:  # noqa: BLE001
            log.debug("%s: %s", what, e)
            self.admin = None

    def drop(self) -> None:
        """An answer that is none (librdkafka's -1001 for a ListOffsets that timed out): as unanswered."""
        self.admin = None
