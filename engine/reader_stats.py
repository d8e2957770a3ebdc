"""Readers' hit and miss counters, in a companion segment beside the cache.

A reader maps the cache PROT_READ and is never seen by writers, so its counters
cannot live in the cache segment. Each cache has a small companion,
`/dev/shm/.shmcache-<name>.readers` (a name no cache can have: cache names start
with a letter or digit), that readers map read-write. Each reader process claims
one 64-byte row (its own cache line: no shared hot counters) and adds to it after
every batch; `stats()`, `shmcache top` and the metrics sum the rows.

    +---------------------+  0
    | header  (4 KiB)     |  magic, version, creation id of the cache it belongs to
    | rows (MAX_READERS)  |  8 int64 each: owner word, hits, misses, batches, read retries,
    |                     |  corruptions (damaged records or buckets met, each a miss)
    +---------------------+

A row whose owner died is reused by the next reader; its counters are kept, so
the sums never go down. A reader that cannot open the companion (another mode,
a cache made without one) simply keeps no shared counters: lookups never fail
for want of statistics. Mode: the owner's read-write; read-write for the group
if the cache's group may read (0640 -> 0660), so a reader group can count; read
only for others if they may read the cache (0644 -> 0664): never wider than the
group that may read. A reader allowed only to read it sees the sums, uncounted.
Like the cache itself it is made and mapped by ipc/segment.py's Segment: opened only
as a regular file, without following a symlink or blocking (open_regular), created
with O_EXCL and its mode set by fchmod (never the umask's).
"""

from __future__ import annotations

import logging
import os
import stat

import numpy as np

from shmcache.engine import layout as L
from shmcache.engine import owners
from shmcache.errors import CacheExistsError, CacheOwnerError, CachePermissionError, NotACacheError, ShmcacheError
from shmcache.ipc import liveness
from shmcache.ipc.segment import SHM_DIR, Segment, check_name, kind_of, open_regular

log = logging.getLogger("shmcache.engine")

MAGIC = 0x31524452434D4853  # b"SHMCRDR1" little-endian
# 2 added the corruptions column (word 5, zero and unused in version 1); 3: each row's
# owner holds its word's owner lock (engine/owners.py), judged alive by it in any PID
# namespace (1 and 2: by pid). Same rows: an earlier companion is used as it is.
VERSION = 3
READABLE_VERSIONS = (1, 2, 3)
LOCKS_SINCE = 3
MAX_READERS = 1024

H_MAGIC = 0
H_VERSION = 1
H_CREATION_ID = 2  # the cache's creation id: a companion left from an older cache is not used

R_OWNER = 0  # owner word of the reader process, 0 if free
R_HITS = 1
R_MISSES = 2
R_BATCHES = 3
R_RETRIES = 4
R_CORRUPTIONS = 5

SIZE = L.PAGE + MAX_READERS * L.ROW_WORDS * L.WORD
FIRST_ROW_WORD = L.PAGE // L.WORD  # the file word index of row 0's R_OWNER


def path_of(name: str) -> str:
    return os.path.join(SHM_DIR, f".shmcache-{check_name(name)}.readers")


def companion_mode(mode: int) -> int:
    """The owner's rw; rw for the group if it may read the cache; r for others if they may."""
    return 0o600 | (0o060 if mode & 0o040 else 0) | (0o004 if mode & 0o004 else 0)


_WHAT = " (its readers' companion)"


def create(name: str, mode: int, creation_id: int) -> None:
    """Make (or replace) the companion of a cache being created. A regular file left at
    its name (by a cache removed by hand) is replaced; anything else is refused."""
    path = path_of(name)
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        st = None
    if st is not None and not stat.S_ISREG(st.st_mode):
        raise NotACacheError(f"cache {name!r}: {path}{_WHAT} is {kind_of(st.st_mode)}, which shmcache did not "
                             "make")
    if st is not None:
        try:
            os.unlink(path)  # left by a cache of the same name that was removed by hand
        except FileNotFoundError:
            pass
        except PermissionError:
            raise CachePermissionError(f"cache {name!r}: permission denied removing the old {path}{_WHAT} "
                                       f"(owner uid {st.st_uid})") from None
    try:
        seg = Segment(name, create_size=SIZE, writable=True, mode=companion_mode(mode), path=path, what=_WHAT)
        try:
            h = np.frombuffer(seg.mm, np.int64, 3)
            h[H_VERSION] = VERSION
            h[H_CREATION_ID] = creation_id
            h[H_MAGIC] = MAGIC
            del h
            seg.finish_create()  # the name, once the header is whole
        finally:
            seg.close()
    except CacheExistsError:
        raise CacheExistsError(f"cache {name!r}: something else made {path}{_WHAT} while the cache was being "
                               "created; nothing was created") from None


def _ours(h: np.ndarray, creation_id: int) -> bool:
    """The first header words `h` are those of a companion of the cache with this creation id."""
    return bool(h[H_MAGIC] == MAGIC and h[H_VERSION] in READABLE_VERSIONS and h[H_CREATION_ID] == creation_id)


def belongs(name: str, creation_id: int) -> bool:
    """The companion at the name is the one of the cache with this creation id."""
    try:
        fd = open_regular(name, path_of(name), os.O_RDONLY, what=_WHAT)
    except (OSError, ShmcacheError):
        return False
    try:
        head = os.pread(fd, 3 * L.WORD, 0)
    finally:
        os.close(fd)
    return len(head) == 3 * L.WORD and _ours(np.frombuffer(head, np.int64), creation_id)


def stray(name: str) -> bool:
    """A companion (a regular file, never anything else at its name) is there."""
    try:
        return stat.S_ISREG(os.lstat(path_of(name)).st_mode)
    except OSError:
        return False


def unlink(name: str, creation_id: int | None = None) -> None:
    """Remove the companion if there is one (never a directory someone put at its name);
    with a creation id, only if it is that cache's: a creator backing out never removes
    the companion another creator of the name made meanwhile."""
    if creation_id is not None and not belongs(name, creation_id):
        return
    try:
        os.unlink(path_of(name))
    except (FileNotFoundError, IsADirectoryError, PermissionError):
        pass


def _check_size(fd: int, size: int) -> None:
    """Segment's check before it maps the companion: a file of another size is not one (a
    stranger's sparse file would be populated whole by the mapping)."""
    if size != SIZE:
        raise ValueError(f"{size} bytes, not {SIZE}")


class ReaderStats:
    """This process's row in a cache's companion; a no-op when there is none."""

    rows: np.ndarray | None = None
    row: np.ndarray | None = None
    _seg: Segment | None = None
    _claimed = False  # a row is claimed at the first batch, so stats-only handles take none

    def __init__(self, name: str, creation_id: int, owner: int | None = None):
        path = path_of(name)
        try:
            try:  # shared: a reader group writes it by design
                seg = Segment(name, writable=True, path=path, what=_WHAT, shared=True, check=_check_size, owner=owner)
            except CacheOwnerError:
                return  # another user's, where the reader expects its cache's owner: not counted in
            except PermissionError:  # a reader allowed to read the sums, not to count
                seg = Segment(name, writable=False, path=path, what=_WHAT, check=_check_size, owner=owner)
        except (OSError, ValueError):
            return  # no companion, not a file, not ours to read, not its size: no shared counters
        self._seg = seg
        self._claimed = not seg.writable  # a read-only row is never claimed: add() is a no-op
        h = np.frombuffer(seg.mm, np.int64, 3)
        ours, version = _ours(h, creation_id), int(h[H_VERSION])
        del h
        if not ours:
            self.close()
            return
        self.owners = owners.Owners(seg.fd, version >= LOCKS_SINCE)
        self.rows = np.frombuffer(seg.mm, np.int64, MAX_READERS * L.ROW_WORDS, L.PAGE)

    def _claim(self) -> np.ndarray | None:
        """This handle's row, held by its owner lock (in an earlier companion, without locks,
        a second handle in the process shares the process's row); None when every row is held
        by a live reader: this one then goes uncounted."""
        me = owners.my_word()
        if self.owners.locks:
            row = self.owners.claim_row(self.rows, MAX_READERS, FIRST_ROW_WORD, me)
        else:
            row = liveness.claim_row(self.rows, MAX_READERS, L.ROW_WORDS, me, share_own=True)
        return None if row < 0 else self.rows[row * L.ROW_WORDS:(row + 1) * L.ROW_WORDS]

    def add(self, hits: int, misses: int, retries: int = 0, corruptions: int = 0) -> None:
        if not self._claimed:
            self._claimed = True
            self.row = self._claim() if self.rows is not None else None
        row = self.row
        if row is not None:
            row[R_HITS] += hits
            row[R_MISSES] += misses
            row[R_BATCHES] += 1
            if retries:
                row[R_RETRIES] += retries
            if corruptions:
                row[R_CORRUPTIONS] += corruptions
            self._drop_if_lost()

    def totals(self) -> dict:
        """Sums over every row ever used, and how many readers are attached now."""
        if self.rows is not None:
            r = self.rows.reshape(MAX_READERS, L.ROW_WORDS)
            held = np.flatnonzero(r[:, R_OWNER]).tolist()
            readers = sum(1 for i in held if self.owners.alive(int(r[i, R_OWNER]), FIRST_ROW_WORD + i * L.ROW_WORDS))
            sums = {
                "reader_hits": int(r[:, R_HITS].sum()),
                "reader_misses": int(r[:, R_MISSES].sum()),
                "reader_batches": int(r[:, R_BATCHES].sum()),
                "reader_corruptions": int(r[:, R_CORRUPTIONS].sum()),
                "readers": readers,
            }
            del r
            if not self._drop_if_lost():
                return sums
        return {"reader_hits": 0, "reader_misses": 0, "reader_batches": 0, "reader_corruptions": 0, "readers": 0}

    def _drop_if_lost(self) -> bool:
        """The companion was cut short under its mapping (any reader of the group may write
        it; ipc/sigbus.py put zero pages in its place): its counters are gone, so this
        handle stops counting and summing, as when there is no companion. The cache itself
        is not touched."""
        if self._seg is None or not self._seg.lost:
            return False
        log.warning("cache %r: its readers' companion %s was cut short by another process; reader counters "
                    "are off for this handle", self._seg.name, self._seg.path)
        self.close()
        return True

    def close(self) -> None:
        if self.row is not None and self.owners.locks:  # the row is free again; its counters stay
            self.owners.release(self.row, R_OWNER, -1, owners.my_word())
        self.row = self.rows = None  # the row's lock goes with the file
        if self._seg is not None:
            self._seg.close()  # unmapped now, or when the last view of it goes
            self._seg = None
