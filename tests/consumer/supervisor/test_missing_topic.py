"""`shmcache run` on a topic the broker does not have (issue 9, bad input): one line on
stderr naming the topic and the bootstrap servers, exit 2, no traceback, and no cache
left behind that this run created; a cache that existed before is kept, entries and all."""

import os
import subprocess
import sys
import uuid

import shmcache

from shmtest.supervisors import harness  # noqa: F401


def _run(name: str, bootstrap: str, topic: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "shmcache", "run", "--name", name, "--bootstrap", bootstrap,
                           "--topic", topic, "--memory", "64MiB"],
                          capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)


def _check_refusal(run: subprocess.CompletedProcess, topic: str, bootstrap: str) -> None:
    assert run.returncode == 2, run.stderr[-3000:]
    assert "Traceback" not in run.stderr, run.stderr[-3000:]
    last = run.stderr.strip().splitlines()[-1]
    assert last.startswith("shmcache: ") and topic in last and bootstrap in last, run.stderr[-3000:]


def test_missing_topic_is_one_line_and_leaves_no_cache(harness):
    topic = f"t-missing-{uuid.uuid4().hex[:10]}"
    fresh = harness.cache_name("missing-fresh")
    run = _run(fresh, harness.bootstrap, topic)
    _check_refusal(run, topic, harness.bootstrap)
    assert not shmcache.exists(fresh)
    assert not os.path.exists(f"/dev/shm/.shmcache-{fresh}.readers")

    kept = harness.cache_name("missing-kept")
    with shmcache.create(kept, memory="64MiB") as w:
        w.set(b"k" * 32, b"value")
        before = w.creation_id
    run = _run(kept, harness.bootstrap, topic)
    _check_refusal(run, topic, harness.bootstrap)
    with shmcache.attach(kept) as r:
        assert r.creation_id == before and r.get(b"k" * 32) == b"value"
