"""The wall clock stepped under a running supervisor (NTP, an operator's `date -s`, a VM
resumed) changes nothing the heartbeats judge: they are CLOCK_MONOTONIC times
(engine/layout.py H_AGE_CLOCK), which a step does not move. Against the real broker, a
real `shmcache run` and real workers.

The supervisor and every process it starts read a wall clock moved by the offset in a
file, read again at each call: a `sitecustomize` on their PYTHONPATH wraps time.time and
time.time_ns, which is where their code (and their log lines) read it, and leaves
time.monotonic alone, as a real step does. The test's own processes and the broker keep
the real clock. Each case checks, in the supervisor's own log times, that the step took
effect. (Stepping CLOCK_REALTIME in C for the whole process instead, by LD_PRELOAD,
also stepped librdkafka's reading of it but not the kernel's timers it waits on, which a
real step moves too: its timed waits then hung. libfaketime has the same gaps, and its
0.9.10 breaks Python's time.sleep besides: wolfcw/libfaketime#426.)

- Set back an hour, then a worker stopped (SIGSTOP): it is still judged stale, named,
  killed and restarted, and the cache is ready again with every entry. With heartbeats
  on the wall clock, its last beat lay an hour in the future: never stale, never killed.
- Set forward ten minutes while a worker is stopped for a moment, well within the bound:
  nobody is killed and the cache stays ready. With heartbeats on the wall clock, its last
  beat was ten minutes old at once: killed.
"""

import contextlib
import datetime
import os
import re

import psutil

from shmtest.supervisors import harness  # noqa: F401
from shmtest.topic_model import Model, check_table, produce_and_wait
from shmtest.waits import poll_until, running

from shmcache.engine.control import layout as C

PARTITIONS = 2
STALE_S = 6.0  # worker_heartbeat_timeout here

SITECUSTOMIZE = """\
import os, time

_path = os.environ["SHMCACHE_TEST_WALL_OFFSET_FILE"]
_time_ns = time.time_ns


def _offset_ns():
    try:
        with open(_path, "rb") as f:
            return int(f.read() or 0) * 1_000_000_000
    except (OSError, ValueError):
        return 0


def time_ns():
    return _time_ns() + _offset_ns()


time.time_ns = time_ns
time.time = lambda: time_ns() / 1e9
"""


class WallClock:
    """The offset of the supervisor's processes' wall clock, by file (atomically replaced)."""

    def __init__(self, tmp_path):
        self.dir = tmp_path / "wallclock"
        self.dir.mkdir()
        (self.dir / "sitecustomize.py").write_text(SITECUSTOMIZE)
        self.path = tmp_path / "wall-offset"
        self.set(0)

    def env(self) -> dict:
        path = os.pathsep.join(p for p in (str(self.dir), os.environ.get("PYTHONPATH", "")) if p)
        return {"PYTHONPATH": path, "SHMCACHE_TEST_WALL_OFFSET_FILE": str(self.path)}

    def set(self, seconds: int) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(f"{seconds:+d}\n")
        os.replace(tmp, self.path)


def _ticks(r, n: int) -> None:
    """Wait for the supervisor to go round its loop n more times (its heartbeat word moves)."""
    seen = [r.control.word(C.H_SUPERVISOR_HEARTBEAT)]

    def moved():
        beat = r.control.word(C.H_SUPERVISOR_HEARTBEAT)
        if beat != seen[-1]:
            seen.append(beat)
        return len(seen) > n

    poll_until(moved, 60, lambda: f"{n} rounds of the supervisor's loop", interval=0.01)


def _log_times(sup, text: str) -> list[datetime.datetime]:
    """The supervisor's log times (its wall clock) of its lines that contain `text`."""
    out = []
    for line in sup.log_text().splitlines():
        m = re.match(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),\d+ ", line)
        if m and text in line:
            out.append(datetime.datetime.strptime(m.group(1), "%Y-%m-%d %H:%M:%S"))
    return out


def _start(harness, kafka_topic, tmp_path, tag: str, seed: int):
    topic = kafka_topic(PARTITIONS)
    model = Model("v1", PARTITIONS, seed=seed)
    produce_and_wait(harness, topic, model, PARTITIONS, rate=1000, max_batches=2 * PARTITIONS)
    clock = WallClock(tmp_path)
    name = harness.cache_name(tag)
    sup = harness.supervisor(name, topic, harness.group(tag), workers=2,
                             config={"worker_heartbeat_timeout": STALE_S}, env=clock.env())
    r = harness.attach(name, sup=sup)
    r.wait_ready(timeout=120)
    first = r.status()["assigned"][0]
    return model, clock, sup, r, first["worker"], psutil.Process(first["worker_pid"])


def test_a_clock_set_back_an_hour_still_lets_a_hung_worker_be_found(harness, kafka_topic, tmp_path):
    model, clock, sup, r, i, victim = _start(harness, kafka_topic, tmp_path, "clockback", 61)
    clock.set(-3600)
    _ticks(r, 2)
    victim.suspend()  # SIGSTOP
    try:
        def stale_named_or_killed():
            # not ready, its partitions' worker named stale; or already killed as stale: that
            # state lasts one supervisor round, which a loaded machine can let this poll miss
            # (seen in a CI run beside another: killed, restarted and ready before a look)
            st = r.status()
            named = not st["ready"] and any((p["worker_down"] or "").startswith("stale")
                                            for p in st["assigned"] if p["worker"] == i)
            return named or st["stale_worker_kills"] >= 1

        poll_until(stale_named_or_killed, 60, lambda: f"worker {i} named stale: {r.status()}", interval=0.01)
        said = f"worker {i} (pid {victim.pid}) was stale"  # logged on the supervisor's round after the death
        kills = poll_until(lambda: _log_times(sup, said), 60,
                           lambda: f"pid {victim.pid} to be killed as stale; supervisor log:\n{sup.log_text()[-3000:]}")
        assert not running(victim)
    finally:
        with contextlib.suppress(psutil.Error):
            victim.resume()
    assert len(kills) == 1, sup.log_text()[-3000:]
    behind = datetime.datetime.now() - kills[0]  # the supervisor's clock was an hour behind when it said so
    assert datetime.timedelta(minutes=59) < behind < datetime.timedelta(minutes=61), (kills, sup.log_text()[-2000:])
    r.wait_ready(timeout=120)
    st = r.status()
    assert st["stale_worker_kills"] == 1 and st["workers"][i]["starts"] == 2, st
    check_table(r, model.snapshot())
    assert sup.terminate() == 0, sup.log_text()[-3000:]


def test_a_clock_set_forward_kills_nobody(harness, kafka_topic, tmp_path):
    model, clock, sup, r, i, victim = _start(harness, kafka_topic, tmp_path, "clockfwd", 62)
    victim.suspend()  # its last beat is from before the step; stopped far shorter than the bound
    try:
        clock.set(600)
        _ticks(r, 3)  # the supervisor judged it after the step, more than once
    finally:
        with contextlib.suppress(psutil.Error):  # (gone if it was killed: the assertions below say so)
            victim.resume()
    _ticks(r, 3)
    st = r.status()
    assert st["stale_worker_kills"] == 0 and [w["starts"] for w in st["workers"]] == [1, 1], st
    assert st["ready"] and victim.is_running(), st
    assert "was stale" not in sup.log_text(), sup.log_text()[-3000:]
    check_table(r, model.snapshot())
    assert sup.terminate() == 0, sup.log_text()[-3000:]
    # the step took effect in the supervisor: what it logged as it stopped is ten minutes ahead
    ahead = _log_times(sup, "")[-1] - datetime.datetime.now()
    assert datetime.timedelta(minutes=9) < ahead < datetime.timedelta(minutes=11), sup.log_text()[-2000:]
