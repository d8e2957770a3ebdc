"""The write side of a cache: the Writer handle (`shmcache.create` / `shmcache.open`).

A Writer is a Reader (engine/reader.py) that also writes: it maps the segment
read-write, holds a writer slot (its row of counters in the segment's writer
table) and applies batches under per-bucket locks; when a lock stays held by a
process that no longer lives, it takes the lock over and rebuilds that bucket.
Its `control` is the control area's write model (engine/control/area.py) that the
supervisor and the workers publish through.

One entry point writes: `apply(keys, actions, values, hashes=None)`; set_many,
delete_many, set and delete are apply with every action ADD or DELETE.

A lock held by a live process is never taken, however long it is held (that process
may go on writing the bucket: a stopped writer, one under a debugger). The writer waits
for it, yielding the CPU at first and then sleeping between looks (at most
WAIT_SLEEP_MAX_S), so a long wait does not burn a core. A wait of WAIT_REPORT_S or more
is published in the writer's row (L.W_WAIT: status() shows a worker's, and its
partitions are not caught up meanwhile), and `on_wait` lets the writer's owner (a
consumer worker) say that it is alive and why it makes no progress.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import numpy as np

from shmcache.engine import _input
from shmcache.engine import _kernels as K
from shmcache.engine import _repair
from shmcache.engine import layout as L
from shmcache.engine import owners
from shmcache.engine.control.area import ControlArea
from shmcache.engine.reader import SPIN_LIMIT, Reader, log
from shmcache.errors import TooManyWritersError
from shmcache.ipc import liveness
from shmcache.ipc.atomics import cas_word, load_word


WAIT_SPIN_S = 0.005  # a lock held by a live process longer than this: sleep between looks, not yield
WAIT_SLEEP_MAX_S = 0.01  # the longest sleep between two looks at a held lock
WAIT_REPORT_S = 1.0  # a wait this long is published in the writer's row (L.W_WAIT) until it ends


class Writer(Reader):
    """A read-write handle: `shmcache.create(...)` or `shmcache.open(name)`."""

    _writable = True
    _slot = -1
    # True on the handle of the create() call that made the cache; False on every other, also
    # on create(exist_ok=True)'s when another process had just made it (the caller's only
    # sure way to know: a look at the name beforehand races with that other creator)
    created = False
    _control_class = ControlArea
    # Called at each look while a lock held by a live process keeps a write waiting:
    # on_wait(bucket, holder_word, waited_s), the holder's owner word (ipc/liveness.py).
    # The waiting write goes on when it returns.
    on_wait: Callable[[int, int, float], None] | None = None

    def __init__(self, name: str):
        """Open cache `name` for writing (shmcache.open); a writer checks the owner itself:
        only a segment of its own user's that no one else may write (ipc/segment.py)."""
        super().__init__(name)

    def _setup(self, name, seg) -> None:
        super()._setup(name, seg)
        try:
            self._pid = os.getpid()
            self._me = liveness.owner_word()
            self._slot = self._claim_slot()
        except BaseException:
            Reader.close(self)
            raise
        # this process's row of the writer table: the kernels count into it in place
        self._counters = self._writers[self._slot * L.ROW_WORDS:(self._slot + 1) * L.ROW_WORDS]
        # its counters carry on (totals never drop), but W_WAIT is a state, not a count: a dead
        # owner's wait (or what an earlier layout kept in that word) is not this process's
        self._counters[L.W_WAIT] = 0

    def _claim_slot(self) -> int:
        """A writer slot for this process's counters: a free one, else one whose owner died."""
        s = self.owners.claim_row(self._writers, L.MAX_WRITERS, owners.writer_row_word(0), self._me)
        if s >= 0:
            return s
        raise TooManyWritersError(f"cache {self.name!r}: all {L.MAX_WRITERS} writer slots are held by live processes")

    def kernel_identity(self) -> tuple[int, np.ndarray]:
        """Engine-internal, beside segment_arrays: the bucket-lock owner word and the
        counters row that this handle passes to the apply kernel (for benchmarks that call
        the kernel itself)."""
        self._check_open()
        return self._me, self._counters

    def close(self) -> None:
        """Give this process's writer slot back (its counters stay in the totals) and unmap.
        Never destroys the cache; safe to call twice."""
        if self._slot >= 0 and self._seg is not None:
            # the word, then its lock (closing the file would drop it too); counters stay: totals never drop
            self.owners.release(self._writers, self._slot * L.ROW_WORDS + L.W_OWNER,
                                owners.writer_row_word(self._slot), self._me)
            self._slot = -1
        super().close()

    def take_over(self, other: "Writer") -> "Writer":
        """Engine-internal (an online resize, engine/resizing.py): this handle and `other` trade
        segments. This handle maps `other`'s from now on, and `other` this handle's old one
        (still mapped, its writer slot and owner locks still held: close it when its last
        readers have moved on). Each keeps its ControlArea object, now over the other's
        words, so whatever holds `handle.control` follows its handle. Returns `other`."""
        mine, theirs = dict(self.__dict__), dict(other.__dict__)
        mine_ctl, theirs_ctl = mine.pop("control"), theirs.pop("control")
        mine_words, theirs_words = dict(mine_ctl.__dict__), dict(theirs_ctl.__dict__)
        mine_ctl.__dict__.clear()
        mine_ctl.__dict__.update(theirs_words)
        theirs_ctl.__dict__.clear()
        theirs_ctl.__dict__.update(mine_words)
        self.__dict__.clear()
        self.__dict__.update(theirs, control=mine_ctl)
        other.__dict__.clear()
        other.__dict__.update(mine, control=theirs_ctl)
        return other

    # -- the one write path ---------------------------------------------------------------------

    def apply(self, keys, actions, values=None, *, hashes=None) -> None:
        """Apply ADD (0) / DELETE (1) entries in order: the batch entry point (no per-entry objects).

        keys: a sequence of key_size-byte keys or an (n, key_size) uint8 array.
        values (ignored for deletes; None: all empty): a sequence of bytes, an (offsets, data)
        pair (value i is data[offsets[i]:offsets[i + 1]]), or a (starts, lens, data) triple
        (value i is data[starts[i]:starts[i] + lens[i]]: a decoded Kafka batch, as the workers
        apply them). Actions and every value's span and length are checked before anything
        is applied. A tuple whose first item is a numpy array is one of the packed forms.
        hashes: optional uint64 array of each key's xxh64 (seed 0, the table's key hash), as
        a wire v2 message carries them, so no key is hashed twice. They are TRUSTED, not
        checked: a wrong one files its key under the wrong bucket, where lookups do not find
        it. Pass only hashes verified against their keys (formats/wire.py's Batch.hashes:
        decode checks every one; a message with a wrong one is not taken as v2)."""
        if values is None:
            k = self._keys(keys)
            starts = lens = np.zeros(len(k), np.int64)
            data = np.zeros(0, np.uint8)
        else:
            k, starts, lens, data = self._entries(keys, values)
        n = len(k)
        acts = _input.actions(self.name, actions, n)
        self._apply(k, acts, starts, lens, data, None if hashes is None else _input.hashes(self.name, hashes, n))

    def set_many(self, keys, values) -> None:
        """Set a batch: keys as for get_many; values in any form apply takes."""
        k, starts, lens, data = self._entries(keys, values)
        self._apply(k, np.zeros(len(k), np.uint8), starts, lens, data)

    def _entries(self, keys, values) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Keys and values, checked, in the kernel's form (two lists of bytes in one pass)."""
        self._check_open()
        return _input.entries(self.name, self.geometry.key_size, self.geometry.max_value, keys, values)

    def delete_many(self, keys) -> None:
        """Delete a batch: keys as for get_many. A key that is not there is counted (stats'
        delete_misses), not an error."""
        k = self._keys(keys)
        z = np.zeros(len(k), np.int64)
        self._apply(k, np.full(len(k), K.DELETE, np.uint8), z, z, np.zeros(0, np.uint8))

    def set(self, key: bytes, value: bytes) -> None:
        """Set one key's value (a batch of one: set_many and apply take whole batches at a
        fraction of the cost a key). ValueTooLargeError past max_value, KeySizeError for a key
        of another size."""
        self.set_many([key], [value])

    def delete(self, key: bytes) -> None:
        """Delete one key; a key that is not there is counted (delete_misses), not an error."""
        self.delete_many([key])

    def _apply(self, k: np.ndarray, actions: np.ndarray, starts, lens, data, hashes=None) -> None:
        self._check_open()
        n = len(k)
        hashed = hashes is not None
        if not hashed:
            hashes = np.empty(n, np.int64)  # filled by the kernel
        k8, k64 = _input.words(k, self._kstride)
        c = self._counters
        i = 0
        stuck_at, since = -1, 0.0  # the entry a held lock stopped, and since when
        try:
            while True:
                i = K.apply_entries(self._meta, self._index, self._ring8, self._ring64, self._geo, k8, k64, hashes,
                                    hashed, actions, starts, lens, data, i, self._me, SPIN_LIMIT, c)
                if i >= n:
                    break
                hashed = True  # the kernel hashed them all before it stopped
                now = time.monotonic()
                if i != stuck_at:
                    stuck_at, since = i, now
                    c[L.W_WAIT] = 0
                self._contended(int(hashes[i]) & (L.NBUCKETS - 1), now - since)
        finally:
            c[L.W_WAIT] = 0
        self.raise_if_lost()  # written into zero pages: not into the cache
        c[L.W_BATCHES] += 1

    def _contended(self, b: int, waited: float) -> None:
        """Bucket b's lock stayed held (for `waited` s so far): take it over if its owner died,
        else give the CPU away, and say so (on_wait) when the owner is a live process."""
        lock = b * L.ROW_WORDS + L.M_LOCK
        owner = int(load_word(self._meta, lock))
        if owner == 0:  # released since the kernel looked
            os.sched_yield()
            return
        if self.owners.writer_alive(owner, self._writers):
            if waited >= WAIT_REPORT_S:
                self._counters[L.W_WAIT] = b + 1
            if waited < WAIT_SPIN_S:
                os.sched_yield()
            else:
                time.sleep(min(WAIT_SLEEP_MAX_S, waited / 10))
            if self.on_wait is not None:
                self.on_wait(b, owner, waited)
            return
        if self._take_over(b, owner):
            log.warning("cache %r: took over bucket %d from dead writer pid %d and rebuilt it",
                        self.name, b, liveness.word_pid(owner))

    def _take_over(self, b: int, owner: int) -> bool:
        """Bucket b's lock from its dead owner to this writer, then the bucket rebuilt; False if another got there first."""
        if cas_word(self._meta, b * L.ROW_WORDS + L.M_LOCK, owner, self._me) != owner:
            return False
        _repair.repair_bucket(self._meta, self._index, self._ring8, self._ring64, self._geo, b)  # counts M_TAKEOVERS
        return True

    def rebuild_bucket(self, b: int) -> bool:
        """Engine-internal, beside segment_arrays: take bucket b's lock if no process holds it
        and rebuild the bucket from its ring, as a takeover does (a restore's bucket that was
        copied mid-write: snapshots/restoring.py). False if its lock is held."""
        self._check_open()
        if cas_word(self._meta, b * L.ROW_WORDS + L.M_LOCK, 0, self._me) != 0:
            return False
        _repair.repair_bucket(self._meta, self._index, self._ring8, self._ring64, self._geo, b)  # counts M_TAKEOVERS
        return True

    def repair_dead_locks(self) -> int:
        """Take over and rebuild every bucket whose lock is held by a dead process; returns how many.

        Writers do this lazily when they meet such a lock; a supervisor calls it after a
        worker died, so that no bucket stays mid-write until some writer happens by."""
        locks = self._meta.reshape(L.NBUCKETS, L.ROW_WORDS)[:, L.M_LOCK]
        repaired = 0
        for b in np.flatnonzero(locks).tolist():
            owner = int(load_word(self._meta, b * L.ROW_WORDS + L.M_LOCK))
            if owner and not self.owners.writer_alive(owner, self._writers) and self._take_over(b, owner):
                repaired += 1
        return repaired


# No process has this owner word: its pid is above the kernel's PID_MAX_LIMIT (2**22).
_NEVER_ALIVE = (2**22 + 1) << 32 | 1


def warm_takeover(w: Writer) -> int:
    """Take over bucket 0 of `w` from a writer that never lived, by the real path
    (repair_dead_locks): numba compiles the repair kernel now, for the argument types a
    takeover gives it, and not on a machine's first real takeover (consumer/warm.py, on its private
    cache; the bucket is rebuilt from its ring, as any taken-over bucket is). Returns 1."""
    w._check_open()
    if cas_word(w._meta, L.M_LOCK, 0, _NEVER_ALIVE) != 0:
        raise RuntimeError(f"cache {w.name!r}: bucket 0 is locked; the warm-up takes over a free bucket only")
    return w.repair_dead_locks()


def apply_kernel_cache():
    """numba's on-disk cache of the apply kernel (its directory: beside the sources,
    NUMBA_CACHE_DIR or the user's cache directory, numba's choice), where a finished
    warm-up leaves its marker (consumer/warm.py); None if this numba has none to show."""
    return getattr(K.apply_entries, "_cache", None)
