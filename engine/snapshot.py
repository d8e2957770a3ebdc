"""Snapshots: a live cache to a file, and a new cache from that file.

The file (format version 1, all integers little-endian):

    "SHMSNAP1"  u32 format version  u32 n      header: n bytes of JSON, then its u64 xxh3-64
    { "layout_version", "nbuckets", "key_size", "max_value", "slots", "ring", "size",
      "topic", "wire_format" (v1 | v2 | kv | ""), "partitions", "offsets": [next offset
      to apply, per partition, -1 none], "taken_ns", "name", "creation_id", "entries" }
    chunk*      "CHNK" u32 first bucket  u32 buckets  u32 0  u64 payload bytes  u64 xxh3-64 of the payload
                payload: the buckets' meta rows, index slots, ring span lengths (int64s) and the
                ring spans (each bucket's live records, tail to head) back to back
    "SNAPEND1"  u32 chunks  u32 0  u64 entries  u64 xxh3-64 of the chunks' checksums

Writing (`write`): the partitions' applied offsets are read first, then the buckets
are copied a chunk at a time (bounded memory, CHUNK_BYTES), each bucket under its
seqlock as a reader reads it (_snapshot_kernels.copy_out: never torn, and no writer
waits); the file is written to PATH.tmp, fsynced, renamed to PATH and its directory
fsynced, so PATH is always a whole snapshot or the previous one. Why replaying from
offsets taken before the copy gives the table Kafka's order implies: DESIGN.md,
"Snapshots".

Reading (`read_header`, `verify`, `restore`): every field is checked before use
(a snapshot is as untrusted as the segment); a truncated file, a failed checksum or
a file that is no snapshot raises SnapshotCorruptError, another topic, format or key
size SnapshotMismatchError. `restore` creates the cache: of the snapshot's own
geometry and layout version a straight copy of each bucket (_snapshot_kernels.copy_in);
of any other, each live record re-inserted through the Writer, oldest first, with
the evictions a smaller table makes counted. A restore that fails removes the cache
it created.
"""

from __future__ import annotations

import json
import logging
import mmap
import os
import struct
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import xxhash

from shmcache.engine import _kernels as K
from shmcache.engine import _snapshot_kernels as SK
from shmcache.engine import layout as L
from shmcache.engine.lifecycle import destroy
from shmcache.errors import SnapshotCorruptError, SnapshotMismatchError
from shmcache.ipc import liveness
from shmcache.ipc.atomics import cas_word, load_word

log = logging.getLogger("shmcache.snapshot")

MAGIC = b"SHMSNAP1"
FORMAT_VERSION = 1
CHUNK_MAGIC = b"CHNK"
END_MAGIC = b"SNAPEND1"
CHUNK_BYTES = 32 << 20  # bucket bytes per chunk at most: the memory a snapshot or restore holds
SPIN_LIMIT = 2000  # copy tries of one bucket before Python yields the CPU
STUCK_S = 1.0  # a bucket mid-write this long under a dead (or no) lock holder is copied as it stands
HEADER_MAX = 1 << 20
READ_AHEAD = 512 << 20  # bytes of the file a restore asks the kernel to read while it creates the segment

_HEAD = struct.Struct("<8sII")
_CHUNK = struct.Struct("<4sIIIQQ")
_END = struct.Struct("<8sIIQQ")


@dataclass(frozen=True)
class SnapshotInfo:
    path: str
    geometry: L.Geometry
    layout_version: int
    topic: str
    wire_format: str
    offsets: tuple[int, ...]
    taken_ns: int
    entries: int
    name: str
    bytes: int = 0  # the file's size

    def to_dict(self) -> dict:
        return {"path": self.path, "topic": self.topic, "wire_format": self.wire_format,
                "offsets": list(self.offsets), "taken_ns": self.taken_ns, "entries": self.entries,
                "name": self.name, "bytes": self.bytes, "layout_version": self.layout_version,
                "memory": self.geometry.size, "key_size": self.geometry.key_size,
                "max_value": self.geometry.max_value}


def _topic_of(header) -> str:
    n = min(max(int(header[L.H_TOPIC_LEN]), 0), L.TOPIC_MAX)
    return header[L.H_TOPIC:L.H_TOPIC + L.TOPIC_MAX // L.WORD].tobytes()[:n].decode("utf-8", "replace")


def _format_of(header) -> str:
    code = int(header[L.H_WIRE_FORMAT])
    return L.WIRE_FORMATS[code - 1] if 1 <= code <= len(L.WIRE_FORMATS) else ""


def buckets_per_chunk(geo: L.Geometry) -> int:
    per = L.ROW_WORDS * L.WORD + geo.slots * L.WORD + L.WORD + geo.ring
    nb = 1
    while nb < L.NBUCKETS and 2 * nb * per <= CHUNK_BYTES:
        nb *= 2
    return nb


def exact_memory(geo: L.Geometry) -> int:
    """A memory= that create() plans into exactly this geometry (or 0 if none does)."""
    m = L.FIXED_BYTES + L.PAGE + L.NBUCKETS * (geo.slots * L.WORD + geo.ring)
    return m if L.Geometry.plan(m, geo.key_size, geo.max_value) == geo else 0


class _Buffers:
    """One chunk's arrays: allocated once per snapshot; a reader points them into the chunk it read."""

    def __init__(self, geo: L.Geometry, nb: int, allocate: bool = True):
        self.meta = np.zeros(nb * L.ROW_WORDS if allocate else 0, np.int64)
        self.index = np.zeros(nb * geo.slots if allocate else 0, np.int64)
        self.lens = np.zeros(nb, np.int64)
        self.ring = np.zeros(nb * geo.ring if allocate else 0, np.uint8)
        self.slots = geo.slots

    def fixed(self, nb: int) -> int:
        return nb * (L.ROW_WORDS + self.slots + 1) * L.WORD


# -- writing ---------------------------------------------------------------------------------


def write(handle, path: str, *, progress=None, rate: int = 0) -> SnapshotInfo:
    """Write a snapshot of the cache `handle` maps (a Reader or a Writer) to `path`.

    rate: bytes of file per second at most (0: as fast as it goes); see _Out for what
    else keeps a snapshot light on the readers beside it. progress(buckets done,
    buckets in all, bytes written) is called after each chunk."""
    path = os.fspath(path)
    header, parts, meta, index, ring8 = handle.segment_arrays()[:5]
    geo = handle.geometry
    t0 = time.monotonic()
    nparts = min(max(int(header[L.H_PARTITIONS]), 0), L.MAX_PARTITIONS)
    rows = parts.reshape(L.MAX_PARTITIONS, L.ROW_WORDS)
    # the offsets first, before any bucket is copied (DESIGN.md, Snapshots)
    offsets = tuple(int(x) for x in rows[:nparts, L.P_APPLIED].tolist())
    taken = time.time_ns()
    entries = int(meta.reshape(L.NBUCKETS, L.ROW_WORDS)[:, L.M_LIVE].sum())
    head = {"layout_version": L.LAYOUT_VERSION, "nbuckets": L.NBUCKETS, "key_size": geo.key_size,
            "max_value": geo.max_value, "slots": geo.slots, "ring": geo.ring, "size": geo.size,
            "topic": _topic_of(header), "wire_format": _format_of(header), "partitions": nparts,
            "offsets": list(offsets), "taken_ns": taken, "name": handle.name,
            "creation_id": int(header[L.H_CREATION_ID]), "entries": entries}
    raw = json.dumps(head, separators=(",", ":")).encode()
    tmp = path + ".tmp"
    nb = buckets_per_chunk(geo)
    buf = _Buffers(geo, nb)
    counts = np.zeros(2, np.int64)
    sums = xxhash.xxh3_64()
    out = _Out(tmp, rate)
    try:
        out.write(_HEAD.pack(MAGIC, FORMAT_VERSION, len(raw)) + raw + struct.pack("<Q", xxhash.xxh3_64_intdigest(raw)))
        for b0 in range(0, L.NBUCKETS, nb):
            _copy_chunk(handle.name, meta, index, ring8, geo, b0, nb, buf, counts)
            n = int(buf.lens.sum())
            views = (buf.meta, buf.index, buf.lens, buf.ring[:n])
            h = xxhash.xxh3_64()
            for v in views:
                h.update(v)
            digest = h.intdigest()
            sums.update(struct.pack("<Q", digest))
            out.write(_CHUNK.pack(CHUNK_MAGIC, b0, nb, 0, buf.fixed(nb) + n, digest))
            for v in views:
                out.write(v)
            out.chunk_done()
            if progress is not None:
                progress(b0 + nb, L.NBUCKETS, out.size)
        out.write(_END.pack(END_MAGIC, L.NBUCKETS // nb, 0, entries, sums.intdigest()))
        out.finish()
        size = out.size
        out.close()
        os.rename(tmp, path)
        _fsync_dir(path)
    except BaseException:
        out.close()
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    if counts[1]:
        log.warning("cache %r: %d buckets had head/tail words no writer leaves; written empty", handle.name,
                    int(counts[1]))
    dt = time.monotonic() - t0
    log.info("cache %r: snapshot %s, %d entries, %s in %.2f s (%.2f GB/s)", handle.name, path, entries,
             L.format_bytes(size), dt, size / max(dt, 1e-9) / 1e9)
    return SnapshotInfo(path, geo, L.LAYOUT_VERSION, head["topic"], head["wire_format"], offsets, taken, entries,
                        handle.name, size)


class _Out:
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
      the write then take that share of a core and of the memory bandwidth);
    - durable when closed (fdatasync), before the caller's rename."""

    PIECE = 4 << 20
    BLOCK = 4096
    DIRECT = True  # False: plain writes only (what happens where O_DIRECT is refused)

    def __init__(self, path: str, rate: int):
        flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW | os.O_CLOEXEC
        try:
            if not self.DIRECT:
                raise OSError("plain writes asked for")
            self.fd = os.open(path, flags | os.O_DIRECT, 0o600)
            self.stage = mmap.mmap(-1, self.PIECE)  # page-aligned, as O_DIRECT wants
        except (OSError, AttributeError):  # tmpfs before Linux 6.6, some FUSE file systems
            self.fd = os.open(path, flags, 0o600)
            self.stage = None
        self.rate = max(int(rate), 0)
        self.size = self.staged = self.flushed = 0
        self.t0 = time.monotonic()

    def write(self, data) -> None:
        mv = memoryview(data).cast("B")
        while len(mv):
            if self.stage is None:
                n = min(len(mv), self.PIECE)
                self._write_all(mv[:n])
            else:
                n = min(len(mv), self.PIECE - self.staged)
                self.stage[self.staged:self.staged + n] = mv[:n]
                self.staged += n
                if self.staged == self.PIECE:
                    self._write_all(memoryview(self.stage))
                    self.staged = 0
            mv = mv[n:]
            self.size += n
            if self.rate:
                ahead = self.size / self.rate - (time.monotonic() - self.t0)
                if ahead > 0:
                    time.sleep(ahead)

    def _write_all(self, mv) -> None:
        while len(mv):
            mv = mv[os.write(self.fd, mv):]

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
            self._write_all(memoryview(self.stage)[:whole])
            os.ftruncate(self.fd, self.size)
            self.staged = 0
        self.chunk_done()
        os.fdatasync(self.fd)

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1
        if self.stage is not None:
            self.stage.close()
            self.stage = None


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


def _copy_chunk(name, meta, index, ring8, geo, b0, nb, buf, counts) -> None:
    """Copy buckets b0..b0+nb into buf, each consistently; yield to writers in between."""
    i, force, stuck_at, since = 0, -1, -1, 0.0
    while True:
        pos = int(buf.lens[:i].sum())
        i = SK.copy_out(meta, index, ring8, geo.slots, geo.ring, b0, i, nb, pos, buf.meta, buf.index, buf.lens,
                        buf.ring, SPIN_LIMIT, force, counts)
        if i >= nb:
            return
        b = b0 + i
        if b != stuck_at:
            stuck_at, since = b, time.monotonic()
        owner = int(load_word(meta, b * L.ROW_WORDS + L.M_LOCK))
        if time.monotonic() - since > STUCK_S and (owner == 0 or not liveness.is_alive(owner)):
            log.warning("cache %r: bucket %d stays mid-write with no live writer; copied as it stands (the "
                        "restore rebuilds it)", name, b)
            force = b
        else:
            os.sched_yield()


def _fsync_dir(path: str) -> None:
    fd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


# -- reading ---------------------------------------------------------------------------------


def _bad(path: str, what: str) -> SnapshotCorruptError:
    return SnapshotCorruptError(f"snapshot {path}: {what}; it cannot be used (an older snapshot, or a replay "
                                "of the topic, can)")


def _read_exact(f, n: int, path: str, what: str, into=None):
    if into is not None:
        got = f.readinto(into)
        if got != n:
            raise _bad(path, f"truncated in {what} ({got} of {n} bytes)")
        return into
    data = f.read(n)
    if len(data) != n:
        raise _bad(path, f"truncated in {what} ({len(data)} of {n} bytes)")
    return data


def _header(f, path: str) -> SnapshotInfo:
    if path.endswith(".tmp"):
        raise _bad(path, "is a snapshot being written (.tmp), never a finished one")
    magic, version, n = _HEAD.unpack(_read_exact(f, _HEAD.size, path, "the header"))
    if magic != MAGIC:
        raise _bad(path, f"does not start with {MAGIC!r} (not a shmcache snapshot)")
    if version != FORMAT_VERSION:
        raise _bad(path, f"has format version {version}; this shmcache reads version {FORMAT_VERSION}")
    if not 0 < n <= HEADER_MAX:
        raise _bad(path, f"header length {n} is not 1..{HEADER_MAX}")
    raw = _read_exact(f, n, path, "the header")
    (digest,) = struct.unpack("<Q", _read_exact(f, 8, path, "the header checksum"))
    if digest != xxhash.xxh3_64_intdigest(raw):
        raise _bad(path, "header checksum mismatch")
    try:
        h = json.loads(raw)
        ks, maxv, slots, ring, size = (int(h[k]) for k in ("key_size", "max_value", "slots", "ring", "size"))
        offsets = tuple(int(x) for x in h["offsets"])
        info = SnapshotInfo(path, L.Geometry(size, ks, maxv, slots, ring), int(h["layout_version"]), str(h["topic"]),
                            str(h["wire_format"]), offsets, int(h["taken_ns"]), int(h["entries"]), str(h["name"]),
                            os.fstat(f.fileno()).st_size)
        nbuckets = int(h["nbuckets"])
    except (ValueError, KeyError, TypeError) as e:
        raise _bad(path, f"header is not what format version {FORMAT_VERSION} writes ({e})") from None
    g = info.geometry
    if (nbuckets != L.NBUCKETS or not 1 <= ks <= L.MAX_KEY_SIZE or slots < L.MIN_SLOTS or slots & (slots - 1)
            or ring <= 0 or ring % L.RECORD_ALIGN or ring > L.POS_MASK or not 0 <= maxv <= 0xFFFFFFFF
            or len(offsets) > L.MAX_PARTITIONS or g.size > 1 << 50):
        raise _bad(path, f"header geometry is impossible ({h})")
    return info


def read_header(path) -> SnapshotInfo:
    """The snapshot's header, checked (the chunks are checked as they are read)."""
    path = os.fspath(path)
    with open(path, "rb") as f:
        return _header(f, path)


def _read_chunk(f, path: str, k: int, b0: int, nb: int, fixed: int, raw) -> tuple[int, int]:
    """Read chunk k (its header and payload, into raw); (payload bytes, checksum)."""
    magic, first, n, _, plen, digest = _CHUNK.unpack(_read_exact(f, _CHUNK.size, path, f"chunk {k}"))
    if magic != CHUNK_MAGIC or first != b0 or n != nb or not fixed <= plen <= len(raw):
        raise _bad(path, f"chunk {k} header is damaged (bucket {first}, {n} buckets, {plen} bytes; "
                         f"expected bucket {b0}, {nb} buckets)")
    _read_exact(f, plen, path, f"chunk {k}", into=raw[:plen])
    try:  # what was read and used goes from the page cache: a restore does not fill it with a copy of the cache
        os.posix_fadvise(f.fileno(), 0, f.tell(), os.POSIX_FADV_DONTNEED)
    except OSError:
        pass
    return plen, digest


def _chunks(f, info: SnapshotInfo, buf: _Buffers, nb: int):
    """Yield each chunk's first bucket, checked against its checksum, into buf. A thread
    reads the next chunk into a second buffer while the caller uses this one (the reads
    release the GIL): reading the file overlaps checking and copying it."""
    path, geo = info.path, info.geometry
    sums = xxhash.xxh3_64()
    fixed = buf.fixed(nb)
    raws = [memoryview(np.zeros(fixed + nb * geo.ring, np.uint8)) for _ in range(2)]
    starts = list(range(0, L.NBUCKETS, nb))
    try:  # a larger read-ahead: a cold file read 2-3x faster here (0.22-0.5 GB/s without)
        os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_SEQUENTIAL)
    except OSError:
        pass
    with ThreadPoolExecutor(1, thread_name_prefix="shmcache-snapshot-read") as pool:
        ahead = pool.submit(_read_chunk, f, path, 0, 0, nb, fixed, raws[0])
        for k, b0 in enumerate(starts):
            plen, digest = ahead.result()
            raw = raws[k % 2]
            if k + 1 < len(starts):
                ahead = pool.submit(_read_chunk, f, path, k + 1, starts[k + 1], nb, fixed, raws[(k + 1) % 2])
            if xxhash.xxh3_64_intdigest(raw[:plen]) != digest:
                raise _bad(path, f"checksum mismatch in chunk {k} (buckets {b0}..{b0 + nb - 1})")
            sums.update(struct.pack("<Q", digest))
            a = np.frombuffer(raw, np.int64, fixed // L.WORD)
            m, s = nb * L.ROW_WORDS, nb * geo.slots
            span = plen - fixed
            # views of the chunk read (no copy); valid until the next chunk is asked for
            buf.meta, buf.index, buf.lens = a[:m], a[m:m + s], a[m + s:m + s + nb]
            buf.ring = np.frombuffer(raw, np.uint8, span, fixed)
            if (buf.lens < 0).any() or (buf.lens > geo.ring).any() or int(buf.lens.sum()) != span:
                raise _bad(path, f"chunk {k} ring lengths do not add up")
            yield b0
    magic, chunks, _, entries, digest = _END.unpack(_read_exact(f, _END.size, path, "the trailer"))
    if magic != END_MAGIC or chunks != L.NBUCKETS // nb or digest != sums.intdigest():
        raise _bad(path, "trailer is damaged or does not match the chunks")
    if f.read(1):
        raise _bad(path, "has bytes after its trailer")


def verify(path) -> SnapshotInfo:
    """Read the whole file and check every checksum; the header's info if it is whole."""
    path = os.fspath(path)
    with open(path, "rb", buffering=0) as f:
        info = _header(f, path)
        nb = buckets_per_chunk(info.geometry)
        for _ in _chunks(f, info, _Buffers(info.geometry, nb, allocate=False), nb):
            pass
    return info


def check_expected(info: SnapshotInfo, *, topic: str | None = None, wire_format: str | None = None,
                   key_size: int | None = None) -> None:
    """SnapshotMismatchError if the snapshot is of another topic, format or key size."""
    for what, want, have in (("topic", topic, info.topic), ("wire format", wire_format, info.wire_format),
                             ("key size", key_size, info.geometry.key_size)):
        if want is not None and have != want and not (what == "wire format" and have == ""):
            raise SnapshotMismatchError(f"snapshot {info.path} is of {what} {have!r}; this cache's {what} is "
                                        f"{want!r}")


# -- restoring -------------------------------------------------------------------------------


def restore(path, name: str, *, memory=None, max_value: int | None = None, mode: int = 0o600,
            topic: str | None = None, wire_format: str | None = None, key_size: int | None = None,
            progress=None) -> dict:
    """Create cache `name` from the snapshot at `path`: of the snapshot's geometry unless
    `memory` (or `max_value`) says otherwise. Returns what was done: entries, evictions,
    mode ("copy" or "re-insert"), seconds, the snapshot's info."""
    from shmcache.engine import table

    path = os.fspath(path)
    t0 = time.monotonic()
    with open(path, "rb", buffering=0) as f:
        info = _header(f, path)
        check_expected(info, topic=topic, wire_format=wire_format, key_size=key_size)
        src = info.geometry
        maxv = src.max_value if max_value is None else max_value
        if memory is None and maxv == src.max_value and exact_memory(src):
            memory = exact_memory(src)
        elif memory is None:
            memory = src.size
        target = L.Geometry.plan(L.parse_bytes(memory), src.key_size, maxv)
        same = target == src and info.layout_version == L.LAYOUT_VERSION
        try:  # the kernel reads the file's start while the segment is made (its 2 MiB pages zeroed)
            os.posix_fadvise(f.fileno(), 0, min(info.bytes, READ_AHEAD), os.POSIX_FADV_WILLNEED)
        except OSError:
            pass
        w = table.create(name, memory=memory, key_size=src.key_size, max_value=maxv, mode=mode)
        try:
            ctl = w.control
            ctl.set_word(L.H_RESTORE_STATE, L.RESTORE_RUNNING)
            nb = buckets_per_chunk(src)
            buf = _Buffers(src, nb, allocate=False)
            dropped = 0
            me = liveness.owner_word()
            for b0 in _chunks(f, info, buf, nb):
                if same:
                    _copy_in(w, b0, nb, buf, me)
                else:
                    dropped += _reinsert(w, src, nb, buf)
                if progress is not None:
                    progress(b0 + nb, L.NBUCKETS, f.tell())
            _publish(w, info)
            st = w.stats()
            ctl.set_word(L.H_RESTORE_ENTRIES, st["entries"])
            ctl.set_word(L.H_RESTORE_EVICTIONS, (st["evictions"] + dropped) if not same else 0)
            ctl.set_word(L.H_RESTORE_NS, int((time.monotonic() - t0) * 1e9))
            ctl.set_word(L.H_RESTORE_TAKEN_NS, info.taken_ns)
            ctl.set_word(L.H_RESTORE_STATE, L.RESTORE_DONE)
        except BaseException:
            w.close()
            destroy(name, force=True)
            raise
    dt = time.monotonic() - t0
    out = {"name": name, "mode": "copy" if same else "re-insert", "entries": st["entries"],
           "evictions": ctl.word(L.H_RESTORE_EVICTIONS), "seconds": dt, "memory": target.size,
           "snapshot": info.to_dict()}
    w.close()
    log.info("cache %r restored from %s (%s): %d entries in %.2f s (%.2f GB/s)", name, path, out["mode"],
             out["entries"], dt, info.bytes / max(dt, 1e-9) / 1e9)
    return out


def _copy_in(w, b0: int, nb: int, buf: _Buffers, me: int) -> None:
    a = w.segment_arrays()
    meta, index, ring8 = a.meta, a.index, a.ring8
    geo = w.geometry
    bad = SK.copy_in(meta, index, ring8, geo.slots, geo.ring, b0, nb, buf.meta, buf.index, buf.lens, buf.ring, me)
    if bad >= 0:
        raise SnapshotCorruptError(f"cache {w.name!r}: bucket {bad} of the snapshot does not fit the geometry it "
                                   "claims (or another process writes the cache being restored)")
    odd = np.flatnonzero(buf.meta[L.M_VERSION::L.ROW_WORDS] & 1)
    for i in odd.tolist():  # copied mid-write (its writer had died): rebuild it from its ring
        b = b0 + i
        if cas_word(meta, b * L.ROW_WORDS + L.M_LOCK, 0, me) == 0:
            K.repair_bucket(meta, index, ring8, a.ring64, a.geo, b)


def _reinsert(w, src: L.Geometry, nb: int, buf: _Buffers) -> int:
    """Apply the chunk's live records through the writer (another geometry); returns how
    many were dropped for a value over the new max_value."""
    most = int(buf.lens.sum()) // L.record_size(src.key_size, 0) + 1
    key_at = np.empty(most, np.int64)
    val_at = np.empty(most, np.int64)
    lens = np.empty(most, np.int64)
    n = SK.live_records(buf.meta, buf.lens, buf.ring, nb, src.ring, src.key_size, src.max_value, key_at, val_at, lens)
    keep = lens[:n] <= w.geometry.max_value
    dropped = n - int(keep.sum())
    key_at, val_at, lens = key_at[:n][keep], val_at[:n][keep], lens[:n][keep]
    keys = np.empty(len(key_at) * src.key_size, np.uint8)
    SK.gather_keys(buf.ring, key_at, len(key_at), src.key_size, keys)
    if len(key_at):
        w.apply(keys.reshape(-1, src.key_size), np.zeros(len(key_at), np.uint8),
                (val_at, lens, buf.ring[:int(buf.lens.sum())]))
    return dropped


def _publish(w, info: SnapshotInfo) -> None:
    """The snapshot's topic, format and offsets into the new cache's control area: a
    supervisor started on it resumes each partition from there."""
    ctl = w.control
    ctl.reset_partitions()
    ctl.partitions[:len(info.offsets), L.P_APPLIED] = info.offsets
    ctl.set_topic(info.topic, len(info.offsets))
    ctl.set_word(L.H_WIRE_FORMAT, L.WIRE_FORMATS.index(info.wire_format) + 1 if info.wire_format in L.WIRE_FORMATS else 0)
