"""A consumer group shared by two caches' supervisors, against the real broker (DESIGN
invariant 10; issue 9 "Operator mistakes", issue 10 "Also seen").

Supervisor A (cache a) runs alone and is ready; supervisor B (cache b) joins the same
group, as a second `shmcache run` given the same --group does, and takes some of the
partitions. Checked, in each of two rounds:
- neither cache is ready while the group is shared (each holds part of the topic), and
  wait_ready() says which partitions another member holds;
- A's status lists B (client id, host, static instance id) with the partitions it holds,
  A's log warns, `shmcache status`, `shmcache top` and the metrics say it;
- B's clean stop hands its partitions back to A at once, although both are static
  members (a static member's close() does not leave the group: the supervisor leaves by
  unsubscribing first); A is ready again and its status says the group is its own.
At the end A's table equals the model, its committed offsets equal its applied offsets,
and no commit failed on either side through the four rebalances (periodic commits every
0.1 s: the ones that meet a rebalance are deferred, not failed).
"""

import os
import subprocess
import sys

import pytest

import shmcache
from shmcache.consumer.supervisor.metrics import CacheCollector

from shmtest.supervisors import REPO, harness  # noqa: F401
from shmtest.topic_model import KafkaProbe, Model, check_table
from shmtest.waits import applied, poll_until, wait_applied

PARTITIONS = 4
FAST = ("heartbeat.interval.ms=500",)


def _metric(name: str, family: str) -> float:
    for fam in CacheCollector(name).collect():
        if fam.name == family:
            return fam.samples[0].value
    raise AssertionError(f"no metric {family}")


def _cli(*args) -> str:
    out = subprocess.run([sys.executable, "-m", "shmcache", *args], capture_output=True, text=True, timeout=60,
                         cwd=str(REPO.parent), env={**os.environ, "COLUMNS": "200"})
    assert out.returncode == 0, out.stderr
    return out.stdout


def test_shared_group_is_not_ready_and_says_so(harness, kafka_topic):
    topic = kafka_topic(PARTITIONS)
    model = Model("v2", PARTITIONS, seed=31)
    group = harness.group("shared")
    name_a, name_b = harness.cache_name("shared-a"), harness.cache_name("shared-b")
    prod = harness.producer(topic, model, rate=20)
    prod.start()
    a = harness.supervisor(name_a, topic, group, fmt="v2", commit_interval=0.1, sets=FAST)
    ra = harness.attach(name_a, sup=a)
    ra.wait_ready(90)
    rb = None
    for round_ in range(2):
        b = harness.supervisor(name_b, topic, group, fmt="v2", workers=1, memory="64MiB", commit_interval=0.1,
                               sets=FAST)
        if rb is None:
            rb = harness.attach(name_b, sup=b)

        def shared(r, sup):
            st = r.status()
            return (st["supervisor_pid"] == sup.pid and st["shared_group"] and st["elsewhere"]
                    and st["elsewhere"] == st["unassigned"] and not st["assigning"]
                    and len(st["assigned"]) + len(st["elsewhere"]) == PARTITIONS and st)

        st = poll_until(lambda: shared(ra, a), 60, lambda: f"round {round_}: A to see B: {ra.status()}")
        stb = poll_until(lambda: shared(rb, b), 60, lambda: f"round {round_}: B to see A: {rb.status()}")
        assert not st["ready"] and not stb["ready"]
        assert set(st["elsewhere"]) == {p["partition"] for p in stb["assigned"]}
        (other,) = st["group_others"]
        assert name_b in other["client_id"] and other["instance_id"].endswith(name_b), other
        assert other["partitions"] == st["elsewhere"] and other["host"]
        with pytest.raises(shmcache.CacheNotReadyError, match="held by another member of the group"):
            ra.wait_ready(0.5)
        if round_ == 0:
            poll_until(lambda: "is shared with 1 other member" in a.log_text(), 30, "A's warning")
            assert "consumer group shared with 1 other member" in _cli("status", name_a)
            assert "consumer group shared with 1 other member" in _cli("top", name_a, "--once")
            assert _metric(name_a, "shmcache_group_other_members") == 1
            assert _metric(name_a, "shmcache_ready") == 0
            assert _metric(name_a, "shmcache_partitions_unassigned") == len(st["elsewhere"])
        assert b.terminate() == 0, b.log_text()[-3000:]
        # B was a static member too: had it not left, A would wait out B's 45 s session timeout
        poll_until(lambda: len(ra.status()["assigned"]) == PARTITIONS, 30,
                   lambda: f"round {round_}: A to get B's partitions back: {ra.status()}")
        poll_until(lambda: ra.status()["ready"] and not ra.status()["shared_group"], 60,
                   lambda: f"round {round_}: A ready and alone again: {ra.status()}")
        assert rb.status()["commit_failures"] == 0, b.log_text()[-3000:]
    assert "alone again" in a.log_text()
    assert _metric(name_a, "shmcache_group_other_members") == 0
    prod.finish()
    probe = KafkaProbe(harness.bootstrap, topic, PARTITIONS, group=group)
    wait_applied(ra, probe.end_offsets(), 60, a)
    poll_until(lambda: probe.committed() == applied(ra, PARTITIONS), 30, "A's last periodic commit")
    probe.close()
    check_table(ra, model.snapshot())
    st = ra.status()
    assert st["commit_failures"] == 0, a.log_text()[-3000:]
    print(f"\nA: {st['commits']} commits, {st['commits_deferred']} deferred by a rebalance, "
          f"{st['rebalances']} rebalances")
    assert a.terminate() == 0


def test_same_instance_id_fences_the_older_supervisor(harness, kafka_topic):
    """Two supervisors with one static instance id in one group (a copied config): the
    broker fences the older one, which says so and exits 1; the newer one takes over."""
    import uuid

    topic = kafka_topic(2)
    group = harness.group("fence")
    inst = ("--instance-id", f"t-fence-{uuid.uuid4().hex[:8]}")
    name_a, name_b = harness.cache_name("fence-a"), harness.cache_name("fence-b")
    a = harness.supervisor(name_a, topic, group, workers=1, memory="64MiB", args=inst)
    ra = harness.attach(name_a, sup=a)
    ra.wait_ready(90)
    b = harness.supervisor(name_b, topic, group, workers=1, memory="64MiB", args=inst)
    rb = harness.attach(name_b, sup=b)
    code = a.wait(120)
    assert code == 1, f"exit code {code}:\n{a.log_text()[-3000:]}"
    assert "fenced it out" in a.log_text() and "Traceback" not in a.log_text(), a.log_text()[-3000:]
    a.reap_children(30)
    assert not ra.status()["supervisor_alive"]
    rb.wait_ready(90)
    assert b.terminate() == 0
