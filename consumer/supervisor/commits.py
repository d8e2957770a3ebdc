"""When and how the supervisor commits: the applied offsets the workers published, never more.

librdkafka's synchronous commit waits without a bound for the group's coordinator
(`rd_kafka_commit` with RD_POLL_INFINITE). A broker that dies, or stops answering,
between the supervisor's look at it and a synchronous commit would stop the
supervisor's loop for as long as the broker stays away: no heartbeat, no broker state
in status(), no worker restarts. So:

- Periodic commits are asynchronous, one in flight at a time; librdkafka hands the
  result to `on_commit` (the consumer's setting) inside consumer.poll. While one is in
  flight, H_COMMIT_PENDING_SINCE says since when (status: `commit_pending_s`).
- A commit inside a revoke callback is synchronous, as librdkafka asks, so the
  offsets go with the generation that had them; the coordinator started that
  rebalance, so it answers.
- The final commit at shutdown is asynchronous and waited for at most FINAL_WAIT_S
  (less if the stop's budget is short, never under its minimum: consumer/supervisor/stop.py)
  while poll serves its result. One not confirmed by then is logged and left: whoever
  owns the partition next starts from the last committed offset, and applying an
  entry again is harmless (docs/design.md, invariants).

A commit refused because the group is moving to a new generation is deferred: the
periodic commits hold until the assignment callback says the move is done (the revoke
callback commits what leaves), for at most REBALANCE_HOLD_S.
"""

from __future__ import annotations

import logging
import math
import time


log = logging.getLogger("shmcache.supervisor")

REBALANCE_HOLD_S = 30.0  # periodic commits wait at most this long for a rebalance to end
FINAL_WAIT_S = 10.0  # how long a stop waits for its final commit to be confirmed
_REBALANCE_ERRORS = ("ILLEGAL_GENERATION", "REBALANCE_IN_PROGRESS", "UNKNOWN_MEMBER_ID")


class Committer:
    """The supervisor's commits of one consumer: what is due, what is in flight, the holds."""

    def __init__(self, control, topic: str, broker):
        self.control = control  # the cache's ControlArea (engine/control/area.py)
        self.topic = topic
        self.broker = broker  # kafka/broker.py BrokerWatch: no commit while it is down
        self.consumer = None  # set once made: its settings carry on_commit=self.on_commit
        self.inflight: dict[int, int] | None = None  # the asynchronous commit awaiting its result
        self.rebalancing: float | None = None  # monotonic time a rebalance was seen starting
        # monotonic time of the last periodic commit; -inf (never) makes the next tick's commit due
        # whatever the clock reads (0.0 would, only once the machine has been up `interval` s)
        self.last = -math.inf
        self._final = False  # the one in flight is a stop's final commit

    # -- the supervisor's events -----------------------------------------------------------------

    def tick(self, now: float, parts, interval: float) -> None:
        """The supervisor's loop: a periodic commit when one is due and nothing holds it."""
        if self.rebalancing is not None and now - self.rebalancing > REBALANCE_HOLD_S:
            self.rebalancing = None  # no new generation came: commit again (and count what fails)
        if now - self.last >= interval and self.rebalancing is None:
            self.periodic(parts)
            self.last = now

    def hold(self, now: float) -> None:
        """A revoke or a loss at `now` (the caller's monotonic clock): a rebalance has begun.
        Periodic commits wait for the assignment, REBALANCE_HOLD_S at most."""
        if self.rebalancing is None:
            self.rebalancing = now

    def assigned(self) -> None:
        """The new generation is in place: periodic commits go again, the held one at once."""
        self.rebalancing = None
        self.last = -math.inf

    # -- the three kinds of commit ------------------------------------------------------------------

    def periodic(self, parts) -> None:
        """Commit what is due, asynchronously; nothing while one is in flight or the broker is down."""
        todo = self._due(parts)
        if not todo or self.inflight is not None:
            return
        self._send(todo)

    def in_callback(self, parts) -> None:
        """The revoke callback's commit: synchronous, before the partitions leave."""
        from confluent_kafka import KafkaException

        todo = self._due(parts)
        if not todo:
            return
        try:
            done = self.consumer.commit(offsets=self._offsets(todo), asynchronous=False)
            err = next((tp.error for tp in done or () if tp.error is not None), None)
        except KafkaException as e:
            err = e.args[0] if e.args else e
        self._result(todo, err, final=True)

    def at_stop(self, parts, beat, wait: float = FINAL_WAIT_S) -> bool:
        """The final commit of a stop, waited for at most `wait` seconds (FINAL_WAIT_S, or what
        the stop's budget leaves, consumer/supervisor/stop.py; consumer.poll serves its result; `beat`
        keeps the heartbeat going meanwhile). True if nothing is left uncommitted."""
        deadline = time.monotonic() + wait
        while True:
            while self.inflight is not None and time.monotonic() < deadline:
                self.consumer.poll(0.1)
                beat()
            if self.inflight is not None:
                log.warning("final commit of %s not confirmed after %.1f s (the broker does not answer); "
                            "the partitions' next owner starts from the last committed offsets",
                            self.inflight, wait)
                return False
            if self.broker.down:
                log.warning("final commit skipped: the broker does not answer")
                return False
            todo = self._due(parts)
            if not todo:
                return True
            self._send(todo, final=True)

    # -- results -------------------------------------------------------------------------------

    def on_commit(self, err, tps) -> None:
        """librdkafka's result of an asynchronous commit (served by consumer.poll)."""
        todo, self.inflight = self.inflight, None
        self.control.set_commit_pending(0)
        if todo is None:
            return
        if err is None:
            err = next((tp.error for tp in tps or () if tp.error is not None), None)
        self._result(sorted(todo.items()), err, final=self._final)

    def _result(self, todo, err, final: bool) -> None:
        if err is not None:
            name = err.name() if hasattr(err, "name") else ""
            if not final and name in _REBALANCE_ERRORS:
                # the group is moving to a new generation: this commit went with the old one.
                self.control.count("commits_deferred")
                self.hold(time.monotonic())
                log.info("commit of %s deferred: the group is rebalancing (%s)", dict(todo), name)
                return
            self.control.count("commit_failures")
            log.warning("commit of %s failed: %s", dict(todo), err)
            return
        self.control.count("commits")
        for p, o in todo:
            self.control.partition_rows.record_commit(p, o)
        (log.info if final else log.debug)("committed %s", dict(todo))

    # -- helpers -----------------------------------------------------------------------------------

    def _due(self, parts) -> list[tuple[int, int]]:
        """(partition, applied offset) of each partition whose applied offset is not committed
        yet; none while the broker is down (the commit would only wait for it)."""
        if self.broker.down:
            return []
        return self.control.partition_rows.uncommitted(parts)

    def _offsets(self, todo):
        from confluent_kafka import TopicPartition

        return [TopicPartition(self.topic, p, o) for p, o in todo]

    def _send(self, todo, final: bool = False) -> None:
        from confluent_kafka import KafkaException

        self.inflight, self._final = dict(todo), final
        self.control.set_commit_pending(time.monotonic_ns())
        try:
            self.consumer.commit(offsets=self._offsets(todo), asynchronous=True)
        except KafkaException as e:  # refused before it was sent (e.g. no assignment any more)
            self.on_commit(e.args[0] if e.args else e, None)
