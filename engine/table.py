"""The table's front door: create, open and attach a cache (`shmcache.create`,
`shmcache.open`, `shmcache.attach`), and the handles they return.

The handles live beside this module: engine/reader.py (Reader: lookups, stats,
status; the checks at attach; Packed, a batch's results), engine/writer.py (Writer:
apply and its forms), engine/_input.py (checking what callers hand in),
engine/control/ (the control area's model), engine/lifecycle.py (opening a name,
exists, list_caches, destroy).

Guaranteed: a created cache is fully initialised before anyone can map it (it is
built as an unnamed file and gets its name last, so no name ever holds a half-made
cache, and a creator killed mid-create leaves nothing behind); a handle's
close() unmaps and never destroys; an attach is read-only (PROT_READ).
Not guaranteed: an entry may be evicted at any time (FIFO per bucket once its
ring or index is full); a key that is set and read concurrently reads as either
the old or the new value. stats() is a snapshot assembled without locks.
"""

from __future__ import annotations

import logging
import os
import secrets
import time
from typing import Sequence

import numpy as np

from shmcache.engine.control import layout as C
from shmcache.engine import layout as L
from shmcache.engine import units
from shmcache.engine import reader_stats
from shmcache.engine.lifecycle import check_mode, destroy, exists, list_caches, set_access  # noqa: F401  (this module's API)
from shmcache.engine.reader import Packed, Reader
from shmcache.engine.writer import Writer
from shmcache.errors import (CacheExistsError, CacheNotFoundError, CachePermissionError, CacheSpaceError,
                             GeometryMismatchError, NotACacheError, ShmcacheError)
from shmcache.ipc import memlimit
from shmcache.ipc.atomics import load_beside, store_word
from shmcache.ipc.segment import SHM_DIR, Segment, check_name, path_of, shm_free_bytes

log = logging.getLogger("shmcache.engine")


def create(name: str, memory: int | str = "256MiB", *, key_size: int = L.DEFAULT_KEY_SIZE,
           max_value: int | None = L.DEFAULT_MAX_VALUE, mode: int = 0o600, exist_ok: bool = False,
           group: int | None = None) -> Writer:
    """Create a cache of fixed size `memory` and return a writer on it.

    FileExistsError (CacheExistsError) if it exists, unless exist_ok=True, which opens
    it instead: its key size and max_value must match, and its memory stays as it was
    (`memory` is then not planned, so one too small for this max_value is no error).
    max_value=None: the existing cache's own, or L.DEFAULT_MAX_VALUE for a new one.
    The writer's `created` says whether this call made the cache. `group`: a gid the new
    file is given before it is named (with mode 0o640, its readers'), so that no reader of
    that group ever finds it at the name without access; an existing cache's is left."""
    check_name(name)
    key_size = _whole(name, "key_size", key_size, 1, L.MAX_KEY_SIZE)
    if max_value is not None:
        max_value = _whole(name, "max_value", max_value, 0, 0xFFFFFFFF)
    check_mode(name, mode)
    nbytes = units.parse_bytes(memory)
    if exist_ok:
        try:
            return _existing(name, key_size, max_value, exist_ok)
        except CacheNotFoundError:
            pass  # not there (yet): create it; a creator that wins the race is opened below
    if max_value is None:
        max_value = L.DEFAULT_MAX_VALUE
    geo = L.Geometry.plan(nbytes, key_size, max_value)
    free = shm_free_bytes()
    if free is not None and geo.size > free:
        raise CacheSpaceError(
            f"cache {name!r}: memory={units.format_bytes(geo.size)} ({geo.size:,} bytes) does not fit in {SHM_DIR}, "
            f"which has {units.format_bytes(free)} ({free:,} bytes) free: ask for less, or make room in {SHM_DIR}")
    room = memlimit.room()  # tmpfs pages are charged to this process's cgroup: past its limit, an OOM kill
    if room is not None and geo.size > room.bytes:
        raise CacheSpaceError(
            f"cache {name!r}: memory={units.format_bytes(geo.size)} ({geo.size:,} bytes) does not fit in this "
            f"process's memory limit, which leaves {units.format_bytes(room.bytes)} ({room.bytes:,} bytes): "
            f"{room.limit:,} bytes at {room.where}, {room.in_use:,} in use (the cache's pages are charged to "
            "the cgroup of the process that creates it); ask for less, or raise the limit")
    loading = load_beside()  # numba loads the word kernels while the pages are allocated
    try:
        seg = Segment(name, create_size=geo.size, writable=True, mode=mode)
    except FileExistsError:
        return _existing(name, key_size, max_value, exist_ok)
    creation_id = secrets.randbits(63)
    try:
        write_header(seg, geo, creation_id, time.time_ns(), loading)
        if group is not None:  # before the name: a reader of the group never meets it without access
            try:
                os.fchown(seg.fd, -1, group)
            except PermissionError as e:
                raise CachePermissionError(f"cache {name!r}: cannot give it group {group}: {e.strerror}; only a "
                                           f"group its user (uid {os.geteuid()}) belongs to") from None
        # the companion just before the name: whoever finds the cache finds its companion
        # too, and a creator killed in between leaves only the companion (destroy removes it)
        _make_companion(name, mode, creation_id)
        seg.finish_create()  # the name: attachers find the cache now, whole
    except FileExistsError:  # another creator of the name got there first, with its companion or the name
        seg.close()  # the segment has no name: it goes with its mapping
        if not os.path.lexists(path_of(name)):
            raise  # its companion only, so far: that creator is still at work (or was killed)
        _companion_back(name)
        return _existing(name, key_size, max_value, exist_ok)
    except BaseException:
        seg.close()
        reader_stats.unlink(name, creation_id)  # this creator's companion, never another's
        raise
    try:
        w = Writer._adopt(name, seg)
        w.created = True
        return w
    except BaseException:  # named, but not handed over (a signal turned exception): take it back
        seg.unname()
        seg.close()
        reader_stats.unlink(name, creation_id)
        raise


def write_header(seg: Segment, geo: L.Geometry, creation_id: int, created_ns: int, loading=None) -> None:
    """A new segment's header: its geometry, who it is, its clocks and owner locks, the magic
    last (an attacher of the named file finds it whole). `loading`: load_beside()'s thread."""
    h = np.frombuffer(seg.mm, np.int64, L.HEADER_WORDS, 0)
    h[L.H_KEY_SIZE] = geo.key_size
    h[L.H_MAX_VALUE] = geo.max_value
    h[L.H_NBUCKETS] = L.NBUCKETS
    h[L.H_SLOTS] = geo.slots
    h[L.H_RING] = geo.ring
    h[L.H_SIZE] = geo.size
    h[L.H_CREATION_ID] = creation_id
    h[L.H_CREATED_NS] = created_ns
    h[C.H_AGE_CLOCK] = C.AGE_CLOCK_MONOTONIC
    h[L.H_OWNER_LOCKS] = 1  # every owner of this segment holds its word's lock (engine/owners.py)
    h[L.H_VERSION] = L.LAYOUT_VERSION
    if loading is not None:
        loading.join()
    store_word(h, L.H_MAGIC, L.MAGIC)


def _make_companion(name: str, mode: int, creation_id: int) -> None:
    """The readers' companion (engine/reader_stats.py), which is optional: where what someone
    else put at its name cannot be replaced (a directory, a FIFO, another user's file in
    the sticky /dev/shm), the cache is made without it, its readers keep no shared counters,
    and a warning says so; never a failed create. A companion another creator of the name
    made meanwhile (CacheExistsError) goes on to create()'s race for the name."""
    try:
        reader_stats.create(name, mode, creation_id)
    except (NotACacheError, CachePermissionError) as e:
        log.warning("%s; the cache is made without it: its readers keep no shared hit and miss counters", e)


def _companion_back(name: str) -> None:
    """After a lost race for the name: the companion this creator made may have replaced
    the winner's, and the winner's readers would count nothing in one of another creation
    id. Give the winner a companion of its own again (best effort: the winner's counts
    are in the one replaced, gone either way)."""
    try:
        with Reader(name) as winner:
            if not reader_stats.belongs(name, winner.creation_id):
                reader_stats.create(name, os.stat(path_of(name)).st_mode & 0o777, winner.creation_id)
    except (OSError, ShmcacheError):
        pass


def _existing(name: str, key_size: int, max_value: int | None, exist_ok: bool) -> Writer:
    """create()'s answer when the name is taken: CacheExistsError, or with exist_ok a writer
    on the cache there, if its key size and max_value (unless None) are the ones asked for."""
    if not exist_ok:
        raise CacheExistsError(f"cache {name!r} already exists ({path_of(name)})")
    w = Writer(name)
    if w.key_size != key_size or max_value not in (None, w.max_value):
        w.close()
        raise GeometryMismatchError(
            f"cache {name!r} exists with key_size={w.key_size}, max_value={w.max_value}; "
            f"asked for key_size={key_size}, max_value={max_value}"
        )
    return w


def open_writer(name: str) -> Writer:
    """Re-attach a writer to an existing cache (a restarted worker)."""
    return Writer(name)


def attach(name: str, owner: int | str | None = None) -> Reader:
    """Map a cache read-only (PROT_READ) from any process; never registers it for cleanup.
    `owner` (a user name or uid, e.g. "shmcache"): refuse a cache whose file another user
    owns (CacheOwnerError naming both) before reading anything of it: any user may create
    the name first (before the supervisor's start, or after a destroy) and serve any values."""
    return Reader(name, owner=owner)


def _whole(name: str, what: str, value, lo: int, hi: int) -> int:
    """An int (a numpy integer too, never a bool or a float) from lo to hi, else a ValueError naming it."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or not lo <= value <= hi:
        raise ValueError(f"cache {name!r}: {what}={value!r} must be a whole number from {lo} to {hi}")
    return int(value)


__all__: Sequence[str] = ["Reader", "Writer", "Packed", "create", "open_writer", "attach", "destroy", "exists",
                          "list_caches"]
