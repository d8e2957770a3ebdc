"""The supervisor's side of a rebalance: which worker fetches which partition, from where,
and how a partition leaves (consumer/supervisor/policy.py hands these callbacks to its consumer;
they run inside its poll()).

An assigned partition starts where the table's content ends (the segment's applied
offset), or at the group's committed offset if that is lower; at the low watermark on
a new segment or when older data is gone from the topic. Re-applying is safe (apply is
idempotent); skipping is not. It goes to the worker with the fewest partitions, and its
row (engine/control/rows.py PartitionRows.assign) is published before the worker is told, with a new
generation, so a reader never calls a half-published assignment ready (H_ASSIGNING).
The worker is told without waiting for an answer (consumer/worker/loop.py): one still starting
(a restart, `reassign`) or hung reads it once up, and the supervisor's loop goes on.

Where a partition starts takes the broker's word (its committed offset and watermarks).
A broker that does not answer then (stopped, or frozen with its connections open) leaves
the partitions pending: the callback returns, status says "waiting for the broker"
(kafka/broker.py), no worker gets them, and the supervisor's loop looks again once
the broker answers (`retry`). One look-up has one bound however many partitions it asks
about, longer against a slow broker (consumer/supervisor/start_offsets.py). A look-up that fails
while the broker answers (its metadata, asked at once) is not an outage: the group
coordinator does not answer or refuses (an authorisation error, say). The broker is then not
shown waiting; the log says it answers and what failed, and the look-up is retried with
backoff. Either way `broker_wait` bounds how long the partitions stay pending, from the first
failed look-up until one succeeds (the broker's answers in between do not start it again):
past it, a ShmcacheError naming the partitions and the error (exit 2 at the command line).

An applied or committed offset above the partition's high watermark belongs to another
log than the one there now: the topic was deleted and re-created (or its log truncated).
That is logged as an error and the partition starts over at its low watermark, not caught
up until it reaches the high watermark; the table keeps what the old log put in it.

A revoked partition is drained first: its worker finishes its batch and reports what it
applied, which is committed before the callback returns (DESIGN invariant 1). A lost
partition is someone else's already: it is stopped and nothing is committed. Every worker
concerned is asked at once and all are waited for against one deadline (drain_timeout); one
that does not answer by then (hung, stopped) is killed before the callback returns, as it
must not wake up later still applying partitions that have gone elsewhere.
"""

from __future__ import annotations

import logging
import time
from typing import Callable

from shmcache.kafka import client as kafka_client
from shmcache.kafka import broker as broker_mod
from shmcache.consumer.supervisor import snapshot_policy
from shmcache.consumer.supervisor.start_offsets import LookUp
from shmcache.consumer.supervisor.topic_id import TopicIdentity
from shmcache.consumer.supervisor.worker_handle import request_all
from shmcache.engine.control import layout as C
from shmcache.engine import layout as L
from shmcache.errors import ShmcacheError

log = logging.getLogger("shmcache.supervisor")

class Assignment:
    """The partitions this supervisor holds (`assigned`: partition -> worker index) and the
    group's rebalance callbacks. `stopping()` says the supervisor is stopping (its final
    commit is made elsewhere, and new partitions are not handed out); `rebalanced()` runs
    after each completed assignment."""

    def __init__(self, cfg, cache, workers: list, commits, broker, stopping: Callable[[], bool],
                 rebalanced: Callable[[], None]) -> None:
        self.cfg, self.cache, self.workers, self.commits = cfg, cache, workers, commits
        self.broker = broker  # kafka/broker.py BrokerWatch: a lookup the broker did not answer is a wait
        self.stopping, self.rebalanced = stopping, rebalanced
        self.assigned: dict[int, int] = {}
        self.pending: set[int] = set()  # assigned by the group, start offset not known yet: no worker has them
        self._retry_at = 0.0  # monotonic time of the next lookup of the pending partitions
        self._delay = broker_mod.RETRY_FIRST_S
        self._failing_since = 0.0  # monotonic time of the first failed look-up of the pending ones; 0 none
        self._failure = ""  # the last failed look-up's error
        self.identity = TopicIdentity(cfg, cache.control, self.start_over)  # a re-created topic (consumer/supervisor/topic_id.py)
        self.look = LookUp(cfg, cache.control, self.identity)  # where partitions start (consumer/supervisor/start_offsets.py)

    def on_assign(self, consumer, tps) -> None:
        """New partitions: start them where the table's content ends; pause them here."""
        self.cache.control.count("rebalances")  # called once per completed rebalance, even with no partitions
        self.cache.control.set_assigning(True)  # readers must not call a half-published assignment ready
        try:
            self._assign(consumer, tps)
        finally:
            self.cache.control.set_assigning(False)
        self.commits.assigned()  # the new generation is in place: periodic commits go again
        self.rebalanced()

    def _assign(self, consumer, tps) -> None:
        if self.cfg.cooperative:
            consumer.incremental_assign(tps)
        else:
            consumer.assign(tps)
        if tps:
            consumer.pause(tps)  # pause state does not survive a move: set it on every assignment
        if not tps or self.stopping():
            return
        parts = sorted(tp.partition for tp in tps)
        log.info("assignment of partitions %s received; handing them to the workers", parts)
        if parts[-1] >= self.cache.control.npartitions and parts[-1] < L.MAX_PARTITIONS:
            self.cache.control.set_topic(self.cfg.topic, parts[-1] + 1)  # the topic grew: ready means all
        self.pending.update(parts)
        self._hand_out(consumer)

    def retry(self, consumer) -> None:
        """The supervisor's loop: partitions still pending are looked up again once the broker
        answers (its probes, consumer/supervisor/startup.py check_broker, say when) and their backoff is over."""
        if not self.pending:
            if self._failing_since:  # revoked while pending: nothing waits any more
                self._failing_since = 0.0
                self.cache.control.set_lookup_failure("", 0)
            return
        waited = time.monotonic() - self._failing_since
        # while the broker is down its own wait (kafka/broker.py) is the one that runs out
        if (self._failing_since and self.cfg.broker_wait and waited >= self.cfg.broker_wait
                and not self.broker.down and not self.stopping()):
            raise ShmcacheError(f"cache {self.cfg.name!r}: the Kafka broker at {self.cfg.bootstrap} answers, but "
                                f"partitions {sorted(self.pending)} of topic {self.cfg.topic!r} have waited {waited:.0f} "
                                f"s (broker_wait {self.cfg.broker_wait:g} s) for {self._failure}")
        if self.stopping() or self.broker.down or time.monotonic() < self._retry_at:
            return
        self.cache.control.set_assigning(True)
        try:
            self._hand_out(consumer)
        finally:
            self.cache.control.set_assigning(False)

    def _hand_out(self, consumer) -> None:
        """Give the pending partitions to the workers, if the broker says where each starts."""
        from confluent_kafka import KafkaException

        try:
            parts, offsets = self.look.run(lambda: sorted(self.pending))
        except KafkaException as e:
            answers = self._broker_answers(consumer)
            parts = sorted(self.pending)
            what = f"looking up where partitions {parts} start"
            text = kafka_client.error_text(e) + self.look.failed(e, answers)
            self._failure = f"{what}: {text}"
            self._failing_since = self._failing_since or time.monotonic()
            if answers:
                # time.monotonic() is the age clock's CLOCK_MONOTONIC, in s
                self.cache.control.set_lookup_failure(self._failure, int(self._failing_since * 1e9))
                self.broker.answered()
                log.warning("the Kafka broker at %s answers, but %s failed: %s (its group coordinator does not answer "
                            "or refuses: not a broker outage); retrying in %.1f s", self.cfg.bootstrap,
                            what, text, self._delay)
            else:
                self.broker.failed(self._failure)
            self._retry_at = time.monotonic() + self._delay
            self._delay = min(self._delay * 2, broker_mod.RETRY_MAX_S)
            return
        self.pending.clear()
        self._failing_since = 0.0
        self.cache.control.set_lookup_failure("", 0)
        self._delay = broker_mod.RETRY_FIRST_S
        self.broker.answered()
        rows = self.cache.control.partition_rows
        plan: dict[int, list] = {}
        for p in parts:
            lo, hi, committed = offsets[p]
            start = self._start_offset(p, lo, hi, committed)
            w = min(self.workers, key=lambda h: len(h.partitions))
            w.partitions.add(p)
            self.assigned[p] = w.index
            generation = rows.assign(p, start, hi, committed, w.index)
            plan.setdefault(w.index, []).append((p, start, generation))
        for idx, items in plan.items():  # not waited for (consumer/worker/loop.py): a worker still starting reads it once up
            self.workers[idx].tell(("assign", items))
        log.info("assigned %s", {p: (self.assigned[p], rows.applied(p), rows.high_watermark(p)) for p in parts})

    def _broker_answers(self, consumer) -> bool:
        """The broker answers a metadata request (so a failed look-up is not an outage)."""
        from confluent_kafka import KafkaException

        try:
            consumer.list_topics(self.cfg.topic, timeout=broker_mod.PROBE_TIMEOUT_S)
        except KafkaException:
            return False
        return True

    def _start_offset(self, p: int, lo: int, hi: int, committed: int) -> int:
        have = self.cache.control.partition_rows.applied(p)
        above = [f"{what} offset {o}" for what, o in (("applied", have), ("committed", committed)) if o > hi]
        if above:  # another log than this one had them: start it over, from its beginning
            log.error("topic %r partition %d: the %s %s above the partition's high watermark %d: the topic was "
                      "deleted and re-created (or its log truncated); starting the partition over at its low "
                      "watermark %d, not caught up until it reaches %d; the cache keeps the entries it applied "
                      "from the old topic (DELETEs in the new one still apply)",
                      self.cfg.topic, p, " and the ".join(above), "are" if len(above) > 1 else "is", hi, lo, hi)
            have = committed = -1
        start = have if have >= 0 else lo
        if committed >= 0:
            start = min(start, committed)
        snapshot_policy.note_start(self.cache, self.cfg.topic, p, have, lo)  # a retention gap is flagged
        return max(start, lo)  # older data is gone from the topic

    def watch_topic(self) -> None:
        """The supervisor's loop: a look at the topic's id now and then (consumer/supervisor/topic_id.py)."""
        if not self.stopping():
            self.identity.tick()

    def start_over(self, old: str, new: str) -> None:
        """The topic was deleted and re-created (its id was `old`, is `new`): every partition
        starts over at the new log's start. The held ones are drained first, nothing committed
        (their offsets are the old log's), and wait with the others to be handed out again."""
        from confluent_kafka import TopicPartition

        ctl = self.cache.control
        assigning = bool(ctl.word(C.H_ASSIGNING))  # set already when a hand-out found it
        ctl.set_assigning(True)  # not ready from now on: the held partitions' flags are the old log's
        try:
            held = sorted(self.assigned)
            log.error("topic %r was deleted and re-created (its id was %s, is %s): every partition starts over at "
                      "the new topic's start, not caught up until it reaches its high watermark; the cache keeps the "
                      "entries it applied from the old topic (DELETEs in the new one still apply)",
                      self.cfg.topic, old, new)
            self.release([TopicPartition(self.cfg.topic, p) for p in held], commit=False)
            ctl.partition_rows.forget_applied()  # none applied of the new log: start at its low watermark
            self.pending.update(held)
            self._retry_at = 0.0
        finally:
            ctl.set_assigning(assigning)

    def release(self, tps, commit: bool) -> None:
        """Drain the workers of the partitions in `tps` (each finishes its batch first), commit
        what they applied if `commit`, and clear the partitions' rows."""
        parts = [tp.partition for tp in tps if tp.partition in self.assigned]
        if not self.stopping():
            by_worker: dict[int, list[int]] = {}
            for p in parts:
                by_worker.setdefault(self.assigned[p], []).append(p)
            asked = [(self.workers[idx], ("revoke", ps)) for idx, ps in by_worker.items() if self.workers[idx].alive()]
            for (w, (_, ps)), answer in zip(asked, request_all(asked, "revoked", self.cfg.drain_timeout)):
                if answer is None:  # hung or stopped: it must not wake up later still applying them
                    w.kill_unanswered(f"the revoke of partitions {ps}", self.cfg.drain_timeout)
            for idx, ps in by_worker.items():
                self.workers[idx].partitions.difference_update(ps)
        if commit and not self.stopping():  # a stop made its final commit already
            self.commits.in_callback(parts)
        rows = self.cache.control.partition_rows
        for p in parts:
            rows.release(p)
            self.assigned.pop(p, None)

    def on_revoke(self, consumer, tps) -> None:
        """Partitions leave: drain their workers, commit what they applied, before returning."""
        log.info("revoked %s", sorted(tp.partition for tp in tps))
        self.pending.difference_update(tp.partition for tp in tps)  # never handed out: nothing to drain
        self.commits.hold(time.monotonic())
        self.release(tps, commit=True)
        self._unassign(consumer, tps)

    def on_lost(self, consumer, tps) -> None:
        """Partitions are already someone else's: stop them, commit nothing."""
        log.warning("lost %s (no commit)", sorted(tp.partition for tp in tps))
        self.pending.difference_update(tp.partition for tp in tps)
        self.commits.hold(time.monotonic())
        self.cache.control.count("partitions_lost", len(tps))
        self.release(tps, commit=False)
        self._unassign(consumer, tps)

    def _unassign(self, consumer, tps) -> None:
        if self.cfg.cooperative:
            consumer.incremental_unassign(tps)
        else:
            consumer.unassign()

    def clear_rows(self) -> None:
        """At the supervisor's stop: no partition of the cache is assigned any more."""
        rows = self.cache.control.partition_rows
        for p in list(self.assigned):
            rows.unassign(p)

    def reassign(self, w) -> None:
        """A restarted worker gets its partitions back, from their applied offsets, each with
        a new generation."""
        rows = self.cache.control.partition_rows
        items = [(p, *rows.reassign(p)) for p in sorted(w.partitions)]
        if items:
            w.tell(("assign", items))  # read once it is up; the supervisor's loop goes on meanwhile
