"""A cache's segment rebuilt at another size beside itself, then put in its place: the
engine's part of an online resize (consumer/supervisor/resizing.py drives it; the
entries go across with snapshots/copying.py).

The new segment is made at a hidden name beside the cache, `/dev/shm/.shmcache-NAME.resizing`
(a cache's name starts with a letter or digit, so none can be that, and list_caches
never shows it): the same buckets and key size and max_value, the index and rings of the
new memory, and the old segment's creation id, creation time, mode and group, so the
readers' companion serves both (its counts carry on). Once the new segment holds
everything, `swap` renames it over the cache's name: rename(2) is atomic, so an attacher
finds the old cache or the new one, whole, never none and never a half. The old file goes
with its last mapping. A reader that follows the name (engine/reattach.py, and the Go and
Java readers' follow) maps the new one at its next look; one that does not keeps the
old, which no writer changes any more.

A process killed before the rename leaves its half at the hidden name only: nothing at
NAME changed. `remove_leftover` removes it (a supervisor's start, and every resize
before it makes its own).

The request: `shmcache resize` asks by a compare-and-swap of the header word
H_RESIZE_ASK from 0 to the bytes it wants (`ask`, through a mapping of the header page
alone); the live supervisor takes it (the word negated) and answers either by the new
segment at the name, or, on the old one, with its refusal's words and the ask cleared
(engine/control/area.py ControlArea.resize_refused).
"""

from __future__ import annotations

import mmap
import os

import numpy as np

from shmcache.engine import layout as L
from shmcache.engine import owners
from shmcache.engine import units
from shmcache.engine.control import layout as C
from shmcache.engine.reader import header_check
from shmcache.engine.table import write_header
from shmcache.engine.writer import Writer
from shmcache.errors import CacheNotFoundError, CacheSpaceError
from shmcache.ipc import memlimit
from shmcache.ipc.atomics import cas_word, load_word
from shmcache.ipc.segment import SHM_DIR, Segment, check_name, identity, open_regular, path_of, shm_free_bytes

SUFFIX = ".resizing"
# How long the supervisor, and each worker, keep the old segment mapped after the swap,
# beating in it: a reader that follows the name, and looked at it just before the swap,
# reads the old one until its next look, and finds it ready meanwhile (its supervisor and
# workers alive, their heartbeats young); shorter than the staleness bounds (10 s).
RETIRE_S = 5.0


def path_beside(name: str) -> str:
    """Where cache `name`'s new segment is built during a resize."""
    return os.path.join(SHM_DIR, f".shmcache-{check_name(name)}{SUFFIX}")


def remove_leftover(name: str) -> bool:
    """Remove a half a resize left at the hidden name (its process was killed before the
    rename); True if there was one."""
    try:
        os.unlink(path_beside(name))
        return True
    except FileNotFoundError:
        return False


def plan(handle, memory) -> L.Geometry:
    """The geometry cache `handle` (a Reader or Writer) would have at `memory` (bytes or
    "1GiB"): its buckets, key size and max_value; MemoryTooSmallError if that cannot hold them."""
    return L.Geometry.plan(units.parse_bytes(memory), handle.key_size, handle.max_value)


def check_room(name: str, geo: L.Geometry) -> None:
    """CacheSpaceError unless /dev/shm, and the memory limit of this process's cgroup, can take
    a segment of `geo` beside the cache (old and new are both resident until the swap)."""
    free = shm_free_bytes()
    size = units.format_bytes(geo.size)
    if free is not None and geo.size > free:
        raise CacheSpaceError(f"cache {name!r}: no room for a {size} segment beside it: {SHM_DIR} has "
                              f"{units.format_bytes(free)} free, and the old segment stays until the new one "
                              f"replaces it (make room in {SHM_DIR}, or ask for less)")
    room = memlimit.room()
    if room is not None and geo.size > room.bytes:
        raise CacheSpaceError(f"cache {name!r}: no room for a {size} segment beside it within the memory limit "
                              f"at {room.where}, which leaves {units.format_bytes(room.bytes)} (tmpfs pages are "
                              "charged to the cgroup of the process that makes them)")


def create_beside(old: Writer, geo: L.Geometry) -> Writer:
    """A writer on a new, empty segment of `geo` for `old`'s cache, at the hidden name
    (a leftover there is replaced): the old header's creation id, creation time, mode and
    group. CacheSpaceError if there is no room for it."""
    name = old.name
    check_room(name, geo)
    remove_leftover(name)
    st = old.file_stat()
    seg = Segment(name, create_size=geo.size, writable=True, mode=st.st_mode & 0o777, path=path_beside(name),
                  what=" (a resize's new segment)")
    try:
        write_header(seg, geo, old.creation_id, old.created_ns)
        if os.fstat(seg.fd).st_gid != st.st_gid:
            os.fchown(seg.fd, -1, st.st_gid)
        seg.finish_create()
        return Writer._adopt(name, seg)
    except BaseException:
        seg.close()
        remove_leftover(name)
        raise


def open_beside(name: str) -> Writer:
    """A writer on the new segment a resize of cache `name` is building (its workers move to it
    before the swap)."""
    return Writer._adopt(name, Segment(name, writable=True, path=path_beside(name), check=header_check(name),
                                       what=" (a resize's new segment)"))


def swap(new: Writer, old_identity: tuple[int, int] | None) -> None:
    """Put `new` (built by create_beside) at its cache's name, in place of the segment whose
    identity (ipc/segment.py) is `old_identity`. CacheNotFoundError if the name holds something
    else by now (destroyed, re-created): nothing is renamed then."""
    name = new.name
    if identity(name) != old_identity:
        raise CacheNotFoundError(f"cache {name!r}: {path_of(name)} is no longer the segment being resized (destroyed "
                                 "or re-created meanwhile); the resize is given up")
    os.rename(path_beside(name), path_of(name))
    new.renamed(path_of(name))


class Ask:
    """`shmcache resize`'s side: its ask in the header word H_RESIZE_ASK of the cache at the name,
    through a read-write mapping of the header page alone (the command is no writer)."""

    def __init__(self, name: str):
        self.fd = open_regular(name, path_of(name), os.O_RDWR)
        try:
            st = os.fstat(self.fd)
            self.identity = (st.st_dev, st.st_ino)
            self._mm = mmap.mmap(self.fd, L.PAGE, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            os.close(self.fd)
            raise
        self.h = np.frombuffer(self._mm, np.int64, L.HEADER_WORDS)
        self._owners = owners.for_segment(self.fd, self.h)

    def supervisor_alive(self) -> bool:
        """The segment's supervisor runs (its owner lock held: engine/owners.py)."""
        return self._owners.alive(int(load_word(self.h, C.H_SUPERVISOR)), C.H_SUPERVISOR)

    def ask(self, nbytes: int) -> int:
        """Ask for `nbytes`; 0 if asked, else the ask already there (another resize's)."""
        was = int(cas_word(self.h, C.H_RESIZE_ASK, 0, nbytes))
        return 0 if was == 0 else was

    def state(self) -> int:
        """H_RESIZE_ASK now: the bytes asked (not taken yet), minus them (being done), 0 (answered)."""
        return int(load_word(self.h, C.H_RESIZE_ASK))

    def refusals(self) -> int:
        """Refusals the supervisor answered so far (H_RESIZE_ANSWERED)."""
        return int(load_word(self.h, C.H_RESIZE_ANSWERED))

    def withdraw(self, nbytes: int) -> bool:
        """Take back an ask the supervisor has not taken yet; False if it has."""
        return int(cas_word(self.h, C.H_RESIZE_ASK, nbytes, 0)) == nbytes

    def close(self) -> None:
        del self.h
        self._mm.close()
        os.close(self.fd)
