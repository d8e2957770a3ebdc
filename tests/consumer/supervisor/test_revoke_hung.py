"""A rebalance that takes a partition from a hung worker (SIGSTOP), against the real broker.

The revoke is sent to every worker concerned at once and all are waited for against one
deadline (drain_timeout). A worker that does not answer by then is killed (SIGKILL)
before the callback returns: left alive, it would wake up later still holding the
partition in its own Kafka client and go on applying it, out of order with the
partition's next owner here. Then, as after any death, it is restarted with what it
still holds.

Supervisor A (cache a, 2 workers, one partition each) has both its workers stopped;
supervisor B (cache b, the same group) joins and takes one of the two partitions. Checked:
A's callback returns after one drain_timeout, the worker of the revoked partition is gone
(killed, as A's log says), the other one (whose partition stayed) is left alone; B
applies its partition; once B leaves again, A holds both, applies everything produced
meanwhile and its table equals the model; commits equal the topic's end.
"""


import psutil

from shmtest.supervisors import harness  # noqa: F401
from shmtest.topic_model import KafkaProbe, Model, check_table, produce_and_wait
from shmtest.waits import poll_until, running, wait_applied

PARTITIONS = 2
DRAIN_S = 6.0
FAST = ("heartbeat.interval.ms=500",)  # members notice a rebalance within 0.5 s, not 3 s
CONFIG = {"drain_timeout": DRAIN_S, "worker_heartbeat_timeout": 600.0}  # no stale kill: the revoke alone


def _held(r) -> dict[int, dict]:
    return {p["partition"]: p for p in r.status()["assigned"]}


def test_a_worker_that_does_not_answer_a_revoke_is_killed_before_the_partition_moves(harness, kafka_topic):
    topic = kafka_topic(PARTITIONS)
    model = Model("v1", PARTITIONS, seed=61)
    ends = produce_and_wait(harness, topic, model, PARTITIONS, rate=1000, max_batches=4 * PARTITIONS)
    group = harness.group("revoke-hung")
    name_a, name_b = harness.cache_name("revoke-a"), harness.cache_name("revoke-b")
    a = harness.supervisor(name_a, topic, group, workers=2, sets=FAST, config=CONFIG)
    ra = harness.attach(name_a, sup=a)
    ra.wait_ready(timeout=120)
    wait_applied(ra, ends, 120, a)
    held = _held(ra)
    assert sorted(held) == [0, 1] and held[0]["worker"] != held[1]["worker"], held  # one partition each
    workers = {p: psutil.Process(held[p]["worker_pid"]) for p in held}
    for w in workers.values():
        w.suspend()  # SIGSTOP: neither can answer anything
    b = None
    try:
        b = harness.supervisor(name_b, topic, group, workers=1, sets=FAST, config=CONFIG)
        rb = harness.attach(name_b, sup=b)
        poll_until(lambda: len(rb.status()["assigned"]) == 1, 120 + 2 * DRAIN_S,
                   lambda: f"B to get a partition; A's log:\n{a.log_text()[-3000:]}")
        (moved,) = list(_held(rb))
        kept = 1 - moved
        # the revoked partition's worker was killed before A's callback returned (B's
        # assignment comes after it); the other worker, whose partition stayed, still runs
        assert not running(workers[moved]), a.log_text()[-3000:]
        assert f"did not answer the revoke of partitions [{moved}] within {DRAIN_S:g} s" in a.log_text(), \
            a.log_text()[-3000:]
        assert running(workers[kept])
        workers[kept].resume()
        ends = produce_and_wait(harness, topic, model, PARTITIONS, rate=1000, max_batches=4 * PARTITIONS)
        poll_until(lambda: (lambda h: moved in h and h[moved]["applied"] >= ends[moved])(_held(rb)), 120,
                   lambda: f"B to apply partition {moved}: {rb.status()['assigned']}")
        assert b.terminate() == 0, b.log_text()[-3000:]
        b = None
        # A holds both again (the killed worker restarted), applies everything, nothing lost or reordered
        ends = produce_and_wait(harness, topic, model, PARTITIONS, rate=1000, max_batches=4 * PARTITIONS)
        ra.wait_ready(timeout=120)
        wait_applied(ra, ends, 120, a)
        check_table(ra, model.snapshot())
    finally:
        for w in workers.values():
            if running(w):
                w.resume()
        if b is not None:
            b.kill()
    probe = KafkaProbe(harness.bootstrap, topic, PARTITIONS, group)
    poll_until(lambda: probe.committed() == ends, 60, lambda: f"commits {probe.committed()} to reach {ends}")
    probe.close()
    assert a.terminate() == 0, a.log_text()[-3000:]
