"""Warm restart from snapshots, end to end: a real broker, real `shmcache run`,
`shmcache snapshot` and `shmcache restore` processes (consumer/supervisor/snapshot_policy.py)."""

from __future__ import annotations

import json
import logging
import os
import signal
import struct
import subprocess
import sys
import threading
import time
import uuid

import pytest
import xxhash

import shmcache
from shmcache.consumer.supervisor import snapshot_dir as snapdir
from shmcache.consumer.supervisor import snapshot_policy as policy
from shmcache.consumer.config import RunConfig
from shmcache.engine.control import layout as C
from shmcache.snapshots import writing as snapshot_io
from shmcache import snapshots as S
from shmcache.errors import SnapshotCorruptError
from shmcache.snapshots.format import HEAD, MAGIC

from shmtest.supervisors import harness  # noqa: F401
from shmtest.topic_model import KafkaProbe, Model, check_table, produce_and_wait
from shmtest.waits import applied, poll_until, wait_applied

PARTS = 3


def _cli(*args, timeout: float = 300) -> str:
    out = subprocess.run([sys.executable, "-m", "shmcache", *map(str, args)], capture_output=True, text=True,
                         timeout=timeout)
    assert out.returncode == 0, out.stderr
    return out.stdout


def _messages(r) -> int:
    """Kafka messages the workers of the current supervisor applied (their rows start at 0)."""
    return sum(w["messages"] for w in r.status()["workers"])


def _ready(h, r, sup, timeout: float = 120):
    poll_until(lambda: sup.check_running() and r.status()["ready"], timeout,
               lambda: f"ready: {r.status()}\n{sup.log_text()[-3000:]}")


def test_snapshot_of_a_live_cache_restores_and_replays_to_the_model(harness, kafka_topic):
    """A snapshot taken while the producer and the supervisor run at full speed, restored
    into a new cache that a new supervisor then fills from the snapshot's offsets: the
    same table as the model's and the live cache's, once both caught up."""
    h = harness
    topic = kafka_topic(PARTS)
    model = Model("v1", PARTS, seed=11)
    name = h.cache_name("live")
    sup = h.supervisor(name, topic, h.group("live"))
    r = h.attach(name, sup=sup)
    prod = h.producer(topic, model, rate=1000.0, batch_kw={"n_new": 60, "n_update": 10, "n_delete": 10})
    prod.start()
    poll_until(lambda: _messages(r) > 200, 120, "the live cache to apply 200 messages")
    path = h.tmp_path / "live.snap"
    info = json.loads(_cli("snapshot", name, path, "--json"))
    prod.finish()
    assert info["entries"] > 0 and len(info["offsets"]) == PARTS
    probe = KafkaProbe(h.bootstrap, topic, PARTS)
    ends = probe.end_offsets()
    probe.close()
    assert sum(ends) > sum(info["offsets"])  # messages came after the snapshot's offsets
    copy = h.cache_name("copy")
    out = json.loads(_cli("restore", path, copy, "--json"))
    assert out["mode"] == "copy" and out["snapshot"]["offsets"] == info["offsets"]
    with shmcache.attach(copy) as c:
        assert applied(c, PARTS) == info["offsets"]
    sup2 = h.supervisor(copy, topic, h.group("copy"))
    r2 = h.attach(copy, sup=sup2)
    wait_applied(r, ends, 120, sup)
    wait_applied(r2, ends, 120, sup2)
    expected = model.snapshot()
    check_table(r, expected)
    check_table(r2, expected)
    assert r2.status()["restore"]["state"] == "restored"
    assert _messages(r2) == sum(e - o for e, o in zip(ends, info["offsets"]))  # resumed at the offsets


def _rewrite_topic(src, dst, topic: str) -> None:
    """A whole, valid snapshot of another topic: the header's topic changed, its checksum made anew."""
    data = open(src, "rb").read()
    magic, version, n = HEAD.unpack_from(data)
    head = json.loads(data[HEAD.size:HEAD.size + n])
    head["topic"] = topic
    raw = json.dumps(head, separators=(",", ":")).encode()
    out = HEAD.pack(magic, version, len(raw)) + raw + struct.pack("<Q", xxhash.xxh3_64_intdigest(raw))
    open(dst, "wb").write(out + data[HEAD.size + n + 8:])


def _fill_stop_remove(h, name: str, topic: str, group: str, model, batches: int, args) -> list[int]:
    """Run a supervisor, produce `batches` batches, wait until applied, stop it cleanly (it
    writes a snapshot), remove the segment (the reboot); returns the topic's end offsets."""
    sup = h.supervisor(name, topic, group, args=args)
    r = h.attach(name, sup=sup)
    ends = produce_and_wait(h, topic, model, PARTS, rate=200.0, max_batches=batches)
    wait_applied(r, ends, 120, sup)
    assert sup.terminate() == 0
    r.close()
    h.readers.remove(r)
    shmcache.destroy(name)
    return ends


def test_reboot_restores_from_the_newest_valid_snapshot(harness, kafka_topic):
    """The reboot: stop everything, remove the segment, `shmcache run --snapshot-dir` again:
    newer snapshots that are damaged (a flipped byte, truncated) or of another topic are
    skipped by name, the valid one is restored, and the supervisor is ready having fetched
    only the messages that came after it; the table equals the model."""
    h = harness
    topic = kafka_topic(PARTS)
    model = Model("v1", PARTS, seed=12)
    name = h.cache_name("boot")
    group = h.group("boot")
    snaps = h.tmp_path / "snaps"
    args = ("--snapshot-dir", str(snaps), "--snapshot-interval", "3600", "--snapshot-keep", "2")
    first = _fill_stop_remove(h, name, topic, group, model, 300, args)
    (good,) = snapdir.files(snaps, name)  # written at the clean stop
    assert S.verify(good).offsets == tuple(first)
    newer = [snapdir.path_for(snaps, name, S.read_header(good).taken_ns + i) for i in (1, 2, 3)]
    data = good.read_bytes()
    flipped = bytearray(data)
    flipped[len(data) // 2] ^= 1
    newer[0].write_bytes(bytes(flipped))
    newer[1].write_bytes(data[:len(data) // 3])
    _rewrite_topic(good, newer[2], "another-topic")
    ends = produce_and_wait(h, topic, model, PARTS, rate=200.0, max_batches=40)
    sup2 = h.supervisor(name, topic, group, args=args)
    r2 = h.attach(name, sup=sup2)
    _ready(h, r2, sup2)
    check_table(r2, model.snapshot())
    st = r2.status()
    assert st["restore"]["state"] == "restored" and st["restore"]["entries"] > 0
    assert _messages(r2) == sum(ends) - sum(first)  # only what came after the snapshot was fetched
    logs = sup2.log_text()
    assert "SnapshotCorruptError" in logs and "SnapshotMismatchError" in logs, logs[-3000:]
    assert st["gap_partitions"] == []


def test_retention_snapshot_keeps_deleted_records_and_gap_is_reported(harness, kafka_topic, kafka_admin):
    """Records deleted from the topic's start after a snapshot (AdminClient.delete_records):
    the cache restored from the snapshot still holds them, has no gap and is ready; a
    cache filled without a snapshot lacks them, its status names the gap, and it is caught
    up but never ready (ready promises the whole topic) until a supervisor started with
    --accept-gaps serves it as it is; the gap stays on record across that restart."""
    from confluent_kafka import TopicPartition

    h = harness
    topic = kafka_topic(PARTS)
    model = Model("v1", PARTS, seed=13)
    name = h.cache_name("ret")
    snaps = h.tmp_path / "snaps"
    args = ("--snapshot-dir", str(snaps), "--snapshot-interval", "3600")
    ends = _fill_stop_remove(h, name, topic, h.group("ret"), model, 90, args)
    assert len(snapdir.files(snaps, name)) == 1
    futures = kafka_admin.delete_records([TopicPartition(topic, p, ends[p]) for p in range(PARTS)])
    for f in futures.values():
        f.result(timeout=30)
    sup2 = h.supervisor(name, topic, h.group("ret2"), args=args)
    r2 = h.attach(name, sup=sup2)
    _ready(h, r2, sup2)
    check_table(r2, model.snapshot())  # everything, though the topic no longer has it
    assert r2.status()["gap_partitions"] == []
    bare = h.cache_name("bare")
    bare_snaps = h.tmp_path / "bare-snaps"  # empty: nothing to restore; periodic snapshots, 2 kept
    sup3 = h.supervisor(bare, topic, h.group("bare"),
                        args=("--snapshot-dir", str(bare_snaps), "--snapshot-interval", "0.5", "--snapshot-keep", "2"))
    r3 = h.attach(bare, sup=sup3)
    # caught up (snapshots are taken of a caught-up table, gap or not), but not ready
    # 3 taken, 2 kept (a 4th may be named at any moment: the count and the files are read
    # together until they agree, which they never do if the oldest are not removed)
    poll_until(lambda: sup3.check_running() and r3.status()["snapshot"]["count"] >= 3
               and len(snapdir.files(bare_snaps, bare)) <= 2, 120,
               lambda: f"3 snapshots, 2 kept: {r3.status()}, {snapdir.files(bare_snaps, bare)}")
    st = r3.status()
    assert st["caught_up"] and not st["ready"] and not st["gaps_accepted"], st
    assert st["restore"]["state"] == "no valid snapshot" and st["snapshot"]["failures"] == 0
    gaps = [p for p in range(PARTS) if ends[p] > 0]
    assert gaps and st["gap_partitions"] == gaps
    assert st["gap_offsets"] == sum(ends)
    assert all(p["gap"] == (ends[p["partition"]] > 0) for p in st["assigned"])
    assert r3.stats()["entries"] == 0
    with pytest.raises(shmcache.CacheNotReadyError, match="retention gap.*--accept-gaps"):
        r3.wait_ready(timeout=0)
    status_text = _cli("status", bare)
    assert "retention gap" in status_text and "not ready until" in status_text
    # the operator's word: served as it is; the gap stays on record in the segment
    assert sup3.terminate() == 0
    sup4 = h.supervisor(bare, topic, h.group("bare"), args=("--accept-gaps",))
    _ready(h, r3, sup4)
    st = r3.status()
    assert st["gaps_accepted"] and st["gap_partitions"] == gaps and st["gap_offsets"] == sum(ends), st
    assert r3.wait_ready(timeout=0)["ready"]
    assert "served as it is" in _cli("status", bare)


def test_sigkill_during_a_periodic_snapshot_keeps_the_previous_one(harness, kafka_topic):
    """The supervisor SIGKILLed while its periodic snapshot is being written (slowed by
    --snapshot-rate so that the kill lands mid-file): the previous snapshot is intact,
    byte for byte; the .tmp left behind is never taken for a snapshot (not listed,
    refused by name); the next start on a lost segment restores the previous snapshot,
    removes the .tmp and resumes from that snapshot's offsets to the model's table."""
    h = harness
    topic = kafka_topic(PARTS)
    model = Model("v1", PARTS, seed=14)
    name = h.cache_name("kill")
    group = h.group("kill")
    snaps = h.tmp_path / "snaps"
    args = ("--snapshot-dir", str(snaps), "--snapshot-interval", "3600")
    first = _fill_stop_remove(h, name, topic, group, model, 120, args)
    (previous,) = snapdir.files(snaps, name)  # written at the clean stop
    before = previous.read_bytes()
    slow = ("--snapshot-dir", str(snaps), "--snapshot-interval", "0.2", "--snapshot-rate", "1MiB")
    sup = h.supervisor(name, topic, group, args=slow)
    r = h.attach(name, sup=sup)
    _ready(h, r, sup)

    def tmps():
        return [p for p in snaps.glob(f"{name}-*.snap.*.tmp") if p.stat().st_size > 0]

    poll_until(lambda: sup.check_running() and tmps(), 120, "the periodic snapshot's .tmp to be written")
    sup.signal(signal.SIGKILL)
    assert sup.wait(30) == -signal.SIGKILL
    sup.kill()  # and its workers, as a machine that went down would
    (tmp,) = tmps()
    assert previous.read_bytes() == before
    assert snapdir.files(snaps, name) == [previous]
    assert S.verify(previous).offsets == tuple(first)
    with pytest.raises(SnapshotCorruptError, match=r"\.tmp"):
        S.verify(tmp)
    r.close()
    h.readers.remove(r)
    shmcache.destroy(name)  # the reboot
    ends = produce_and_wait(h, topic, model, PARTS, rate=200.0, max_batches=30)
    sup2 = h.supervisor(name, topic, group, args=args)
    r2 = h.attach(name, sup=sup2)
    wait_applied(r2, ends, 120, sup2)
    check_table(r2, model.snapshot())
    st = r2.status()
    assert st["restore"]["state"] == "restored"
    assert _messages(r2) == sum(ends) - sum(first)  # resumed at the previous snapshot's offsets
    assert not tmp.exists()  # removed at start, never read


STOP_TIMEOUT = 10.0  # --stop-timeout of the test below
STOP_MARGIN = 20.0  # what a noisy, shared machine may add to it (the bound is the product's promise)


def test_a_stop_abandons_a_slow_periodic_snapshot_and_takes_its_own(harness, kafka_topic):
    """SIGTERM while a periodic snapshot is being written at a rate that needs about a minute
    for it (17 MB at 256KiB/s), with --stop-timeout 10: the stop tells it to give up as
    it begins, so the supervisor exits 0 within the budget (plus a margin for a noisy
    machine) instead of waiting for it; the abandoned snapshot leaves no .tmp, says so in
    one log line and is not counted as a failure; the previous snapshot stays byte for
    byte, and the clean stop's own snapshot, of the final offsets, restores to the model."""
    h = harness
    topic = kafka_topic(PARTS)
    model = Model("v1", PARTS, seed=16)
    name = h.cache_name("slowstop")
    group = h.group("slowstop")
    snaps = h.tmp_path / "snaps"
    sup = h.supervisor(name, topic, group, args=("--snapshot-dir", str(snaps), "--snapshot-interval", "3600"))
    r = h.attach(name, sup=sup)
    ends = produce_and_wait(h, topic, model, PARTS, rate=200.0, max_batches=60)
    wait_applied(r, ends, 120, sup)
    assert sup.terminate() == 0, sup.log_text()[-3000:]
    (previous,) = snapdir.files(snaps, name)  # written at that clean stop
    before = previous.read_bytes()
    slow = ("--snapshot-dir", str(snaps), "--snapshot-interval", "0.2", "--snapshot-rate", "256KiB",
            "--stop-timeout", str(STOP_TIMEOUT))
    sup2 = h.supervisor(name, topic, group, args=slow)  # on the same segment: no restore
    ends = produce_and_wait(h, topic, model, PARTS, rate=200.0, max_batches=30)
    wait_applied(r, ends, 120, sup2)

    def tmps():
        return sorted(snaps.glob(f"{name}-*.snap.*.tmp"))

    poll_until(lambda: sup2.check_running() and tmps(), 120, "a periodic snapshot's .tmp to be written")
    t0 = time.monotonic()
    sup2.signal(signal.SIGTERM)
    code = sup2.wait(STOP_TIMEOUT + STOP_MARGIN)
    took = time.monotonic() - t0
    logs = sup2.log_text()
    assert code == 0, f"exit {code} after {took:.1f} s (stop_timeout {STOP_TIMEOUT:g} s):\n{logs[-3000:]}"
    sup2.reap_children(10)
    print(f"stop with a periodic snapshot being written: exit 0 after {took:.2f} s")
    assert tmps() == []
    assert logs.count("periodic snapshot abandoned: the supervisor stops") == 1, logs[-3000:]
    assert "Traceback" not in logs and "did not give up" not in logs, logs[-3000:]
    st = r.status()
    assert st["snapshot"]["failures"] == 0, st["snapshot"]
    newest, *older = snapdir.files(snaps, name)
    assert older == [previous] and previous.read_bytes() == before
    assert S.verify(newest).offsets == tuple(ends) == tuple(applied(r, PARTS))  # the clean stop's, offsets final
    copy = h.cache_name("slowstop-copy")
    out = json.loads(_cli("restore", newest, copy, "--json"))
    assert out["snapshot"]["offsets"] == ends
    with shmcache.attach(copy) as c:
        check_table(c, model.snapshot())


@pytest.mark.parametrize("where", ["a file", "under a file", "removed after the start", "a full disk"])
def test_a_snapshot_that_cannot_be_written_is_counted_and_raises_nothing(tmp_path, small_fs, where):
    """The supervisor's snapshots (SnapshotPolicy, on a real cache) where they cannot be
    written. A snapshot dir that is a regular file, or lies under one (it cannot be made),
    is refused at the start (ValueError, exit 2 at the command line). One removed after the
    start (the supervisor holds the directory it checked, not its name), or whose disk is
    full (a small tmpfs of the test's own): take() returns None and counts a failure;
    at_stop after a clean stop (what the supervisor's shutdown calls) raises nothing and
    counts one more; no temporary file is left, the previous snapshot stays."""
    name = f"t-snapfail-{uuid.uuid4().hex[:8]}"
    previous = None
    if where == "a full disk":
        snaps = small_fs(64 << 10)
        previous = snapdir.path_for(snaps, name, 1)
        previous.write_bytes(MAGIC + b" an older one")
    elif where == "removed after the start":
        snaps = tmp_path / "snaps"
    else:
        (tmp_path / "afile").write_text("a file\n")
        snaps = tmp_path / "afile" if where == "a file" else tmp_path / "afile" / "snaps"
    cfg = RunConfig(name=name, bootstrap="127.0.0.1:1", topic="t", snapshot_dir=str(snaps), snapshot_interval=1)
    if where in ("a file", "under a file"):
        with pytest.raises(ValueError, match=f"snapshot_dir {snaps}: "):
            policy.SnapshotPolicy(cfg)
        assert (tmp_path / "afile").read_text() == "a file\n" and os.listdir(tmp_path) == ["afile"]
        return
    try:
        with shmcache.create(name, memory="40MiB") as w:
            w.set(b"k" * 32, b"v")
            pol = policy.SnapshotPolicy(cfg)
            pol.opened(w, False)
            if where == "removed after the start":
                snaps.rmdir()
            assert pol.take() is None
            assert w.control.word(C.H_SNAPSHOT_FAILURES) == 1
            assert pol.at_stop(clean=True, wait=5)
            assert w.control.word(C.H_SNAPSHOT_FAILURES) == 2 and w.control.word(C.H_SNAPSHOTS) == 0
    finally:
        shmcache.destroy(name, force=True)
    if where == "a full disk":
        assert os.listdir(snaps) == [previous.name]
    else:
        assert not snaps.exists() and os.listdir(tmp_path) == []


def test_a_periodic_snapshot_that_does_not_give_up_keeps_the_cache_mapped(tmp_path, monkeypatch, caplog):
    """A periodic snapshot stuck where its cancel cannot reach it (a write to a hung disk;
    here a snapshot.write that blocks until released): at_stop waits only the bound it is
    given, logs a warning, takes no snapshot and returns False, which tells the supervisor
    to leave the cache mapped until the process exits; once the write returns (abandoned),
    the thread ends, nothing counted as a failure."""
    name = f"t-snapstuck-{uuid.uuid4().hex[:8]}"
    cfg = RunConfig(name=name, bootstrap="127.0.0.1:1", topic="t", snapshot_dir=str(tmp_path), snapshot_interval=0.01)
    entered, disk = threading.Event(), threading.Event()

    def hung_write(handle, path, *, cancel, **kw):
        entered.set()
        disk.wait()  # the disk answers only when the test says so; the cancel is not looked at meanwhile
        raise snapshot_io.cancelled(str(path))  # what the write does at its next look at the cancel

    monkeypatch.setattr(S, "write", hung_write)
    caplog.set_level(logging.INFO, logger="shmcache.snapshots")
    try:
        with shmcache.create(name, memory="40MiB") as w:
            w.set(b"k" * 32, b"v")
            pol = policy.SnapshotPolicy(cfg)
            pol.opened(w, False)
            poll_until(lambda: pol.tick(lambda: True) or entered.is_set(), 30, "the periodic snapshot to start")
            pol.stopping()
            t0 = time.monotonic()
            assert pol.at_stop(clean=True, wait=0.2) is False
            assert time.monotonic() - t0 < 5
            assert "did not give up" in caplog.text and "abandoned" not in caplog.text
            disk.set()
            assert pol.at_stop(clean=False, wait=30) is True  # the thread ended
            assert "periodic snapshot abandoned: the supervisor stops" in caplog.text
            assert w.control.word(C.H_SNAPSHOT_FAILURES) == 0 and w.control.word(C.H_SNAPSHOTS) == 0
    finally:
        disk.set()
        shmcache.destroy(name, force=True)
    assert os.listdir(tmp_path) == []


def test_snapshots_to_a_full_disk_are_counted_and_the_supervisor_carries_on(harness, kafka_topic, small_fs):
    """`shmcache run --snapshot-dir` on a disk too small for a snapshot (a small tmpfs of
    the test's own): each periodic snapshot fails, is counted, leaves no temporary file,
    and the next one is tried; the supervisor goes on applying; a clean stop exits 0
    having made its final commit (and counted its final snapshot's failure)."""
    h = harness
    topic = kafka_topic(PARTS)
    model = Model("v1", PARTS, seed=15)
    name = h.cache_name("full")
    group = h.group("full")
    snaps = small_fs(64 << 10)
    sup = h.supervisor(name, topic, group, args=("--snapshot-dir", str(snaps), "--snapshot-interval", "0.2"))
    r = h.attach(name, sup=sup)
    ends = produce_and_wait(h, topic, model, PARTS, rate=200.0, max_batches=60)
    wait_applied(r, ends, 120, sup)
    poll_until(lambda: sup.check_running() and r.status()["snapshot"]["failures"] >= 2, 120,
               lambda: f"2 failed snapshots counted: {r.status()['snapshot']}\n{sup.log_text()[-3000:]}")
    assert [p for p in os.listdir(snaps) if not p.endswith(".tmp")] == []
    ends = produce_and_wait(h, topic, model, PARTS, rate=200.0, max_batches=20)  # it still applies what comes
    wait_applied(r, ends, 120, sup)
    failures = r.status()["snapshot"]["failures"]
    assert sup.terminate() == 0, sup.log_text()[-3000:]
    probe = KafkaProbe(h.bootstrap, topic, PARTS, group=group)
    try:
        assert probe.committed() == ends  # the final commit was made
    finally:
        probe.close()
    st = r.status()
    assert st["snapshot"]["failures"] >= failures + 1 and st["snapshot"]["count"] == 0  # the one at the stop
    assert os.listdir(snaps) == []
    check_table(r, model.snapshot())
    logs = sup.log_text()
    assert "No space left on device" in logs and "Traceback" not in logs, logs[-3000:]
