"""A worker whose write waits for a bucket lock that a live process holds (engine/writer.py
on_wait): a stopped `shmcache set`, a writer of the application's under a debugger, a
frozen cgroup.

Such a lock is never taken (its holder may go on writing the bucket), so the worker
waits for it. It is not hung: it beats (its heartbeat word) at each look, so the supervisor does
not kill it as stale. Killing it would not help either: its successor would wait for the
same lock, and the supervisor would kill that one too, over and over, saying only that
it "was stale". Meanwhile the batch's partitions are not applied further, so their lag
shows and the cache is not ready. One warning names the holder after WARN_S, then one
every REPEAT_S while the wait lasts: what an operator needs to stop or kill it.

A worker whose supervisor is gone stops waiting and exits, as its loop would.
"""

from __future__ import annotations

import logging
import os

import psutil

from shmcache.ipc import liveness

log = logging.getLogger("shmcache.worker")

WARN_S = 1.0  # a wait this long is reported
REPEAT_S = 30.0  # and again every this long while it lasts


def describe(word: int) -> str:
    """`pid 123 (name, status)` for a log line, as far as the live process that owner word
    `word` names can be seen; `pid 1 of another PID namespace` for one this process's /proc
    does not show (engine/owners.py)."""
    pid = liveness.word_pid(word)
    if not liveness.is_alive(word):
        return f"pid {pid} of another PID namespace"
    try:
        p = psutil.Process(pid)
        with p.oneshot():
            return f"pid {pid} ({p.name()}, {p.status()})"
    except psutil.Error:
        return f"pid {pid}"


class LockWait:
    """The worker's on_wait hook (engine/writer.py)."""

    def __init__(self, index: int, row, parent: int):
        self.index = index
        self.row = row  # the worker's row (engine/control/rows.py WorkerRow)
        self.parent = parent  # the fork server's pid: gone with the supervisor
        self.last = 0.0  # the wait's length at the last look: a shorter one is a new wait
        self.report_at = WARN_S

    def __call__(self, bucket: int, holder: int, waited: float) -> None:
        self.row.beat()  # alive: waiting, not hung
        if waited < self.last:
            self.report_at = WARN_S
        self.last = waited
        if os.getppid() != self.parent:
            log.warning("worker %d: its supervisor is gone while it waited for bucket %d's lock; exiting",
                        self.index, bucket)
            raise SystemExit(0)
        if waited < self.report_at:
            return
        self.report_at = waited + REPEAT_S
        log.warning("worker %d: bucket %d's lock has been held for %.0f s by %s, a live process: waiting for it "
                    "(a live writer's lock is never taken; stop or kill that process to go on); this worker "
                    "applies nothing meanwhile", self.index, bucket, waited, describe(holder))
