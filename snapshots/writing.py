"""Writing a snapshot: a live cache to a file, light on the readers beside it.

`write` reads the partitions' applied offsets first, then copies the buckets a chunk at
a time (bounded memory, format.CHUNK_BYTES), each bucket under its seqlock as a reader
reads it (_kernels.copy_out: never torn, and no writer waits). Why replaying from offsets
taken before the copy gives the table Kafka's order implies: docs/design.md, "Snapshots".

The file is written to a temporary file beside PATH whose name is its writer's own
(PATH.<16 hex digits>.tmp), fsynced, renamed to PATH and its directory fsynced, so PATH
is always a whole snapshot or the previous one, however many write to it at once (the
last rename wins). A write that fails, or that its caller cancels (the `cancel` event:
SnapshotCancelled), removes its temporary file; a writer holds a lock on its own until
the rename, so the next write to PATH removes those whose writer was killed (and none
being written); PATH is refused if it holds anything but a snapshot (a cache's segment,
another file, a directory, a link), and a name ending in .tmp is refused (that is what an
unfinished snapshot is called, and no reader takes it).

Light on the readers (SnapshotOut): O_DIRECT or flushed-and-dropped writes, a rate whose
pauses a cancel event cuts short, a thread at SCHED_IDLE (lower_priority), and a
directory fsync after the rename.
"""

from __future__ import annotations

import errno
import fcntl
import json
import logging
import mmap
import os
import re
import secrets
import signal
import stat
import struct
import threading
import time

import numpy as np
import xxhash

from shmcache.engine import layout as L
from shmcache.engine import units
from shmcache.engine.control import layout as C
from shmcache.errors import SnapshotCancelled, SnapshotError
from shmcache.ipc.atomics import load_word
from shmcache.ipc.segment import kind_of
from shmcache.snapshots import _kernels as SK
from shmcache.snapshots.format import (CHUNK, CHUNK_MAGIC, END, END_MAGIC, FORMAT_VERSION, HEAD, MAGIC, Buffers,
                                       SnapshotInfo, buckets_per_chunk, format_of, topic_of)

log = logging.getLogger("shmcache.snapshot")

SPIN_LIMIT = 2000  # copy tries of one bucket before Python yields the CPU
STUCK_S = 1.0  # a bucket mid-write this long under a dead (or no) lock holder is copied as it stands


def write(handle, path: str, *, progress=None, rate: int = 0, cancel=None) -> SnapshotInfo:
    """Write a snapshot of the cache `handle` maps (a Reader or a Writer) to `path`.

    rate: bytes of file per second at most (0: as fast as it goes); see SnapshotOut for what
    else keeps a snapshot light on the readers beside it. progress(buckets done,
    buckets in all, bytes written) is called after each chunk.
    cancel: a threading.Event (or None) that asks this snapshot to give up: looked at before
    each chunk, while a bucket mid-write is waited for, and waited on by the rate's pauses,
    so a paced snapshot stops within a chunk's copy and write of it being set (a supervisor's
    stop: consumer/supervisor/snapshot_policy.py). Then SnapshotCancelled, `path` untouched, no temporary file.

    SnapshotError if `path` ends in .tmp or holds anything but a snapshot
    (check_destination); OSError naming `path` if the file cannot be written (a full
    disk: ENOSPC). Either way `path` is untouched and no temporary file is left."""
    path = os.fspath(path)
    if path.endswith(TMP_SUFFIX):
        raise SnapshotError(f"snapshot path {path!r}: a name ending in {TMP_SUFFIX} is what an unfinished snapshot "
                            "is called (no reader takes it)")
    check_destination(path)
    header, parts, meta, index, ring8 = handle.segment_arrays()[:5]
    geo = handle.geometry
    t0 = time.monotonic()
    nparts = min(max(int(header[L.H_PARTITIONS]), 0), L.MAX_PARTITIONS)
    rows = parts.reshape(L.MAX_PARTITIONS, L.ROW_WORDS)
    # the offsets first, before any bucket is copied (docs/design.md, Snapshots)
    offsets = tuple(int(x) for x in rows[:nparts, C.P_APPLIED].tolist())
    taken = time.time_ns()
    entries = int(meta.reshape(L.NBUCKETS, L.ROW_WORDS)[:, L.M_LIVE].sum())
    head = {"layout_version": L.LAYOUT_VERSION, "nbuckets": L.NBUCKETS, "key_size": geo.key_size,
            "max_value": geo.max_value, "slots": geo.slots, "ring": geo.ring, "size": geo.size,
            "topic": topic_of(header), "wire_format": format_of(header), "partitions": nparts,
            "offsets": list(offsets), "taken_ns": taken, "name": handle.name,
            "creation_id": int(header[L.H_CREATION_ID]), "entries": entries,
            "topic_id": handle.control.topic_id}
    raw = json.dumps(head, separators=(",", ":")).encode()
    nb = buckets_per_chunk(geo)
    buf = Buffers(geo, nb)
    counts = np.zeros(2, np.int64)
    sums = xxhash.xxh3_64()
    remove_abandoned(path)  # what writers of PATH that were killed left beside it
    # A stop (SIGINT, SIGTERM, SIGHUP: a KeyboardInterrupt from the command line's handler)
    # that comes while the temporary file is made waits, blocked, and is raised inside the
    # try below, which removes that file: never between its creation and the try.
    held = signal.pthread_sigmask(signal.SIG_BLOCK, _STOPS)
    try:
        out = SnapshotOut(path, rate, cancel)
    except OSError as e:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)
        raise _not_written(e, path, f"could not create a file in {os.path.dirname(os.path.abspath(path))}") from e
    except BaseException:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)
        raise
    tmp = out.path
    try:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)  # a stop that came meanwhile is raised here
        out.write(HEAD.pack(MAGIC, FORMAT_VERSION, len(raw)) + raw + struct.pack("<Q", xxhash.xxh3_64_intdigest(raw)))
        for b0 in range(0, L.NBUCKETS, nb):
            copy_chunk(handle, meta, index, ring8, geo, b0, nb, buf, counts, cancel, path)
            n = int(buf.lens.sum())
            views = (buf.meta, buf.index, buf.lens, buf.ring[:n])
            h = xxhash.xxh3_64()
            for v in views:
                h.update(v)
            digest = h.intdigest()
            sums.update(struct.pack("<Q", digest))
            out.write(CHUNK.pack(CHUNK_MAGIC, b0, nb, 0, buf.fixed(nb) + n, digest))
            for v in views:
                out.write(v)
            out.chunk_done()
            if progress is not None:
                progress(b0 + nb, L.NBUCKETS, out.size)
        handle.raise_if_lost()  # a segment cut short under the copy gave zero pages, not the table
        out.write(END.pack(END_MAGIC, L.NBUCKETS // nb, 0, entries, sums.intdigest()))
        out.finish()
        size = out.size
        check_destination(path)  # again: nothing else came to be at PATH while this one was written
        os.rename(tmp, path)
        out.close()  # after the rename: until then its lock says the .tmp is being written
    except BaseException as e:
        try:
            os.unlink(tmp)  # first: whatever else fails, no temporary file is left
        except OSError:
            pass
        finally:
            out.close()
        if isinstance(e, OSError):
            raise _not_written(e, path, f"its temporary file {os.path.basename(tmp)} was removed") from e
        raise
    try:
        fsync_dir(path)
    except OSError as e:
        raise OSError(e.errno, f"snapshot {path} was written, but its directory's fsync failed: "
                      f"{e.strerror or e}") from e
    if counts[1]:
        log.warning("cache %r: %d buckets had head/tail words no writer leaves; written empty", handle.name,
                    int(counts[1]))
    dt = time.monotonic() - t0
    log.info("cache %r: snapshot %s, %d entries, %s in %.2f s (%s/s)", handle.name, path, entries,
             units.format_bytes(size), dt, units.format_bytes(size / max(dt, 1e-9)))
    return SnapshotInfo(path, geo, L.LAYOUT_VERSION, head["topic"], head["wire_format"], offsets, taken, entries,
                        handle.name, size, head["topic_id"])


def check_destination(path: str) -> None:
    """SnapshotError unless `path` is free for a snapshot: nothing there, or a snapshot
    (a file that starts with the snapshot magic, whole or not), which the new one
    replaces. Anything else is refused by name and kind: a cache's segment, another
    file, a directory, a link, a device."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    except OSError as e:
        raise SnapshotError(f"snapshot {path}: cannot look at what is there ({e.strerror}); nothing was written") from e
    if not stat.S_ISREG(st.st_mode):
        kind = kind_of(st.st_mode)
        raise SnapshotError(f"snapshot {path}: there is {kind} at that path, not a snapshot; refusing to replace it "
                            "(give the path of a snapshot file to write)")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            first = os.pread(fd, len(MAGIC), 0)
        finally:
            os.close(fd)
    except OSError as e:
        raise SnapshotError(f"snapshot {path}: a file is there and cannot be read to check that it is a snapshot "
                            f"({e.strerror}); refusing to replace it") from e
    if first == MAGIC:
        return
    if len(first) == len(MAGIC) and int.from_bytes(first, "little") == L.MAGIC:
        what = "a shmcache cache segment (a cache's shared memory)"
    elif st.st_size == 0:
        what = "an empty file"
    else:
        what = f"a file of {units.format_bytes(st.st_size)} that is not a shmcache snapshot (it starts with {first!r})"
    raise SnapshotError(f"snapshot {path}: there is {what} at that path; refusing to replace it (a snapshot only "
                        "replaces a snapshot)")


def _not_written(e: OSError, path: str, what: str) -> OSError:
    """The OSError `e` again (its errno, so its type), saying which snapshot was not written and why."""
    message = f"snapshot {path} not written: {e.strerror or e} ({what}; {path} is untouched)"
    return OSError(message) if e.errno is None else OSError(e.errno, message)


def copy_chunk(handle, meta, index, ring8, geo, b0, nb, buf, counts, cancel, path) -> None:
    """Copy buckets b0..b0+nb of `handle`'s segment into buf, each consistently; yield to writers in between.
    SnapshotCancelled once `cancel` is set (before the copy, and while a bucket is waited for)."""
    i, force, stuck_at, since = 0, -1, -1, 0.0
    while True:
        if cancel is not None and cancel.is_set():
            raise cancelled(path)
        pos = int(buf.lens[:i].sum())
        i = SK.copy_out(meta, index, ring8, geo.slots, geo.ring, b0, i, nb, pos, buf.meta, buf.index, buf.lens,
                        buf.ring, SPIN_LIMIT, force, counts)
        if i >= nb:
            return
        b = b0 + i
        if b != stuck_at:
            stuck_at, since = b, time.monotonic()
        owner = int(load_word(meta, b * L.ROW_WORDS + L.M_LOCK))
        if time.monotonic() - since > STUCK_S and not handle.lock_holder_alive(owner):
            log.warning("cache %r: bucket %d stays mid-write with no live writer; copied as it stands (the "
                        "restore rebuilds it)", handle.name, b)
            force = b
        else:
            os.sched_yield()


# -- the file, written light on the readers beside it ----------------------------------------

TMP_SUFFIX = ".tmp"  # how the name of every snapshot being written ends
_STOPS = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}  # the signals a command stops on (cli/stop.py)
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
    snapshot's name does (never read: format.parse_header refuses such names)."""
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
