"""The supervisor's own look at the high watermarks, for partitions whose worker cannot be
trusted to publish them (DESIGN invariant 10: ready means the whole topic, now).

A worker publishes its partitions' applied offsets and the high watermark of its last
fetch (consumer/worker/loop.py). One that hangs, is stopped, dies, or backs off between
restarts publishes nothing: its partitions would go on showing the lag of its last
batch, and their caught-up flags what they said before it. So, every REFRESH_S, the
supervisor asks the broker itself (AdminClient.list_offsets, latest; futures looked at
on a later tick, kafka/admin_poll.py, so a broker that does not answer stops nothing)
for the high watermarks of the partitions

  - whose worker is not up (starting, backing off) or has not beaten for SLOW_S, and
  - whose worker was restarted, until they are caught up again,

and raises their readiness target (P_HIGH_WATERMARK, the supervisor's word) to the
answer, so status() shows their lag growing. A partition still catching up under a live
worker keeps its assignment's target.

Readiness (P_CAUGHT_UP): a partition whose worker died (backing off; a stale one was
killed) is not caught up: its flag is cleared, nobody else writes it then. At the
restart, before the new worker is told, its target is unknown (-1: the new worker cannot
call it caught up against an old one; the last known stays in P_LATEST, where the lag
is read from). It is caught up again once the applied offset reaches a high watermark
asked for after the restart: the worker says so after a batch, the supervisor when the
answer comes (nothing new arrived, so the worker fetched nothing to say it with).

A stalled fetch: librdkafka 2.16's consumer can stop fetching a partition after the broker
restarts (a CI run saw two of a worker's three partitions fetch nothing for minutes, the
worker beating all along; librdkafka issues 5153 and 4492), with no error, and its cached
high watermark then stays what it was, so the partition showed no lag and stayed ready
with the new messages missing. So every STALL_LOOK_S the look takes in every assigned
partition, and a partition under a trusted worker is stalled when a look asked after its
worker last moved it on (its applied offset, or the high watermark its fetches saw) found
more at the broker, and the worker has not moved it on STALL_S after that look. Its
readiness target rises to the look's answer (status shows the lag; caught up stays, a
latch), and its worker is told to fetch its partitions through a new consumer
(consumer/worker/loop.py, "refetch"), with one warning line. A partition that stalls again
unmoved is refetched after twice as long each time, up to REFETCH_MAX_S.
"""

from __future__ import annotations

import logging
import time

from shmcache.kafka import client as kafka_client
from shmcache.kafka.admin_poll import AdminLook
from shmcache.consumer.supervisor.worker_handle import WorkerState

log = logging.getLogger("shmcache.supervisor")

REFRESH_S = 1.0  # between two looks
SLOW_S = 1.0  # an up worker's heartbeat older than this (10 idle loops): its partitions are looked at
TIMEOUT_S = 10.0  # a look's request timeout; one unanswered for twice this is dropped
STALL_LOOK_S = 5.0  # between two looks that take in every assigned partition
# a partition its worker has not moved on this long after a look found more: stalled. Longer than
# librdkafka's longest reconnect backoff (reconnect.backoff.max.ms, 10 s), so a consumer
# reconnecting after the broker came back is not taken for a stuck one
STALL_S = 15.0
REFETCH_MAX_S = 300.0  # the longest wait before a partition stalled again, unmoved, is refetched again


class WatermarkWatch:
    def __init__(self, cfg, control):
        self.cfg = cfg
        self.control = control  # the cache's ControlArea (engine/control/area.py)
        self.look = AdminLook(cfg, TIMEOUT_S)  # {partition: future} while a look is out
        self.next = 0.0  # monotonic time of the next look
        self.restarted: dict[int, float] = {}  # partition -> monotonic time of its worker's restart
        self.next_all = 0.0  # monotonic time of the next look at every assigned partition
        # partition under a trusted worker -> (applied, latest watermark, monotonic time they were first seen so)
        self.moved: dict[int, tuple[int, int, float]] = {}
        self.behind: dict[int, tuple[float, int]] = {}  # partition -> (asked, answer) of a look that found more
        self.refetches: dict[int, int] = {}  # partition -> refetches since its worker last moved it on
        self.untrusted: set[int] = set()  # of the look out, the partitions asked for as untrusted or restarted

    def paused(self) -> None:
        """The workers applied nothing for a while, on purpose (an online resize held them): what
        was seen of their progress before says nothing of a stall now."""
        self.moved.clear()
        self.behind.clear()

    def restarting(self, parts) -> None:
        """A restarted worker is about to get these partitions back (before it is told)."""
        now = time.monotonic()
        rows = self.control.partition_rows
        for p in parts:
            rows.worker_restarting(p)
            self.restarted[p] = now
        self.next = 0.0  # look at once

    def tick(self, assigned: dict[int, int], workers: list, broker_down: bool) -> None:
        """The supervisor's loop, after its workers' checks: `assigned` is partition -> worker index."""
        now = time.monotonic()
        rows = self.control.partition_rows
        for p, i in assigned.items():
            if workers[i].state is WorkerState.BACKING_OFF:
                rows.worker_lost(p)  # applied up to the end no more
        for p in [p for p in self.restarted if p not in assigned]:
            del self.restarted[p]  # revoked: a new assignment sets its own target
        self._follow(assigned, workers, now, broker_down)
        if self.look.out:
            answers = self.look.answers()
            if answers is None:
                return
            self._answered(self.look.asked, answers, assigned, workers)
        if now < self.next or broker_down:
            return
        self.next = now + REFRESH_S
        watched = [p for p, i in assigned.items() if p in self.restarted or not self._trusted(workers[i])]
        self.untrusted = set(watched)  # what the answer may raise targets of; the others only stall looks
        if now >= self.next_all:
            self.next_all = now + STALL_LOOK_S
            watched = list(assigned)
        if watched:
            self.look.ask(lambda admin, timeout: self._list_offsets(admin, timeout, watched),
                          f"asking for the high watermarks of {watched} failed")

    def _follow(self, assigned: dict[int, int], workers: list, now: float, broker_down: bool) -> None:
        """Note when each partition under a trusted worker was last moved on; refetch those
        stalled (see the module's doc). While the broker is away nothing is stalled: nobody fetches."""
        rows = self.control.partition_rows
        stalled: dict[int, list[int]] = {}
        for p, i in assigned.items():
            if p in self.restarted or not self._trusted(workers[i]):
                self.moved.pop(p, None)
                self.behind.pop(p, None)
                continue
            seen = (rows.applied(p), rows.latest(p))
            was = self.moved.get(p)
            if was is None or was[:2] != seen or broker_down:
                self.moved[p] = (*seen, now)
                self.behind.pop(p, None)
                self.refetches.pop(p, None)
                continue
            look = self.behind.get(p)
            if look is not None and now - look[0] >= min(STALL_S * 2 ** self.refetches.get(p, 0), REFETCH_MAX_S):
                stalled.setdefault(i, []).append(p)
        for gone in [p for p in self.moved if p not in assigned]:
            self.moved.pop(gone)
            self.behind.pop(gone, None)
            self.refetches.pop(gone, None)
        for i, parts in stalled.items():
            ends = {}
            for p in parts:
                _, ends[p] = self.behind.pop(p)
                self.refetches[p] = self.refetches.get(p, 0) + 1
                if rows.caught_up(p):
                    rows.raise_target(p, ends[p])  # the lag shows; caught up stays (a latch)
            log.warning("partitions %s of worker %d fetched nothing for %.0f s while the broker held more (%s): its "
                        "Kafka consumer is stuck; the worker fetches them again through a new one", parts, i,
                        now - min(self.moved[p][2] for p in parts),
                        ", ".join(f"{p}: applied {rows.applied(p)}, the broker's end {ends[p]}" for p in parts))
            workers[i].tell(("refetch", parts))

    def _stall_look(self, p: int, hi: int, asked: float) -> None:
        """A look asked at `asked` found partition p's high watermark `hi`: more than its trusted
        worker had seen, if that worker has not moved it on since before the look."""
        was = self.moved.get(p)
        if was is not None and was[2] <= asked and hi > max(was[0], was[1]) and p not in self.behind:
            self.behind[p] = (asked, hi)

    @staticmethod
    def _trusted(w) -> bool:
        return w.state is WorkerState.UP and w.heartbeat_age() <= SLOW_S

    def _list_offsets(self, admin, timeout: float, parts: list[int]) -> dict:
        """Ask `admin` for the high watermarks of `parts`: {partition: future}."""
        from confluent_kafka import TopicPartition
        from confluent_kafka.admin import OffsetSpec

        futures = admin.list_offsets({TopicPartition(self.cfg.topic, p): OffsetSpec.latest() for p in parts},
                                     isolation_level=kafka_client.isolation_level(self.cfg), request_timeout=timeout)
        return {tp.partition: f for tp, f in futures.items()}

    def _answered(self, asked: float, futures: dict, assigned: dict[int, int], workers: list) -> None:
        """`futures`: the answered ones (AdminLook.answers) of a look asked at `asked` (monotonic)."""
        rows = self.control.partition_rows
        for p, fut in futures.items():
            hi = -1
            with self.look.failing(f"high watermark of partition {p}"):
                hi = fut.result(timeout=0).offset
            if hi < 0:  # failed, or librdkafka's answer to a ListOffsets that timed out (-1001): as unanswered
                self.look.drop()
                continue
            if p not in assigned:
                continue
            w = workers[assigned[p]]
            self._stall_look(p, hi, asked)
            if p not in self.untrusted:
                continue  # a stall look's: the target of a partition under a trusted worker is its assignment's
            since = self.restarted.get(p)
            if since is not None and asked < since:
                continue  # asked before the restart: no target for the new worker
            if since is None and not rows.caught_up(p) and w.state is WorkerState.UP:
                continue  # catching up under a live worker: its assignment's target stays
            rows.raise_target(p, hi)
            if since is None or w.state is not WorkerState.UP:
                continue
            if rows.confirm_caught_up(p):
                log.info("partition %d caught up again at offset %d after its worker's restart", p, rows.applied(p))
            if rows.caught_up(p):
                del self.restarted[p]
