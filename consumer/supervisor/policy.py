"""The supervisor daemon (`shmcache run`): this node's only member of the consumer group.

It owns the segment and the group membership; workers (consumer/worker/loop.py) own
the fetching and applying. Its consumer never delivers data: every partition it
is assigned is paused at once (and again after every rebalance, since a
partition that moves loses its pause state), and its poll() serves rebalance
callbacks and heartbeats only.

Where an assigned partition starts, and how a revoked one is drained, is
consumer/supervisor/rebalance.py. What may be committed, and when (DESIGN invariant 1):
only applied offsets published by workers in the segment; periodically, after a
revoke drained the affected workers, and at shutdown after every worker
stopped. Nothing on lost.

The broker may go away while it runs: it then keeps serving status ("waiting
for the broker", kafka/broker.py), retries with backoff, holds its commits,
and carries on where it was when the broker answers (workers keep their
partitions; librdkafka reconnects them). `broker_wait` bounds the wait: past it,
BrokerUnavailableError. Start-up (opening the cache, the wait for a killed
supervisor's workers, the segment's identity, the wait for the broker and the
topic, removing a cache a failed start created) and the broker probes are
consumer/supervisor/startup.py.

Each worker process is driven through a handle (consumer/supervisor/worker_handle.py) with
explicit states (starting, up, stopping, stopped, backing-off), the restart
backoff and the kill of a worker whose heartbeat is stale; this module is the
policy: group membership, rebalances, commits, and what a restart does to a
worker's partitions (consumer/supervisor/watermarks.py: not caught up until applied again up
to a high watermark the supervisor asked the broker for). A stop asks every worker
at once and waits for all of them against one deadline (drain_timeout); the whole
stop (the drain, the final commit, leaving the group, closing the consumer, the
snapshot) has one budget, stop_timeout, each phase given what is left
(consumer/supervisor/stop.py); a periodic snapshot being written gives up as the stop begins
(consumer/supervisor/snapshot_policy.py stopping).

What it publishes besides: its commits, commit failures, rebalances and lost
partitions in header words (engine/control/area.py SUPERVISOR_COUNTERS), and with
`metrics_port` a Prometheus endpoint (consumer/supervisor/metrics.py) that reads all of
the segment's counters at scrape time.
"""

from __future__ import annotations

import enum
import logging
import os
import signal
import time

from shmcache.kafka import client as kafka_client
from shmcache.kafka import broker as broker_mod
from shmcache.consumer.supervisor import commits as commits_mod
from shmcache.consumer.worker import forkserver
from shmcache.consumer.supervisor import snapshot_dir, snapshot_policy
from shmcache.consumer.supervisor import startup
from shmcache.consumer.supervisor import stop as stop_mod
from shmcache.consumer.config import RunConfig
from shmcache.consumer.supervisor.rebalance import Assignment
from shmcache.consumer.supervisor.resizing import Resizer
from shmcache.consumer.supervisor.watermarks import WatermarkWatch
from shmcache.consumer.supervisor.worker_handle import WorkerHandle, stop_all
from shmcache.engine import layout as L
from shmcache.errors import ShmcacheError
from shmcache.ipc import heap

log = logging.getLogger("shmcache.supervisor")

SEGMENT_CHECK_S = 1.0  # how often the supervisor checks that /dev/shm/NAME is still its segment


class State(enum.Enum):
    INIT = "init"
    RUNNING = "running"
    STOPPING = "stopping"
    STOPPED = "stopped"


class Supervisor:
    def __init__(self, cfg: RunConfig, snapshot_dir_fd: int | None = None):
        self.cfg = cfg
        self._snapshot_dir_fd = snapshot_dir_fd  # snapshot_dir.check_dir's, made at the start
        self.state = State.INIT
        self.cache = None
        self.consumer = None
        self.workers: list[WorkerHandle] = []
        self.assignment = None  # consumer/supervisor/rebalance.py Assignment: the partitions held, the rebalance callbacks
        self.metrics = None  # the Prometheus endpoint, when metrics_port is set
        self.broker = None  # broker_mod.BrokerWatch, once the cache is open
        self._stop_reason = ""
        self._exit_code = 0
        self._fatal = False  # the consumer hit a fatal error: it can neither commit nor leave
        self.segment_id = None  # (st_dev, st_ino) of /dev/shm/NAME when this supervisor opened it
        self._last_segment_check = 0.0
        self.commits = None  # consumer/supervisor/commits.py Committer, once the cache is open
        # the interpreter's exit could wait without a bound: librdkafka's close did not return in
        # time (consumer/supervisor/stop.py close_consumer), or a worker's fork server never reported its
        # exit (worker_handle.stop_all); run() then ends the process with os._exit
        self.exit_at_once = False
        self.group_watch = None
        self.watermarks = None  # consumer/supervisor/watermarks.py WatermarkWatch, once the cache is open
        self.snapshots = None  # snapshot_policy.SnapshotPolicy, made in run()
        self.resizer = Resizer(self)  # an online resize, when `shmcache resize` asks for one

    # -- lifecycle ----------------------------------------------------------------------------

    def request_stop(self, reason: str, code: int = 0) -> None:
        if not self._stop_reason:
            (log.error if code else log.info)("stop requested: %s", reason)
            self._stop_reason = reason
            self._exit_code = code

    def run(self) -> int:
        """Run until SIGTERM, SIGINT or SIGHUP (each a clean stop); returns the exit code."""
        assert self.state is State.INIT, self.state
        # SIGHUP too: a terminal closing under a run in its foreground would otherwise kill it
        # outright, no final commit; its workers and fork server ignore it, as they do Ctrl-C
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(sig, lambda s, f: self.request_stop(signal.Signals(s).name))
        from shmcache.engine import table

        # the workers' fork server imports while the cache opens and the broker answers
        forkserver.prestart()
        self.workers = [WorkerHandle(self, i) for i in range(self.cfg.workers)]
        created = None
        joined = False
        try:
            existed = table.exists(self.cfg.name)
            self.snapshots = snapshot_policy.SnapshotPolicy(self.cfg, self._snapshot_dir_fd)
            restored = None if existed else self.snapshots.restore_at_start()
            self.cache, self.segment_id = startup.open_cache(self.cfg)
            self.snapshots.opened(self.cache, restored is not None)
            self.cache.control.set_memory_max(self.cfg.memory_max_bytes)  # its ceiling, for status and the metrics
            # this run made the cache (its restore, or the create itself; never a look beforehand,
            # which races with another creator): a start that fails removes it
            created = self.cache.creation_id if restored is not None or self.cache.created else None
            self.metrics = startup.serve_metrics(self.cfg, self.cache.control)
            joined = self._start()
            self.state = State.RUNNING
            while not self._stop_reason:
                msg = self.consumer.poll(0.1)  # paused: serves callbacks only (a stray message is dropped)
                if msg is not None and msg.error() is not None and msg.error().fatal():
                    # e.g. FENCED_INSTANCE_ID: another consumer joined with this group.instance.id
                    self._fatal = True
                    self.request_stop(f"fatal Kafka error: {msg.error()}; another supervisor with instance id "
                                      f"{self.cfg.instance_id!r} in group {self.cfg.group!r}?", code=1)
                    break
                startup.check_broker(self.cfg, self.consumer, self.broker)
                self._tick()
            return self._exit_code
        finally:
            removing = not joined and created is not None  # this run's cache, never filled: not kept
            self._shutdown(removing)
            if removing:
                startup.remove_created(self.cfg.name, created)

    def _check_segment(self) -> None:
        """Stop (exit 1) if /dev/shm/NAME was unlinked or now names another file: filling a
        segment nobody can attach any more would be a silent data gap."""
        from shmcache.ipc.segment import identity, path_of

        path = path_of(self.cfg.name)
        now = identity(self.cfg.name)
        if now == self.segment_id:
            return
        what = "was removed (unlinked)" if now is None else "was replaced by another file"
        log.error("cache %r: %s %s while this supervisor filled it; readers can no longer attach to what it "
                  "writes. Stopping the workers and exiting", self.cfg.name, path, what)
        self.request_stop(f"segment {path} {what}", code=1)

    def _start(self) -> bool:
        """Wait for the broker, check the topic, start the workers, join the group.

        False if a stop was asked for while waiting (nothing was started)."""
        from confluent_kafka import Consumer, KafkaException

        from shmcache.consumer import warm

        cfg = self.cfg
        self.broker = broker_mod.BrokerWatch(self.cache.control, cfg.bootstrap, cfg.broker_wait)
        self.commits = commits_mod.Committer(self.cache.control, cfg.topic, self.broker)
        self.watermarks = WatermarkWatch(cfg, self.cache.control)
        self.assignment = Assignment(cfg, self.cache, self.workers, self.commits, self.broker,
                                     stopping=lambda: self.state is State.STOPPING, rebalanced=self._rebalanced)
        try:
            self.consumer = Consumer(cfg.consumer_settings(**cfg.group_settings(), on_commit=self.commits.on_commit,
                                                           **kafka_client.client_settings(self.broker.on_error)))
        except (KafkaException, TypeError) as e:  # librdkafka refused a setting of the [kafka] table or --set
            raise ValueError(f"cache {cfg.name!r}: a librdkafka setting was refused: "
                             f"{kafka_client.error_text(e)}") from None
        self.commits.consumer = self.consumer
        # compile every kernel once, while the broker answers, unless this install is warm already
        # (after everything that can refuse the run at once: a refusal leaves no warm-up running)
        warming = None if warm.is_warm() else warm.start()
        if self.cache.created and not self.cache.control.topic:  # this run's cache: its topic while waiting
            self.cache.control.set_topic(cfg.topic, 0)
        try:
            tmeta = startup.topic_metadata(cfg, self.cache.control, self.consumer, self.broker,
                                           lambda: self._stop_reason)
        except BaseException:
            if warming is not None:
                warm.finish(warming, self._beat, lambda: True)  # stopped, by pid
            raise
        # the workers start with the kernels in numba's cache, so each loads them, none compiles
        log.info("%s", "kernels warm for this install (shmcache warm ran): workers start at once" if warming is None
                 else warm.finish(warming, self._beat, lambda: self._stop_reason or tmeta is None))
        if tmeta is None:
            return False
        startup.adopt_topic(cfg, self.cache)  # the topic exists: now, and only now, the cache's
        npart = len(tmeta.partitions)
        if npart > L.MAX_PARTITIONS:
            raise ShmcacheError(f"cache {cfg.name!r}: topic {cfg.topic!r} has {npart} partitions; "
                                f"at most {L.MAX_PARTITIONS} are supported")
        self.cache.control.set_topic(cfg.topic, npart)
        for w in self.workers:
            w.start(self._forking)
        self.consumer.subscribe([cfg.topic], on_assign=self.assignment.on_assign,
                                on_revoke=self.assignment.on_revoke, on_lost=self.assignment.on_lost)
        log.info("joined group %r for topic %r (%d partitions, %s assignment), %d workers",
                 cfg.group, cfg.topic, npart, cfg.assignment, cfg.workers)
        return True

    def _beat(self) -> None:
        self.cache.control.beat()

    def _forking(self) -> bool:
        """While a worker's fork is awaited (the fork server may still be importing): beat, and
        give the wait up (True) once a stop is asked for."""
        self._beat()
        return bool(self._stop_reason)

    def _rebalanced(self) -> None:
        if self.group_watch is not None:
            self.group_watch.soon()

    def _shutdown(self, removing: bool = False) -> None:
        """Stop everything; `removing`: the cache goes after this (startup.remove_created)."""
        if self.state is State.STOPPED:
            return
        clean = self.state is State.RUNNING and not self._exit_code and not self._fatal
        self.state = State.STOPPING
        reason = self._stop_reason or "error"
        budget = stop_mod.StopBudget(self.cfg.stop_timeout)  # one for the whole stop (consumer/supervisor/stop.py)
        if self.snapshots is not None:  # a periodic snapshot gives up now, not after the drain (it may take minutes)
            self.snapshots.stopping()
        # every worker stops fetching and exits (killed if not by the one deadline); then the final commit
        if not stop_all(self.workers, reason, budget.drain(self.cfg.drain_timeout)):
            self.exit_at_once = True
        if self.consumer is not None:
            if not self._fatal:  # bounded: the broker may be gone
                self.commits.at_stop(list(self.assignment.assigned), self._beat, budget.commit())
            self._leave(budget.leave())
            # on_revoke sees STOPPING: the final commit is made
            if not stop_mod.close_consumer(self.consumer, budget.close()):
                self.exit_at_once = True
        if self.metrics is not None:  # before the cache closes: a scrape reads it
            self.metrics.close()
        self.resizer.close()  # the segment a resize replaced, if still kept
        if self.cache is not None:
            if clean and self.cfg.snapshot_dir and not budget.left():
                log.warning("no snapshot at this stop: its budget (stop_timeout %g s) is spent; the previous "
                            "snapshots stay", self.cfg.stop_timeout)
                clean = False
            # a clean stop: workers drained, offsets final. False: the periodic snapshot's thread
            # still reads the cache, which stays mapped until the process exits
            closable = self.snapshots.at_stop(clean, budget.snapshot())
            self.cache.control.set_metrics_port(0)
            self.cache.control.release_supervisor()
            if self.assignment is not None:
                self.assignment.clear_rows()
            if closable:
                self.cache.close()
            log.info("stopped (%s)%s", reason, "" if removing else "; the cache stays in /dev/shm for readers")
        self.state = State.STOPPED

    def _fenced(self, reason: str) -> None:
        self._fatal = True
        self.request_stop(f"fatal: {reason}", code=1)

    def _leave(self, wait: float) -> None:
        """A clean stop leaves the group, static member or not: librdkafka's close() does not
        send a static member's LeaveGroup, which would leave its partitions with nobody for
        the whole session timeout while another member waits for them. An unsubscribe does.
        `wait`: what the stop's budget leaves for it (consumer/supervisor/stop.py); none, it is skipped."""
        if not self.cfg.static or self._fatal:
            return
        if wait <= 0:
            log.warning("not leaving group %r: the stop's budget (stop_timeout %g s) is spent; the group drops "
                        "this member after its session timeout", self.cfg.group, self.cfg.stop_timeout)
            return
        try:
            self.consumer.unsubscribe()
            deadline = time.monotonic() + wait
            while self.assignment.assigned and time.monotonic() < deadline:
                self.consumer.poll(0.1)  # serves the revoke callback (commit of what was applied)
        except Exception as e:  # noqa: BLE001 - close() follows either way
            log.warning("leaving group %r: %s", self.cfg.group, e)

    # -- periodic work ------------------------------------------------------------------------------

    def _tick(self) -> None:
        now = time.monotonic()
        self.cache.control.beat()
        if now - self._last_segment_check >= SEGMENT_CHECK_S:
            self._last_segment_check = now
            self._check_segment()
            if self._stop_reason:
                return
        for w in self.workers:
            if w.check(now):  # it died (or was killed, stale) and its backoff (consumer/supervisor/worker_handle.py) is over
                self._restart(w)
        self.assignment.retry(self.consumer)  # partitions whose start the broker did not say yet
        self.watermarks.tick(self.assignment.assigned, self.workers, self.broker.down)
        self.commits.tick(now, list(self.assignment.assigned), self.cfg.commit_interval)
        if self.group_watch is None:
            from shmcache.consumer.supervisor.group import GroupWatch

            self.group_watch = GroupWatch(self.cfg, self.cache, self.consumer, on_fenced=self._fenced)
        if not self.broker.down:  # their looks would only time out
            self.group_watch.tick()
            self.assignment.watch_topic()
        self.snapshots.tick(lambda: self.cache.control.status()["caught_up"])
        self.resizer.tick()

    def _restart(self, w: WorkerHandle) -> None:
        """A worker died: repair what it left locked, start a new one from its applied offsets."""
        log.info("restarting worker %d", w.index)
        repaired = self.cache.repair_dead_locks()
        if repaired:
            log.warning("repaired %d buckets the dead worker left locked", repaired)
        w.start(self._forking)
        self.watermarks.restarting(w.partitions)  # not caught up until applied up to a look from now on
        self.assignment.reassign(w)


def run(cfg: RunConfig) -> int:
    # before anything starts: a ValueError naming it (exit 2 at the CLI); used by its descriptor from here on
    snapshot_dir_fd = snapshot_dir.check_dir(cfg.snapshot_dir)
    logging.basicConfig(level=logging.INFO,
                        format="%(asctime)s %(levelname)s %(name)s[%(process)d]: %(message)s")
    log.info("shmcache supervisor pid %d", os.getpid())
    heap.limit_arenas()  # before librdkafka's threads: two arenas between them (ipc/heap.py)
    sup = Supervisor(cfg, snapshot_dir_fd)
    code = 1
    try:
        code = sup.run()
    except BaseException as e:
        if not sup.exit_at_once:
            raise
        code = stop_mod.error_exit_code(e)  # said as the command line would: it never sees it
    finally:
        # the interpreter's exit could wait for librdkafka's handle or join a worker for ever:
        # everything else is shut. Also when an error ended the run (BrokerUnavailableError
        # past broker_wait), or it would reach the interpreter's exit first
        if sup.exit_at_once:
            stop_mod.exit_now(code)
    return code
