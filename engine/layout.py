"""The shared-memory segment layout: the one contract every process agrees on.

One segment per cache, a file under /dev/shm, laid out as consecutive sections,
each a whole number of 4 KiB pages so every section starts page-aligned:

    +----------------------+  0
    | header   (4 KiB)     |  int64 words: magic, version, geometry, ids, topic; control words
    | writers  (4 KiB)     |  MAX_WRITERS x 8 int64: owner word + counters per writer process
    | workers  (4 KiB)     |  MAX_WORKERS x 8 int64: a row per consumer worker (control area)
    | partitions (64 KiB)  |  MAX_PARTITIONS x 8 int64: a row per partition (control area)
    | bucket meta (512 KiB)|  NBUCKETS x 8 int64: lock, seqlock version, ring head/tail, counts
    | index                |  NBUCKETS x slots int64: open-addressing (linear probing) slots
    | rings                |  NBUCKETS x ring_bytes uint8: records, oldest overwritten first
    +----------------------+  size

A record in a bucket's ring, 16-byte aligned, never wrapping around the ring end:

    [int64 xxh64(key)][int64 flags << 32 | value_len][key: key_size B][value][pad to 16]

An index slot is 0 (empty) or `tag << 47 | (offset + 1)`, where offset is the
record's byte offset in its bucket's ring and tag is the top 16 bits of the key's
hash. A bucket's head and tail are absolute, ever-growing byte positions (ring
offset = position % ring bytes); the live records lie between them. Bucket = xxh64(key) % NBUCKETS; a key's home slot is
`(xxh64 >> BUCKET_BITS) % slots`.

What is *not* guaranteed: a stored entry may be evicted at any time (FIFO per
bucket when its ring or its index is full); evictions are counted.

The control area (the header's words 10, 11, 14, 15 and from 48 on, and the workers'
and partitions' rows: how the cache is kept filled from Kafka) is named in
engine/control/layout.py; this module gives only where its sections lie.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import accumulate

from shmcache.engine.units import format_bytes
from shmcache.errors import CorruptCacheError, MemoryTooSmallError

MAGIC = 0x31484341434D4853  # b"SHMCACH1" read as a little-endian int64
LAYOUT_VERSION = 1

PAGE = 4096
WORD = 8  # every shared word is an int64

BUCKET_BITS = 13
NBUCKETS = 1 << BUCKET_BITS  # 8192: per-bucket locks spread contention; P | 8192 for wire v2

ADD = 0  # the actions an apply takes, one per entry (the wire formats carry the same codes)
DELETE = 1

# -- header: int64 word indices -------------------------------------------------
H_MAGIC = 0
H_VERSION = 1
H_KEY_SIZE = 2
H_MAX_VALUE = 3
H_NBUCKETS = 4
H_SLOTS = 5  # index slots per bucket (a power of two)
H_RING = 6  # ring bytes per bucket (a multiple of RECORD_ALIGN)
H_SIZE = 7  # total segment bytes
H_CREATION_ID = 8  # random, tells a re-created segment from the old one
H_CREATED_NS = 9  # time.time_ns() at creation (stats: created_s)
# words 10, 14, 15 and 48.. are the control area's (engine/control/layout.py)
H_OWNER_LOCKS = 11  # 1: every owner word in the segment is held with an owner lock (engine/owners.py)
H_TOPIC_LEN = 12  # bytes of the topic name in H_TOPIC
H_PARTITIONS = 13  # partitions of the topic (0 until a supervisor has seen it)
H_TOPIC = 16  # words 16..47: the Kafka topic name, utf-8
TOPIC_MAX = 32 * WORD
HEADER_WORDS = PAGE // WORD

# -- per-process slot tables ------------------------------------------------------
ROW_WORDS = 8  # 64 B rows: one cache line each, so processes never share a line

MAX_WRITERS = 64
W_OWNER = 0  # owner word of the process holding the slot, 0 if free
W_SETS = 1
W_DELETES = 2
W_DELETE_MISSES = 3
W_BATCHES = 4
# bucket + 1 whose lock this writer has waited for, for WAIT_REPORT_S or more, held by a live
# process; 0 none (engine/writer.py: such a lock is never taken)
W_WAIT = 5
W_UNKNOWN = 6  # entries of an unknown action, skipped
W_CORRUPTIONS = 7  # damaged bucket states this writer met (each one repaired, see _repair.py)

MAX_WORKERS = 64  # consumer worker processes, one row each (K_*: engine/control/layout.py)
MAX_PARTITIONS = 1024  # partitions of the cache's topic, row = partition number (P_*: engine/control/layout.py)

# -- bucket meta: int64 word offsets within a bucket's row ---------------------------
M_LOCK = 0  # 0 free, else owner word of the writer holding it
M_VERSION = 1  # seqlock: odd while a writer changes the bucket
M_HEAD = 2  # absolute ring position where the next record goes
M_TAIL = 3  # absolute ring position of the oldest record
M_LIVE = 4  # live entries
M_LIVE_BYTES = 5  # ring bytes held by live records
M_EVICTIONS = 6  # live records overwritten to make room
M_TAKEOVERS = 7  # locks taken over from a dead writer, bucket then rebuilt

# -- records -------------------------------------------------------------------------
RECORD_ALIGN = 16
RECORD_HEADER = 8 + 8  # hash + (flags, value length)
F_LIVE = 1  # the current value of its key
F_DEAD = 2  # replaced or deleted; space is reclaimed when the tail passes
F_PAD = 3  # filler up to the ring end; the next record starts at ring offset 0

# -- index slots -----------------------------------------------------------------------
POS_BITS = 47  # slot = tag << POS_BITS | (ring offset + 1)
POS_MASK = (1 << POS_BITS) - 1
TAG_SHIFT = 48  # tag = hash >> 48 (16 bits), disjoint from bucket and home bits
SLOT_RING_BYTES = 48  # ring bytes budgeted per index slot: load stays ~1/3 for 150 B records
MAX_LOAD_NUM, MAX_LOAD_DEN = 3, 4  # index full at 3/4: evict the oldest before inserting
MIN_SLOTS = 8

DEFAULT_KEY_SIZE = 32
DEFAULT_MAX_VALUE = 4096
MAX_KEY_SIZE = 1024

_FIXED_SECTIONS = (
    PAGE,  # header
    MAX_WRITERS * ROW_WORDS * WORD,
    MAX_WORKERS * ROW_WORDS * WORD,
    MAX_PARTITIONS * ROW_WORDS * WORD,
    NBUCKETS * ROW_WORDS * WORD,  # bucket meta
)
FIXED_BYTES = sum(_FIXED_SECTIONS)
# where each section after the header starts (the index: right after the bucket meta)
_SECTION_OFFSETS = tuple(accumulate(_FIXED_SECTIONS))


def align(n: int, a: int) -> int:
    return (n + a - 1) // a * a


def record_size(key_size: int, value_len: int) -> int:
    """Ring bytes a record takes. Plain arithmetic on module constants, so that the kernels
    compile this very function (engine/_bucket.py) rather than keep a copy."""
    return (RECORD_HEADER + key_size + value_len + RECORD_ALIGN - 1) // RECORD_ALIGN * RECORD_ALIGN


@dataclass(frozen=True)
class Geometry:
    """Where everything is, derived from the segment size and the key/value limits."""

    size: int
    key_size: int
    max_value: int
    slots: int  # index slots per bucket
    ring: int  # ring bytes per bucket

    @property
    def max_live(self) -> int:
        return self.slots * MAX_LOAD_NUM // MAX_LOAD_DEN

    # the fixed sections: the same in every segment
    writers_off, workers_off, partitions_off, meta_off, index_off = _SECTION_OFFSETS

    @property
    def ring_off(self) -> int:
        return align(self.index_off + NBUCKETS * self.slots * WORD, PAGE)

    @property
    def capacity_bytes(self) -> int:
        return NBUCKETS * self.ring

    @classmethod
    def plan(cls, memory: int, key_size: int, max_value: int) -> "Geometry":
        """Split `memory` bytes into index and rings; raise if a largest record cannot fit."""
        max_record = record_size(key_size, max_value)
        budget = (memory - FIXED_BYTES - PAGE) // NBUCKETS  # PAGE: ring section alignment
        slots = _pow2_floor(max(budget // (SLOT_RING_BYTES + WORD), MIN_SLOTS))
        while slots > MIN_SLOTS and budget - slots * WORD < max_record:
            slots //= 2  # small caches give index room back so a largest value still fits
        ring = (budget - slots * WORD) // RECORD_ALIGN * RECORD_ALIGN
        if ring < max_record:
            need = FIXED_BYTES + PAGE + NBUCKETS * (max_record + MIN_SLOTS * WORD)
            raise MemoryTooSmallError(
                f"memory={format_bytes(memory)} is too small for {NBUCKETS} buckets holding "
                f"values up to {max_value} B with {key_size} B keys: at least "
                f"{format_bytes(align(need, 1 << 20))} is needed"
            )
        size = align(FIXED_BYTES + NBUCKETS * slots * WORD, PAGE) + NBUCKETS * ring
        return cls(size=size, key_size=key_size, max_value=max_value, slots=slots, ring=ring)

    @classmethod
    def from_header(cls, name: str, header, file_size: int) -> "Geometry":
        """The geometry a segment's header words claim, checked word by word against this
        layout's own derivations and the file's size; CorruptCacheError names the first
        field that is wrong, what it holds and what it should be. The kernels index the
        segment with these figures, so nothing here may be taken on trust."""
        h = [int(x) for x in header[:H_TOPIC]]

        def bad(field: str, should: str) -> CorruptCacheError:
            return CorruptCacheError(f"cache {name!r}: header field {field} is {h[_FIELDS[field]]}; "
                                     f"it should be {should} (a damaged or foreign segment)")

        ks, maxv, slots, ring, size = h[H_KEY_SIZE], h[H_MAX_VALUE], h[H_SLOTS], h[H_RING], h[H_SIZE]
        problem = geometry_problem(h[H_NBUCKETS], ks, maxv, slots, ring, size)
        if problem:
            raise bad(*problem)
        if size != file_size:
            raise bad("size", f"{file_size}, the size of the file")
        if not 0 <= h[H_TOPIC_LEN] <= TOPIC_MAX:
            raise bad("topic_len", f"from 0 to {TOPIC_MAX}")
        if not 0 <= h[H_PARTITIONS] <= MAX_PARTITIONS:
            raise bad("partitions", f"from 0 to {MAX_PARTITIONS}")
        return cls(size=size, key_size=ks, max_value=maxv, slots=slots, ring=ring)


def geometry_problem(nbuckets: int, key_size: int, max_value: int, slots: int, ring: int,
                     size: int) -> tuple[str, str] | None:
    """The first figure of a claimed geometry that this layout cannot hold or that
    contradicts the others, as (field, what it should be); None if they agree. A
    segment's header (Geometry.from_header) and a snapshot's (snapshots/format.py) are
    checked by it: the kernels index with these figures."""
    if nbuckets != NBUCKETS:
        return "nbuckets", str(NBUCKETS)
    if not 1 <= key_size <= MAX_KEY_SIZE:
        return "key_size", f"from 1 to {MAX_KEY_SIZE}"
    if not 0 <= max_value <= 0xFFFFFFFF:
        return "max_value", "from 0 to 2**32-1"
    if slots < MIN_SLOTS or slots & (slots - 1) or slots > POS_MASK:
        return "slots", f"a power of two from {MIN_SLOTS} to 2**{POS_BITS - 1}"
    if ring <= 0 or ring % RECORD_ALIGN or ring > POS_MASK:
        return "ring", f"a positive multiple of {RECORD_ALIGN} below 2**{POS_BITS}"
    least = record_size(key_size, max_value)
    if ring < least:
        return "ring", f">= {least}, one record of key_size={key_size} and max_value={max_value}"
    derived = align(FIXED_BYTES + NBUCKETS * slots * WORD, PAGE) + NBUCKETS * ring
    if size != derived:
        return "size", f"{derived}, as derived from slots={slots} and ring={ring}"
    return None


_FIELDS = {"nbuckets": H_NBUCKETS, "key_size": H_KEY_SIZE, "max_value": H_MAX_VALUE, "slots": H_SLOTS,
           "ring": H_RING, "size": H_SIZE, "topic_len": H_TOPIC_LEN, "partitions": H_PARTITIONS}


def bucket_spans(geo: Geometry, b: int) -> tuple[tuple[int, int], tuple[int, int], tuple[int, int]]:
    """Where bucket b lives in the segment: (offset, length) in bytes of its meta row,
    its index slots and its ring. Snapshots copy buckets by these spans, so a layout
    change is made here once."""
    return ((geo.meta_off + b * ROW_WORDS * WORD, ROW_WORDS * WORD),
            (geo.index_off + b * geo.slots * WORD, geo.slots * WORD),
            (geo.ring_off + b * geo.ring, geo.ring))


def _pow2_floor(n: int) -> int:
    return 1 << (max(n, 1).bit_length() - 1)
