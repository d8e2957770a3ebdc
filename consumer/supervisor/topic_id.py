"""Is the topic there now the one the table's offsets came from? (DESIGN invariant 10.)

Kafka gives a topic an id (a UUID) when it is created; one deleted and re-created under
its name gets a new one, and its offsets start at 0 again. Offsets alone tell the new log
from the old only while the new one is shorter than what the table applied
(consumer/supervisor/rebalance.py, consumer/worker/log_replaced.py); a new log that already holds more
messages looks like the old one, and its messages below the applied offsets were never
applied: the cache said ready without them. The id tells them apart whatever the offsets.

The table's topic id lives in the segment (engine/layout.py H_TOPIC_ID; a snapshot carries
it to its restore). `TopicIdentity` asks the broker for the topic's id
(AdminClient.describe_topics):

  - before every hand-out of partitions (consumer/supervisor/rebalance.py `_hand_out`), bounded like
    the offsets' look-up and failing like it (the partitions stay pending, retried), so a
    supervisor started on a table whose topic was re-created meanwhile never starts a
    partition at an offset of the old log;
  - every CHECK_S while running, without blocking the loop (kafka/admin_poll.py: a
    future looked at on a later tick), for a topic re-created under a running supervisor.

A table without an id (new, or filled by an earlier shmcache) takes the topic's. A
different one means the topic was re-created: every partition starts over at the new
log's start (Assignment.start_over), and only then is the new id written, so a
supervisor killed in between finds the old id and does it again. A broker too old to
have topic ids (before Kafka 2.8) gives none: then nothing is compared, as before.
"""

from __future__ import annotations

import logging
import time

from shmcache.kafka import client as kafka_client
from shmcache.kafka.admin_poll import AdminLook
from shmcache.engine.control import layout as C

log = logging.getLogger("shmcache.supervisor")

CHECK_S = 5.0  # between two looks while running
TIMEOUT_S = 10.0  # a periodic look's request timeout; one unanswered for twice this is dropped


def _text(desc) -> str:
    u = desc.topic_id
    return "" if u is None else C.topic_id_text(u.get_most_significant_bits(), u.get_least_significant_bits())


def _unsupported(e) -> bool:
    """The broker does not know the request (too old for topic ids)."""
    from confluent_kafka import KafkaError

    return kafka_client.error_code(e) in (KafkaError.UNSUPPORTED_VERSION, KafkaError._UNSUPPORTED_FEATURE)


class TopicIdentity:
    """`check()` before a hand-out, `tick()` from the loop; `on_replaced(old, new)` starts
    every partition over (it must return before the new id is recorded)."""

    def __init__(self, cfg, control, on_replaced):
        self.cfg = cfg
        self.control = control  # the cache's ControlArea (engine/control/area.py)
        self.on_replaced = on_replaced
        self.look = AdminLook(cfg, TIMEOUT_S)  # the periodic look's (the look-up's client is dropped with its failures)
        self.unsupported = False  # the broker has no topic ids: nothing to compare
        self.recorded = 0.0  # monotonic time the table's id last changed: an answer asked before is stale

    def check(self, admin, deadline: float, timeout: float) -> None:
        """Ask now through `admin` (the look-up's AdminClient) with request `timeout`, answered
        by `deadline` (monotonic); KafkaException if the broker does not answer (the look-up
        fails with it)."""
        from confluent_kafka import KafkaError, KafkaException

        if self.unsupported:
            return
        fut = self._describe(admin, timeout)[self.cfg.topic]
        try:
            desc = fut.result(max(deadline - time.monotonic(), 0.1))
        except KafkaException as e:
            if _unsupported(e):
                self.unsupported = True
                log.info("the broker gives topic %r no id (%s: Kafka before 2.8): a re-created topic is told from "
                         "the old one by its offsets alone", self.cfg.topic, e)
                return
            raise
        except Exception as e:  # noqa: BLE001 - the future's own timeout: the same as no answer
            raise KafkaException(KafkaError(KafkaError._TIMED_OUT, f"describing topic {self.cfg.topic!r}: no "
                                            f"answer in {timeout:.1f} s ({e!r})")) from e
        self._seen(_text(desc))

    def tick(self) -> None:
        if self.unsupported:
            return
        failed = f"describing topic {self.cfg.topic!r} failed"
        if self.look.out:
            answers = self.look.answers()
            if answers and self.look.asked >= self.recorded:  # else the old id, asked before a hand-out saw the new one
                desc = None
                with self.look.failing(failed):  # deleted (not re-created yet), a hiccup: the next look asks again
                    desc = answers[self.cfg.topic].result()
                if desc is not None:  # outside: a start-over that fails is no broker hiccup, said at debug
                    try:
                        self._seen(_text(desc))
                    except Exception:  # noqa: BLE001 - the table keeps the old id: the next look tries again
                        log.exception("starting every partition of topic %r over failed; the next look, in %g s, "
                                      "tries again", self.cfg.topic, CHECK_S)
            return
        if self.look.due(CHECK_S):
            self.look.ask(self._describe, failed)

    def _describe(self, admin, timeout: float) -> dict:
        """Ask `admin` for the topic's description: {topic: future}."""
        from confluent_kafka import TopicCollection

        return admin.describe_topics(TopicCollection([self.cfg.topic]), request_timeout=timeout)

    def _seen(self, now_id: str) -> None:
        had = self.control.topic_id
        if not now_id:  # an answer without an id (a request that timed out, like ListOffsets' -1001): none
            log.debug("describing topic %r gave no id", self.cfg.topic)
            return
        if had == now_id:
            return
        if had:
            self.on_replaced(had, now_id)  # every partition starts over first
        else:
            log.info("topic %r has id %s; the table's offsets belong to it from now on", self.cfg.topic, now_id)
        self.control.set_topic_id(now_id)
        self.recorded = time.monotonic()
