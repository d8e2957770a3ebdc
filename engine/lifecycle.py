"""Lifecycle of a cache's name under /dev/shm, apart from making one (table.create):
whether something is there, which names are caches, who may read it, and removing one.

/dev/shm is shared with every user: any name may hold a FIFO, a directory, a symlink
or someone else's file. Every open here goes through ipc/segment.py's open_regular
(no symlink followed, no blocking, regular files only), and destroy removes a
segment only once it has checked that it is a shmcache segment no one else uses.
"""

from __future__ import annotations

import os
from typing import Iterable

import numpy as np

from shmcache.engine.control import layout as C
from shmcache.engine import layout as L
from shmcache.engine import owners
from shmcache.engine import reader_stats
from shmcache.errors import CacheInUseError, CacheNotFoundError, CachePermissionError, NotACacheError
from shmcache.ipc.segment import SHM_DIR, check_name, open_regular, path_of
from shmcache.ipc.segment import unlink as segment_unlink

def destroy(name: str, force: bool = False) -> None:
    """Remove the cache's name and its readers' companion; processes that have it mapped
    keep reading until they close.

    Refused unless force=True: a name that is not a shmcache segment (NotACacheError:
    no magic, or not a regular file), and a cache a live process of another pid still
    uses as its supervisor, a writer or a worker (CacheInUseError, naming the pids):
    they would go on writing into a segment no one can attach again.
    Handles of the calling process itself do not count: they are the caller's to close
    (and keep their mapping until then, like readers'). A directory is never removed."""
    check_name(name)
    path = path_of(name)
    try:
        fd = open_regular(name, path, os.O_RDONLY)
    except CacheNotFoundError as e:
        if not reader_stats.stray(name):
            raise
        reader_stats.unlink(name)
        raise CacheNotFoundError(f"{e}; removed its readers' companion {reader_stats.path_of(name)}, left by a "
                                 "creator killed just before it named the cache") from None
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
        raise NotACacheError(f"cache {name!r}: {path} is not a shmcache segment (no shmcache magic); it was not "
                             "removed: destroy(force=True) or shmcache destroy --force removes it anyway")
    me = owners.my_word()
    judge = owners.Owners(fd, int(words[L.H_OWNER_LOCKS]) == 1)
    users: dict[str, str] = {}
    held = [("supervisor", int(words[C.H_SUPERVISOR]), C.H_SUPERVISOR)]
    for role, first, count in (("writer", owners.writer_row_word(0), L.MAX_WRITERS),
                               ("worker", owners.worker_row_word(0), L.MAX_WORKERS)):
        for r in range(count):  # W_OWNER / K_OWNER: word 0 of a row
            if words[first + r * L.ROW_WORDS]:
                held.append((role, int(words[first + r * L.ROW_WORDS]), first + r * L.ROW_WORDS))
    for role, word, index in held:
        if word != me and judge.alive(word, index):
            users.setdefault(owners.pid_text(word), role)
    if users:
        who = ", ".join(f"{role} {pid}" for pid, role in users.items())
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


def check_mode(name: str, mode) -> None:
    """ValueError naming the cache unless `mode` is one a cache may have: the owner's
    read-write, no one else's write, no execute bits (0o600; 0o640 for a reader group, 0o644
    for everyone): writers trust the memory they read."""
    if isinstance(mode, bool) or not isinstance(mode, int) or mode & ~0o666 or mode & 0o600 != 0o600 or mode & 0o022:
        shown = f"{mode:#o}" if isinstance(mode, int) and not isinstance(mode, bool) else repr(mode)
        raise ValueError(f"cache {name!r}: mode={shown} must give the owner read-write, no one else write and no "
                         "execute bits (0o600, or 0o640 / 0o644 for readers): writers trust the memory they read")


def set_access(name: str, mode: int, gid: int | None = None) -> None:
    """Give the cache `mode` (as create's mode=) and, if `gid` is given, that group; its
    readers' companion the matching mode (reader_stats.companion_mode) and group. What a
    supervisor does at each start with its `mode` and `reader_group`, so that they hold for a
    cache it created, restored from a snapshot or found. Only the files' owner may; a group
    only one its user belongs to (CachePermissionError naming both otherwise). Readers
    attached keep their mappings; the next attach sees the new mode."""
    check_mode(name, mode)
    for path, m, what in ((path_of(name), mode, ""),
                          (reader_stats.path_of(name), reader_stats.companion_mode(mode), " (its readers' companion)")):
        try:
            fd = open_regular(name, path, os.O_RDONLY, what=what)
        except CacheNotFoundError:
            if what:
                continue  # a cache made without one: its readers count nothing
            raise
        try:
            if gid is not None:
                os.fchown(fd, -1, gid)
            os.fchmod(fd, m)
        except PermissionError as e:
            st = os.fstat(fd)
            raise CachePermissionError(
                f"cache {name!r}: cannot give {path}{what} (owner uid {st.st_uid}, group {st.st_gid}) mode "
                f"{m:04o}{'' if gid is None else f' and group {gid}'}: {e.strerror}; only its owner may, and only to "
                f"a group its user (uid {os.geteuid()}) belongs to") from None
        finally:
            os.close(fd)
