"""`shmcache destroy NAME` while a real `shmcache run` supervisor fills the cache: refused
(exit 2, one line naming the supervisor's pid), the cache and the supervisor untouched;
`--force` removes it. (The unit cases, with emulated users, are in
tests/ipc/test_destroy_and_modes.py.)"""

import os
import subprocess
import sys

import shmcache

from shmtest.supervisors import harness  # noqa: F401


def _destroy(name: str, *flags: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "shmcache", "destroy", name, *flags], capture_output=True,
                          text=True, timeout=90, env={**os.environ, "CI": "true"})


def test_destroy_is_refused_while_the_supervisor_runs(harness, kafka_topic):
    topic = kafka_topic(2)
    name = harness.cache_name("destroy")
    sup = harness.supervisor(name, topic, harness.group("destroy"), workers=1)
    harness.attach(name, sup=sup)
    res = _destroy(name)
    assert res.returncode == 2, (res.returncode, res.stderr)
    assert "Traceback" not in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert f"cache '{name}' is in use by a live supervisor pid {sup.pid}" in res.stderr, res.stderr
    assert shmcache.exists(name) and sup.running()
    res = _destroy(name, "--force")
    assert res.returncode == 0, res.stderr
    assert not shmcache.exists(name)
