"""The read side of a cache: the Reader handle (`shmcache.attach`), what it checks of a
cache's file as it attaches and after each call, and its batch results (Packed).

A Reader maps the segment with PROT_READ and looks keys up in batches through the
compiled lookup kernel: it takes no lock, never blocks a writer and is never seen
by writers. A Reader has no write methods at all; the Writer (engine/writer.py)
is a Reader that also writes.

Not guaranteed: an entry may be evicted at any time (FIFO per bucket once its
ring or index is full); a key that is set and read concurrently reads as either
the old or the new value. stats() is a snapshot assembled without locks.

The checks: the header before anything is mapped (a stranger's file at the name costs one
page read), the geometry against the file's size, and whether the file was cut short
under the mapping (ipc/sigbus.py put zero pages there).
"""

from __future__ import annotations

import functools
import logging
import os
import time

from typing import NamedTuple

import numpy as np

from shmcache.engine import _input
from shmcache.engine import _lookup as LK
from shmcache.engine import layout as L
from shmcache.engine import units
from shmcache.engine import owners, reader_stats
from shmcache.engine.control.area import ControlView
from shmcache.errors import ClosedError, CorruptCacheError, LayoutVersionError, NotACacheError, UnsafeModeError
from shmcache.ipc.atomics import load_word
from shmcache.ipc.segment import UNSAFE_MODE_BITS, Segment, owner_uid, path_of, user_text

log = logging.getLogger("shmcache.engine")

# Spins before a kernel hands a held lock / odd bucket back to Python, which yields
# the CPU and checks whether the holder still lives (spin with backoff: docs/design.md, Atomics).
SPIN_LIMIT = 2000
# How long a lookup call waits in all on buckets that stay mid-write under a live lock
# holder, or whose version never settles (a writer stopped inside a bucket, or a hostile
# process): from the first stuck bucket a call meets, each key whose bucket is still stuck
# after this many seconds is reported missing at once, a corruption counted and its bucket
# given up for the rest of the call. A bound per call, not per key: a batch of 1,024 keys
# in 1,024 held buckets returns after about this long. A healthy writer holds a bucket for
# microseconds.
STUCK_GIVE_UP = 1.0
# a call's given-up buckets before its bound: none (the kernel writes given_up only with give_up)
_NONE_GIVEN_UP = np.zeros(L.NBUCKETS, np.bool_)


# -- what a handle checks of a cache's file ----------------------------------------------------


def too_small(name: str, path: str, size: int) -> NotACacheError:
    return NotACacheError(f"cache {name!r}: {path} is {size} bytes, not a shmcache segment")


def check_header(name: str, path: str, size: int, h: np.ndarray, magic: int) -> L.Geometry:
    """The geometry of the cache whose header words are h and whose file holds size bytes;
    NotACacheError, LayoutVersionError or CorruptCacheError naming what is wrong. magic
    is h's H_MAGIC word as the caller read it (on a mapping, an acquire load: a creator
    names its segment once the magic is in)."""
    if magic == 0:
        raise NotACacheError(
            f"cache {name!r}: {path} has no shmcache magic (shmcache did not make it, or its header "
            f"was overwritten): not a usable cache; remove it with shmcache destroy --force {name}")
    if magic != L.MAGIC:
        raise NotACacheError(f"cache {name!r}: {path} is not a shmcache segment (bad magic)")
    if h[L.H_VERSION] != L.LAYOUT_VERSION:
        raise LayoutVersionError(
            f"cache {name!r} has layout version {int(h[L.H_VERSION])}; this shmcache reads "
            f"version {L.LAYOUT_VERSION} (destroy and re-create it, or use a matching shmcache)"
        )
    return L.Geometry.from_header(name, h, size)


def raise_if_lost(name: str, seg: Segment) -> None:
    """Reader.raise_if_lost, for the control view too: it holds the segment, not the handle
    (a handle its own view referred back to would wait for the cycle collector to unmap)."""
    if seg.lost:
        raise CorruptCacheError(
            f"cache {name!r}: {seg.path} was cut short while this process mapped it (truncated by a process "
            "that may write it); its content is gone from this handle: attach again, or destroy and re-create "
            "the cache")


def header_check(name: str):
    """Segment's check of a file before it maps it (ipc/segment.py): its mode must let no one
    but its owner write it (UnsafeModeError), and its first page, read with pread(2), must
    be a whole cache's header for a file of its size. A stranger's file at
    the name (a sparse one of any size) is refused having cost one page read, not mapped
    and populated first."""
    path = path_of(name)

    def check(fd: int, size: int) -> None:
        st = os.fstat(fd)
        if st.st_mode & UNSAFE_MODE_BITS:
            raise UnsafeModeError(
                f"cache {name!r}: {path} has mode {st.st_mode & 0o777:04o} (owner {user_text(st.st_uid)}): its group or "
                "others may write it, so anyone could have put its content there; no shmcache creator makes such a "
                "file: refusing to read it (destroy and re-create the cache, or chmod it back to 0600 or 0640)")
        page = os.pread(fd, L.PAGE, 0) if size >= L.PAGE else b""
        if len(page) < L.PAGE:  # shrunk since its size was read, too
            raise too_small(name, path, size)
        h = np.frombuffer(page, np.int64)
        check_header(name, path, size, h, int(h[L.H_MAGIC]))
    return check


# -- a batch's results ----------------------------------------------------------------------


class Packed:
    """Lookup results without per-key objects: value i is data[offsets[i]:offsets[i + 1]]
    where found[i]; offsets has len(found) + 1 entries (int64)."""

    __slots__ = ("found", "offsets", "data")  # a plain class: built once per batch, cheaply

    def __init__(self, found: np.ndarray, offsets: np.ndarray, data: np.ndarray):
        self.found = found
        self.offsets = offsets
        self.data = data

    def __repr__(self) -> str:
        return f"Packed({len(self.found)} keys, {int(self.found.sum())} found, {len(self.data)} value bytes)"

    def __len__(self) -> int:
        """The number of keys looked up (found or not)."""
        return len(self.found)

    def to_list(self) -> list[bytes | None]:
        """The values in key order: bytes where found, None where not (one object per hit;
        the arrays give the same without them)."""
        buf = self.data.tobytes()
        o = self.offsets.tolist()
        return [buf[o[i]:o[i + 1]] if f else None for i, f in enumerate(self.found.tolist())]

    def to_arrow(self, large: bool = False):
        """A pyarrow BinaryArray (nulls where not found), built from these buffers without per-row work."""
        try:
            import pyarrow as pa
        except ImportError:  # optional dependency
            raise ImportError("to_arrow() needs pyarrow: pip install 'shmcache[arrow]'") from None
        n = len(self.found)
        valid = pa.py_buffer(np.packbits(self.found, bitorder="little"))
        if large or self.offsets[-1] > np.iinfo(np.int32).max:
            return pa.Array.from_buffers(pa.large_binary(), n, [valid, pa.py_buffer(self.offsets), pa.py_buffer(self.data)])
        offs = self.offsets.astype(np.int32)
        return pa.Array.from_buffers(pa.binary(), n, [valid, pa.py_buffer(offs), pa.py_buffer(self.data)])


# -- the handle -------------------------------------------------------------------------------


class SegmentArrays(NamedTuple):
    """A handle's views of its segment's sections (engine/layout.py), for the engine's own
    modules that work on whole buckets (snapshots/). Views, not copies: read the
    buckets under their seqlocks, write them only through the kernels, as a Writer does.
    On a Reader the mapping is read-only and so are these."""

    header: np.ndarray  # int64 words, L.H_*
    partitions: np.ndarray  # int64 rows of L.ROW_WORDS, L.P_*
    meta: np.ndarray  # int64 bucket rows of L.ROW_WORDS, L.M_*
    index: np.ndarray  # int64, geometry.slots per bucket
    ring8: np.ndarray  # the rings as bytes
    ring64: np.ndarray  # the same rings as int64 words
    geo: np.ndarray  # the kernels' geometry vector (slots, ring, key_size, max_value, max_live, key stride)


class Reader:
    """A read-only handle on a cache: `shmcache.attach(name)`."""

    _seg: Segment | None = None  # class defaults: close() may run on a half-built handle
    _writable = False
    _owner: int | None = None  # the uid the cache's file must belong to (attach(owner=)), None: any
    _control_class = ControlView

    def __init__(self, name: str, owner: int | str | None = None):
        """Attach to cache `name`; shmcache.attach(name). A name only ever holds a whole
        cache (a creator names its segment last: see ipc/segment.py), so there is no
        creator to wait for; anything but a regular file is refused by open_regular.
        `owner` (a user name or uid): the user whose cache it must be, or CacheOwnerError
        naming both, before anything of it is read; its readers' companion too (another
        owner's is not counted in)."""
        uid = owner_uid(owner, name)
        self._owner = uid
        self._setup(name, Segment(name, writable=self._writable, check=header_check(name), owner=uid))

    @classmethod
    def _adopt(cls, name: str, seg: Segment):
        """A handle on a segment already opened (a creator's, just named)."""
        handle = cls.__new__(cls)
        handle._setup(name, seg)
        return handle

    def _setup(self, name: str, seg: Segment) -> None:
        self.name = name
        self._seg = seg
        try:
            self._map()
        except BaseException:
            self._seg.close()
            raise
        self._hits = 0
        self._misses = 0
        self._counts = np.zeros(2, np.int64)  # the lookup kernel's retries and corruptions (_lookup.C_*)
        self._warned: set[int] = set()  # buckets this handle has logged damage of
        self._shared_stats = reader_stats.ReaderStats(name, self.creation_id, self._owner)  # every reader's counts
        self._avg_value = 128  # running guess of value size, to size lookup buffers

    # -- mapping --------------------------------------------------------------------------

    def _map(self) -> None:
        seg = self._seg
        if seg.size < L.PAGE or seg.mm is None:
            raise too_small(self.name, seg.path, seg.size)
        self._header = h = np.frombuffer(seg.mm, np.int64, L.HEADER_WORDS, 0)
        # checked again on the mapping (the file may have changed since Segment's check read
        # it): every figure the kernels index with is checked once here and never re-read, so
        # a later change of these header words cannot move the arrays under the kernels
        geo = check_header(self.name, seg.path, seg.size, h, load_word(h, L.H_MAGIC))
        self.geometry = geo
        mm = seg.mm
        rows = L.ROW_WORDS
        self._writers = np.frombuffer(mm, np.int64, L.MAX_WRITERS * rows, geo.writers_off)
        self._workers = np.frombuffer(mm, np.int64, L.MAX_WORKERS * rows, geo.workers_off)
        self._partitions = np.frombuffer(mm, np.int64, L.MAX_PARTITIONS * rows, geo.partitions_off)
        self._meta = np.frombuffer(mm, np.int64, L.NBUCKETS * rows, geo.meta_off)
        self._index = np.frombuffer(mm, np.int64, L.NBUCKETS * geo.slots, geo.index_off)
        self._ring8 = np.frombuffer(mm, np.uint8, L.NBUCKETS * geo.ring, geo.ring_off)
        self._ring64 = np.frombuffer(mm, np.int64, L.NBUCKETS * geo.ring // L.WORD, geo.ring_off)
        self.owners = owners.for_segment(seg.fd, h)  # who of the words' owners lives (engine/owners.py)
        self._kstride = L.align(geo.key_size, 8)
        self._geo = np.array([geo.slots, geo.ring, geo.key_size, geo.max_value, geo.max_live, self._kstride], np.int64)
        # the control area's public model (engine/control/area.py): read-only on a Reader
        self.control = self._control_class(self.name, self._header, self._workers, self._partitions,
                                           self._writers, self.owners,
                                           intact=functools.partial(raise_if_lost, self.name, seg))

    @property
    def key_size(self) -> int:
        """Bytes in every key of this cache (fixed at create)."""
        return self.geometry.key_size

    @property
    def max_value(self) -> int:
        """The longest value this cache takes, in bytes (fixed at create)."""
        return self.geometry.max_value

    @property
    def creation_id(self) -> int:
        """The id the creator drew for this cache: a cache destroyed and made again under the
        same name has another (a handle that follows the name tells them apart by it)."""
        return int(self._header[L.H_CREATION_ID])

    @property
    def created_ns(self) -> int:
        """time.time_ns() when the cache was created (a resize's new segment keeps it)."""
        return int(self._header[L.H_CREATED_NS])

    def file_stat(self) -> os.stat_result:
        """Engine-internal: fstat(2) of the file this handle maps (its mode, owner and group)."""
        self._check_open()
        return os.fstat(self._seg.fd)

    def renamed(self, path: str) -> None:
        """Engine-internal: the file this handle maps is at `path` now (a resize's swap)."""
        self._seg.path = path

    def segment_arrays(self) -> SegmentArrays:
        """Engine-internal: the mapped sections of the segment (see SegmentArrays)."""
        self._check_open()
        return SegmentArrays(self._header, self._partitions, self._meta, self._index, self._ring8,
                             self._ring64, self._geo)

    def lock_holder_alive(self, word: int) -> bool:
        """Engine-internal, beside segment_arrays: the writer whose owner word a bucket's lock
        holds runs (engine/owners.py; 0: no holder, False)."""
        self._check_open()
        return self.owners.writer_alive(word, self._writers)

    def close(self) -> None:
        """Unmap. Never destroys the cache; safe to call twice."""
        if "_shared_stats" in self.__dict__:
            self.__dict__.pop("_shared_stats").close()
        if "control" in self.__dict__:
            self.__dict__.pop("control").release()
        for attr in ("_header", "_writers", "_workers", "_partitions", "_meta", "_index", "_ring8", "_ring64",
                     "_counters"):
            self.__dict__.pop(attr, None)
        if self._seg is not None:
            self._seg.close()
            self._seg = None

    @property
    def closed(self) -> bool:
        """True once close() has run."""
        return self._seg is None

    def __enter__(self):
        """The handle itself: `with shmcache.attach(name) as r:` closes it (never destroys the
        cache) on the way out."""
        return self

    def __exit__(self, *exc) -> None:
        """close() (the cache stays)."""
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"{units.format_bytes(self.geometry.size)}"
        return f"<{type(self).__name__} {self.name!r} {state}>"

    def _check_open(self) -> None:
        if self._seg is None:
            raise ClosedError(f"cache {self.name!r}: this handle is closed")

    def raise_if_lost(self) -> None:
        """CorruptCacheError if the segment's file was cut short while this handle mapped it
        (ipc/sigbus.py: the mapping then holds zero pages, and what a call read from it since
        is not the cache's). Checked after every lookup, write, stats(), status() and
        wait_ready() poll (the last two by the control view)."""
        if self._seg is not None:
            raise_if_lost(self.name, self._seg)

    # -- input ----------------------------------------------------------------------------------

    def _keys(self, keys) -> np.ndarray:
        """(n, key_size) C-contiguous uint8 from an array or a sequence of bytes."""
        self._check_open()
        return _input.keys(self.name, self.geometry.key_size, keys)

    # -- lookups --------------------------------------------------------------------------

    def _lookup(self, keys, want_values: bool) -> Packed:
        k = self._keys(keys)
        n = len(k)
        hashes = np.empty(n, np.int64)  # filled by the kernel
        found = np.zeros(n, np.bool_)
        offsets = np.zeros(n + 1, np.int64)
        out = np.empty(max(n * self._avg_value, 1024) if want_values else 0, np.uint8)
        k8, k64 = _input.words(k, self._kstride)
        i, pos, static_b, static_v = 0, 0, -1, -1
        given_up, give_up = _NONE_GIVEN_UP, False  # buckets this call stopped waiting for (none, read only)
        deadline = None  # the call's one wait on stuck buckets ends here (set when one is first met)
        retries0, corrupt0 = int(self._counts[LK.C_RETRIES]), int(self._counts[LK.C_CORRUPTIONS])
        while True:
            i, pos, status = LK.lookup(self._meta, self._index, self._ring8, self._ring64, self._geo, k8, k64,
                                       hashes, i, found, offsets, out, pos, want_values, self._avg_value, static_b,
                                       static_v, SPIN_LIMIT, self._counts, given_up, give_up)
            if status == LK.DONE:
                break
            if status == LK.NEED_SPACE:
                bigger = np.empty(max(2 * len(out), pos + self.geometry.max_value), np.uint8)
                bigger[:pos] = out[:pos]
                out = bigger
                continue
            if deadline is None:
                deadline = time.monotonic() + STUCK_GIVE_UP
            if time.monotonic() > deadline:  # every call returns in one bound: the kernel gives the rest up
                given_up, give_up = np.zeros(L.NBUCKETS, np.bool_), True
                continue
            static_b, static_v = self._stuck_bucket(int(hashes[i]) & (L.NBUCKETS - 1), static_b, static_v)
        self.raise_if_lost()  # zero pages read as misses: not this cache's answer
        if give_up and (new := sorted(set(np.flatnonzero(given_up).tolist()) - self._warned)):
            # one line a call, naming the buckets this handle had not logged
            self._warned.update(new)
            log.warning("cache %r: %d bucket(s) stayed mid-write or kept changing for %.1f s (%s%s); their keys are "
                        "reported missing for this call", self.name, len(new), STUCK_GIVE_UP,
                        ", ".join(map(str, new[:8])), ", ..." if len(new) > 8 else "")
        hits = int(np.count_nonzero(found))
        self._hits += hits
        self._misses += n - hits
        self._shared_stats.add(hits, n - hits, int(self._counts[LK.C_RETRIES]) - retries0,
                               int(self._counts[LK.C_CORRUPTIONS]) - corrupt0)
        if want_values and hits:
            self._avg_value = max(16, pos // hits + 1)
        return Packed(found, offsets, out[:pos])

    def _stuck_bucket(self, b: int, static_b: int, static_v: int) -> tuple[int, int]:
        """A bucket stayed mid-write (or kept changing): read it as it stands if no live
        process holds its lock, else yield. A writer takes the lock before it makes the
        version odd and makes it even before it unlocks, so an odd version that holds
        still across a read of a free lock is damage: read as it stands, and counted."""
        lock = b * L.ROW_WORDS + L.M_LOCK
        ver = b * L.ROW_WORDS + L.M_VERSION
        version = int(load_word(self._meta, ver))
        owner = int(load_word(self._meta, lock))
        if version & 1 and int(load_word(self._meta, ver)) == version:
            if owner == 0:
                if (b, version) != (static_b, static_v):
                    self._counts[LK.C_CORRUPTIONS] += 1
                    if b not in self._warned:  # once per handle and bucket: a damaged bucket is met on every call
                        self._warned.add(b)
                        log.warning("cache %r: bucket %d is mid-write (version %d) with no writer holding its "
                                    "lock: damage, read as it stands", self.name, b, version)
                return b, version
            # Only if the dead writer still holds the lock is that version its own: a live
            # writer taking over in between makes another odd version, never to be accepted.
            if not self.owners.writer_alive(owner, self._writers) and load_word(self._meta, lock) == owner:
                return b, version
        os.sched_yield()  # a live writer is mid-write (or just finished): retry
        return static_b, static_v

    def get_many_packed(self, keys) -> Packed:
        """Look a batch up: found mask, value offsets and one data buffer (see Packed)."""
        return self._lookup(keys, True)

    def get_many(self, keys) -> list[bytes | None]:
        """Look a batch up: each key's value as bytes, None where it is missing, in key order.

        keys: a sequence of `key_size`-byte keys (a list of `bytes` is read in one compiled
        pass) or an (n, key_size) uint8 array. One bytes object per hit: get_many_packed
        returns the same without them, and is the faster for large batches. KeySizeError
        names a key of the wrong size. A key being set meanwhile reads as its old or its new
        value; an entry may have been evicted (a miss)."""
        return self._lookup(keys, True).to_list()

    def get(self, key: bytes) -> bytes | None:
        """One key's value as bytes, or None if it is not in the cache (a batch of one:
        get_many and get_many_packed take whole batches at a fraction of the cost a key)."""
        return self.get_many([key])[0]

    def contains_many(self, keys) -> np.ndarray:
        """Bool array: which keys are present."""
        return self._lookup(keys, False).found

    def __contains__(self, key: bytes) -> bool:
        """`key in r`: whether the cache holds the key (contains_many for a batch)."""
        return bool(self.contains_many([key])[0])

    # -- stats ------------------------------------------------------------------------------

    def stats(self) -> dict:
        """A snapshot: table-wide figures summed over buckets and writer slots; every
        reader process's hits and misses (`reader_hits`, `reader_misses`, `readers`
        attached and alive); and this handle's own `hits`, `misses` and retries."""
        self._check_open()
        m = self._meta.reshape(L.NBUCKETS, L.ROW_WORDS)
        w = self._writers.reshape(L.MAX_WRITERS, L.ROW_WORDS)
        geo = self.geometry
        shared = self._shared_stats.totals()
        st = {
            "name": self.name,
            "entries": int(m[:, L.M_LIVE].sum()),
            "bytes_used": int(m[:, L.M_LIVE_BYTES].sum()),
            "capacity_bytes": geo.capacity_bytes,
            "max_entries": L.NBUCKETS * geo.max_live,
            "memory": geo.size,
            "evictions": int(m[:, L.M_EVICTIONS].sum()),
            "lock_takeovers": int(m[:, L.M_TAKEOVERS].sum()),
            "sets": int(w[:, L.W_SETS].sum()),
            "deletes": int(w[:, L.W_DELETES].sum()),
            "delete_misses": int(w[:, L.W_DELETE_MISSES].sum()),
            "writers": int(np.count_nonzero(w[:, L.W_OWNER])),
            "write_batches": int(w[:, L.W_BATCHES].sum()),  # batches applied: sets / write_batches = batch size
            "hits": self._hits,
            "misses": self._misses,
            "read_retries": int(self._counts[LK.C_RETRIES]),
            **shared,
            # damaged bucket states met: by writers (each then repaired) and by readers (each a miss)
            "corruptions": int(w[:, L.W_CORRUPTIONS].sum()) + shared["reader_corruptions"]
            + (int(self._counts[LK.C_CORRUPTIONS]) if self._shared_stats.row is None else 0),
            "key_size": geo.key_size,
            "max_value": geo.max_value,
            "buckets": L.NBUCKETS,
            "layout_version": L.LAYOUT_VERSION,
            "creation_id": self.creation_id,
            "created_s": int(self._header[L.H_CREATED_NS]) / 1e9,  # unix time the cache was created
        }
        self.raise_if_lost()
        return st

    # -- readiness (filled by a supervisor; see engine/control/area.py) -------------------------------

    def status(self) -> dict:
        """Topic, supervisor, per-partition progress (applied, watermark, lag, caught up), workers."""
        self._check_open()
        return self.control.status()

    def wait_ready(self, timeout: float | None = None, max_lag: int | None = None,
                   max_behind: float | None = None) -> dict:
        """Block until every partition of the topic is assigned to this cache and has caught up
        with the high watermark seen at assignment and, with a bound, no partition is more than
        max_lag messages or max_behind seconds behind its topic; raises CacheNotReadyError on
        timeout."""
        self._check_open()
        return self.control.wait_ready(timeout, max_lag=max_lag, max_behind=max_behind)
