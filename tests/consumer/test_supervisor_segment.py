"""A supervisor whose segment is unlinked or replaced under it (issue 9, "Operator
mistakes"): within a few seconds it logs which, stops its workers and exits non-zero,
instead of filling a segment that no reader can attach any more."""

import os
import sys

import psutil
import pytest

import shmcache
from shmcache.engine import reader_stats
from shmcache.ipc.segment import path_of

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _pipeline import harness, poll_until  # noqa: E402,F401


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
