"""The supervisor's side of a rebalance: which worker fetches which partition, from where,
and how a partition leaves (consumer/supervisor.py hands these callbacks to its consumer;
they run inside its poll()).

An assigned partition starts where the table's content ends (the segment's applied
offset), or at the group's committed offset if that is lower; at the low watermark on
a new segment or when older data is gone from the topic. Re-applying is safe (apply is
idempotent); skipping is not. It goes to the worker with the fewest partitions, and its
row (engine/layout.py P_*) is published before the worker is told, with a new
generation, so a reader never calls a half-published assignment ready (H_ASSIGNING).

A revoked partition is drained first: its worker finishes its batch and reports what it
applied, which is committed before the callback returns (DESIGN invariant 1). A lost
partition is someone else's already: it is stopped and nothing is committed.
"""

from __future__ import annotations

import logging
import time
from typing import Callable

from shmcache.consumer import snapshots as snapshots_mod
from shmcache.engine import layout as L

log = logging.getLogger("shmcache.supervisor")

KAFKA_TIMEOUT_S = 15.0


class Assignment:
    """The partitions this supervisor holds (`assigned`: partition -> worker index) and the
    group's rebalance callbacks. `stopping()` says the supervisor is stopping (its final
    commit is made elsewhere, and new partitions are not handed out); `rebalanced()` runs
    after each completed assignment."""

    def __init__(self, cfg, cache, workers: list, commits, stopping: Callable[[], bool],
                 rebalanced: Callable[[], None]) -> None:
        self.cfg, self.cache, self.workers, self.commits = cfg, cache, workers, commits
        self.stopping, self.rebalanced = stopping, rebalanced
        self.assigned: dict[int, int] = {}

    def on_assign(self, consumer, tps) -> None:
        """New partitions: start them where the table's content ends; pause them here."""
        self.cache.control.count(L.H_REBALANCES)  # called once per completed rebalance, even with no partitions
        self.cache.control.set_word(L.H_ASSIGNING, 1)  # readers must not call a half-published assignment ready
        try:
            self._assign(consumer, tps)
        finally:
            self.cache.control.set_word(L.H_ASSIGNING, 0)
        self.commits.assigned()  # the new generation is in place: periodic commits go again
        self.rebalanced()

    def _assign(self, consumer, tps) -> None:
        from confluent_kafka import TopicPartition

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
        committed = {tp.partition: tp.offset for tp in consumer.committed(
            [TopicPartition(self.cfg.topic, p) for p in parts], timeout=KAFKA_TIMEOUT_S)}
        rows = self.cache.control.partitions
        plan: dict[int, list] = {}
        for p in parts:
            lo, hi = consumer.get_watermark_offsets(TopicPartition(self.cfg.topic, p), timeout=KAFKA_TIMEOUT_S)
            start = self._start_offset(p, lo, committed[p])
            w = min(self.workers, key=lambda h: len(h.partitions))
            w.partitions.add(p)
            self.assigned[p] = w.index
            row = rows[p]
            row[L.P_APPLIED] = start
            row[L.P_HIGH_WATERMARK] = hi
            row[L.P_LATEST] = hi
            row[L.P_CAUGHT_UP] = int(start >= hi)
            row[L.P_COMMITTED] = committed[p]
            row[L.P_OWNER] = w.index + 1
            row[L.P_GENERATION] += 1
            row[L.P_ASSIGNED] = 1
            plan.setdefault(w.index, []).append((p, start, int(row[L.P_GENERATION])))
        for idx, items in plan.items():
            self.workers[idx].request(("assign", items), "assigned", self.cfg.drain_timeout)
        log.info("assigned %s", {p: (self.assigned[p], int(rows[p, L.P_APPLIED]), int(rows[p, L.P_HIGH_WATERMARK]))
                                 for p in parts})

    def _start_offset(self, p: int, lo: int, committed: int) -> int:
        have = int(self.cache.control.partitions[p, L.P_APPLIED])
        start = have if have >= 0 else lo
        if committed >= 0:
            start = min(start, committed)
        snapshots_mod.note_start(self.cache, self.cfg.topic, p, have, lo)  # a retention gap is flagged
        return max(start, lo)  # older data is gone from the topic

    def release(self, tps, commit: bool) -> None:
        """Drain the workers of the partitions in `tps` (each finishes its batch first), commit
        what they applied if `commit`, and clear the partitions' rows."""
        parts = [tp.partition for tp in tps if tp.partition in self.assigned]
        if not self.stopping():
            by_worker: dict[int, list[int]] = {}
            for p in parts:
                by_worker.setdefault(self.assigned[p], []).append(p)
            for idx, ps in by_worker.items():
                w = self.workers[idx]
                if w.alive():
                    w.request(("revoke", ps), "revoked", self.cfg.drain_timeout)
                w.partitions.difference_update(ps)
        if commit and not self.stopping():  # a stop made its final commit already
            self.commits.in_callback(parts)
        rows = self.cache.control.partitions
        for p in parts:
            rows[p, L.P_ASSIGNED] = rows[p, L.P_OWNER] = rows[p, L.P_CAUGHT_UP] = 0
            self.assigned.pop(p, None)

    def on_revoke(self, consumer, tps) -> None:
        """Partitions leave: drain their workers, commit what they applied, before returning."""
        log.info("revoked %s", sorted(tp.partition for tp in tps))
        self.commits.hold(time.monotonic())
        self.release(tps, commit=True)
        self._unassign(consumer, tps)

    def on_lost(self, consumer, tps) -> None:
        """Partitions are already someone else's: stop them, commit nothing."""
        log.warning("lost %s (no commit)", sorted(tp.partition for tp in tps))
        self.commits.hold(time.monotonic())
        self.cache.control.count(L.H_PARTITIONS_LOST, len(tps))
        self.release(tps, commit=False)
        self._unassign(consumer, tps)

    def _unassign(self, consumer, tps) -> None:
        if self.cfg.cooperative:
            consumer.incremental_unassign(tps)
        else:
            consumer.unassign()

    def clear_rows(self) -> None:
        """At the supervisor's stop: no partition of the cache is assigned any more."""
        rows = self.cache.control.partitions
        for p in list(self.assigned):
            rows[p, L.P_ASSIGNED] = rows[p, L.P_OWNER] = 0

    def reassign(self, w) -> None:
        """A restarted worker gets its partitions back, from their applied offsets, each with
        a new generation."""
        rows = self.cache.control.partitions
        items = []
        for p in sorted(w.partitions):
            rows[p, L.P_GENERATION] += 1
            items.append((p, int(rows[p, L.P_APPLIED]), int(rows[p, L.P_GENERATION])))
        if items:
            w.request(("assign", items), "assigned", self.cfg.drain_timeout)
