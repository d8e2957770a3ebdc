"""How a snapshot file is written so that the readers beside it lose little (the
writer's side of engine/snapshot.py): O_DIRECT or flushed-and-dropped writes, a rate
(whose pauses a cancel event cuts short), a thread at SCHED_IDLE, and a directory fsync
after the rename."""

from __future__ import annotations

import errno
import fcntl
import logging
import mmap
import os
import re
import secrets
import stat
import threading
import time

from shmcache.errors import SnapshotCancelled

log = logging.getLogger("shmcache.snapshot")

TMP_SUFFIX = ".tmp"  # how the name of every snapshot being written ends
_TMP = re.compile(r"(.+)\.[0-9a-f]{16}" + re.escape(TMP_SUFFIX))


class SnapshotOut:
    """The snapshot file, written so that the readers beside it lose little:
    - with O_DIRECT where the file system takes it: the bytes go from this process's
      buffer to the disk, with no page cache to fill, write back (the kernel's flusher
      threads run at normal priority, whatever this thread's) and reclaim. The stream
      goes through an aligned staging buffer of PIECE bytes; the last piece is padded to
      a block and the file cut back to its size. Where O_DIRECT is refused, plain
      writes, each chunk flushed (fdatasync) and dropped from the page cache
      (POSIX_FADV_DONTNEED) once written, so dirty pages never pile up and a snapshot
      as large as the cache does not push others' page cache out;
    - paced to `rate` bytes/s when asked, a PIECE at a time (the copy, the checksum and
      the write then take that share of a core and of the memory bandwidth); the pause
      waits on `cancel` (a threading.Event, or None) and raises SnapshotCancelled as soon
      as it is set, so a slow snapshot gives up at once when asked (a supervisor's stop);
    - durable when closed (fdatasync), before the caller's rename."""

    PIECE = 4 << 20
    BLOCK = 4096
    DIRECT = True  # False: plain writes only (what happens where O_DIRECT is refused)

    def __init__(self, final: str, rate: int, cancel: threading.Event | None = None):
        """Create a new file beside `final` (the snapshot's path), of a name no other
        writer has: tmp_name(final), made with O_EXCL. Two snapshots to the same path
        at once each write their own file; the last rename wins, with a whole one."""
        self.final, self.cancel = final, cancel
        for _ in range(100):
            self.path = tmp_name(final)
            self.fd = _create_locked(self.path)
            if self.fd >= 0:
                break
        else:
            raise FileExistsError(errno.EEXIST, "no unused temporary name found for a snapshot", final)
        self.stage = None
        try:
            if self.DIRECT:
                self.stage = mmap.mmap(-1, self.PIECE)  # page-aligned, as O_DIRECT wants
                try:  # O_DIRECT on the open file; refused (EINVAL) where the file system has none
                    fcntl.fcntl(self.fd, fcntl.F_SETFL, fcntl.fcntl(self.fd, fcntl.F_GETFL) | os.O_DIRECT)
                except (OSError, AttributeError):  # tmpfs before Linux 6.6, some FUSE file systems
                    self.stage.close()
                    self.stage = None
        except BaseException:
            self.close()
            os.unlink(self.path)
            raise
        self.rate = max(int(rate), 0)
        self.size = self.staged = self.flushed = 0
        self.t0 = time.monotonic()

    def write(self, data) -> None:
        with memoryview(data) as raw, raw.cast("B") as mv:
            pos = 0
            while pos < len(mv):
                with mv[pos:pos + (self.PIECE if self.stage is None else self.PIECE - self.staged)] as piece:
                    n = len(piece)
                    if self.stage is None:
                        self._write_all(piece)
                    else:
                        self.stage[self.staged:self.staged + n] = piece
                        self.staged += n
                        if self.staged == self.PIECE:
                            self._write_stage(self.PIECE)
                            self.staged = 0
                pos += n
                self.size += n
                if self.rate:
                    ahead = self.size / self.rate - (time.monotonic() - self.t0)
                    if ahead > 0:
                        self._pause(ahead)

    def _pause(self, seconds: float) -> None:
        """The rate's pause: on the cancel event when there is one, which ends it early."""
        if self.cancel is None:
            time.sleep(seconds)
        elif self.cancel.wait(seconds):
            raise cancelled(self.final)

    def _write_all(self, mv) -> None:
        # each view of the data is released as soon as it is written, or the write fails:
        # a view left in a traceback's frame would keep the staging buffer exported, and
        # its close() would fail (BufferError) on the way out of a failed snapshot
        done = 0
        while done < len(mv):
            with mv[done:] as rest:
                done += os.write(self.fd, rest)

    def _write_stage(self, n: int) -> None:
        with memoryview(self.stage) as whole, whole[:n] as mv:
            self._write_all(mv)

    def chunk_done(self) -> None:
        if self.stage is None:
            os.fdatasync(self.fd)
            os.posix_fadvise(self.fd, self.flushed, self.size - self.flushed, os.POSIX_FADV_DONTNEED)
            self.flushed = self.size

    def finish(self) -> None:
        """The tail written, the file its size and on the disk."""
        if self.stage is not None and self.staged:
            whole = -(-self.staged // self.BLOCK) * self.BLOCK
            self.stage[self.staged:whole] = bytes(whole - self.staged)
            self._write_stage(whole)
            os.ftruncate(self.fd, self.size)
            self.staged = 0
        self.chunk_done()
        os.fdatasync(self.fd)

    def close(self) -> None:
        """The file closed and its lock let go (it stays where it is: the caller renames or
        removes it first, while the lock still says a writer is at work on it)."""
        fd, stage = self.fd, self.stage
        self.fd, self.stage = -1, None
        try:
            if fd >= 0:
                os.close(fd)
        finally:
            if stage is not None:
                stage.close()


def cancelled(final: str) -> SnapshotCancelled:
    """The error of a snapshot of `final` abandoned because its cancel event was set."""
    return SnapshotCancelled(f"snapshot {final} abandoned: its writer was asked to give up ({final} is untouched; "
                             "its temporary file is removed)")


def tmp_name(final: str) -> str:
    """A name for a snapshot of `final` being written: beside it (the rename stays in its
    file system), unique to its writer, ending in TMP_SUFFIX as every unfinished
    snapshot's name does (never read: snapshot_format.parse_header refuses such names)."""
    return f"{final}.{secrets.token_hex(8)}{TMP_SUFFIX}"


def _create_locked(path: str) -> int:
    """A new file at `path` (O_EXCL), its fd holding an exclusive flock: the sign, for
    remove_if_abandoned, that its writer is alive (the kernel lets a lock go with the last
    fd, however the process ends). -1 if the name is taken, or if the file was removed
    between its creation and the lock (by a remove_if_abandoned that came in between)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    try:
        fd = os.open(path, flags, 0o600)
    except FileExistsError:
        return -1
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if _same_file(os.fstat(fd), path):
            return fd
    except OSError:  # BlockingIOError: a remover holds it for a moment, and will remove it
        pass
    os.close(fd)
    return -1


def _same_file(st, path: str) -> bool:
    try:
        now = os.lstat(path)
    except FileNotFoundError:
        return False
    return (now.st_dev, now.st_ino) == (st.st_dev, st.st_ino)


def remove_if_abandoned(path) -> bool:
    """Remove `path`, a snapshot's temporary file (tmp_name), if its writer is gone: no
    process holds its lock (a writer holds it from the file's creation to its rename, so a
    killed one's file is free). A file being written, a name that is not a regular file
    of this user's (a FIFO, a link, someone else's file) is left. True if removed."""
    path = os.fspath(path)
    try:  # O_NONBLOCK: a FIFO planted under such a name opens without waiting for a writer
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or st.st_uid != os.geteuid():
            return False
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        if not _same_file(st, path):
            return False
        os.unlink(path)  # under the lock: a writer that just made this name retries with another
        return True
    except OSError:  # BlockingIOError: its writer is at work
        return False
    finally:
        os.close(fd)


def remove_abandoned(final: str) -> list[str]:
    """Remove what killed writers of snapshots of `final` left beside it (its
    PATH.<16 hex>.tmp files that remove_if_abandoned finds free). Returns their paths."""
    final = os.path.abspath(os.fspath(final))
    d, base = os.path.split(final)
    try:
        names = os.listdir(d)
    except OSError:
        return []
    gone = []
    for n in sorted(names):
        m = _TMP.fullmatch(n)
        if m and m.group(1) == base and remove_if_abandoned(os.path.join(d, n)):
            log.info("removed %s, left by a snapshot of %s that did not finish", n, final)
            gone.append(os.path.join(d, n))
    return gone


def final_name(name: str) -> str | None:
    """The snapshot name a temporary file's name (tmp_name) was for, or None if it is not one.
    A name of the form an older shmcache wrote, FINAL.tmp, counts too."""
    if not name.endswith(TMP_SUFFIX):
        return None
    m = _TMP.fullmatch(name)
    return m.group(1) if m else name[:-len(TMP_SUFFIX)]


def lower_priority() -> str:
    """The calling thread (only it) to SCHED_IDLE: it runs on a core nothing else wants,
    so a snapshot never takes the CPU from a reader or a worker. Where that is refused,
    nice 19. For a thread that does nothing else afterwards (an unprivileged thread
    cannot come back). Returns what it got."""
    try:
        os.sched_setscheduler(0, os.SCHED_IDLE, os.sched_param(0))  # 0: the calling thread (Linux)
        return "SCHED_IDLE"
    except (OSError, AttributeError):
        pass
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)  # a thread id: that thread only (Linux)
        return "nice 19"
    except OSError as e:
        log.warning("could not lower the snapshot thread's priority: %s", e)
        return "unchanged"


def fsync_dir(path: str) -> None:
    fd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
