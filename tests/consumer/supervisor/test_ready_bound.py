"""Readiness with a bound (issue 55, point 2): ready is a latch, so a cache whose topic runs
ahead of it stays "ready"; a caller or a probe may also ask "and no more than N messages, or
S seconds, behind" (engine/control/bound.py).

- A live daemon on the real broker: its worker publishes the Kafka time of the last message
  it applied, status shows `behind_s`, and with the worker stopped (SIGSTOP) while the topic
  runs 7 messages ahead, the cache is still ready but past `--max-lag 6` and past 60 s
  (its last message applied was produced an hour ago), in the Python API, the command line
  and the daemon's /ready?max_lag=&max_behind=; within them all at 7 messages and 2 hours;
  `shmcache status` and `top` show the partition's seconds behind beside its lag;
  once the worker runs again, within a bound of 0 messages and 0 seconds.
- /ready's query over a golden control area (control_ready_behind), no broker: the bounds and
  the words, and a 400 naming what is wrong for every query the contract's grammar refuses.
"""

from __future__ import annotations

import http.client
import os
import re
import subprocess
import sys
import time

import numpy as np
import psutil
import pytest

import shmcache
from shmcache.consumer.supervisor.metrics import MetricsServer
from shmcache.dev.local_kafka import free_ports

from shmtest import scene as S
from shmtest.supervisors import harness  # noqa: F401
from shmtest.topic_model import produce_entries
from shmtest.waits import poll_until

HOUR_MS = 3600 * 1000


def _get(port: int, path: str, method: str = "GET") -> tuple[int, str]:
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=20)
    try:
        c.request(method, path)
        resp = c.getresponse()
        return resp.status, resp.read().decode()
    finally:
        c.close()


def _wait_ready(name: str, *bound: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "shmcache", "wait-ready", "--timeout", "0.3", *bound, name],
                          capture_output=True, text=True, timeout=120)


def test_a_live_daemon_ready_but_behind_is_past_its_bound_everywhere(harness, kafka_topic):
    topic = kafka_topic(1)
    rng = np.random.default_rng(55)
    produce_entries(harness.bootstrap, topic, {0: 20}, rng, timestamp_ms=int(time.time() * 1000) - HOUR_MS)
    (port,) = free_ports(1)
    name = harness.cache_name("bound")
    sup = harness.supervisor(name, topic, harness.group("bound"), workers=1,
                             config={"worker_heartbeat_timeout": 600, "metrics_port": port})
    r = harness.attach(name, sup=sup)
    st = r.wait_ready(timeout=120, max_lag=0, max_behind=0)  # no lag: 0 s behind, however old its messages
    assert st["assigned"][0]["applied"] == 20 and st["assigned"][0]["behind_s"] == 0
    worker = psutil.Process(st["assigned"][0]["worker_pid"])
    worker.suspend()  # SIGSTOP: it applies nothing; the supervisor asks the broker for its watermark itself
    try:
        produce_entries(harness.bootstrap, topic, {0: 7}, rng)
        poll_until(lambda: r.status()["assigned"][0]["lag"] == 7, 60, lambda: f"lag 7: {r.status()['assigned']}")
        st = r.status()
        p = st["assigned"][0]
        assert st["ready"], st["why"]  # a latch: the partition caught up once, its worker is not stale
        assert HOUR_MS / 1000 <= p["behind_s"] < HOUR_MS / 1000 + 600, p

        # the Python API
        with pytest.raises(shmcache.CacheNotReadyError, match=r"not ready after 0\.2 s: partitions more than 6 "
                                                              r"messages behind: 0 \(lag 7\)$"):
            r.wait_ready(timeout=0.2, max_lag=6)
        with pytest.raises(shmcache.CacheNotReadyError, match=r": partitions more than 60\.0 s behind: 0 \(36\d\d s\)$"):
            r.wait_ready(timeout=0.2, max_behind=60)
        assert r.wait_ready(timeout=10, max_lag=7, max_behind=7200)["ready"]

        # the command line
        past = _wait_ready(name, "--max-lag", "6", "--max-behind", "60")
        assert past.returncode == 1 and past.stdout == "", past
        assert re.fullmatch(r"shmcache: not-ready: cache '\S+' not ready after 0\.3 s: partitions more than 6 messages "
                            r"behind: 0 \(lag 7\); partitions more than 60\.0 s behind: 0 \(36\d\d s\)\n", past.stderr), \
            past.stderr
        within = _wait_ready(name, "--max-lag", "7", "--max-behind", "7200")
        assert within.returncode == 0 and '"ready": true' in within.stdout, within
        for view in (["status", name], ["top", "--once", name]):  # the tables: a behind column beside the lag
            shown = subprocess.run([sys.executable, "-m", "shmcache", *view], capture_output=True, text=True,
                                   timeout=120, env={**os.environ, "COLUMNS": "200"})
            assert shown.returncode == 0 and "behind" in shown.stdout, shown
            assert re.search(r"\b7\W+3,6\d\d s\b", shown.stdout), shown.stdout  # lag 7, then behind

        # the daemon's /ready
        assert _get(port, "/ready")[0] == 200
        code, said = _get(port, "/ready?max_lag=6")
        assert code == 503 and said.rstrip().endswith("partitions more than 6 messages behind: 0 (lag 7)"), said
        code, said = _get(port, "/ready?max_behind=60")
        assert code == 503 and "partitions more than 60.0 s behind: 0 (36" in said, said
        assert _get(port, "/ready?max_lag=7&max_behind=7200") == (200, f"cache {name!r} ready\n")
    finally:
        worker.resume()
    st = r.wait_ready(timeout=120, max_lag=0, max_behind=0)  # it applies the 7: no lag, 0 s behind again
    assert st["assigned"][0]["applied"] == 27
    assert _get(port, "/ready?max_lag=0&max_behind=0")[0] == 200


@pytest.fixture
def behind():
    """The daemon's endpoint over golden/control's control_ready_behind: ready, partition 1 40
    messages and 90 s behind, partition 2 3 messages behind and its time unknown."""
    procs = {role: subprocess.Popen(["sleep", "600"]) for role in ("supervisor", "worker")}
    s = S.Scene("ready-bound")
    srv = None
    try:
        case = S.control_cases()["control_ready_behind"]
        s.install_control(case, {role: S.live_owner(p.pid) for role, p in procs.items()})
        s.keep_ages(case)
        srv = MetricsServer(s.name, 0)
        yield srv.port
    finally:
        if srv is not None:
            srv.close()
        s.clear()
        for p in procs.values():
            p.kill()
            p.wait()


@pytest.mark.parametrize("query, code, ends", [
    ("", 200, "ready"),
    ("?max_lag=40", 200, "ready"),
    ("?max_lag=39", 503, ": partitions more than 39 messages behind: 1 (lag 40)"),
    ("?max_behind=600", 503, ": partitions more than 600.0 s behind: 2 (unknown)"),
    ("?max_behind=30.5&max_lag=3", 503, ": partitions more than 3 messages behind: 1 (lag 40); partitions more than "
                                        "30.5 s behind: 1 (90 s), 2 (unknown)"),
])
def test_ready_takes_the_bound_as_its_query(behind, query, code, ends):
    got, said = _get(behind, "/ready" + query)
    said = said.rstrip("\n")
    if "(90 s)" in ends:  # the golden's 90 s, read a moment later
        said = said.replace("(91 s)", "(90 s)")
    assert (got, said.endswith(ends)) == (code, True), said


@pytest.mark.parametrize("query, names", [
    ("?max_lag=-1", "max_lag '-1' is not a count"),
    ("?max_lag=1e3", "max_lag '1e3' is not a count"),
    ("?max_lag=", "max_lag '' is not a count"),
    ("?max_lag=1000000000000000000", "is not a count (1-18 digits)"),
    ("?max_behind=inf", "max_behind 'inf' is not a number of seconds"),
    ("?max_behind=1000000000", "is not a number of seconds"),
    ("?max_lag=1&max_lag=2", "max_lag given 2 times"),
    ("?bogus=1", "not 'bogus'"),
    ("?max_lag", "/ready takes max_lag=N and max_behind=S"),
    ("?max_lag=1&max_behind=2&x=3", "/ready takes max_lag=N and max_behind=S"),
])
def test_a_query_the_grammar_refuses_is_a_400_naming_it(behind, query, names):
    code, said = _get(behind, "/ready" + query)
    assert code == 400 and names in said and said.count("\n") == 1, said
    assert _get(behind, "/ready" + query, "HEAD") == (400, "")
