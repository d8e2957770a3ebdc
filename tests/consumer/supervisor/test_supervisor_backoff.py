"""A worker that dies at once is restarted with a growing backoff, not ten times a second
(issue 11), against the real broker and a real supervisor.

Every worker process the supervisor spawns is killed (SIGKILL) the moment it exists,
before it could even claim its row. Until the supervisor has counted FAILS deaths in a
row, the restarts must stay within what the backoff allows over that (condition-waited)
window; status() and `shmcache status` show the backoff. Once the killing stops the
worker comes up, and after staying up its deaths in a row count from zero again.
"""

import os
import signal
import subprocess
import sys
import time


from shmtest.supervisors import harness  # noqa: F401
from shmtest.waits import poll_until

from shmcache.consumer.supervisor.backoff import BACKOFF_RESET_S, backoff_s

FAILS = 4


def test_a_worker_that_dies_at_once_is_restarted_with_backoff(harness, kafka_topic):
    topic = kafka_topic(1)
    name = harness.cache_name("backoff")
    sup = harness.supervisor(name, topic, harness.group("backoff"), workers=1)
    r = harness.attach(name, sup=sup)
    killed: set[int] = set()

    def kill_new():
        for c in sup.workers():
            if c.pid not in killed:
                killed.add(c.pid)
                try:
                    os.kill(c.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass

    def worker():
        ws = r.status()["workers"]
        return ws[0] if ws else None

    start = time.monotonic()

    def enough_deaths():
        assert sup.running(), sup.log_text()[-3000:]
        kill_new()
        w = worker()
        return w is not None and w["restart_failures"] >= FAILS

    poll_until(enough_deaths, 120, lambda: f"{FAILS} deaths in a row: {worker()}, killed {len(killed)}",
               interval=0.01)
    window = time.monotonic() - start
    w = worker()
    # restarts so far (starts - 1) never outran the backoff: each of the first FAILS - 1
    # deaths was followed by its wait before the next start
    allowed, waited = 0, 0.0
    while waited + backoff_s(allowed + 1) <= window:
        allowed += 1
        waited += backoff_s(allowed)
    assert w["starts"] - 1 <= allowed, (w, window, allowed)
    assert w["starts"] - 1 >= FAILS - 1, w  # and it was restarted after each death
    assert w["state"] == "backing-off", w
    assert w["next_restart_s"] is not None and w["next_restart_s"] > time.time() - 60, w
    out = subprocess.run([sys.executable, "-m", "shmcache", "status", name], capture_output=True,
                         text=True, timeout=60, env={**os.environ, "COLUMNS": "250"})
    assert out.returncode in (0, 1), out.stderr
    assert "backoff" in out.stdout and f"{w['restart_failures']} in a row" in out.stdout, out.stdout

    # the killing stops: the restart comes when due, the worker comes up and stays up,
    # and its deaths in a row count from zero again
    poll_until(lambda: (worker() or {}).get("state") == "up", 60, lambda: f"the worker up: {worker()}")
    poll_until(lambda: worker()["restart_failures"] == 0, BACKOFF_RESET_S + 60,
               lambda: f"the deaths in a row reset: {worker()}")
    w = worker()
    assert w["alive"] and w["next_restart_s"] is None, w
    assert sup.terminate() == 0, sup.log_text()[-3000:]
