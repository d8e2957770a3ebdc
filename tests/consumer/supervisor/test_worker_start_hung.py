"""A worker that hangs before it comes up is killed and restarted (consumer/supervisor/worker_handle.py
`worker_start_timeout`), against the real broker, a real `shmcache run` and real workers.

A worker is "starting" from its fork until it claims its row (consumer/worker/loop.py: it opens
the cache and loads its kernels first). One stopped there (SIGSTOP) stayed "starting" for
ever: its partitions truthfully not ready, and nothing restarted it (it beats no heartbeat
the stale-worker kill could judge). The test kills a worker that holds partitions, catches
its restart between its fork and its row (the fork server's new child, stopped the moment
it appears; a catch that came too late, the row already claimed, is killed and tried
again), and checks: the worker shows "starting", the cache is not ready; the supervisor
kills it (by pid) once `--worker-start-timeout` (small here) has passed, with one log line
naming it and why, counts it (`start_timeout_kills`), restarts it through the backoff, and
the cache is ready again with every entry produced, before and after.

All along, the supervisor goes round its loop: its heartbeat stays fresh. It once waited
for the restarted worker to acknowledge its partitions, up to drain_timeout (30 s by
default, the value here) with its loop held: the supervisor itself then looked hung
(stale past 10 s), and the start bound could only be judged after that wait.
"""

import contextlib
import os
import signal
import time
from pathlib import Path

import psutil

from shmcache.engine.control.status import why

from shmtest.supervisors import harness  # noqa: F401
from shmtest.topic_model import Model, check_table, produce_and_wait
from shmtest.waits import poll_until, wait_applied

PARTITIONS = 4
START_S = 8.0  # --worker-start-timeout here; the default (120 s) would only make the test slower. The
# first look at the stopped worker must come within it, also under two CI runs at once
FRESH_S = 3.0  # the supervisor's heartbeat is never older than this (it beats every round, ~0.1 s)


def _children(pid: int) -> set[int]:
    """The pids `pid` forked that are still its children (every thread's list)."""
    out: set[int] = set()
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError):
                out.update(int(c) for c in (task / "children").read_text().split())
    return out


def _state(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


def _published(r, i: int, pid: int) -> dict | None:
    """The cache's status once the supervisor has published worker i's restart (or pid is gone)."""
    st = r.status()
    return st if st["workers"][i]["state"] != "backing-off" or _state(pid) == "gone" else None


def _catch_restart(r, fork_pid: int, i: int) -> tuple[int, dict]:
    """Kill worker i and stop its restart before it claims its row; the stopped pid, and the
    cache's status at the first look that shows the restart published (early in the start bound)."""
    for _ in range(6):
        old = r.status()["workers"][i]["pid"]
        known = _children(fork_pid)
        os.kill(old, signal.SIGKILL)
        new = None
        end = time.monotonic() + 60
        while new is None and time.monotonic() < end:  # polled as fast as /proc answers: the window is short
            fresh = _children(fork_pid) - known - {old}
            if fresh:
                new = min(fresh)
                os.kill(new, signal.SIGSTOP)
        assert new is not None, "worker %d was not restarted within 60 s" % i
        poll_until(lambda: _state(new) in ("T", "gone"), 10, f"pid {new} to stop")
        # the supervisor publishes "starting" just after the fork server hands it the pid: a
        # look faster than that still read the death's "backing-off" (CI, on a quiet machine)
        st = poll_until(lambda: _published(r, i, new), START_S / 2, f"worker {i}'s restart (pid {new}) published")
        if _state(new) == "T" and st["workers"][i]["pid"] != new:
            return new, st  # stopped before it claimed its row
        with contextlib.suppress(ProcessLookupError):  # too late (up already): once more
            os.kill(new, signal.SIGKILL)
        poll_until(lambda: r.status()["workers"][i]["state"] == "up" and r.status()["workers"][i]["pid"] not in
                   (old, new), 60, f"worker {i} up again")
    raise AssertionError(f"could not stop worker {i} before it claimed its row in 6 tries")


def test_a_worker_hung_before_it_comes_up_is_killed_and_restarted(harness, kafka_topic):
    topic = kafka_topic(PARTITIONS)
    model = Model("v1", PARTITIONS, seed=53)
    produce_and_wait(harness, topic, model, PARTITIONS, rate=1000, max_batches=2 * PARTITIONS)
    name = harness.cache_name("starthung")
    sup = harness.supervisor(name, topic, harness.group("starthung"), workers=2,
                             args=("--worker-start-timeout", str(START_S)))
    r = harness.attach(name, sup=sup)
    r.wait_ready(timeout=120)
    st = r.status()
    i = st["assigned"][0]["worker"]
    parts = sorted(p["partition"] for p in st["assigned"] if p["worker"] == i)
    fork = sup.named("shmcache-fork")
    assert len(fork) == 1, fork
    victim, st = _catch_restart(r, fork[0].pid, i)
    victim_proc = psutil.Process(victim)
    t0 = time.monotonic()
    try:
        w = st["workers"][i]
        assert w["state"] == "starting" and not st["ready"], st
        assert all(not p["caught_up"] for p in st["assigned"] if p["partition"] in parts), st["assigned"]
        ages = []  # the supervisor's heartbeat age, sampled while its restarted worker hangs

        def killed():
            st = r.status()
            ages.append(st["supervisor_heartbeat_age_s"])
            assert ages[-1] is not None and ages[-1] < FRESH_S and not st["supervisor_stale"], (
                f"the supervisor stopped going round its loop while worker {i} hung starting: heartbeat "
                f"{ages[-1]} s old; why not ready: {why(st)}")
            return _state(victim) in ("Z", "gone")

        # killed (by pid) past the start bound, then restarted through the backoff
        poll_until(killed, 120, lambda: f"pid {victim} to be killed; supervisor log:\n{sup.log_text()[-3000:]}")
        killed_after = time.monotonic() - t0

        def restarted():
            w = r.status()["workers"][i]
            return w["state"] == "up" and w["alive"] and w["pid"] not in (None, victim)

        poll_until(restarted, 120, lambda: f"worker {i} restarted: {r.status()['workers']}")
        up_after = time.monotonic() - t0
    finally:
        with contextlib.suppress(psutil.Error):
            if victim_proc.is_running():
                victim_proc.resume()  # psutil checks it is still the same process
    print(f"\nworker {i} stopped while starting: killed {killed_after:.1f} s after the catch "
          f"(worker_start_timeout {START_S:g} s), up again after {up_after:.1f} s; the supervisor's heartbeat "
          f"at most {max(ages):.2f} s old in {len(ages)} looks")
    st = r.status()
    assert st["start_timeout_kills"] == 1 and st["stale_worker_kills"] == 0, st
    log = sup.log_text()
    line = f"worker {i} (pid {victim}) did not come up within {START_S:g} s"
    assert log.count("did not come up within") == 1 and line in log, log[-3000:]
    # the cache takes what was produced meanwhile and is whole
    ends = produce_and_wait(harness, topic, model, PARTITIONS, rate=1000, max_batches=2 * PARTITIONS)
    wait_applied(r, ends, 120, sup)
    r.wait_ready(timeout=120)
    check_table(r, model.snapshot())
    assert sup.terminate() == 0, sup.log_text()[-3000:]
