"""An online resize (issue 56): `shmcache resize NAME --memory SIZE` against a cache a live
supervisor serves (engine/resizing.py, consumer/supervisor/resizing.py), on the real broker.

- Grown under ingest: a reader that follows the name in another process looks up every key
  it knows of all along, and never misses one nor reads a wrong value; readiness never
  flaps; the workers are the same processes before and after; every message produced
  before, during and after is in the table, once (the table equals what was sent).
- Shrunk while the rings still hold every live entry: done. Then, on the same daemon,
  refused with one line and nothing changed: a shrink below what the entries need (exit 2,
  saying how many it would hold), no room beside the cache, a size too small for the key
  and value sizes, not a size. No live supervisor, no cache: refused too.
- A supervisor SIGKILLed during a resize: the old cache at the name, whole; the new one's
  half at its hidden name, removed by the next start, which goes on from the cache.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import threading
import urllib.request
import uuid

import numpy as np
import psutil

import shmcache
from shmcache.dev.local_kafka import free_ports
from shmcache.engine import resizing, units
from shmcache.ipc.segment import identity

from shmtest.supervisors import harness  # noqa: F401
from shmtest.topic_model import check_table, produce_entries
from shmtest.waits import applied, assert_no_worker_restarted, poll_until

PARTITIONS = 3
WATCHER = r"""
import json, sys, time
import numpy as np
import shmcache
name, keys_path, stop_path = sys.argv[1:4]
sent = json.load(open(keys_path))
keys = [bytes.fromhex(k) for k in sent]
values = [bytes.fromhex(v) for v in sent.values()]
f = shmcache.follow(name)
out = {"rounds": 0, "misses": 0, "wrong": 0, "not_ready": 0, "sizes": [], "attached": 0}
import os
while not os.path.exists(stop_path):
    r = f.reader()
    out["attached"] += f.attached_now
    size = r.geometry.size
    if not out["sizes"] or out["sizes"][-1] != size:
        out["sizes"].append(size)
    got = r.get_many(keys)
    out["misses"] += sum(g is None for g in got)
    out["wrong"] += sum(g is not None and g != v for g, v in zip(got, values))
    out["not_ready"] += not r.status()["ready"]
    out["rounds"] += 1
print(json.dumps(out))
"""


def _resize(name: str, memory: str, *more: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "shmcache", "resize", name, "--memory", memory, *more],
                          capture_output=True, text=True, timeout=300, stdin=subprocess.DEVNULL)


def _pids(r) -> list[int]:
    return sorted(w["pid"] for w in r.status()["workers"])


def test_a_cache_grows_and_shrinks_online_under_ingest_with_no_miss_and_no_flap(harness, kafka_topic, tmp_path):
    topic = kafka_topic(PARTITIONS)
    rng = np.random.default_rng(56)
    sent = produce_entries(harness.bootstrap, topic, {p: 3000 for p in range(PARTITIONS)}, rng)
    name = harness.cache_name("resize")
    (port,) = free_ports(1)
    sup = harness.supervisor(name, topic, harness.group("resize"), memory="64MiB", config={"metrics_port": port},
                             args=("--max-value", "96"))
    r = harness.attach(name, sup=sup)
    r.wait_ready(timeout=120)
    check_table(r, sent)
    pids = _pids(r)
    before, larger = r.geometry.size, resizing.plan(r, 128 << 20).size

    (tmp_path / "keys.json").write_text(json.dumps({k.hex(): v.hex() for k, v in sent.items()}))
    stop = tmp_path / "stop"
    hits = r.stats()["reader_hits"]
    log_path = tmp_path / "watcher.out"
    watcher = subprocess.Popen([sys.executable, "-c", WATCHER, name, str(tmp_path / "keys.json"), str(stop)],
                               stdout=open(log_path, "w"), stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
    more: dict[bytes, bytes] = {}
    ingest_stop = threading.Event()

    def ingest():
        g = np.random.default_rng(57)
        while not ingest_stop.is_set():
            more.update(produce_entries(harness.bootstrap, topic, {p: 50 for p in range(PARTITIONS)}, g))

    t = threading.Thread(target=ingest, daemon=True)
    try:
        poll_until(lambda: r.stats()["reader_hits"] >= hits + len(sent) or watcher.poll() is not None, 60,
                   "the watcher's first round of lookups")
        t.start()
        grown = _resize(name, "128MiB")
        assert grown.returncode == 0, grown.stderr
        assert grown.stdout.startswith(f"resized {name} from {units.format_bytes(before)} to "
                                       f"{units.format_bytes(larger)}: "), grown.stdout
        shrunk = _resize(name, "64MiB", "--json")
        assert shrunk.returncode == 0, shrunk.stderr
        out = json.loads(shrunk.stdout)
        assert out["resized"] and out["from"] > out["size"] == before and out["entries"] >= len(sent), out
    finally:
        ingest_stop.set()
        t.join(60)
        stop.write_text("")
        try:
            watcher.wait(60)
        finally:
            if watcher.poll() is None:
                watcher.kill()
    assert watcher.returncode == 0, log_path.read_text()
    seen = json.loads(log_path.read_text().strip().splitlines()[-1])
    assert seen["misses"] == 0 and seen["wrong"] == 0 and seen["not_ready"] == 0, seen
    assert seen["rounds"] > 10 and len(seen["sizes"]) == 3 and seen["sizes"][0] == seen["sizes"][2] == before, seen

    expected = PARTITIONS * 3000 + len(more)  # one message an entry
    with shmcache.follow(name).reader() as now:
        poll_until(lambda: sum(applied(now, PARTITIONS)) >= expected, 120, "every message applied")
    with shmcache.attach(name) as now:  # the segment at the name now: the third
        assert sum(applied(now, PARTITIONS)) == expected  # every message applied, once each
        st = now.status()
        assert st["ready"] and now.geometry.size == before, st["why"]
        assert _pids(now) == pids  # the same worker processes: nothing restarted
        assert_no_worker_restarted(now)
        last = now.control.resize()
        assert last["resizes"] == 2 and last["last_resize"]["from"] > before and last["resize_asked"] == 0, last
        check_table(now, {**sent, **more})
    assert not os.path.exists(resizing.path_beside(name))
    log = sup.log_text()
    assert log.count(f"cache {name!r}: resized from ") == 2, log[-3000:]
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=20).read().decode()
    assert f'shmcache_resizes_total{{cache="{name}"}} 2.0' in text, text
    assert f'shmcache_segment_bytes{{cache="{name}"}} {float(before):.7e}' in text, text

    # refused, with one line, and nothing changes: rings too small for the live entries (3 MiB
    # rings hold one such record a bucket), no room beside it, too small for the key and value
    # sizes, not a size; the same size says so
    was = identity(name)
    small = _resize(name, "3MiB")
    assert small.returncode == 2 and small.stdout == "", small
    line = small.stderr.strip()
    assert "\n" not in line and re.fullmatch(rf"shmcache: cache {name!r}: resize to 2\.9 MiB refused: a cache of "
                                             r"2\.9 MiB holds [\d,]+ of its [\d,]+ live entries \(.*\): ask for more",
                                             line), line
    huge = _resize(name, "100TiB")
    assert huge.returncode == 2 and "no room for a 100.0 TiB segment beside it" in huge.stderr, huge.stderr
    tiny = _resize(name, "1MiB")
    assert tiny.returncode == 2 and "memory=1.0 MiB is too small for 8192 buckets" in tiny.stderr, tiny.stderr
    bad = _resize(name, "lots")
    assert bad.returncode == 2 and "--memory" in bad.stderr, bad.stderr
    same = _resize(name, "64MiB")
    assert same.returncode == 0 and same.stdout.strip() == f"{name} is {units.format_bytes(before)} already", same
    assert identity(name) == was and not os.path.exists(resizing.path_beside(name))
    with shmcache.attach(name) as now:
        check_table(now, {**sent, **more})
        assert now.status()["ready"] and now.control.resize()["resizes"] == 2


def test_a_cache_no_supervisor_serves_is_not_resized(tmp_path):
    name = f"t-rnosup-{uuid.uuid4().hex[:8]}"
    with shmcache.create(name, memory="64MiB") as w:
        w.set(b"k" * 32, b"v")
    try:
        p = _resize(name, "128MiB")
        assert p.returncode == 2 and p.stderr.strip() == (
            f"shmcache: cache {name!r}: no live supervisor serves it (`shmcache run` resizes the cache it serves; a "
            "cache nobody fills is made again at the size wanted)"), p.stderr
        missing = _resize(f"{name}-none", "128MiB")
        assert missing.returncode == 2 and "does not exist" in missing.stderr, missing.stderr
    finally:
        shmcache.destroy(name)


def test_a_supervisor_killed_during_a_resize_leaves_the_old_cache_whole(harness, kafka_topic):
    topic = kafka_topic(PARTITIONS)
    sent = produce_entries(harness.bootstrap, topic, {p: 2000 for p in range(PARTITIONS)}, np.random.default_rng(59))
    name = harness.cache_name("rkill")
    sup = harness.supervisor(name, topic, harness.group("rkill"), memory="64MiB")
    r = harness.attach(name, sup=sup)
    r.wait_ready(timeout=120)
    was = identity(name)
    inner = psutil.Process(sup.proc.pid)
    workers = [psutil.Process(w["pid"]) for w in r.status()["workers"]]
    for w in workers:
        w.suspend()  # the resize waits for them to hold (drain_timeout, 30 s): its new segment is made by then
    cmd = subprocess.Popen([sys.executable, "-m", "shmcache", "resize", name, "--memory", "256MiB"],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
    try:
        poll_until(lambda: os.path.exists(resizing.path_beside(name)) or cmd.poll() is not None, 120,
                   "the resize's new segment to be made")
        inner.kill()  # waiting for its workers to hold: after the new segment, before any copy or swap
        out, err = cmd.communicate(timeout=120)
    finally:
        for w in workers:
            w.resume()  # orphaned: they exit
        if cmd.poll() is None:
            cmd.kill()
    assert cmd.returncode == 2 and "its supervisor stopped during the resize" in err, (out, err)
    assert identity(name) == was and os.path.exists(resizing.path_beside(name))
    check_table(r, sent)  # the old cache, whole
    poll_until(lambda: all(not w["alive"] for w in r.status()["workers"]), 60, "the orphaned workers to exit")

    sup2 = harness.supervisor(name, topic, harness.group("rkill"), memory="64MiB")
    r.wait_ready(timeout=120)
    assert not os.path.exists(resizing.path_beside(name))
    assert "the new segment of a resize whose supervisor stopped" in sup2.log_text()
    more = produce_entries(harness.bootstrap, topic, {0: 10}, np.random.default_rng(60))
    poll_until(lambda: sum(applied(r, PARTITIONS)) == PARTITIONS * 2000 + 10, 60, "the new messages applied")
    check_table(r, {**sent, **more})


def test_a_cache_grows_by_itself_up_to_memory_max_while_its_entries_are_evicted_young(harness, kafka_topic):
    """run --memory 3MiB --memory-max 12MiB --grow-below 86400: waves of 20,000 entries evict, at
    each size short of the ceiling, entries that by the rule's estimate (live entries / evictions a
    second) lived well under a day, so the cache grows, 2x a time, up to the ceiling and never
    past it; at the ceiling a wave that fits is all there."""
    topic = kafka_topic(1)
    name = harness.cache_name("grow")
    sup = harness.supervisor(name, topic, harness.group("grow"), memory="3MiB", workers=1,
                             args=("--max-value", "96", "--memory-max", "12MiB", "--grow-below", "86400"))
    r = harness.attach(name, sup=sup)
    r.wait_ready(timeout=120)
    ceiling = resizing.plan(r, 12 << 20).size
    follow = shmcache.follow(name)
    rng = np.random.default_rng(61)
    sizes = [follow.reader().geometry.size]
    total = 0
    for _ in range(8):
        done = follow.reader().control.resize()["resizes"]
        produce_entries(harness.bootstrap, topic, {0: 20_000}, rng)
        total += 20_000
        poll_until(lambda: applied(follow.reader(), 1)[0] >= total, 60, "the wave applied")
        if follow.reader().stats()["evictions"]:  # it evicted young entries: a growth comes
            poll_until(lambda: follow.reader().control.resize()["resizes"] > done, 60,
                       lambda: f"a growth after {follow.reader().stats()['evictions']} evictions:\n"
                               f"{sup.log_text()[-2000:]}")
            sizes.append(follow.reader().geometry.size)
        if sizes[-1] >= ceiling:
            break
    assert sizes == sorted(sizes) and sizes[0] < sizes[-1] == ceiling, sizes
    assert follow.reader().control.resize()["resizes"] >= 2  # 2x a time: 2.9 MiB, 5.8 MiB, then the ceiling
    last = produce_entries(harness.bootstrap, topic, {0: 5000}, rng)
    poll_until(lambda: applied(follow.reader(), 1)[0] >= total + 5000, 60, "the last wave applied")
    got = follow.reader().get_many(list(last))  # at the ceiling: the newest entries are all there (older ones
    assert got == list(last.values())            # may be evicted: a full bucket evicts its oldest first)
    assert follow.reader().geometry.size == ceiling
    log = sup.log_text()
    assert "entries are evicted" in log and "under grow_below (86400 s): growing from 2.9 MiB to" in log, log[-3000:]
    follow.close()
