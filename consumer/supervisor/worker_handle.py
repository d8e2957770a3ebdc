"""The supervisor's handle on one worker process: its states, its restart backoff
(consumer/supervisor/backoff.py), its stale-heartbeat kill and the requests and stops sent to it.

States (published in the segment, so `status()` and `shmcache top` show them):

    stopped --start()--> starting --row claimed--> up --ask_stop()--> stopping --> stopped
                            |                        |
                            +------- it died --------+--> backing-off --restart due--> starting
                            |                        |
       not up in time ------+                        +------ stale heartbeat
       (worker_start_timeout)   (each killed with SIGKILL, then as a death)

A worker that is up beats (K_HEARTBEAT) once per loop: every 0.1 s when idle, after every
batch when busy. One whose heartbeat is older than `worker_heartbeat_timeout` is hung or
stopped: it is killed by pid (SIGKILL) and goes the way of a death, through the backoff,
and counted (H_STALE_KILLS). The clock starts when the supervisor sees it up, after its
kernels are loaded, so a slow start is never taken for a hang. A start has its own bound:
a worker still starting (forked, its row not claimed: it has not opened the cache or loaded
its kernels) `worker_start_timeout` after it was forked is hung or stopped before it came
up, and is killed the same way (H_START_KILLS); otherwise it would stay "starting" for ever,
its partitions not ready and nothing restarting it.

A worker that dies is restarted after a backoff that doubles with each death in a
row (consumer/supervisor/backoff.py).

Each (re)start gets a new pipe, so replies from an old instance can never be
mistaken for the new one's. What a restart does to the worker's partitions
(repair, re-assign) is the supervisor's policy (consumer/supervisor/policy.py).

A stop (stop_all) has one deadline for every worker: each is asked first, then all
are waited for until `timeout` from the ask, and those left then are killed, all at once.
A worker is followed by its owner word (the process itself), not by multiprocessing's
word for it, which comes from the fork server: a frozen one never reports an exit, and
the stop then ends the process without the interpreter's exit, which would join the
worker for ever. Nor does a frozen fork server fork: a start waits worker_start_timeout
for the new pid at most (consumer/worker/forkserver.py start_within), then kills it and fails,
and the next start comes from a fresh one.
"""

from __future__ import annotations

import enum
import logging
import multiprocessing.connection
import os
import signal
import time

import psutil

from shmcache.consumer.worker import forkserver
from shmcache.consumer.supervisor.backoff import RestartBackoff
from shmcache.consumer.worker import loop as worker_mod
from shmcache.engine.control import layout as C
from shmcache.ipc import liveness

log = logging.getLogger("shmcache.supervisor")

class WorkerState(enum.Enum):
    STOPPED = "stopped"
    STARTING = "starting"  # forked, not yet claimed its row (the cache, the Kafka client)
    UP = "up"
    STOPPING = "stopping"
    BACKING_OFF = "backing-off"  # died; restarted at `restart_at`


class WorkerHandle:
    """One worker process: started, commanded and stopped by the supervisor.

    Each (re)start gets a new pipe, so replies from an old instance can never be
    mistaken for the new one's."""

    def __init__(self, sup: "Supervisor", index: int):  # noqa: F821 - any object with .cfg and .cache
        self.sup = sup
        self.index = index
        self.proc = None
        self.conn = None
        self.partitions: set[int] = set()
        self.state = WorkerState.STOPPED
        self.backoff = RestartBackoff()  # on the supervisor's monotonic clock
        self.restart_at_ns = 0  # the restart due as time.time_ns(), for status
        self.word = 0  # the running process's owner word (pid and start time; ipc/liveness.py)
        self.killed_stray = False  # alive() killed it after its fork server died
        self.up_ns = 0  # time.monotonic_ns() the supervisor saw the current instance up (its heartbeat's floor)
        self.killed_for = ""  # why the supervisor killed the current instance (stale, unanswered revoke), if it did
        self.started_at = 0.0  # time.monotonic() the current instance was forked (its start's bound counts from it)

    @property
    def failures(self) -> int:
        """Deaths in a row (see RestartBackoff)."""
        return self.backoff.failures

    def _publish(self) -> None:
        if self.sup.cache is None:  # the supervisor stops before it opened its cache
            return
        self.sup.cache.control.set_worker_handle(
            self.index, self.state.value, self.failures,
            self.restart_at_ns if self.state is WorkerState.BACKING_OFF else 0)

    def start(self, waiting=lambda: False) -> None:
        """Fork the worker from the fork server, waiting for it if it is still importing, for
        worker_start_timeout at most; waiting() is called meanwhile (the supervisor beats) and
        gives the wait up by returning True (a stop asked for). A fork server that forks
        nothing by then is hung or stopped, and is killed (consumer/worker/forkserver.py
        start_within): the start has failed, and check() takes it for a death (the backoff,
        then a start from a fresh fork server)."""
        ctx = forkserver.context()
        self.conn, child = ctx.Pipe()
        cfg = self.sup.cfg.to_dict()
        cfg["_log_level"] = logging.getLogger().level or logging.INFO
        proc = ctx.Process(target=worker_mod.main, args=(cfg, self.index, child), name=f"shmcache-worker-{self.index}")
        bound = self.sup.cfg.worker_start_timeout
        t0 = time.monotonic()
        forked = forkserver.start_within(proc, bound, waiting)
        took = time.monotonic() - t0
        child.close()
        self.proc = proc if forked else None
        self.killed_stray = False
        if forked:
            self.killed_for = ""
        elif took < bound:  # waiting() gave the wait up: a stop was asked for
            self.killed_for = (f"was not forked: its start was given up after {took:.1f} s for a stop, its fork "
                               f"server (forking nothing yet) killed")
        else:
            self.killed_for = (f"was not forked: its fork server forked nothing within {bound:g} s "
                               f"(worker_start_timeout: hung or stopped) and was killed")
        self.started_at = time.monotonic()
        try:
            self.word = liveness.owner_word(proc.pid) if forked else 0
        except psutil.Error:  # gone already: check() sees it and the backoff applies
            self.word = 0
        self.sup.cache.control.worker_row(self.index).count_start()
        self.state = WorkerState.STARTING
        self._publish()
        if forked:
            log.info("worker %d started, pid %d", self.index, self.proc.pid)
        else:
            log.error("worker %d %s", self.index, self.killed_for)

    def _runs(self) -> bool:
        """The process runs, as its owner word says: that names the process itself, and a zombie
        is gone (killed, it never writes again). multiprocessing learns of an exit only from the
        fork server, which never tells while it is frozen and says "gone" for every worker once
        it died; without a word (the process was gone before it could be read) it is asked."""
        if self.proc is None:
            return False
        return liveness.is_alive(self.word) if self.word else self.proc.is_alive()

    def _kill(self) -> None:
        """SIGKILL, by pid, if the owner word still names a live process (pids are reused);
        without a word (the process was gone before it could be read), if multiprocessing
        says it runs."""
        if self.word and not liveness.is_alive(self.word):
            return
        if self.word or self.proc.is_alive():
            try:
                os.kill(self.proc.pid, signal.SIGKILL)
            except OSError:
                pass

    def alive(self) -> bool:
        """The process runs, as its owner word says (see _runs): multiprocessing learns of a
        worker's exit from the fork server, which reports none while it is frozen (a worker
        that died then is dead all the same), and reports each of its workers gone when it
        died (killed by hand) while they still run. One still running then is killed, so that
        no restart ever runs beside it (two writers on a partition could apply it out of order)."""
        if not self._runs():
            return False
        if self.proc.is_alive():
            return True
        if not self.killed_stray:
            log.warning("worker %d (pid %d) is still running but its fork server is gone; killing it",
                        self.index, self.proc.pid)
            self.killed_stray = True
        self._kill()
        return True  # until it is gone

    def heartbeat_age(self) -> float:
        """Seconds since the up worker's last heartbeat (or since it was seen up, if later)."""
        beat = int(self.sup.cache.control.workers[self.index, C.K_HEARTBEAT])
        return (time.monotonic_ns() - max(beat, self.up_ns)) / 1e9  # the age clock (C.H_AGE_CLOCK)

    def _check_heartbeat(self) -> None:
        """An up worker whose heartbeat is older than the bound is hung or stopped: kill it
        (by pid), and let check() see it die. Its partitions are not caught up from the moment
        the bound passed (engine/control/status.py reads the same words)."""
        age = self.heartbeat_age()
        if age > self.sup.cfg.worker_heartbeat_timeout:
            self._kill_hung("stale_worker_kills", f"was stale (no heartbeat for {age:.1f} s, worker_heartbeat_timeout "
                                             f"{self.sup.cfg.worker_heartbeat_timeout:g} s: hung or stopped)")

    def _check_start(self) -> None:
        """A worker that has not claimed its row `worker_start_timeout` after it was forked is
        hung or stopped before it came up: kill it (by pid), and let check() see it die."""
        bound = self.sup.cfg.worker_start_timeout
        if time.monotonic() - self.started_at > bound:
            self._kill_hung("start_timeout_kills", f"did not come up within {bound:g} s (worker_start_timeout: hung or "
                                             f"stopped before it opened the cache and loaded its kernels)")

    def _kill_hung(self, counter: str, why: str) -> None:
        """Kill the running instance (by pid), said and counted once; check() then sees it die."""
        if not self.alive():
            return
        if not self.killed_for:
            self.killed_for = why
            self.sup.cache.control.count(counter)
        self._kill()
        self.proc.join(1.0)  # SIGKILL is delivered at once, even to a stopped process

    def check(self, now: float) -> bool:
        """Follow the process (called every supervisor tick); True when a restart is due now."""
        if self.state is WorkerState.STARTING and self.alive():
            owner = int(self.sup.cache.control.workers[self.index, C.K_OWNER])
            if owner and liveness.word_pid(owner) == self.proc.pid:
                self.state = WorkerState.UP
                self.up_ns = time.monotonic_ns()
                self.backoff.up(now)
                self._publish()
            else:
                self._check_start()
        if self.state is WorkerState.UP:
            self._check_heartbeat()
        if self.state is WorkerState.UP and self.backoff.settle(now):
            self._publish()  # it stayed up: the next death is a first one again
        if self.state in (WorkerState.STARTING, WorkerState.UP) and not self.alive():
            self._died(now)
        return self.state is WorkerState.BACKING_OFF and self.backoff.due(now)

    def _died(self, now: float) -> None:
        code = self.proc.exitcode if self.proc is not None else None
        wait = self.backoff.died(now)
        self.state = WorkerState.BACKING_OFF
        self.restart_at_ns = time.time_ns() + int(wait * 1e9)
        self._publish()
        how = (self.killed_for if self.proc is None
               else f"{self.killed_for} and was killed with SIGKILL" if self.killed_for
               else f"died with exit code {code}" if code is not None
               else "died (its fork server did not report how)")
        log.warning("worker %d (pid %s) %s; restarting in %.1f s (%d deaths in a row)",
                    self.index, self.proc.pid if self.proc is not None else "?", how, wait, self.failures)
        if self.conn is not None:
            self.conn.close()

    def tell(self, cmd: tuple) -> bool:
        """Send a command that has no reply (an assignment), without waiting: the worker reads
        its pipe in order, between batches, so whatever is sent after it (a revoke, a stop)
        finds it done. A worker still starting reads it once it is up; one that died, or is
        killed before it reads it, takes it nowhere: its restart is told again (the
        supervisor's re-assignment). False if the pipe is gone (it died)."""
        return self._send(cmd)

    def _send(self, cmd: tuple) -> bool:
        try:
            self.conn.send(cmd)
            return True
        except (OSError, EOFError):  # its pipe is gone: it died
            return False

    def _reply(self, reply: str):
        """The reply waiting in the pipe, if there is one: (True, payload); (True, None) if the
        worker is gone; (False, None) if it has not answered yet."""
        try:
            while self.conn.poll(0):
                kind, payload = self.conn.recv()
                if kind == reply:
                    return True, payload
        except (OSError, EOFError):
            return True, None
        return (False, None) if self.alive() else (True, None)

    def kill_unanswered(self, what: str, timeout: float) -> None:
        """A worker that did not answer a revoke within `timeout` while alive is hung or stopped:
        kill it now (SIGKILL, by pid), before its partitions go anywhere else. Resumed later, it
        would go on applying partitions that are no longer its own, out of order with their
        next owner's writes. check() then sees it die and restarts it with what it still holds."""
        if self.proc is None or not self.alive():
            return
        self.killed_for = f"did not answer {what} within {timeout:g} s (drain_timeout): hung or stopped"
        self._kill()
        self.proc.join(1.0)  # SIGKILL is delivered at once, even to a stopped process

    def stop(self, reason: str, timeout: float) -> bool:
        """Stop this worker alone: stop_all of one."""
        return stop_all([self], reason, timeout)

    def ask_stop(self, reason: str) -> None:
        """The first half of a stop (see stop_all): ask the worker to stop fetching and exit;
        it finishes its batch, reports what it applied and exits."""
        self.state = WorkerState.STOPPING if self.proc is not None else WorkerState.STOPPED
        self._publish()
        if self.proc is None:
            return
        log.info("stopping worker %d (pid %d): %s", self.index, self.proc.pid, reason)
        if self.alive():
            try:
                self.conn.send(("stop",))
            except OSError:  # its pipe is gone: it died
                pass

    def await_stop(self, deadline: float, timeout: float) -> None:
        """The second half: wait for the process to exit until `deadline` (monotonic); one still
        running then is killed (SIGKILL, by pid), and gone() waits for it."""
        if self.proc is None:
            return
        while self._runs() and time.monotonic() < deadline:
            self.proc.join(min(0.05, max(0.0, deadline - time.monotonic())))
            if not self.proc.is_alive():
                time.sleep(0.05)  # multiprocessing says gone (its fork server died): follow the process
        if self._runs():
            log.warning("worker %d (pid %d) did not stop within %g s (drain_timeout): hung or stopped; killing it "
                        "(SIGKILL)", self.index, self.proc.pid, timeout)
            self._kill()

    def gone(self, end: float) -> None:
        """Wait until `end` (monotonic) for the process to be gone (SIGKILL again meanwhile, by
        pid): one killed in uninterruptible sleep goes when it wakes."""
        while self._runs() and time.monotonic() < end:
            self._kill()
            self.proc.join(0.1)

    def let_go(self, end: float) -> bool:
        """Forget the process, waiting until `end` for its fork server to report its exit.
        False if it never did (a frozen fork server; or the process still runs): multiprocessing
        still counts it among its children, and the interpreter's exit would join it for ever."""
        if self.proc is None:
            return True
        self.proc.join(max(0.0, end - time.monotonic()))
        reported = not self.proc.is_alive()
        if not reported:
            log.warning("worker %d (pid %d): its fork server did not report its exit within %g s%s", self.index,
                        self.proc.pid, REPORT_WAIT_S, "" if self._runs() else " (it is gone: the fork server is hung)")
        self.conn.close()
        self.proc = None
        self.state = WorkerState.STOPPED
        self._publish()
        return reported


KILL_WAIT_S = 5.0  # for the kernel to take down the workers a stop killed (SIGKILL), all together
REPORT_WAIT_S = 1.0  # for the fork server to report the exits of the workers a stop saw go, all together


def stop_all(handles: list[WorkerHandle], reason: str, timeout: float) -> bool:
    """Stop every worker against one deadline, `timeout` seconds from now: all are asked
    first, so they drain at once, then waited for; whoever is left at the deadline is
    killed, all of them at once, and waited for together (KILL_WAIT_S at most, then
    REPORT_WAIT_S for their fork server to report it). A stop so takes at most `timeout`
    + a few seconds, whatever the count of workers or how many of them hang.
    Returns False if a worker's exit was never reported (a frozen fork server): the
    process must then end without the interpreter's exit (which joins every child
    multiprocessing believes alive)."""
    deadline = time.monotonic() + timeout
    for h in handles:
        h.ask_stop(reason)
    for h in handles:
        h.await_stop(deadline, timeout)
    end = time.monotonic() + KILL_WAIT_S
    for h in handles:
        h.gone(end)
    end = time.monotonic() + REPORT_WAIT_S
    return all([h.let_go(end) for h in handles])  # a list: every handle is let go


def request_all(requests: list[tuple[WorkerHandle, tuple]], reply: str, timeout: float) -> list:
    """Send each worker its command, then wait for every reply against one deadline,
    `timeout` seconds from now (so hung workers cost one timeout, not one each). The replies'
    payloads in order; None for a worker that died or did not answer."""
    deadline = time.monotonic() + timeout
    out: list = [None] * len(requests)
    waiting = [i for i, (h, cmd) in enumerate(requests) if h._send(cmd)]
    while waiting:
        for i in list(waiting):
            done, out[i] = requests[i][0]._reply(reply)
            if done:
                waiting.remove(i)
        if not waiting or time.monotonic() >= deadline:
            break
        multiprocessing.connection.wait([requests[i][0].conn for i in waiting],
                                        min(0.05, max(0.0, deadline - time.monotonic())))
    for i in waiting:
        log.warning("worker %d did not answer %r within %.0f s", requests[i][0].index, requests[i][1][0], timeout)
    return out
