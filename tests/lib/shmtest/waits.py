"""Waiting helpers of the end-to-end pipeline tests (real broker, real `shmcache run`
processes): poll a condition until it holds, processes until they are gone or stopped,
a cache's applied offsets until they reach the topic's end, its workers until they are up.

Every wait here waits for a condition, with a bound that fails the test saying what it
waited for; none waits for a time.
"""

from __future__ import annotations

import signal
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING

import psutil

from shmcache.engine.control import layout as C

if TYPE_CHECKING:
    from shmtest.supervisors import SupervisorProc


def poll_until(cond, timeout: float, what: str, interval: float = 0.05):
    """Call cond() until it returns something truthy; fail with `what` after `timeout` s."""
    deadline = time.monotonic() + timeout
    last = None
    while True:
        last = cond()
        if last:
            return last
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what() if callable(what) else what}")
        time.sleep(interval)


# -- processes ---------------------------------------------------------------------------------


def stop_popen(p, timeout: float = 60.0) -> None:
    """SIGTERM a child (subprocess.Popen) that still runs and reap it; SIGKILL past `timeout`."""
    if p.poll() is None:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def running(p: psutil.Process) -> bool:
    """Still running: not gone, not a zombie (what liveness.is_alive counts as alive)."""
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def resume(procs: list[psutil.Process]) -> None:
    """SIGCONT each process a test stopped (SIGSTOP) that still runs."""
    for p in procs:
        if running(p):
            p.resume()


def threads_stopped(pid: int) -> bool:
    """Every thread of `pid` is stopped (SIGSTOP delivered, not only sent)."""
    tasks = Path(f"/proc/{pid}/task")
    return all((t / "stat").read_text().rsplit(")", 1)[1].split()[0] == "T" for t in tasks.iterdir())


def wait_gone(procs: list[psutil.Process], what: str = "every process of the supervisor") -> None:
    """Until none of `procs` runs (running())."""
    poll_until(lambda: not [p for p in procs if running(p)], 30,
               lambda: f"{what} to be gone: {[p for p in procs if running(p)]}")


# -- a cache ----------------------------------------------------------------------------------------


def applied(r, partitions: int) -> list[int]:
    """Applied offsets from the segment's control area (valid after the supervisor exits too)."""
    rows = r.control.partitions
    return [int(rows[p, C.P_APPLIED]) for p in range(partitions)]


def wait_applied(r, ends: list[int], timeout: float, sup: SupervisorProc | None = None) -> None:
    """Until every partition's applied offset reached `ends`."""

    def done():
        if sup is not None:
            sup.check_running()
        return all(a >= e for a, e in zip(applied(r, len(ends)), ends))

    def what():
        logs = f"; supervisor log:\n{sup.log_text()[-4000:]}" if sup is not None else ""
        return f"applied {applied(r, len(ends))} to reach {ends}{logs}"

    poll_until(done, timeout, what, interval=0.1)


def assert_no_worker_restarted(r, timeout: float = 60.0) -> None:
    """Every worker was started once and is up. A worker that owns no partition may still
    be importing its kernels when the others have applied everything, so wait for each to
    claim its row before judging; a restart would show as starts > 1."""

    def up():
        ws = r.status()["workers"]
        assert all(w["starts"] == 1 for w in ws), ws  # a restart is never undone: fail at once
        assert all(w["state"] in ("starting", "up") for w in ws), ws  # the supervisor runs
        return all(w["alive"] and w["state"] == "up" for w in ws)

    poll_until(up, timeout, lambda: f"every worker to be up: {r.status()['workers']}")


