"""`shmcache demo` on a broker it did not start (`--bootstrap`), in the other wire
format; and the demo when something goes wrong: a check that fails (a cache too
small, so entries are evicted) exits 1, and Ctrl-C exits 130, each after
stopping everything it started and removing its topic, group and segment."""

import contextlib
import os
import re
import signal
import subprocess
import sys

import shmcache

from shmtest.demo_run import ENV, REPO, DemoRun, alive, assert_nothing_left, run_demo
from shmtest.waits import poll_until


def _topic_of(out: str) -> str:
    return re.search(r"topic '(shmcache-demo-[0-9a-f]+)'", out).group(1)


def _groups(admin) -> set[str]:
    return {g.group_id for g in admin.list_consumer_groups().result(timeout=15).valid}


def _topics(admin) -> set[str]:
    return set(admin.list_topics(timeout=10).topics)


def test_v2_on_an_existing_broker_keeping_the_cache(kafka_broker, kafka_admin):
    run = run_demo(["--entries", "20000", "--format", "v2", "--bootstrap", kafka_broker.bootstrap, "--keep"],
                   timeout=600, script=False)
    name, topic = run.cache(), _topic_of(run.out)
    try:
        assert run.code == 0, run.out
        assert f"using the Kafka broker at {kafka_broker.bootstrap}" in run.out and "Kafka broker pid" not in run.out
        assert run.row("hit rate (present)").startswith("100.00%")
        assert_nothing_left(run, kept=True)
        with shmcache.attach(name) as r:  # kept: readable, its supervisor gone, everything committed
            st = r.status()
            assert not st["supervisor_alive"] and st["commits"] >= 1
            assert f"{r.stats()['entries']:,}" == run.row("table entries").split()[0]
        assert topic in _topics(kafka_admin)  # --keep keeps the topic too
    finally:
        shmcache.destroy(name)
        for f in kafka_admin.delete_topics([topic], operation_timeout=10).values():
            f.result(timeout=15)


def test_a_failed_check_exits_1_and_cleans_up(kafka_broker, kafka_admin):
    # 40 MiB holds ~24 records per bucket: 200,000 entries (~24 per bucket) overflow some buckets
    run = run_demo(["--entries", "200000", "--memory", "40MiB", "--bootstrap", kafka_broker.bootstrap],
                   timeout=600, script=False)
    assert run.code == 1, run.out
    assert "demo FAILED" in run.out and "evictions" in run.out.split("demo FAILED")[1]
    assert int(run.row("evictions").replace(",", "")) > 0
    assert_nothing_left(run)
    topic = _topic_of(run.out)
    assert topic not in _topics(kafka_admin) and topic not in _groups(kafka_admin)


# The demo's cleanup is bounded by its steps' own bounds: the supervisor's stop (dev/run_process.py,
# 60 s, and 10 s for its workers), the topic's and the group's deletion (30 s each): 130 s. This
# test gave it 120 s, and CI, two runs at once on two cores, once ran out of it
STOP_BOUND_S = 240


def test_ctrl_c_stops_everything_it_started(kafka_broker, kafka_admin):
    p = subprocess.Popen([sys.executable, "-m", "shmcache", "demo", "--entries", "5000000",
                          "--bootstrap", kafka_broker.bootstrap], cwd=REPO, stdin=subprocess.DEVNULL,
                         stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         env={**ENV, "PYTHONFAULTHANDLER": "1"}, start_new_session=True)
    lines = []
    try:
        for line in p.stdout:  # until the supervisor is up and producing has begun
            lines.append(line)
            if "partitions assigned, ready" in line:
                break
        said = "".join(lines)
        started = re.search(r"supervisor pid (\d+) with \d+ workers \(pids (\d+), (\d+)\), cache '(demo-[0-9a-f]+)'", said)
        assert started, f"the demo's start line is not as expected:\n{said}"
        sup, *workers = (int(x) for x in started.groups()[:3])
        name = started.group(4)
        topic = _topic_of("".join(lines))
        with shmcache.attach(name) as r:  # the stop comes mid-stream: entries applied, most still to come
            poll_until(lambda: r.stats()["entries"] > 0, 300, "the demo's first entries in its cache")
        p.send_signal(signal.SIGINT)  # the demo alone, as a terminal's Ctrl-C would reach it first
        try:
            rest, _ = p.communicate(timeout=STOP_BOUND_S)
        except subprocess.TimeoutExpired:  # where it is stuck: every thread's stack (PYTHONFAULTHANDLER), then it dies
            os.kill(p.pid, signal.SIGABRT)
            try:
                rest, _ = p.communicate(timeout=30)
            finally:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(p.pid, signal.SIGKILL)  # its supervisor and workers
            raise AssertionError(f"the demo did not stop within {STOP_BOUND_S} s of its Ctrl-C; it printed:\n"
                                 f"{''.join(lines)}"
                                 f"{rest}") from None
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    out = "".join(lines) + rest
    assert p.returncode == 130, out
    assert "demo FAILED: interrupted" in out
    assert not [pid for pid in [sup, *workers] if alive(pid)]
    assert not os.path.exists(f"/dev/shm/{name}")
    assert topic not in _topics(kafka_admin)


_SWALLOWED = """
import os, signal, sys
from shmcache.dev import demo
from shmcache.cli import main


class Bomb:
    def __del__(self):
        os.kill(os.getpid(), signal.SIGTERM)  # the handler runs in here: its KeyboardInterrupt is swallowed


read_back = demo.Demo.read_back


def dropping_a_bomb(self):
    Bomb()  # dropped at once
    print("the SIGTERM was sent", flush=True)
    read_back(self)


demo.Demo.read_back = dropping_a_bomb
sys.exit(main(["demo", *sys.argv[1:]]))
"""


def test_a_stop_swallowed_by_a_finalizer_still_stops_the_demo(kafka_broker, kafka_admin):
    """A SIGTERM whose handler runs inside a __del__ has its KeyboardInterrupt dropped
    ("Exception ignored in"); the demo must still stop at its next wait or step (exit 130,
    everything it started stopped and removed), not run on to "demo passed"."""
    p = subprocess.Popen([sys.executable, "-c", _SWALLOWED, "--entries", "20000", "--bootstrap",
                          kafka_broker.bootstrap], cwd=REPO, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, env=ENV, start_new_session=True)
    try:
        out, _ = p.communicate(timeout=600)
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.communicate()
    assert "the SIGTERM was sent" in out and "Exception ignored in" in out and "KeyboardInterrupt" in out, out
    assert p.returncode == 130, out
    assert "demo FAILED: interrupted" in out and "demo passed" not in out
    run = DemoRun(p.returncode, out)
    assert_nothing_left(run)
    topic = _topic_of(out)
    assert topic not in _topics(kafka_admin) and topic not in _groups(kafka_admin)
