"""A supervisor whose segment is unlinked or replaced under it (issue 9, "Operator
mistakes"): within a few seconds it logs which, stops its workers and exits non-zero,
instead of filling a segment that no reader can attach any more. And one killed while
it creates the segment leaves nothing at the name: the next run creates it afresh."""

import os
import signal
import time

import psutil
import pytest

import shmcache
from shmcache.engine import reader_stats
from shmcache.ipc.segment import path_of

from shmtest.supervisors import harness  # noqa: F401
from shmtest.topic_model import Model, produce_and_wait
from shmtest.waits import poll_until


@pytest.mark.parametrize("how", ["unlink", "replace"])
def test_supervisor_exits_when_its_segment_goes(harness, kafka_topic, how):
    topic = kafka_topic(2)
    name = harness.cache_name(f"gone-{how}")
    sup = harness.supervisor(name, topic, harness.group("gone"), workers=2)
    r = harness.attach(name, sup=sup)
    poll_until(lambda: r.status()["supervisor_alive"] and len(r.status()["workers"]) == 2
               and all(w["alive"] for w in r.status()["workers"]), 60, lambda: f"workers up: {r.status()}")
    workers = [psutil.Process(w["pid"]) for w in r.status()["workers"]]
    if how == "unlink":
        os.unlink(path_of(name))  # what `shmcache destroy --force` does under a running supervisor
    else:  # another cache put in its place in one step: an unlink and a create would race the
        # supervisor's check, which may rightly see the name missing in between
        spare = harness.cache_name(f"gone-{how}-spare")
        shmcache.create(spare, memory="64MiB").close()
        os.rename(reader_stats.path_of(spare), reader_stats.path_of(name))
        os.rename(path_of(spare), path_of(name))
    try:
        code = sup.wait(60)
        assert code not in (None, 0), f"exit code {code}:\n{sup.log_text()[-3000:]}"
        text = sup.log_text()
        assert ("was removed (unlinked)" if how == "unlink" else "was replaced by another file") in text, text[-3000:]
        assert "Traceback" not in text, text[-3000:]
        _, alive = psutil.wait_procs(workers, timeout=30)
        assert not alive, f"workers still running: {alive}"
        if how == "replace":  # the new segment was left alone
            with shmcache.attach(name) as fresh:
                assert fresh.status()["supervisor_pid"] is None
    finally:
        if how == "unlink":
            reader_stats.unlink(name)  # the name is gone: harness.close() cannot destroy it


def _creating(pid: int) -> bool:
    """The process holds an unnamed file in /dev/shm: a segment it is creating."""
    try:
        fds = os.listdir(f"/proc/{pid}/fd")
    except OSError:
        return False
    for fd in fds:
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("/dev/shm/#") and target.endswith(" (deleted)"):
            return True
    return False


def test_a_supervisor_killed_while_it_creates_the_cache_leaves_nothing_behind(harness, kafka_topic):
    """SIGKILLed mid-create (stopped the moment it holds the unnamed segment, and only
    killed if the name is still free: the creation verifiably unfinished), it leaves
    nothing at the name, and the next run creates the cache and fills it. Before, the
    name kept a file without magic that every later run refused."""
    topic = kafka_topic(2)
    model = Model("v1", 2, seed=5)
    produce_and_wait(harness, topic, model, 2, rate=10_000, max_batches=20)
    for attempt in range(3):  # a creation caught whole between two looks: try again
        name = harness.cache_name("killed-creating")
        sup = harness.supervisor(name, topic, harness.group("killed-creating"), memory="1GiB")
        while sup.running() and not _creating(sup.proc.pid) and not os.path.lexists(path_of(name)):
            time.sleep(0.001)
        assert sup.running(), sup.log_text()[-3000:]
        sup.signal(signal.SIGSTOP)
        caught = _creating(sup.proc.pid) and not os.path.lexists(path_of(name))
        sup.kill()
        if caught:
            break
    else:
        pytest.fail("three supervisors finished creating their cache before being caught at it")
    assert sup.wait(30) == -signal.SIGKILL
    assert not os.path.lexists(path_of(name)), "a killed creation left a file at the name"
    again = harness.supervisor(name, topic, harness.group("killed-creating"), memory="64MiB")
    r = harness.attach(name, sup=again)
    r.wait_ready(90)
    expected = model.snapshot()
    assert r.get_many(list(expected)) == list(expected.values())
