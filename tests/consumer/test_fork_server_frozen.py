"""A fork server that stops answering (SIGSTOP: an operator's `kill -STOP` on the wrong pid,
a cgroup freezer) while its workers hang too must not hold up the supervisor's stop.

multiprocessing learns a worker's exit only from the fork server, which reaps it: frozen,
it never reports one, and every worker the stop kills stays "alive" to multiprocessing
for as long as anyone waits. The stop followed that word: after the drain's deadline it
waited up to 5 s on each killed worker in turn, and the interpreter's exit then joined
them for ever. The trap's hardest case: both workers hung, so the stop must kill both, and
the fork server frozen before the stop begins. The supervisor exits 0 within drain_timeout
+ a margin for a loaded machine (the time taken is printed), and once the fork server is
let go no process of the supervisor is left.
"""

import os
import signal
import sys
import time

import psutil

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _supervisors import harness  # noqa: E402,F401
from _topic_model import Model  # noqa: E402
from _waits import poll_until, running, wait_gone  # noqa: E402

import shmcache  # noqa: E402

PARTITIONS = 4
DRAIN_S = 6.0
MARGIN_S = 8.0  # the kills, the final commit, the interpreter's exit, on a loaded 2-core machine


def test_a_frozen_fork_server_does_not_hold_up_the_stop(harness, kafka_topic):
    model = Model("v1", PARTITIONS, seed=83)
    # no stale-worker kill: the stop alone must deal with the hung workers
    name, _, _, sup, r = harness.caught_up(kafka_topic(PARTITIONS), model, PARTITIONS, "fork-frozen",
                                           {"drain_timeout": DRAIN_S, "worker_heartbeat_timeout": 600.0})
    poll_until(lambda: all(w["alive"] for w in r.status()["workers"]), 60, lambda: f"workers up: {r.status()}")
    workers = [psutil.Process(w["pid"]) for w in r.status()["workers"]]
    (server,) = sup.named("shmcache-fork")
    procs = [psutil.Process(sup.pid), *sup.children()]  # the fork server and the workers
    assert len(workers) == 2 and all(w.ppid() == server.pid for w in workers), (workers, server)
    frozen = [*workers, server]
    for p in frozen:
        p.suspend()  # SIGSTOP
    try:
        t0 = time.monotonic()
        sup.signal(signal.SIGTERM)
        code = sup.wait(DRAIN_S + 120)
        took = time.monotonic() - t0
    finally:
        for p in frozen:
            if running(p):
                p.resume()
    print(f"\nSIGTERM with both workers hung and the fork server frozen: exit {code} after {took:.1f} s "
          f"(drain_timeout {DRAIN_S:g} s)")
    log = sup.log_text()
    assert code == 0, log[-3000:]
    assert took <= DRAIN_S + MARGIN_S, (took, log[-3000:])
    for w in workers:  # killed at the deadline, then let go without the fork server's word
        assert f"(pid {w.pid}) did not stop within" in log, log[-3000:]
        assert f"(pid {w.pid}): its fork server did not report its exit" in log, log[-3000:]
    wait_gone(procs)

    r.close()
    harness.readers.remove(r)
    shmcache.destroy(name)
    assert not [f for f in os.listdir("/dev/shm") if name in f]
