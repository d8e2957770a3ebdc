"""SIGTERM to a supervisor with one worker hung (SIGSTOP) ends within one drain_timeout, not
one per wait (the request, then the join: 2 x drain_timeout, 61.7 s with the default 30 s,
over the systemd unit's TimeoutStopSec=60), against the real broker.

Every worker is asked to stop at once and all are waited for against one deadline; the
hung one is killed (SIGKILL) at it; then the final commit, of what was applied only: the
hung worker's partitions are committed at what it applied before it stopped, not at what
was produced after. The supervisor exits 0 within drain_timeout + 10 s (a correctness
bound, with margin for a loaded machine; the time taken is printed), no process of it is
left, and once the cache is destroyed nothing of it is left in /dev/shm.
SHMCACHE_STOP_DRAIN_S sets drain_timeout (default 12 s; 30 is the default of `shmcache run`).
"""

import os

import psutil

from shmtest.supervisors import harness  # noqa: F401
from shmtest.topic_model import KafkaProbe, Model, produce_and_wait
from shmtest.waits import applied, resume, wait_applied, wait_gone

import shmcache

PARTITIONS = 4
DRAIN_S = float(os.environ.get("SHMCACHE_STOP_DRAIN_S", "12"))


def test_sigterm_with_a_hung_worker_stops_within_one_drain_timeout(harness, kafka_topic):
    topic = kafka_topic(PARTITIONS)
    model = Model("v1", PARTITIONS, seed=47)
    # no stale-worker kill during the test: the stop alone must deal with the hung worker
    name, group, ends, sup, r = harness.caught_up(topic, model, PARTITIONS, "stop-hung",
                                                  {"drain_timeout": DRAIN_S, "worker_heartbeat_timeout": 600.0})
    st = r.status()
    i = st["assigned"][0]["worker"]
    hung = psutil.Process(st["assigned"][0]["worker_pid"])
    parts = sorted(p["partition"] for p in st["assigned"] if p["worker"] == i)
    held = applied(r, PARTITIONS)
    procs = [psutil.Process(sup.pid), *sup.children()]  # the fork server and the workers
    assert len([p for p in procs if p.pid != sup.pid]) >= 3, procs
    hung.suspend()  # SIGSTOP
    try:
        # more messages: the other worker applies its share, the hung one cannot
        ends = produce_and_wait(harness, topic, model, PARTITIONS, rate=1000, max_batches=2 * PARTITIONS)
        others = [p for p in range(PARTITIONS) if p not in parts]
        wait_applied(r, [ends[p] if p in others else 0 for p in range(PARTITIONS)], 120, sup)
        code, took = sup.sigterm_timed(DRAIN_S + 120)
    finally:
        resume([hung])
    print(f"\nSIGTERM with one worker hung: exit {code} after {took:.1f} s (drain_timeout {DRAIN_S:g} s)")
    assert code == 0, sup.log_text()[-3000:]
    assert took <= DRAIN_S + 10, (took, sup.log_text()[-3000:])
    log = sup.log_text()
    assert f"worker {i} (pid {hung.pid}) did not stop within" in log, log[-3000:]
    wait_gone(procs)

    # the final commit is what was applied: all of it for the live worker's partitions, and for
    # the hung one's only what it applied before it was stopped
    now = applied(r, PARTITIONS)
    assert [now[p] for p in parts] == [held[p] for p in parts], (now, held, parts)
    assert all(now[p] == ends[p] for p in others) and any(now[p] < ends[p] for p in parts), (now, ends)
    probe = KafkaProbe(harness.bootstrap, topic, PARTITIONS, group=group)
    try:
        assert probe.committed() == now, (probe.committed(), now)
    finally:
        probe.close()

    r.close()
    harness.readers.remove(r)
    shmcache.destroy(name)
    assert not [f for f in os.listdir("/dev/shm") if name in f]
