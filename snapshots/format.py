"""The snapshot file: its format, and reading it back checked (snapshots/writing.py writes
it, snapshots/restoring.py restores from it; this module is the contract between the two).

The file (format version 1, all integers little-endian):

    "SHMSNAP1"  u32 format version  u32 n      header: n bytes of JSON, then its u64 xxh3-64
    { "layout_version", "nbuckets", "key_size", "max_value", "slots", "ring", "size",
      "topic", "wire_format" (v1 | v2 | kv | proto | ""), "partitions", "offsets": [next offset
      to apply, per partition, -1 none], "taken_ns", "name", "creation_id", "entries",
      "topic_id" (the Kafka topic's id the offsets belong to, "" unknown; absent in
      snapshots of an earlier shmcache) }
    chunk*      "CHNK" u32 first bucket  u32 buckets  u32 0  u64 payload bytes  u64 xxh3-64 of the payload
                payload: the buckets' meta rows, index slots, ring span lengths (int64s) and the
                ring spans (each bucket's live records, tail to head) back to back
    "SNAPEND1"  u32 chunks  u32 0  u64 entries  u64 xxh3-64 of the chunks' checksums

Every field is checked before use (a snapshot is as untrusted as the segment, and its
checksums are not keyed: anyone can write one that holds): each header field for its
type and bounds, the geometry by the segment's own rule (layout.geometry_problem). A
truncated file, a failed checksum or check, or a file that is no snapshot raises
SnapshotCorruptError naming what was wrong; another topic, format or key size
SnapshotMismatchError.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import struct
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import numpy as np
import xxhash

from shmcache.engine.control import layout as C
from shmcache.engine import layout as L
from shmcache.errors import SnapshotCorruptError, SnapshotError, SnapshotMismatchError
from shmcache.ipc.segment import kind_of

MAGIC = b"SHMSNAP1"
FORMAT_VERSION = 1
CHUNK_MAGIC = b"CHNK"
END_MAGIC = b"SNAPEND1"
CHUNK_BYTES = 32 << 20  # bucket bytes per chunk at most: the memory a snapshot or restore holds
HEADER_MAX = 1 << 20
I64 = (1 << 63) - 1  # every integer of the header is a signed 64-bit word somewhere
SIZE_MAX = 1 << 50  # a cache's size at most (1 PiB): well past any machine's memory
NAME_MAX = 255  # a cache's name: a file name under /dev/shm

HEAD = struct.Struct("<8sII")
CHUNK = struct.Struct("<4sIIIQQ")
END = struct.Struct("<8sIIQQ")


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
    topic_id: str = ""  # the Kafka topic id its offsets belong to (engine/control/layout.py topic_id_text), "" unknown

    def to_dict(self) -> dict:
        return {"path": self.path, "topic": self.topic, "wire_format": self.wire_format,
                "offsets": list(self.offsets), "taken_ns": self.taken_ns, "entries": self.entries,
                "name": self.name, "bytes": self.bytes, "layout_version": self.layout_version,
                "topic_id": self.topic_id,
                "memory": self.geometry.size, "key_size": self.geometry.key_size,
                "max_value": self.geometry.max_value}


def topic_of(header) -> str:
    n = min(max(int(header[L.H_TOPIC_LEN]), 0), L.TOPIC_MAX)
    return header[L.H_TOPIC:L.H_TOPIC + L.TOPIC_MAX // L.WORD].tobytes()[:n].decode("utf-8", "replace")


def format_of(header) -> str:
    code = int(header[C.H_WIRE_FORMAT])
    return C.WIRE_FORMATS[code - 1] if 1 <= code <= len(C.WIRE_FORMATS) else ""


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


class Buffers:
    """One chunk's arrays: allocated once per snapshot; a reader points them into the chunk it read."""

    def __init__(self, geo: L.Geometry, nb: int, allocate: bool = True):
        self.meta = np.zeros(nb * L.ROW_WORDS if allocate else 0, np.int64)
        self.index = np.zeros(nb * geo.slots if allocate else 0, np.int64)
        self.lens = np.zeros(nb, np.int64)
        self.ring = np.zeros(nb * geo.ring if allocate else 0, np.uint8)
        self.slots = geo.slots

    def fixed(self, nb: int) -> int:
        return nb * (L.ROW_WORDS + self.slots + 1) * L.WORD


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


def parse_header(f, path: str) -> SnapshotInfo:
    if path.endswith(".tmp"):
        raise _bad(path, "is a snapshot being written (.tmp), never a finished one")
    magic, version, n = HEAD.unpack(_read_exact(f, HEAD.size, path, "the header"))
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
    return _checked(_json_object(raw, path), path, os.fstat(f.fileno()).st_size)


def _json_object(raw: bytes, path: str) -> dict:
    """The header's JSON object; SnapshotCorruptError for anything else (the checksum is not
    keyed: anyone can write a header that passes it, nested a million deep, say). NaN and
    Infinity are read as floats, which no field takes: _checked names the field."""
    try:
        h = json.loads(raw)
    except (ValueError, RecursionError) as e:  # RecursionError: arrays nested past the interpreter's stack
        raise _bad(path, f"header is not JSON ({type(e).__name__}: {str(e)[:100]})") from None
    if not isinstance(h, dict):
        raise _bad(path, f"header is a JSON {type(h).__name__}, not an object")
    return h


def _checked(h: dict, path: str, file_size: int) -> SnapshotInfo:
    """The header's fields, each checked for its type and bounds, the geometry's figures
    against each other as a segment's are (layout.geometry_problem) and against the file's
    size; SnapshotCorruptError names the first field that is wrong and what it should be."""

    def bad(field: str, should: str) -> SnapshotCorruptError:
        shown = "missing" if field not in h else repr(h[field])
        shown = shown if len(shown) <= 80 else shown[:80] + "..."
        return _bad(path, f"header field {field} is {shown}; it should be {should}")

    def integer(field: str, lo: int, hi: int) -> int:
        v = h.get(field)
        if type(v) is not int or not lo <= v <= hi:  # bool and float are not integers here
            raise bad(field, f"an integer from {lo} to {hi}")
        return v

    def text(field: str, most: int, default: str | None = None) -> str:
        v = h.get(field, default)
        try:
            if type(v) is str and len(v.encode()) <= most:
                return v
        except UnicodeEncodeError:  # a lone surrogate ("\\ud800"): no UTF-8 holds it
            pass
        raise bad(field, f"a string of at most {most} bytes of UTF-8")

    ks, maxv, slots, ring, size = (integer(k, 0, I64) for k in ("key_size", "max_value", "slots", "ring", "size"))
    problem = L.geometry_problem(integer("nbuckets", 0, I64), ks, maxv, slots, ring, size)
    if problem:
        raise bad(*problem)
    if size > SIZE_MAX:
        raise bad("size", f"at most {SIZE_MAX} (1 PiB)")
    if L.NBUCKETS * slots * L.WORD > file_size:  # every bucket's index slots are in the file
        raise bad("slots", f"at most {file_size // (L.NBUCKETS * L.WORD)}: the file ({file_size} bytes) holds "
                           f"{L.NBUCKETS} buckets' index slots")
    offsets = h.get("offsets")
    if type(offsets) is not list or len(offsets) > L.MAX_PARTITIONS or any(
            type(x) is not int or not -1 <= x <= I64 for x in offsets):
        raise bad("offsets", f"a list of at most {L.MAX_PARTITIONS} integers from -1 to {I64}")
    if type(h.get("partitions")) is not int or h["partitions"] != len(offsets):
        raise bad("partitions", f"{len(offsets)}, the number of offsets")
    integer("creation_id", -I64 - 1, I64)
    wire_format = text("wire_format", 8)
    if wire_format not in ("", *C.WIRE_FORMATS):
        raise bad("wire_format", f"one of {('', *C.WIRE_FORMATS)}")
    topic_id = text("topic_id", 64, "")
    try:
        C.topic_id_words(topic_id)
    except ValueError:
        raise bad("topic_id", "the base64 of 16 bytes, or empty") from None
    return SnapshotInfo(path, L.Geometry(size, ks, maxv, slots, ring), integer("layout_version", 1, 0xFFFF),
                        text("topic", L.TOPIC_MAX), wire_format, tuple(offsets), integer("taken_ns", 0, I64),
                        integer("entries", 0, L.NBUCKETS * slots), text("name", NAME_MAX), file_size, topic_id)


def open_file(path: str, own: bool = False):
    """The snapshot file at `path`, opened for reading without waiting on a FIFO planted
    there (O_NONBLOCK), and only if it is a regular file; with `own` (a snapshot directory's
    files), only one of this user's, never through a symbolic link (O_NOFOLLOW).
    SnapshotError naming it otherwise; OSError if it cannot be opened."""
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | (os.O_NOFOLLOW if own else 0)
    try:
        fd = os.open(path, flags)
    except OSError as e:
        if own and e.errno == errno.ELOOP:
            raise SnapshotError(f"snapshot {path}: is a symbolic link; a snapshot directory's files are taken "
                                "only as they are") from None
        raise
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise SnapshotError(f"snapshot {path}: is {kind_of(st.st_mode)}, not a snapshot file; not read")
        if own and st.st_uid != os.geteuid():
            raise SnapshotError(f"snapshot {path}: belongs to uid {st.st_uid}, not to this user (uid "
                                f"{os.geteuid()}); a snapshot directory's files are taken only from their writer")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb", buffering=0)
    except BaseException:
        os.close(fd)
        raise


def read_header(path, own: bool = False) -> SnapshotInfo:
    """The snapshot's header, checked (the chunks are checked as they are read); `own`: open_file's."""
    path = os.fspath(path)
    with open_file(path, own) as f:
        return parse_header(f, path)


def _read_chunk(f, path: str, k: int, b0: int, nb: int, fixed: int, raw) -> tuple[int, int]:
    """Read chunk k (its header and payload, into raw); (payload bytes, checksum)."""
    magic, first, n, _, plen, digest = CHUNK.unpack(_read_exact(f, CHUNK.size, path, f"chunk {k}"))
    if magic != CHUNK_MAGIC or first != b0 or n != nb or not fixed <= plen <= len(raw):
        raise _bad(path, f"chunk {k} header is damaged (bucket {first}, {n} buckets, {plen} bytes; "
                         f"expected bucket {b0}, {nb} buckets)")
    _read_exact(f, plen, path, f"chunk {k}", into=raw[:plen])
    try:  # what was read and used goes from the page cache: a restore does not fill it with a copy of the cache
        os.posix_fadvise(f.fileno(), 0, f.tell(), os.POSIX_FADV_DONTNEED)
    except OSError:
        pass
    return plen, digest


def chunks(f, info: SnapshotInfo, buf: Buffers, nb: int):
    """Yield each chunk's first bucket, checked against its checksum, into buf. A thread
    reads the next chunk into a second buffer while the caller uses this one (the reads
    release the GIL): reading the file overlaps checking and copying it."""
    path, geo = info.path, info.geometry
    sums = xxhash.xxh3_64()
    fixed = buf.fixed(nb)
    # a chunk is never longer than the file: a ring the header claims (up to 2**47 bytes) is not allocated
    raws = [memoryview(np.zeros(max(fixed, min(fixed + nb * geo.ring, info.bytes)), np.uint8)) for _ in range(2)]
    starts = list(range(0, L.NBUCKETS, nb))
    try:  # a larger read-ahead: a cold file is read sequentially, chunk after chunk
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
    magic, chunks, _, entries, digest = END.unpack(_read_exact(f, END.size, path, "the trailer"))
    if magic != END_MAGIC or chunks != L.NBUCKETS // nb or digest != sums.intdigest():
        raise _bad(path, "trailer is damaged or does not match the chunks")
    if f.read(1):
        raise _bad(path, "has bytes after its trailer")


def verify(path) -> SnapshotInfo:
    """Read the whole file and check every checksum; the header's info if it is whole."""
    path = os.fspath(path)
    with open_file(path) as f:
        info = parse_header(f, path)
        nb = buckets_per_chunk(info.geometry)
        for _ in chunks(f, info, Buffers(info.geometry, nb, allocate=False), nb):
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
