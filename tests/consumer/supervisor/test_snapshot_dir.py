"""The supervisor's snapshot directory is not trusted blindly (issue 39 item 7): a FIFO
under a snapshot's name hung restore_at_start and `shmcache restore` in open(); a
symbolic link or another user's file was restored; a directory others may write was
taken; and snapshots were ordered by the wall clock in their names, so after a clock set
back retention removed the newest. SnapshotPolicy on real caches and files, no broker."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest

import shmcache
from shmcache.consumer.supervisor import snapshot_dir as snapdir
from shmcache.consumer.supervisor import snapshot_policy as policy
from shmcache.consumer.config import RunConfig
from shmcache import snapshots as S

REPO = Path(__file__).resolve().parents[3]
NOBODY = 65534


@pytest.fixture
def name():
    n = f"t-snapdir-{uuid.uuid4().hex[:8]}"
    yield n
    for extra in ("", "-copy"):
        if shmcache.exists(n + extra):
            shmcache.destroy(n + extra, force=True)


def _cache(name: str, entries: int):
    w = shmcache.create(name, memory="40MiB")
    w.control.set_topic("t", 1)
    w.set_many([i.to_bytes(32, "big") for i in range(entries)], [b"v" * 50] * entries)
    return w


def _cfg(name: str, d: Path, keep: int = 3) -> RunConfig:
    return RunConfig(name=name, bootstrap="127.0.0.1:1", topic="t", snapshot_dir=str(d), snapshot_keep=keep,
                     memory="40MiB")


def _unblock(fifo: Path) -> None:
    """Release a reader stuck opening `fifo` (the code before the fix): open it for writing."""
    try:
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        os.close(fd)
    except OSError:
        pass


def test_the_start_reads_only_this_users_regular_files(name, tmp_path, caplog):
    """Newer than the one good snapshot: a FIFO, a symbolic link to a snapshot outside the
    directory, and (as root) another user's snapshot. The start restores the good one at
    once, and logs each of the others by name with why it was not read."""
    d = tmp_path / "snaps"
    d.mkdir(mode=0o700)
    with _cache(name, 1000) as w:
        good = S.write(w, snapdir.path_for(d, name, 1_000)).path
        outside = S.write(w, tmp_path / "outside.snap").path
    shmcache.destroy(name)
    fifo = snapdir.path_for(d, name, 4_000)
    os.mkfifo(fifo, 0o600)
    link = snapdir.path_for(d, name, 3_000)
    link.symlink_to(outside)
    strangers = []
    if os.geteuid() == 0:
        stranger = snapdir.path_for(d, name, 2_000)
        stranger.write_bytes(Path(outside).read_bytes())
        os.chown(stranger, NOBODY, NOBODY)
        strangers.append(stranger)
    done: dict = {}

    def start():
        done["out"] = policy.SnapshotPolicy(_cfg(name, d)).restore_at_start()

    with caplog.at_level(logging.INFO, "shmcache.snapshots"):
        t = threading.Thread(target=start, daemon=True)
        t.start()
        t.join(60)
        hung = t.is_alive()
        if hung:
            _unblock(fifo)
            t.join(30)
    assert not hung, "restore_at_start hung on the FIFO"
    assert done["out"]["snapshot"]["path"] == good and done["out"]["entries"] == 1000
    assert f"not reading {fifo}: it is a FIFO" in caplog.text
    assert f"not reading {link}: it is a symbolic link" in caplog.text
    for p in strangers:
        assert f"not reading {p}: it belongs to uid {NOBODY}, not to this user" in caplog.text
    assert "restoring from snapshot" in caplog.text and str(outside) not in caplog.text


def test_a_link_swapped_in_after_the_listing_is_not_followed(name, tmp_path):
    """The check at the listing is lstat; the open itself refuses a link (O_NOFOLLOW) and
    another user's file, as restore(own=True) does for the supervisor."""
    with _cache(name, 10) as w:
        outside = S.write(w, tmp_path / "outside.snap").path
    shmcache.destroy(name)
    link = tmp_path / "link.snap"
    link.symlink_to(outside)
    with pytest.raises(shmcache.errors.SnapshotError, match="is a symbolic link"):
        S.restore(link, name, own=True)
    assert not shmcache.exists(name)
    S.restore(link, name)  # a path given by hand (shmcache restore) may be a link
    shmcache.destroy(name)
    if os.geteuid() == 0:
        os.chown(outside, NOBODY, NOBODY)
        with pytest.raises(shmcache.errors.SnapshotError, match=f"belongs to uid {NOBODY}"):
            S.read_header(outside, own=True)


def test_shmcache_restore_of_a_fifo_says_so_at_once(name, tmp_path):
    fifo = tmp_path / "x.snap"
    os.mkfifo(fifo, 0o600)
    try:
        p = subprocess.run([sys.executable, "-m", "shmcache", "restore", str(fifo), name], cwd=REPO,
                           capture_output=True, text=True, timeout=60)
    except subprocess.TimeoutExpired:
        pytest.fail("shmcache restore hung on a FIFO")
    assert p.returncode == 2 and "is a FIFO, not a snapshot file" in p.stderr and "Traceback" not in p.stderr, \
        p.stderr
    assert not shmcache.exists(name)


@pytest.mark.parametrize("how", ["world-writable", "group-writable", "another owner"])
def test_a_directory_others_may_write_stops_the_start(name, tmp_path, how):
    d = tmp_path / "snaps"
    d.mkdir()
    if how == "another owner":
        if os.geteuid() != 0:
            pytest.skip("giving a directory to another user needs root")
        os.chmod(d, 0o755)
        os.chown(d, NOBODY, NOBODY)
    else:
        os.chmod(d, 0o777 if how == "world-writable" else 0o770)
    with pytest.raises(ValueError, match=f"snapshot_dir {d}: .*other users may write to it"):
        snapdir.check_dir(d)
    p = subprocess.run([sys.executable, "-m", "shmcache", "run", "--name", name, "--bootstrap", "127.0.0.1:1",
                        "--topic", "t", "--snapshot-dir", str(d)], cwd=REPO, capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 2 and "other users may write to it" in p.stderr and "Traceback" not in p.stderr, p.stderr
    assert not shmcache.exists(name)
    if how != "another owner":
        os.chmod(d, 0o700)
        snapdir.check_dir(d)  # the same directory, only its writer may write: taken


def test_snapshots_are_ordered_as_they_were_made_whatever_the_clock(name, tmp_path):
    """Two snapshots exist, named when the wall clock was a day ahead; it has been set
    back since. The next snapshot (of a table with more in it) sorts first, retention
    (keep 2) removes the oldest, not it, and the start restores it."""
    d = tmp_path / "snaps"
    d.mkdir(mode=0o700)
    ahead = time.time_ns() + 86_400 * 10**9
    with _cache(name, 100) as w:
        older = [S.write(w, snapdir.path_for(d, name, ahead + i)).path for i in (0, 1)]
        w.set_many([i.to_bytes(32, "big") for i in range(1000, 1500)], [b"w" * 50] * 500)
        pol = policy.SnapshotPolicy(_cfg(name, d, keep=2))
        pol.opened(w, False)
        newest = pol.take()
    shmcache.destroy(name)
    assert newest is not None and newest.exists()
    assert snapdir.files(d, name) == [newest, Path(older[1])]
    assert not Path(older[0]).exists()
    out = policy.SnapshotPolicy(_cfg(name, d)).restore_at_start()
    assert out["snapshot"]["path"] == str(newest) and out["entries"] == 600


@pytest.mark.skipif(os.geteuid() != 0, reason="a link and a directory of another user need root")
def test_a_link_re_pointed_after_the_start_changes_nothing(name, tmp_path):
    """Issue 53, item 7: --snapshot-dir a symbolic link that another user owns, in a folder
    anyone may write (as /tmp), pointing at this user's directory. Checked at the start, it
    was then re-pointed at that user's own directory, and the supervisor's snapshots (the
    cache's every value, 0600) went there, to be read, removed or swapped for the one the
    next start restores. Now the directory is opened once, checked on what was opened, and
    reached only through that descriptor: the snapshots stay where they were checked."""
    anyone = tmp_path / "anyone"
    anyone.mkdir()
    os.chmod(anyone, 0o1777)
    mine = tmp_path / "root-snaps"
    mine.mkdir(mode=0o700)
    theirs = anyone / "theirs"
    theirs.mkdir()
    os.chown(theirs, NOBODY, NOBODY)
    link = anyone / "snaps"
    link.symlink_to(mine)
    os.lchown(link, NOBODY, NOBODY)
    with _cache(name, 100) as w:
        pol = policy.SnapshotPolicy(_cfg(name, link))  # the start: the link's target is checked, and opened
        pol.opened(w, False)
        link.unlink()  # the other user re-points the link at their own directory
        link.symlink_to(theirs)
        os.lchown(link, NOBODY, NOBODY)
        taken = pol.take()
        w.set_many([i.to_bytes(32, "big") for i in range(1000, 1100)], [b"w" * 50] * 100)
        again = pol.take()
    shmcache.destroy(name)
    assert taken is not None and again is not None
    assert sorted(p.name for p in mine.iterdir()) == sorted([taken.name, again.name])
    assert list(theirs.iterdir()) == [], "a snapshot went to the other user's directory"
    out = pol.restore_at_start()  # and the next restore reads the checked directory, not the link's new target
    assert out["entries"] == 200 and Path(out["snapshot"]["path"]).name == again.name
