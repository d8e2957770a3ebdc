"""Stopping, restarting and killing parts of the pipeline while a producer keeps
producing, against the real broker (DESIGN invariants 1, 2 and 6, and the
supervisor's duties: final commit on SIGTERM, restart of a dead worker).

- a SIGTERM'd and restarted supervisor loses nothing, and the group's committed
  offset never runs ahead of what the segment says is applied (invariant 1);
- after SIGTERM the exit code is 0, committed == applied for every partition, the
  segment stays, and it holds exactly the topic's prefix up to those offsets;
- SIGKILL'd workers are restarted (new pid, start count grows), and the table
  still converges to the model (re-applied messages are harmless: invariant 6).
"""

import contextlib
import os
import signal
import threading

import psutil
import pytest

import shmcache

from shmtest.supervisors import harness  # noqa: F401
from shmtest.topic_model import KafkaProbe, Model, check_table, replay_topic
from shmtest.waits import applied, poll_until, wait_applied

PARTITIONS = 4


class CommitSampler(threading.Thread):
    """Every `period` s: the group's committed offsets, then the segment's applied offsets.
    Read in that order, committed(t1) <= applied(t1) <= applied(t2) must hold if the
    supervisor commits only what was applied."""

    def __init__(self, probe: KafkaProbe, reader, partitions: int, period: float = 0.2):
        super().__init__(daemon=True, name="commit-sampler")
        self.probe, self.reader, self.partitions, self.period = probe, reader, partitions, period
        self.stop_event = threading.Event()
        self.samples = 0
        self.with_commits = 0  # samples where every partition had a committed offset
        self.violations: list[tuple[int, int, int]] = []  # (partition, committed, applied)
        self.error: BaseException | None = None

    def run(self) -> None:
        try:
            while not self.stop_event.wait(self.period):
                committed = self.probe.committed()
                done = applied(self.reader, self.partitions)
                self.samples += 1
                self.with_commits += all(c >= 0 for c in committed)
                self.violations += [(p, c, a) for p, (c, a) in enumerate(zip(committed, done)) if c >= 0 and c > a]
        except BaseException as e:  # noqa: BLE001 - reported by the test
            self.error = e

    def finish(self) -> None:
        self.stop_event.set()
        self.join(30)
        if self.error is not None:
            raise self.error


def _progress(r, before: list[int], by: int = 1):
    """Every partition's applied offset moved at least `by` past `before`."""
    return lambda: all(a >= b + by for a, b in zip(applied(r, len(before)), before))


def test_restart_mid_stream_loses_nothing_and_never_commits_ahead(harness, kafka_topic):
    topic = kafka_topic(PARTITIONS)
    model = Model("v1", PARTITIONS, seed=2)
    name, group = harness.cache_name("restart"), harness.group("restart")
    prod = harness.producer(topic, model, rate=40)
    prod.start()
    sup = harness.supervisor(name, topic, group)
    r = harness.attach(name, sup=sup)
    probe = KafkaProbe(harness.bootstrap, topic, PARTITIONS, group=group)
    sampler = CommitSampler(probe, r, PARTITIONS)
    sampler.start()
    ends = KafkaProbe(harness.bootstrap, topic, PARTITIONS)
    try:
        for round_ in range(2):
            poll_until(_progress(r, [0] * PARTITIONS, by=5 + 20 * round_), 60,
                       lambda: f"progress before stop, applied {applied(r, PARTITIONS)}")
            # a commit has happened since the last start (commit interval 0.5 s)
            poll_until(lambda: all(c >= 0 for c in probe.committed()), 30, "a first commit")
            assert sup.terminate() == 0, sup.log_text()[-3000:]
            # the producer keeps going while nobody consumes: wait until there is a backlog
            stopped_at = applied(r, PARTITIONS)
            poll_until(lambda: all(e > a + 3 for e, a in zip(ends.end_offsets(), stopped_at)), 30,
                       "a backlog while the supervisor is down")
            sup = harness.supervisor(name, topic, group)
            poll_until(_progress(r, stopped_at, by=3), 60,
                       lambda: f"progress after restart {round_ + 1}, applied {applied(r, PARTITIONS)}, "
                               f"log:\n{sup.log_text()[-3000:]}")
        prod.finish()
        wait_applied(r, ends.end_offsets(), 60, sup)
        poll_until(lambda: probe.committed() == applied(r, PARTITIONS), 30, "the last periodic commit")
    finally:
        sampler.finish()
        ends.close()
    check_table(r, model.snapshot())
    assert sampler.samples >= 20 and sampler.with_commits >= 10, (sampler.samples, sampler.with_commits)
    assert not sampler.violations, f"committed ahead of applied (partition, committed, applied): {sampler.violations[:10]}"
    assert sup.terminate() == 0
    probe.close()


@pytest.mark.parametrize("sig, to", [(signal.SIGTERM, "supervisor"), (signal.SIGINT, "group"),
                                     (signal.SIGHUP, "group")], ids=["sigterm", "ctrl-c", "hangup"])
def test_a_stop_signal_commits_exactly_what_was_applied(harness, kafka_topic, sig, to):
    """SIGTERM to the supervisor (systemd's stop), and SIGINT or SIGHUP to every process of
    the run at once, workers first (what Ctrl-C or a closing terminal sends the foreground
    process group): a clean stop each time, exit 0, the final commit exactly what was
    applied. A SIGHUP killed the supervisor, its workers and its fork server outright."""
    topic = kafka_topic(PARTITIONS)
    model = Model("v1", PARTITIONS, seed=3)
    name, group = harness.cache_name(f"stop-{sig.name.lower()}"), harness.group(f"stop-{sig.name.lower()}")
    prod = harness.producer(topic, model, rate=50)
    prod.start()
    sup = harness.supervisor(name, topic, group, commit_interval=30.0)  # only the final commit counts
    r = harness.attach(name, sup=sup)
    poll_until(_progress(r, [0] * PARTITIONS, by=10), 60, lambda: f"progress, applied {applied(r, PARTITIONS)}")
    if to == "group":  # mid-stream: the producer is still producing
        for p in sup.children():
            with contextlib.suppress(psutil.NoSuchProcess):
                p.send_signal(sig)
    sup.signal(sig)
    code = sup.wait(60)
    assert code == 0, sup.log_text()[-3000:]
    sup.reap_children(10)
    done = applied(r, PARTITIONS)
    probe = KafkaProbe(harness.bootstrap, topic, PARTITIONS, group=group)
    # the producer goes on until every partition has messages the stopped cache does not hold
    poll_until(lambda: all(e > d for e, d in zip(probe.end_offsets(), done)), 30, "a backlog on every partition")
    prod.finish()

    committed = probe.committed()
    probe.close()
    assert all(d > 0 for d in done), done
    assert committed == done, f"committed {committed} != applied {done}"

    assert shmcache.exists(name)
    r2 = shmcache.attach(name)  # a new reader attaches to the stopped cache
    harness.readers.append(r2)
    st = r2.status()
    assert not st["supervisor_alive"] and not st["ready"]
    # the table is exactly the topic's prefix up to the committed offsets
    prefix = replay_topic(harness.bootstrap, topic, done, "v1")
    assert len(prefix) > 100
    check_table(r2, prefix)


def test_killed_workers_are_restarted_and_the_table_converges(harness, kafka_topic):
    topic = kafka_topic(PARTITIONS)
    model = Model("v2", PARTITIONS, seed=4)
    name = harness.cache_name("killw")
    prod = harness.producer(topic, model, rate=40)
    prod.start()
    sup = harness.supervisor(name, topic, harness.group("killw"))
    r = harness.attach(name, sup=sup)
    r.wait_ready(60)
    for k in range(4):
        i = k % 2
        # ready says the partitions caught up, not that an idle worker finished starting
        poll_until(lambda: r.status()["workers"][i]["alive"], 60, lambda: f"worker {i} up: {r.status()['workers']}")
        st = r.status()
        w = st["workers"][i]
        old_pid, old_starts = w["pid"], w["starts"]
        assert old_pid in {c.pid for c in sup.children()}  # a child of the supervisor
        mine = [p["partition"] for p in st["assigned"] if p["worker"] == i]
        assert mine, st["assigned"]
        before = applied(r, PARTITIONS)
        os.kill(old_pid, signal.SIGKILL)

        def restarted():
            ws = r.status()["workers"][i]
            return ws["starts"] == old_starts + 1 and ws["alive"] and ws["pid"] not in (None, old_pid)

        poll_until(restarted, 60, lambda: f"worker {i} restarted: {r.status()['workers']}")
        # the new worker fetches its partitions again
        poll_until(lambda: all(applied(r, PARTITIONS)[p] > before[p] for p in mine), 60,
                   lambda: f"partitions {mine} to progress past {before}: {applied(r, PARTITIONS)}")
        assert sup.running()
    prod.finish()
    probe = KafkaProbe(harness.bootstrap, topic, PARTITIONS)
    wait_applied(r, probe.end_offsets(), 60, sup)
    probe.close()
    check_table(r, model.snapshot())
    st = r.wait_ready(30)  # a worker sets caught-up just after the applied offset wait_applied saw
    assert [w["starts"] for w in st["workers"]] == [3, 3], st["workers"]
    assert st["ready"]
    assert sup.terminate() == 0
    assert [w["state"] for w in r.status()["workers"]] == ["stopped", "stopped"]
