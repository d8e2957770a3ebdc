"""A fork server that stops answering (SIGSTOP: an operator's `kill -STOP` on the wrong pid,
a cgroup freezer) must hold up neither the supervisor's stop nor a worker's restart.

The stop, with its workers hung too. multiprocessing learns a worker's exit only from the fork server, which reaps it: frozen,
it never reports one, and every worker the stop kills stays "alive" to multiprocessing
for as long as anyone waits. The stop followed that word: after the drain's deadline it
waited up to 5 s on each killed worker in turn, and the interpreter's exit then joined
them for ever. The trap's hardest case: both workers hung, so the stop must kill both, and
the fork server frozen before the stop begins. The supervisor exits 0 within drain_timeout
+ a margin for a loaded machine (the time taken is printed), and once the fork server is
let go no process of the supervisor is left.

A restart. multiprocessing waits for the new worker's pid from the fork server with no
bound: a worker that died while the fork server was frozen went unseen (multiprocessing
said it ran), and its restart would have waited for ever. A worker is followed by its
owner word now, and a fork server that forks nothing within worker_start_timeout is
killed; the start counts as a death, and the next one comes from a fresh fork server. The
trap's hardest case: the worker is killed after the fork server froze, so nothing but its
owner word says it is gone. Both workers come back (the other, its fork server killed
under it, is killed as a stray and restarted), and the table ends equal to the model.
The supervisor beats while it waits for a fork, and a stop asked for meanwhile gives the
wait up at once: the stop fits its budget with worker_start_timeout far off.
"""

import os
import signal
import time

import psutil

from shmtest.supervisors import harness  # noqa: F401
from shmtest.topic_model import Model, check_table, produce_and_wait
from shmtest.waits import poll_until, resume, running, wait_applied, wait_gone

import shmcache

PARTITIONS = 4
DRAIN_S = 6.0
MARGIN_S = 8.0  # the kills, the final commit, the interpreter's exit, on a loaded 2-core machine
START_S = 10.0  # worker_start_timeout: a fork server that forks nothing by then is killed


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
        code, took = sup.sigterm_timed(DRAIN_S + 120)
    finally:
        resume(frozen)
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


def test_a_fork_server_frozen_while_running_is_replaced(harness, kafka_topic):
    topic = kafka_topic(PARTITIONS)
    model = Model("v1", PARTITIONS, seed=89)
    name, _, _, sup, r = harness.caught_up(topic, model, PARTITIONS, "fork-frozen-run", {"worker_start_timeout": START_S})
    poll_until(lambda: all(w["alive"] for w in r.status()["workers"]), 60, lambda: f"workers up: {r.status()}")
    old = {w["worker"]: (w["pid"], w["starts"]) for w in r.status()["workers"]}
    (server,) = sup.named("shmcache-fork")
    server.suspend()  # SIGSTOP
    try:
        os.kill(old[0][0], signal.SIGKILL)  # after the freeze: nothing but its owner word says it is gone

        def back():
            ws = r.status()["workers"]
            return all(w["alive"] and w["starts"] > old[w["worker"]][1] for w in ws)

        poll_until(back, 120, lambda: f"both workers restarted: {r.status()['workers']}\n{sup.log_text()[-3000:]}")
    finally:
        resume([server])
    log = sup.log_text()
    assert "worker 0 was not forked: its fork server forked nothing within" in log, log[-3000:]
    assert not running(server), "the hung fork server was killed"
    (fresh,) = sup.named("shmcache-fork")
    assert fresh.pid != server.pid
    ends = produce_and_wait(harness, topic, model, PARTITIONS, rate=1000, max_batches=2 * PARTITIONS)
    wait_applied(r, ends, 120, sup)
    check_table(r, model.snapshot())
    assert sup.terminate() == 0, sup.log_text()[-3000:]


def test_a_stop_during_a_start_from_a_frozen_fork_server_fits_its_budget(harness, kafka_topic):
    """SIGTERM while a restart waits for the frozen fork server's pid: the wait gives up at once
    (worker_start_timeout is far off), the fork server is killed, and the stop fits drain_timeout
    + a margin; the supervisor beat all along (its status never looked hung)."""
    model = Model("v1", PARTITIONS, seed=97)
    bound = 300.0  # worker_start_timeout: only the stop can end the wait within the test
    name, _, _, sup, r = harness.caught_up(kafka_topic(PARTITIONS), model, PARTITIONS, "fork-frozen-stop",
                                           {"worker_start_timeout": bound, "drain_timeout": DRAIN_S})
    poll_until(lambda: all(w["alive"] for w in r.status()["workers"]), 60, lambda: f"workers up: {r.status()}")
    victim = r.status()["workers"][0]["pid"]
    (server,) = sup.named("shmcache-fork")
    procs = [psutil.Process(sup.pid), *sup.children()]
    server.suspend()  # SIGSTOP
    try:
        os.kill(victim, signal.SIGKILL)
        poll_until(lambda: "restarting worker 0" in sup.log_text(), 60, lambda: sup.log_text()[-3000:])
        beats = []  # the supervisor's heartbeat age, once a second while it waits for the fork
        for _ in range(4):
            time.sleep(1.0)
            beats.append(round(r.status()["supervisor_heartbeat_age_s"], 2))
        code, took = sup.sigterm_timed(DRAIN_S + 120)
    finally:
        resume([server])
    print(f"\nSIGTERM during a start from a frozen fork server: exit {code} after {took:.1f} s; the supervisor's "
          f"heartbeat age while it waited: {beats}")
    log = sup.log_text()
    assert code == 0, log[-3000:]
    assert took <= DRAIN_S + MARGIN_S, (took, log[-3000:])
    assert "worker 0 was not forked: its start was given up after" in log, log[-3000:]  # for the stop, not the bound
    assert min(beats) < 0.5, beats  # not beating, each would be over 1 s
    wait_gone(procs)
    r.close()
    harness.readers.remove(r)
    shmcache.destroy(name)
