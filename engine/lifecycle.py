"""Lifecycle of a cache's name under /dev/shm, apart from making one (table.create):
opening one (waiting for a creator still at work on it), whether something is
there, which names are caches, and removing one.

/dev/shm is shared with every user: any name may hold a FIFO, a directory, a symlink
or someone else's file. Every open here goes through ipc/segment.py's open_regular
(no symlink followed, no blocking, regular files only), and destroy removes a
segment only once it has checked that it is a shmcache segment no one else uses.
"""

from __future__ import annotations

import os
import time
from typing import Iterable

import numpy as np

from shmcache.engine import layout as L
from shmcache.engine import reader_stats
from shmcache.errors import CacheInUseError, CachePermissionError, NotACacheError
from shmcache.ipc import liveness
from shmcache.ipc.segment import SHM_DIR, Segment, check_name, creator_at_work, open_regular, path_of
from shmcache.ipc.segment import unlink as segment_unlink

SIZED_TIMEOUT = 0.5  # how long attach waits for a new file to get its size
READY_TIMEOUT = 30.0  # how long attach waits for a creator to finish, plus READY_S_PER_GIB of the size
READY_S_PER_GIB = 10.0  # the creator's move to 2 MiB pages took 2-3.5 s per GiB here


def ready_limit(size: int) -> float:
    """How long an attacher waits for the creator of a file of `size` bytes to finish:
    a creator sizes the file right after creating it, so an empty one that stays so is
    not ours; a sized one gets time in proportion, as the creator's collapse takes."""
    return READY_TIMEOUT + READY_S_PER_GIB * size / 2**30 if size else SIZED_TIMEOUT


def open_segment(name: str, writable: bool) -> Segment:
    """Map cache `name` once its creator (if one is still at work) has finished: what
    attach and open map; the caller checks the header."""
    wait_created(name)
    return Segment(name, writable=writable)


def wait_created(name: str) -> None:
    """Wait (ready_limit) while a creator is still at work on the file: sized, moved
    to 2 MiB pages, initialised. Mapping before then would see a 0-byte file, or keep
    4 KiB page entries where the creator's collapse came after (ipc/segment.py).

    Only a live creator is waited for: it holds the file's creation lock from before it
    sizes the file until the magic is written, so a sized file without magic whose lock
    is free has no creator (one killed mid-create, or a header zeroed since): refused
    at once (NotACacheError). Anything but a regular file is refused by open_regular;
    permission errors are left to the mapping, which words them."""
    path = path_of(name)
    t0 = time.monotonic()
    try:
        fd = open_regular(name, path, os.O_RDONLY)
    except PermissionError:
        return
    try:
        def has_magic() -> bool:
            return int.from_bytes(os.pread(fd, 8, L.H_MAGIC * L.WORD), "little") != 0

        while True:
            size = os.fstat(fd).st_size
            if size >= L.PAGE and has_magic():
                return
            if size and not creator_at_work(fd):
                if size >= L.PAGE and has_magic():
                    return  # finished (and let go of the lock) between the two looks
                raise NotACacheError(
                    f"cache {name!r}: {path} ({size:,} bytes) has no shmcache magic and no creator is at "
                    "work on it (its creator died mid-create, or its header was overwritten): not a usable "
                    f"cache; remove it with shmcache destroy --force {name}")
            if time.monotonic() - t0 > ready_limit(size):
                return  # the mapping says what is wrong with it
            time.sleep(0.01)
    finally:
        os.close(fd)


def destroy(name: str, force: bool = False) -> None:
    """Remove the cache's name and its readers' companion; processes that have it mapped
    keep reading until they close.

    Refused unless force=True: a name that is not a shmcache segment (NotACacheError:
    no magic, or not a regular file), and a cache a live process of another pid still
    uses as its supervisor, a writer or a worker, or is still creating (CacheInUseError,
    naming the pids): they would go on writing into a segment no one can attach again.
    Handles of the calling process itself do not count: they are the caller's to close
    (and keep their mapping until then, like readers'). A directory is never removed."""
    check_name(name)
    path = path_of(name)
    try:
        fd = open_regular(name, path, os.O_RDONLY)
    except NotACacheError as e:
        if not force:
            raise NotACacheError(f"{e}; it was not removed: destroy(force=True) or shmcache destroy --force "
                                 "removes it anyway") from None
        fd = -1
    except PermissionError:
        if not force:
            raise CachePermissionError(
                f"cache {name!r}: permission denied reading {path} to check that it is a shmcache segment no "
                "one uses; destroy(force=True) or shmcache destroy --force skips the check") from None
        fd = -1
    try:
        if fd >= 0 and not force:
            _check_unused(name, path, fd)
            st, now = os.fstat(fd), os.lstat(path)
            if (st.st_dev, st.st_ino) != (now.st_dev, now.st_ino):
                raise CacheInUseError(f"cache {name!r}: {path} was replaced while it was being checked; "
                                      "nothing was removed")
        segment_unlink(name)
    finally:
        if fd >= 0:
            os.close(fd)
    reader_stats.unlink(name)


def _check_unused(name: str, path: str, fd: int) -> None:
    """Raise unless the file at fd is a shmcache segment that no other live process uses."""
    head = os.pread(fd, L.PAGE + (L.MAX_WRITERS + L.MAX_WORKERS) * L.ROW_WORDS * L.WORD, 0)
    words = np.frombuffer(head[: len(head) // L.WORD * L.WORD], np.int64)
    magic = int(words[L.H_MAGIC]) if len(words) else 0
    if magic != L.MAGIC:
        if magic == 0 and os.fstat(fd).st_size and creator_at_work(fd):
            raise CacheInUseError(f"cache {name!r} is being created by a live process (it holds {path}'s "
                                  "creation lock); destroy it once its creator is done, or force=True")
        raise NotACacheError(f"cache {name!r}: {path} is not a shmcache segment (no shmcache magic); it was not "
                             "removed: destroy(force=True) or shmcache destroy --force removes it anyway")
    me = os.getpid()
    users: dict[int, str] = {}
    owners = [("supervisor", int(words[L.H_SUPERVISOR]))]
    for role, first, count in (("writer", L.PAGE // L.WORD, L.MAX_WRITERS),
                               ("worker", L.PAGE // L.WORD + L.MAX_WRITERS * L.ROW_WORDS, L.MAX_WORKERS)):
        rows = words[first:first + count * L.ROW_WORDS:L.ROW_WORDS]  # W_OWNER / K_OWNER: word 0 of a row
        owners += [(role, int(w)) for w in rows[rows != 0]]
    for role, word in owners:
        pid = liveness.word_pid(word)
        if word and pid != me and pid not in users and liveness.is_alive(word):
            users[pid] = role
    if users:
        who = ", ".join(f"{role} pid {pid}" for pid, role in users.items())
        raise CacheInUseError(
            f"cache {name!r} is in use by a live {who}: stop it first (it would go on writing into a removed "
            "segment), or destroy(force=True) / shmcache destroy --force removes it anyway")


def exists(name: str) -> bool:
    """True if anything is at the cache's name (a cache, or whatever else would keep create() from making one)."""
    return os.path.lexists(path_of(name))


def list_caches() -> Iterable[str]:
    """Names under /dev/shm whose file carries the shmcache magic. Never blocks and never
    raises for what else is there (FIFOs, directories, symlinks, others' files are skipped)."""
    try:
        entries = sorted(e.name for e in os.scandir(SHM_DIR))
    except OSError:
        return
    for entry in entries:
        try:
            fd = open_regular(check_name(entry), os.path.join(SHM_DIR, entry), os.O_RDONLY)
        except (OSError, ValueError):  # not a cache name, gone, not a regular file, not ours to read
            continue
        try:
            magic = int.from_bytes(os.pread(fd, 8, L.H_MAGIC * L.WORD), "little")
        except OSError:
            continue
        finally:
            os.close(fd)
        if magic == L.MAGIC:
            yield entry
