"""Snapshots (snapshots/) with real processes: copied under full-speed writers
without a torn bucket, restored by copy and by re-insert, damaged files refused by
name, and a snapshot writer killed mid-write leaves the previous snapshot whole."""

from __future__ import annotations

import errno
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

import shmcache
from shmcache.consumer.supervisor import snapshot_dir as snapdir
from shmcache.consumer.supervisor import snapshot_policy as policy
from shmcache.consumer.config import RunConfig
from shmcache.engine.control import layout as C
from shmcache import snapshots as S
from shmcache.snapshots.writing import SnapshotOut
from shmcache.errors import SnapshotCancelled, SnapshotCorruptError, SnapshotError
from shmcache.ipc.segment import path_of

from shmtest.procs import check_table, universe, verify


def _tmps(d) -> list[Path]:
    """The temporary files of snapshots being written (or left) in directory d."""
    return sorted(Path(d).glob("*.tmp"))


def _size(p) -> int:
    try:
        return os.path.getsize(p)
    except FileNotFoundError:  # renamed or removed since it was listed
        return 0


def _fill(w, n: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    w.set_many(rng.integers(0, 256, (n, 32), np.uint8), [bytes(100)] * n)


def _check_restored(name: str, keys, hdr) -> int:
    """The restored table keeps every invariant and every value it holds is whole; returns its entries."""
    with shmcache.attach(name) as r:
        entries = check_table(r)["entries"]
        found = 0
        for i in range(0, len(keys), 50_000):
            packed = r.get_many_packed(keys[i:i + 50_000])
            nbad, _, problem = verify(packed, hdr[i:i + 50_000])
            assert nbad == 0, problem
            found += int(packed.found.sum())
        assert found == entries == r.stats()["entries"]
        return entries


@pytest.mark.slow  # a long run: snapshots taken under full-speed writers for seconds
def test_snapshot_under_full_speed_writers_is_never_torn(cache_name, procs, tmp_path):
    """Two writers set keys at full speed (hot buckets evicting under them) while snapshots
    are taken: each snapshot restores, by copy and by re-insert into a smaller table, to a
    table whose every bucket is one a writer left (invariants hold, every value whole)."""
    seed, nkeys = 7, 60_000
    shmcache.create(cache_name, memory="48MiB").close()
    writers = [procs("writer", cache_name, seed, nkeys, wid, 4.0, 1000) for wid in (1, 2)]
    with shmcache.attach(cache_name) as r:  # compile the copy kernel before the writers' clock starts
        S.write(r, tmp_path / "warm.snap")
    for p in writers:
        assert "ready" in p.recv(120)
    for p in writers:
        p.send("go")
    keys, hdr = universe(seed, nkeys)
    taken = []
    with shmcache.attach(cache_name) as r:
        while not any(p.p.poll() is not None for p in writers) and len(taken) < 40:
            taken.append(S.write(r, tmp_path / f"s{len(taken)}.snap"))
            if writers[0]._q.qsize():  # a writer said it is done
                break
    sets = [p.recv(60)["sets"] for p in writers]
    assert all(s > 0 for s in sets) and len(taken) >= 2
    for i, info in enumerate(taken):
        # every snapshot by copy (the table as copied); the last two also re-inserted into a smaller table
        for memory, mode in ((None, "copy"), ("40MiB", "re-insert"))[:1 if i < len(taken) - 2 else 2]:
            name = f"{cache_name}-r{i}{mode[0]}"
            try:
                out = S.restore(info.path, name, memory=memory)
                assert out["mode"] == mode
                n = _check_restored(name, keys, hdr)
                assert n == out["entries"] > 0
            finally:
                if shmcache.exists(name):
                    shmcache.destroy(name)
        os.unlink(info.path)


def _flip(path, offset: int, dst) -> None:
    data = bytearray(open(path, "rb").read())
    data[offset] ^= 0x40
    open(dst, "wb").write(bytes(data))


def test_damaged_snapshots_are_refused_by_name(cache_name, tmp_path):
    """Truncated anywhere, a byte flipped in the header, a chunk or the trailer, a .tmp:
    SnapshotCorruptError naming the file, and no cache is left behind by a failed restore."""
    with shmcache.create(cache_name, memory="40MiB") as w:
        rng = np.random.default_rng(3)
        keys = rng.integers(0, 256, (20_000, 32), np.uint8)
        w.set_many(keys, [bytes(100)] * len(keys))
        good = S.write(w, tmp_path / "good.snap")
    size = os.path.getsize(good.path)
    assert size == good.bytes
    bad = []
    for cut in (5, 40, size // 3, size - 9, size - 1):
        p = tmp_path / f"cut{cut}.snap"
        p.write_bytes(open(good.path, "rb").read()[:cut])
        bad.append(p)
    for off in (12, 100, size // 2, size - 3):
        p = tmp_path / f"flip{off}.snap"
        _flip(good.path, off, p)
        bad.append(p)
    tmp = tmp_path / "x.snap.tmp"
    tmp.write_bytes(open(good.path, "rb").read())
    bad.append(tmp)
    for p in bad:
        with pytest.raises(SnapshotCorruptError, match=str(p)):
            S.verify(p)
        with pytest.raises(SnapshotCorruptError):
            S.restore(p, cache_name + "-r")
        assert not shmcache.exists(cache_name + "-r")
    assert S.verify(good.path).entries == 20_000


def test_sigkill_during_snapshot_keeps_the_previous_one(cache_name, tmp_path):
    """`shmcache snapshot` killed while it writes: PATH still holds the previous snapshot,
    byte for byte; the PATH.tmp it left is never taken for a snapshot (not listed, refused)."""
    with shmcache.create(cache_name, memory="512MiB") as w:
        rng = np.random.default_rng(5)
        keys = rng.integers(0, 256, (400_000, 32), np.uint8)
        w.set_many(keys, [bytes(120)] * len(keys))
    d = tmp_path / "snaps"
    d.mkdir()
    path = snapdir.path_for(d, cache_name, 1)
    cmd = [sys.executable, "-m", "shmcache", "snapshot", cache_name, str(path)]
    subprocess.run(cmd, check=True, capture_output=True, timeout=300)
    before = path.read_bytes()
    killed = False
    for _ in range(5):  # the kill must land while the .tmp is being written
        p = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = time.monotonic() + 120
            while p.poll() is None and time.monotonic() < deadline:
                tmps = _tmps(d)
                if tmps and _size(tmps[0]) > 1 << 20:
                    os.kill(p.pid, signal.SIGKILL)
                    killed = True
                    break
                time.sleep(0.001)
        finally:
            if p.poll() is None and not killed:
                p.kill()
            p.wait(30)
        if killed:
            break
        path.write_bytes(before)  # it finished first: put the previous one back and try again
    assert killed and p.returncode == -signal.SIGKILL
    (tmp,) = _tmps(d)
    assert tmp.name.startswith(path.name + ".")
    assert path.read_bytes() == before
    assert S.verify(path).entries == 400_000
    assert snapdir.files(d, cache_name) == [path]
    with pytest.raises(SnapshotCorruptError, match=r"\.tmp"):
        S.verify(tmp)


def test_a_cancelled_snapshot_gives_up_at_once_and_keeps_the_previous_one(cache_name, tmp_path):
    """write() whose cancel event is set (what a supervisor's stop does to its periodic
    snapshot): SnapshotCancelled, a SnapshotError; PATH byte for byte the previous snapshot,
    no temporary file left, paced or not. Set while a paced write (512KiB/s: a 4 MiB piece
    is followed by a pause of about 8 s) has its first piece in the file: it gives up at
    once, not at the pause's end (nor after the half minute the whole file would take)."""
    path = tmp_path / "s.snap"
    with shmcache.create(cache_name, memory="128MiB") as w:
        _fill(w, 20_000, 12)
        S.write(w, path)
        before = path.read_bytes()
        _fill(w, 20_000, 13)  # the table moves on
        cancel = threading.Event()
        cancel.set()
        for rate in (0, 1 << 20):
            with pytest.raises(SnapshotCancelled, match="abandoned") as e:
                S.write(w, path, rate=rate, cancel=cancel)
            assert isinstance(e.value, SnapshotError)
            assert _tmps(tmp_path) == [] and path.read_bytes() == before
        cancel.clear()
        set_at = []

        def cancel_once_written():
            deadline = time.monotonic() + 60
            while not any(_size(t) for t in _tmps(tmp_path)) and time.monotonic() < deadline:
                time.sleep(0.001)
            set_at.append(time.monotonic())
            cancel.set()

        helper = threading.Thread(target=cancel_once_written)
        helper.start()
        try:
            with pytest.raises(SnapshotCancelled):
                S.write(w, path, rate=512 << 10, cancel=cancel)
            gave_up = time.monotonic() - set_at[0]
        finally:
            helper.join()
        assert gave_up < 2.0, f"gave up {gave_up:.2f} s after its cancel was set"
        assert _tmps(tmp_path) == [] and path.read_bytes() == before
        assert S.verify(path).entries == 20_000


@pytest.mark.parametrize("direct", [True, False], ids=["o_direct", "plain-writes"])
def test_a_full_disk_fails_cleanly_and_keeps_the_previous_snapshot(cache_name, tmp_path, small_fs, monkeypatch,
                                                                   direct):
    """The disk fills up mid-write (a small tmpfs of the test's own), through O_DIRECT's
    staging buffer and through plain writes: an OSError (ENOSPC) naming PATH, no
    temporary file left (its space given back), the previous snapshot byte for byte; as
    `shmcache snapshot`: one line on stderr naming PATH and what happened, exit 2."""
    monkeypatch.setattr(SnapshotOut, "DIRECT", direct)
    with shmcache.create(cache_name, memory="40MiB") as w:
        _fill(w, 2000, 8)
        small = S.write(w, tmp_path / "small.snap").bytes
        _fill(w, 30_000, 9)
        big = S.write(w, tmp_path / "big.snap").bytes
        d = small_fs(small + big // 2)  # the previous snapshot and half of the next one
        path = d / "x.snap"
        shutil.copyfile(tmp_path / "small.snap", path)
        before = path.read_bytes()
        free = shutil.disk_usage(d).free
        for _ in range(2):  # and again: nothing of the first failure is in the way
            with pytest.raises(OSError) as e:
                S.write(w, path)
            assert e.value.errno == errno.ENOSPC
            assert str(path) in str(e.value) and "No space left on device" in str(e.value)
            assert os.listdir(d) == ["x.snap"] and path.read_bytes() == before
            assert shutil.disk_usage(d).free == free
    res = subprocess.run([sys.executable, "-m", "shmcache", "snapshot", cache_name, str(path)], capture_output=True,
                         text=True, timeout=300, env={**os.environ, "CI": "true"})
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and len(lines) == 1 and "Traceback" not in res.stderr, res.stderr
    assert str(path) in lines[0] and "no space left" in lines[0].lower()
    assert os.listdir(d) == ["x.snap"] and path.read_bytes() == before
    assert S.verify(path).entries == 2000


def test_overlapping_snapshots_to_one_path_leave_a_whole_one(cache_name, tmp_path):
    """A slow `shmcache snapshot --rate` started first, and a fast one that starts and
    finishes while the slow one is mid-write (stopped there with SIGSTOP, so that it is so
    on any machine): each writes a temporary file of its own, the fast one never touches
    the slow one's; PATH is whole after the fast one's rename, and again after the slow
    one's (the last rename wins); no temporary file is left."""
    path = tmp_path / "s.snap"
    with shmcache.create(cache_name, memory="40MiB") as w:
        _fill(w, 20_000, 10)
        S.write(w, path)  # the previous good snapshot
        slow = subprocess.Popen([sys.executable, "-m", "shmcache", "snapshot", cache_name, str(path), "--rate", "1MiB"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env={**os.environ, "CI": "true"})
        try:
            deadline = time.monotonic() + 120
            while not (_tmps(tmp_path) and _size(_tmps(tmp_path)[0]) > 0):  # its first bytes written
                assert slow.poll() is None and time.monotonic() < deadline, slow.communicate()
                time.sleep(0.001)
            os.kill(slow.pid, signal.SIGSTOP)
            (slow_tmp,) = _tmps(tmp_path)  # still there: stopped mid-write, before its rename
            written = _size(slow_tmp)
            _fill(w, 20_000, 11)  # the table moves on
            fast = S.write(w, path)
            assert fast.entries == 40_000 and S.verify(path).entries == 40_000
            assert _tmps(tmp_path) == [slow_tmp] and _size(slow_tmp) == written
        finally:
            os.kill(slow.pid, signal.SIGCONT)
            out, err = slow.communicate(timeout=300)
    assert slow.returncode == 0, err
    assert S.verify(path).entries == 20_000  # the slow one's, renamed last, whole
    assert _tmps(tmp_path) == []


def _snapshot_mid_write(cache_name, path, d):
    """A `shmcache snapshot --rate 1MiB` of PATH with its first bytes written: (process, its .tmp)."""
    before = set(_tmps(d))
    p = subprocess.Popen([sys.executable, "-m", "shmcache", "snapshot", cache_name, str(path), "--rate", "1MiB"],
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env={**os.environ, "CI": "true"})
    deadline = time.monotonic() + 120
    while True:
        new = [t for t in _tmps(d) if t not in before and _size(t) > 0]
        if new:
            return p, new[0]
        assert p.poll() is None and time.monotonic() < deadline, p.communicate()
        time.sleep(0.001)


def test_a_restore_keeps_the_topic_id_the_offsets_belong_to(cache_name, tmp_path):
    """The table's topic id travels with its offsets: a restored table holds the snapshot's,
    which a supervisor then compares with the topic's (consumer/supervisor/topic_id.py); a table
    without one gives a snapshot without one."""
    tid = C.topic_id_text(0x0123456789ABCDEF, -2)
    with shmcache.create(cache_name, memory="40MiB") as w:
        w.set(b"k" * 32, b"v")
        w.control.set_topic("txmeta", 2)
        none = S.write(w, tmp_path / "none.snap")
        w.control.set_topic_id(tid)
        info = S.write(w, tmp_path / "id.snap")
    assert none.topic_id == "" and info.topic_id == tid
    assert S.read_header(info.path).topic_id == tid
    for snap, want in ((info, tid), (none, "")):
        S.restore(snap.path, cache_name + "-r")
        try:
            with shmcache.attach(cache_name + "-r") as r:
                assert r.status()["topic_id"] == want and r.get(b"k" * 32) == b"v"
        finally:
            shmcache.destroy(cache_name + "-r")


def test_the_next_snapshot_removes_what_killed_writers_left_and_nothing_else(cache_name, tmp_path):
    """A writer of PATH stopped mid-write (SIGSTOP: alive, its file's lock held), then
    another killed mid-write (SIGKILL), its .tmp left; a FIFO and a link wear the name of
    a temporary file. The next snapshot of PATH removes the killed writer's file, and
    only it: the stopped writer's file is left and, resumed, it finishes and renames a
    whole snapshot; the FIFO (opened without waiting for a writer) and the link stay.
    (The killed writer, started beside the stopped one, left that one's file too.)"""
    path = tmp_path / "s.snap"
    stopped = None
    with shmcache.create(cache_name, memory="40MiB") as w:
        _fill(w, 20_000, 12)
        try:
            stopped, live = _snapshot_mid_write(cache_name, path, tmp_path)
            os.kill(stopped.pid, signal.SIGSTOP)
            p, dead = _snapshot_mid_write(cache_name, path, tmp_path)
            p.kill()
            p.wait(30)
            fifo = tmp_path / f"s.snap.{'f' * 16}.tmp"
            os.mkfifo(fifo)
            link = tmp_path / f"s.snap.{'e' * 16}.tmp"
            link.symlink_to(dead)
            assert set(_tmps(tmp_path)) == {dead, live, fifo, link}
            assert S.write(w, path).entries == 20_000
            assert set(_tmps(tmp_path)) == {live, fifo, link}  # the killed writer's file gone, the live one's kept
        finally:
            if stopped is not None:
                os.kill(stopped.pid, signal.SIGCONT)
                _, err = stopped.communicate(timeout=300)
    assert stopped.returncode == 0, err
    assert S.verify(path).entries == 20_000
    assert set(_tmps(tmp_path)) == {fifo, link}


def test_a_supervisor_start_leaves_a_snapshot_being_written(cache_name, tmp_path):
    """What a supervisor removes at its start (SnapshotPolicy.opened): a killed writer's
    .tmp in its snapshot dir, never one whose writer is alive (a `shmcache snapshot` into
    the same dir, stopped mid-write)."""
    with shmcache.create(cache_name, memory="40MiB") as w:
        _fill(w, 20_000, 13)
        p, dead = _snapshot_mid_write(cache_name, snapdir.path_for(tmp_path, cache_name, 1), tmp_path)
        p.kill()
        p.wait(30)
        live_path = snapdir.path_for(tmp_path, cache_name, 2)
        stopped, live = _snapshot_mid_write(cache_name, live_path, tmp_path)
        os.kill(stopped.pid, signal.SIGSTOP)
        try:
            assert snapdir.unfinished(tmp_path, cache_name) == [dead, live]
            cfg = RunConfig(bootstrap="127.0.0.1:1", name=cache_name, topic="t", snapshot_dir=str(tmp_path))
            policy.SnapshotPolicy(cfg).opened(w, restored=False)
            assert snapdir.unfinished(tmp_path, cache_name) == [live]
        finally:
            os.kill(stopped.pid, signal.SIGCONT)
            _, err = stopped.communicate(timeout=300)
    assert stopped.returncode == 0, err
    assert snapdir.unfinished(tmp_path, cache_name) == [] and snapdir.files(tmp_path, cache_name) == [live_path]


def test_a_snapshot_replaces_only_a_snapshot(cache_name, tmp_path):
    """A PATH that holds anything but a snapshot is refused, naming PATH and what is there,
    and left as it was, with no temporary file written: the cache's own segment in
    /dev/shm, another file, an empty file, a directory, a symbolic link (even to a
    snapshot), a FIFO; a name ending in .tmp (what no reader takes) too. A snapshot
    there, whole or truncated (it starts as one), is replaced."""
    with shmcache.create(cache_name, memory="40MiB") as w:
        w.set(b"k" * 32, b"v")
        good = Path(S.write(w, tmp_path / "good.snap").path)
        other = tmp_path / "notes.txt"
        other.write_text("not a snapshot\n")
        (tmp_path / "empty").touch()
        (tmp_path / "adir").mkdir()
        (tmp_path / "link.snap").symlink_to(good)
        os.mkfifo(tmp_path / "fifo")
        seg = Path(path_of(cache_name))
        seg_head = seg.read_bytes()[:4096]
        listing = sorted(os.listdir(tmp_path))
        for p, what in ((seg, "a shmcache cache segment"), (other, "not a shmcache snapshot"),
                        (tmp_path / "empty", "an empty file"), (tmp_path / "adir", "a directory"),
                        (tmp_path / "link.snap", "a symbolic link"), (tmp_path / "fifo", "a FIFO"),
                        (tmp_path / "x.snap.tmp", "a name ending in .tmp")):
            with pytest.raises(SnapshotError) as e:
                S.write(w, p)
            assert str(p) in str(e.value) and what in str(e.value), e.value
            assert sorted(os.listdir(tmp_path)) == listing
        assert seg.read_bytes()[:4096] == seg_head and other.read_text() == "not a snapshot\n"
        assert os.readlink(tmp_path / "link.snap") == str(good) and (tmp_path / "empty").stat().st_size == 0
        assert w.get(b"k" * 32) == b"v"
        with shmcache.attach(cache_name) as r:
            assert r.get(b"k" * 32) == b"v"
        w.set(b"j" * 32, b"w")
        truncated = tmp_path / "truncated.snap"
        truncated.write_bytes(good.read_bytes()[:100])
        for p in (good, truncated):
            assert S.write(w, p).entries == 2 and S.verify(p).entries == 2
        assert _tmps(tmp_path) == []
