"""The table handles: Reader (attach, read-only) and Writer (create/open).

A Reader maps the segment with PROT_READ and looks keys up in batches through the
compiled lookup kernel: it takes no lock, never blocks a writer and is never seen
by writers. A Writer maps it read-write, holds a writer slot (its counters) and
applies batches under per-bucket locks; when a lock stays held by a process that
no longer lives, the Writer takes it over and rebuilds that bucket.

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

from shmcache.engine import _keylist
from shmcache.engine import _kernels as K
from shmcache.engine import _lookup as LK
from shmcache.engine import layout as L
from shmcache.engine import reader_stats
from shmcache.engine.lifecycle import destroy, exists, list_caches  # noqa: F401  (part of this module's API)
from shmcache.errors import (
    CacheNotReadyError,
    CacheSpaceError,
    ClosedError,
    GeometryMismatchError,
    KeySizeError,
    LayoutVersionError,
    NotACacheError,
    ReadOnlyError,
    TooManyWritersError,
    ValueTooLargeError,
)
from shmcache.ipc import liveness
from shmcache.ipc.atomics import cas_word, load_word, store_word
from shmcache.ipc.segment import SHM_DIR, Segment, check_name, creator_at_work, open_regular, path_of, shm_free_bytes

log = logging.getLogger("shmcache.engine")

# Spins before a kernel hands a held lock / odd bucket back to Python, which yields
# the CPU and checks whether the holder still lives (NOTES-atomics: spin with backoff).
SPIN_LIMIT = 2000
SIZED_TIMEOUT = 0.5  # how long attach waits for a new file to get its size
READY_TIMEOUT = 30.0  # how long attach waits for a creator to finish, plus READY_S_PER_GIB of the size
READY_S_PER_GIB = 10.0  # the creator's move to 2 MiB pages took 2-3.5 s per GiB here
# How long a lookup waits on one key whose bucket stays mid-write under a live lock holder,
# or whose version never settles (a writer stopped inside a bucket, or a hostile process),
# before it reports the key missing, counts a corruption and gives the bucket up for the
# rest of the call. A healthy writer holds a bucket for microseconds.
STUCK_GIVE_UP = 1.0


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
        return len(self.found)

    def to_list(self) -> list[bytes | None]:
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


def _ready_limit(size: int) -> float:
    """How long an attacher waits for the creator of a file of `size` bytes to finish:
    a creator sizes the file right after creating it, so an empty one that stays so is
    not ours; a sized one gets time in proportion, as the creator's collapse takes."""
    return READY_TIMEOUT + READY_S_PER_GIB * size / 2**30 if size else SIZED_TIMEOUT


def _join_bytes(items: list) -> tuple[np.ndarray, bytes] | None:
    """Each item's length in bytes and all their bytes back to back (engine/_keylist.py)."""
    return _keylist.join_bytes(items)


def _wait_created(name: str) -> None:
    """Wait (_ready_limit) while a creator is still at work on the file: sized, moved
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
            if time.monotonic() - t0 > _ready_limit(size):
                return  # the mapping says what is wrong with it
            time.sleep(0.01)
    finally:
        os.close(fd)


class Reader:
    """A read-only handle on a cache: `shmcache.attach(name)`."""

    _seg: Segment | None = None  # class defaults: close() may run on a half-built handle
    _writable = False

    def __init__(self, name: str, *, _segment: Segment | None = None):
        self.name = name
        if _segment is None:
            _wait_created(name)
        self._seg = _segment or Segment(name, writable=self._writable)
        try:
            self._map()
        except BaseException:
            self._seg.close()
            raise
        self._hits = 0
        self._misses = 0
        self._counts = np.zeros(2, np.int64)  # the lookup kernel's retries and corruptions (_lookup.C_*)
        self._warned: set[int] = set()  # buckets this handle has logged damage of
        self._shared_stats = reader_stats.ReaderStats(name, self.creation_id)  # every reader's hits, misses
        self._avg_value = 128  # running guess of value size, to size lookup buffers

    # -- mapping --------------------------------------------------------------------------

    def _map(self) -> None:
        seg = self._seg
        if seg.size < L.PAGE or seg.mm is None:
            raise NotACacheError(f"cache {self.name!r}: {seg.path} is {seg.size} bytes, not a shmcache segment")
        self._header = np.frombuffer(seg.mm, np.int64, L.HEADER_WORDS, 0)
        if load_word(self._header, L.H_MAGIC) == 0:  # the creator writes the magic last; _wait_created waited
            raise CacheNotReadyError(
                f"cache {self.name!r}: {seg.path} has no shmcache magic after waiting for its creator "
                f"{_ready_limit(seg.size):.0f} s "
                "(still being created, or not a shmcache segment)")
        h = self._header
        if h[L.H_MAGIC] != L.MAGIC:
            raise NotACacheError(f"cache {self.name!r}: {seg.path} is not a shmcache segment (bad magic)")
        if h[L.H_VERSION] != L.LAYOUT_VERSION:
            raise LayoutVersionError(
                f"cache {self.name!r} has layout version {int(h[L.H_VERSION])}; this shmcache reads "
                f"version {L.LAYOUT_VERSION} (destroy and re-create it, or use a matching shmcache)"
            )
        # every figure the kernels index with, checked once here and never re-read (a later
        # change of these header words cannot move the arrays under the kernels)
        geo = L.Geometry.from_header(self.name, h, seg.size)
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
        self._kstride = L.align(geo.key_size, 8)
        self._geo = np.array([geo.slots, geo.ring, geo.key_size, geo.max_value, geo.max_live, self._kstride], np.int64)

    @property
    def key_size(self) -> int:
        return self.geometry.key_size

    @property
    def max_value(self) -> int:
        return self.geometry.max_value

    @property
    def creation_id(self) -> int:
        return int(self._header[L.H_CREATION_ID])

    def close(self) -> None:
        """Unmap. Never destroys the cache; safe to call twice."""
        if "_shared_stats" in self.__dict__:
            self.__dict__.pop("_shared_stats").close()
        for attr in ("_header", "_writers", "_workers", "_partitions", "_meta", "_index", "_ring8", "_ring64",
                     "_counters"):
            self.__dict__.pop(attr, None)
        if self._seg is not None:
            self._seg.close()
            self._seg = None

    @property
    def closed(self) -> bool:
        return self._seg is None

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def __repr__(self) -> str:
        state = "closed" if self.closed else f"{L.format_bytes(self.geometry.size)}"
        return f"<{type(self).__name__} {self.name!r} {state}>"

    def _check_open(self) -> None:
        if self._seg is None:
            raise ClosedError(f"cache {self.name!r}: this handle is closed")

    # -- input normalisation --------------------------------------------------------------

    def _keys(self, keys) -> np.ndarray:
        """(n, key_size) C-contiguous uint8 from an array or a sequence of bytes."""
        self._check_open()
        ks = self.geometry.key_size
        if isinstance(keys, np.ndarray):
            if keys.dtype != np.uint8 or keys.ndim != 2 or keys.shape[1] != ks:
                raise KeySizeError(
                    f"cache {self.name!r}: keys must be an (n, {ks}) uint8 array, got {keys.dtype} {keys.shape}"
                )
            return np.ascontiguousarray(keys)
        if isinstance(keys, (bytes, bytearray, memoryview, str)):
            raise TypeError(f"cache {self.name!r}: keys must be a sequence of keys; for one key use get/set/delete")
        keys = keys if isinstance(keys, list) else list(keys)
        packed = _join_bytes(keys)
        if packed is None or (packed[0] != ks).any():  # the loop only words the error
            for i, k in enumerate(keys):
                if not isinstance(k, (bytes, bytearray, memoryview)) or memoryview(k).nbytes != ks:
                    what = f"{memoryview(k).nbytes} bytes" if isinstance(k, (bytes, bytearray, memoryview)) \
                        else type(k).__name__
                    raise KeySizeError(f"cache {self.name!r}: key {i} is {what}; this cache's keys are {ks} bytes")
        return np.frombuffer(packed[1], np.uint8).reshape(len(keys), ks)

    def _words(self, k: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The kernels' view of keys: flat uint8 rows padded to 8 bytes, and its int64 view
        (an unaligned view is fine: numba compiles for it and x86 loads do not care)."""
        if self._kstride != k.shape[1]:
            padded = np.zeros((len(k), self._kstride), np.uint8)
            padded[:, : k.shape[1]] = k
            k = padded
        flat = k.reshape(-1)
        return flat, flat.view(np.int64)

    # -- lookups --------------------------------------------------------------------------

    def _lookup(self, keys, want_values: bool) -> Packed:
        k = self._keys(keys)
        n = len(k)
        hashes = np.empty(n, np.int64)  # filled by the kernel
        found = np.zeros(n, np.bool_)
        offsets = np.zeros(n + 1, np.int64)
        out = np.empty(max(n * self._avg_value, 1024) if want_values else 0, np.uint8)
        k8, k64 = self._words(k)
        i, pos, static_b, static_v = 0, 0, -1, -1
        given_up: set[int] = set()  # buckets this call stopped waiting for
        stuck_i, stuck_since = -1, 0.0
        retries0, corrupt0 = int(self._counts[LK.C_RETRIES]), int(self._counts[LK.C_CORRUPTIONS])
        while True:
            i, pos, status = LK.lookup(self._meta, self._index, self._ring8, self._ring64, self._geo, k8, k64,
                                       hashes, i, found, offsets, out, pos, want_values, self._avg_value, static_b,
                                       static_v, SPIN_LIMIT, self._counts)
            if status == LK.DONE:
                break
            if status == LK.NEED_SPACE:
                bigger = np.empty(max(2 * len(out), pos + self.geometry.max_value), np.uint8)
                bigger[:pos] = out[:pos]
                out = bigger
                continue
            b = int(hashes[i]) & (L.NBUCKETS - 1)
            if i != stuck_i:
                stuck_i, stuck_since = i, time.monotonic()
            if b in given_up or time.monotonic() - stuck_since > STUCK_GIVE_UP:  # every call returns in a bound
                given_up.add(b)
                if b not in self._warned:
                    self._warned.add(b)
                    log.warning("cache %r: bucket %d stayed mid-write or kept changing for %.1f s; its keys are "
                                "reported missing for this call", self.name, b, STUCK_GIVE_UP)
                self._counts[LK.C_CORRUPTIONS] += 1  # the key: a miss
                found[i] = False
                offsets[i + 1] = pos
                i += 1
                continue
            static_b, static_v = self._stuck_bucket(b, static_b, static_v)
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
            if not liveness.is_alive(owner) and load_word(self._meta, lock) == owner:
                return b, version
        os.sched_yield()  # a live writer is mid-write (or just finished): retry
        return static_b, static_v

    def get_many_packed(self, keys) -> Packed:
        """Look a batch up: found mask, value offsets and one data buffer (see Packed)."""
        return self._lookup(keys, True)

    def get_many(self, keys) -> list[bytes | None]:
        return self._lookup(keys, True).to_list()

    def get(self, key: bytes) -> bytes | None:
        return self.get_many([key])[0]

    def contains_many(self, keys) -> np.ndarray:
        """Bool array: which keys are present."""
        return self._lookup(keys, False).found

    def __contains__(self, key: bytes) -> bool:
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
        return {
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
        }

    # -- readiness (filled by a supervisor; see consumer/control.py) ------------------------------

    def status(self) -> dict:
        """Topic, supervisor, per-partition progress (applied, watermark, lag, caught up), workers."""
        from shmcache.consumer import control

        self._check_open()
        return control.status(self)

    def wait_ready(self, timeout: float | None = None) -> dict:
        """Block until every partition assigned to this node has caught up with the high
        watermark seen at assignment; raises CacheNotReadyError on timeout."""
        from shmcache.consumer import control

        self._check_open()
        return control.wait_ready(self, timeout)

    # -- a reader cannot write ----------------------------------------------------------------

    def _read_only(self, *args, **kwargs):
        raise ReadOnlyError(f"cache {self.name!r} is attached read-only; writers use shmcache.open()")

    set = set_many = delete = delete_many = apply = _read_only


class Writer(Reader):
    """A read-write handle: `shmcache.create(...)` or `shmcache.open(name)`."""

    _writable = True
    _slot = -1

    def __init__(self, name: str, *, _segment: Segment | None = None):
        super().__init__(name, _segment=_segment)
        try:
            self._pid = os.getpid()
            self._me = liveness.owner_word()
            self._slot = self._claim_slot()
        except BaseException:
            Reader.close(self)
            raise
        # this process's row of the writer table: the kernels count into it in place
        self._counters = self._writers[self._slot * L.ROW_WORDS:(self._slot + 1) * L.ROW_WORDS]

    def _claim_slot(self) -> int:
        """A writer slot for this process's counters: a free one, else one whose owner died."""
        s = liveness.claim_row(self._writers, L.MAX_WRITERS, L.ROW_WORDS, self._me)
        if s >= 0:
            return s
        raise TooManyWritersError(f"cache {self.name!r}: all {L.MAX_WRITERS} writer slots are held by live processes")

    def close(self) -> None:
        if self._slot >= 0 and self._seg is not None:
            store_word(self._writers, self._slot * L.ROW_WORDS + L.W_OWNER, 0)  # counters stay: totals never drop
            self._slot = -1
        super().close()

    def _ints(self, arr, what: str) -> np.ndarray:
        """An integer array as given (never a float or bool truncated or taken as 0/1)."""
        a = arr if isinstance(arr, np.ndarray) else np.asarray(arr)
        if a.dtype.kind not in "iu" and a.size:
            raise TypeError(f"cache {self.name!r}: {what} must be integers, got an array of {a.dtype}")
        return a

    def _bytes(self, data, what: str) -> np.ndarray:
        """Flat uint8 bytes of a numpy array (any plain dtype, by its bytes) or a bytes-like object."""
        if isinstance(data, np.ndarray):
            if data.dtype == np.uint8 and data.ndim == 1 and data.flags.c_contiguous:
                return data  # as the wire decoder gives it
            if data.dtype.hasobject:
                raise TypeError(f"cache {self.name!r}: {what} must be bytes, got an array of {data.dtype}")
            return np.ascontiguousarray(data).reshape(-1).view(np.uint8)
        try:
            m = memoryview(data)
            return np.frombuffer(m if m.c_contiguous else m.tobytes(), np.uint8)
        except TypeError:
            raise TypeError(f"cache {self.name!r}: {what} must be bytes or a numpy array, "
                            f"got {type(data).__name__}") from None

    def _actions(self, actions, n: int) -> np.ndarray:
        """Actions as uint8, each ADD (0) or DELETE (1): any other value is refused, not
        wrapped into range (256 would be an ADD) or skipped."""
        a = self._ints(actions, "actions (0 ADD, 1 DELETE)")
        if a.shape != (n,):
            raise ValueError(f"cache {self.name!r}: {n} keys but actions of shape {a.shape}")
        if n and (int(a.max()) > K.DELETE or (a.dtype.kind == "i" and int(a.min()) < K.ADD)):
            i = int(np.flatnonzero((a < K.ADD) | (a > K.DELETE))[0])
            raise ValueError(f"cache {self.name!r}: action {i} is {int(a[i])}; an action is 0 (ADD) or 1 (DELETE)")
        return np.ascontiguousarray(a, np.uint8)

    def _values(self, values, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(starts, lens, data) from a sequence of bytes or an (offsets, data) pair."""
        maxv = self.geometry.max_value
        if isinstance(values, tuple) and len(values) == 2 and isinstance(values[0], np.ndarray):
            offsets = self._ints(values[0], "value offsets")
            if offsets.dtype == np.uint64 and offsets.size and offsets.max() > np.iinfo(np.int64).max:
                raise ValueError(f"cache {self.name!r}: value offsets must rise from 0 to at most len(data)")
            offsets = np.ascontiguousarray(offsets, np.int64)
            data = self._bytes(values[1], "value data")
            if offsets.shape != (n + 1,):
                raise ValueError(f"cache {self.name!r}: value offsets must have {n + 1} entries for {n} keys, got {offsets.shape}")
            lens = np.empty(n, np.int64)
            bad = K.spans_of_offsets(offsets, len(data), maxv, lens)  # one compiled pass, not six numpy ones
            if bad == -2:
                raise ValueError(f"cache {self.name!r}: value offsets must rise from 0 to at most len(data)={len(data)}")
            if bad >= 0:
                raise ValueTooLargeError(f"cache {self.name!r}: value {bad} is {int(offsets[bad + 1] - offsets[bad])} "
                                         f"bytes; the limit is {maxv} (max_value)")
            return offsets[:-1], lens, data
        else:
            if isinstance(values, (bytes, bytearray, memoryview, str)):
                raise TypeError(f"cache {self.name!r}: values must be a sequence of values; for one value use set()")
            values = values if isinstance(values, list) else list(values)
            if len(values) != n:
                raise ValueError(f"cache {self.name!r}: {n} keys but {len(values)} values")
            packed = _join_bytes(values)
            if packed is None:  # the loop only words the error
                for i, v in enumerate(values):
                    if not isinstance(v, (bytes, bytearray, memoryview)):
                        raise TypeError(f"cache {self.name!r}: value {i} is {type(v).__name__}, not bytes")
            lens, joined = packed
            data = np.frombuffer(joined, np.uint8)
            starts = np.cumsum(lens) - lens
        if n and lens.max() > maxv:
            i = int(np.argmax(lens))
            raise ValueTooLargeError(f"cache {self.name!r}: value {i} is {int(lens[i])} bytes; the limit is {maxv} (max_value)")
        return starts.astype(np.int64, copy=False), lens.astype(np.int64, copy=False), data

    def apply(self, keys, actions, values=None) -> None:
        """Apply ADD (0) / DELETE (1) entries in order. values as in set_many (ignored for deletes).

        This is the batch entry point for decoded Kafka messages: no per-entry objects."""
        k = self._keys(keys)
        n = len(k)
        actions = self._actions(actions, n)
        if values is None:
            starts = lens = np.zeros(n, np.int64)
            data = np.zeros(0, np.uint8)
        else:
            starts, lens, data = self._values(values, n)
        self._apply(k, actions, starts, lens, data)

    def _apply(self, k: np.ndarray, actions: np.ndarray, starts, lens, data) -> None:
        self._check_open()
        n = len(k)
        hashes = np.empty(n, np.int64)  # filled by the kernel
        k8, k64 = self._words(k)
        c = self._counters
        i = 0
        while True:
            i = K.apply_entries(self._meta, self._index, self._ring8, self._ring64, self._geo, k8, k64, hashes,
                                actions, starts, lens, data, i, self._me, SPIN_LIMIT, c)
            if i >= n:
                break
            self._contended(int(hashes[i]) & (L.NBUCKETS - 1))
        c[L.W_BATCHES] += 1

    def _contended(self, b: int) -> None:
        """Bucket b's lock stayed held: take it over if its owner died, else yield the CPU."""
        lock = b * L.ROW_WORDS + L.M_LOCK
        owner = int(load_word(self._meta, lock))
        if owner == 0 or liveness.is_alive(owner):
            os.sched_yield()
            return
        if cas_word(self._meta, lock, owner, self._me) == owner:
            K.repair_bucket(self._meta, self._index, self._ring8, self._ring64, self._geo, b)
            self._writers[self._slot * L.ROW_WORDS + L.W_TAKEOVERS] += 1
            log.warning("cache %r: took over bucket %d from dead writer pid %d and rebuilt it",
                        self.name, b, liveness.word_pid(owner))

    def apply_spans(self, keys: np.ndarray, actions: np.ndarray, starts: np.ndarray, lens: np.ndarray,
                    data: np.ndarray) -> None:
        """Apply a decoded batch as it comes from consumer.wire: value i is
        data[starts[i]:starts[i] + lens[i]]. Actions, spans and lengths are checked
        (ADD/DELETE only, inside data, at most max_value) before anything is applied."""
        k = self._keys(keys)
        n = len(k)
        acts = self._actions(actions, n)
        lens = np.asarray(self._ints(lens, "value lengths"), np.int64)
        starts = np.asarray(self._ints(starts, "value starts"), np.int64)
        if lens.shape != (n,) or starts.shape != (n,):
            raise ValueError(f"cache {self.name!r}: {n} keys but starts/lens of shapes {starts.shape}/{lens.shape}")
        data = self._bytes(data, "value data")
        # starts are checked on their own first: with starts <= len(data) and 0 <= lens <= max_value
        # the ends cannot wrap past 2**63 (which made a span far outside data look inside it)
        if n and (lens.max() > self.geometry.max_value or lens.min() < 0 or starts.min() < 0
                  or starts.max() > len(data) or (starts + lens).max() > len(data)):
            raise ValueTooLargeError(f"cache {self.name!r}: a value span is outside data (of {len(data)} bytes) "
                                     f"or over max_value ({self.geometry.max_value})")
        self._apply(k, acts, starts, lens, data)

    def set_many(self, keys, values) -> None:
        """Set a batch: keys as for get_many; values a sequence of bytes or (offsets, data)."""
        k = self._keys(keys)
        starts, lens, data = self._values(values, len(k))
        self._apply(k, np.zeros(len(k), np.uint8), starts, lens, data)

    def delete_many(self, keys) -> None:
        k = self._keys(keys)
        z = np.zeros(len(k), np.int64)
        self._apply(k, np.full(len(k), K.DELETE, np.uint8), z, z, np.zeros(0, np.uint8))

    def set(self, key: bytes, value: bytes) -> None:
        self.set_many([key], [value])

    def delete(self, key: bytes) -> None:
        self.delete_many([key])

    def repair_dead_locks(self) -> int:
        """Take over and rebuild every bucket whose lock is held by a dead process; returns how many.

        Writers do this lazily when they meet such a lock; a supervisor calls it after a
        worker died, so that no bucket stays mid-write until some writer happens by."""
        locks = self._meta.reshape(L.NBUCKETS, L.ROW_WORDS)[:, L.M_LOCK]
        repaired = 0
        for b in np.flatnonzero(locks).tolist():
            owner = int(load_word(self._meta, b * L.ROW_WORDS + L.M_LOCK))
            if owner and not liveness.is_alive(owner) and cas_word(self._meta, b * L.ROW_WORDS + L.M_LOCK, owner, self._me) == owner:
                K.repair_bucket(self._meta, self._index, self._ring8, self._ring64, self._geo, b)
                self._writers[self._slot * L.ROW_WORDS + L.W_TAKEOVERS] += 1
                repaired += 1
        return repaired


# -- lifecycle ------------------------------------------------------------------------------------


def create(name: str, memory: int | str = "256MiB", *, key_size: int = L.DEFAULT_KEY_SIZE,
           max_value: int = L.DEFAULT_MAX_VALUE, mode: int = 0o600, exist_ok: bool = False) -> Writer:
    """Create a cache of fixed size `memory` and return a writer on it.

    FileExistsError (CacheExistsError) if it exists, unless exist_ok=True, which opens
    it instead (its key size and max_value must match; its memory stays as it was)."""
    check_name(name)
    key_size = _whole(name, "key_size", key_size, 1, L.MAX_KEY_SIZE)
    max_value = _whole(name, "max_value", max_value, 0, 0xFFFFFFFF)
    if isinstance(mode, bool) or not isinstance(mode, int) or mode & ~0o666 or mode & 0o600 != 0o600 or mode & 0o022:
        shown = f"{mode:#o}" if isinstance(mode, int) and not isinstance(mode, bool) else repr(mode)
        raise ValueError(f"cache {name!r}: mode={shown} must give the owner read-write, no one else write and no "
                         "execute bits (0o600, or 0o640 / 0o644 for readers): writers trust the memory they read")
    geo = L.Geometry.plan(L.parse_bytes(memory), key_size, max_value)
    free = shm_free_bytes()
    if free is not None and geo.size > free:
        raise CacheSpaceError(
            f"cache {name!r}: memory={L.format_bytes(geo.size)} ({geo.size:,} bytes) does not fit in {SHM_DIR}, "
            f"which has {L.format_bytes(free)} ({free:,} bytes) free: ask for less, or make room in {SHM_DIR}")
    try:
        seg = Segment(name, create_size=geo.size, writable=True, mode=mode)
    except FileExistsError:
        if not exist_ok:
            raise
        w = Writer(name)
        if (w.key_size, w.max_value) != (key_size, max_value):
            w.close()
            raise GeometryMismatchError(
                f"cache {name!r} exists with key_size={w.key_size}, max_value={w.max_value}; "
                f"asked for key_size={key_size}, max_value={max_value}"
            ) from None
        return w
    try:
        h = np.frombuffer(seg.mm, np.int64, L.HEADER_WORDS, 0)
        h[L.H_KEY_SIZE] = key_size
        h[L.H_MAX_VALUE] = max_value
        h[L.H_NBUCKETS] = L.NBUCKETS
        h[L.H_SLOTS] = geo.slots
        h[L.H_RING] = geo.ring
        h[L.H_SIZE] = geo.size
        h[L.H_CREATION_ID] = secrets.randbits(63)
        h[L.H_CREATED_NS] = time.time_ns()
        h[L.H_VERSION] = L.LAYOUT_VERSION
        h[L.H_STATE] = L.STATE_READY
        reader_stats.create(name, mode, int(h[L.H_CREATION_ID]))
        store_word(h, L.H_MAGIC, L.MAGIC)  # last: attachers wait for the magic
        del h
        seg.finish_create()  # attachers now find the magic; the creation lock goes
        return Writer(name, _segment=seg)
    except BaseException:
        seg.close()
        seg.unlink()
        reader_stats.unlink(name)
        raise


def open_writer(name: str) -> Writer:
    """Re-attach a writer to an existing cache (a restarted worker)."""
    return Writer(name)


def attach(name: str) -> Reader:
    """Map a cache read-only (PROT_READ) from any process; never registers it for cleanup."""
    return Reader(name)


def _whole(name: str, what: str, value, lo: int, hi: int) -> int:
    """An int (a numpy integer too, never a bool or a float) from lo to hi, else a ValueError naming it."""
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)) or not lo <= value <= hi:
        raise ValueError(f"cache {name!r}: {what}={value!r} must be a whole number from {lo} to {hi}")
    return int(value)


__all__: Sequence[str] = ["Reader", "Writer", "Packed", "create", "open_writer", "attach", "destroy", "exists", "list_caches"]
