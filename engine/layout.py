"""The shared-memory segment layout: the one contract every process agrees on.

One segment per cache, a file under /dev/shm, laid out as consecutive sections,
each a whole number of 4 KiB pages so every section starts page-aligned:

    +----------------------+  0
    | header   (4 KiB)     |  int64 words: magic, version, geometry, ids, control words (engine/control.py)
    | writers  (4 KiB)     |  MAX_WRITERS x 8 int64: owner word + counters per writer process
    | workers  (4 KiB)     |  MAX_WORKERS x 8 int64: pid word, heartbeat, counters (consumer/)
    | partitions (64 KiB)  |  MAX_PARTITIONS x 8 int64: applied offset, watermark, owner (consumer/)
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
"""

from __future__ import annotations

import base64
import re
from dataclasses import dataclass
from fractions import Fraction

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
H_SUPERVISOR = 10  # owner word (pid << 32 | start stamp) of the supervisor, 0 if none
# word 11 is free (it was a state word nobody read: the magic, written last, says a segment is made)
H_TOPIC_LEN = 12
H_PARTITIONS = 13  # partitions of the topic (0 until a supervisor has seen it)
H_SUPERVISOR_HEARTBEAT = 14  # the supervisor's last loop, on the age clock (status: supervisor_heartbeat_age_s)
# The clock of the words that measure an age: K_HEARTBEAT, H_SUPERVISOR_HEARTBEAT,
# H_BROKER_SINCE, H_COMMIT_PENDING_SINCE. AGE_CLOCK_MONOTONIC: CLOCK_MONOTONIC ns
# (time.monotonic_ns()), one clock for every process of the machine that a step of the
# wall clock (NTP, an operator, a VM resumed) does not move: with time.time_ns(), a clock
# set back an hour made a hung worker's heartbeat look fresh for that hour, and one set
# forward made every worker look hung. AGE_CLOCK_WALL (0): time.time_ns(), as an earlier
# shmcache wrote them. Set when the segment is made and when a supervisor starts.
H_AGE_CLOCK = 15
AGE_CLOCK_WALL, AGE_CLOCK_MONOTONIC = 0, 1
H_TOPIC = 16  # words 16..47: the Kafka topic name, utf-8, for status output
TOPIC_MAX = 32 * WORD
# Supervisor counters and facts: written by the supervisor only, zeroed when one starts
# (as the worker rows are), read by status, `shmcache top` and the metrics endpoint.
H_COMMITS = 48  # offset commits Kafka accepted
H_COMMIT_FAILURES = 49  # commits Kafka refused or timed out (the offsets go again next time)
H_REBALANCES = 50  # completed rebalances: assign callbacks, one per group generation, even if empty
H_PARTITIONS_LOST = 51  # partitions lost: taken away without a revoke (nothing committed)
H_SUPERVISOR_STARTED = 52  # time.time_ns() when the current supervisor started
H_METRICS_PORT = 53  # TCP port of the supervisor's Prometheus endpoint, 0 if none
H_ASSIGNING = 54  # 1 while the supervisor publishes an assignment (rows half-written): not ready
# The broker's state as the supervisor sees it (consumer/broker.py), written by it alone.
H_BROKER_STATE = 60  # BROKER_* below
H_BROKER_SINCE = 61  # the current wait for the broker began, on the age clock; 0 when it answers
BROKER_UNKNOWN, BROKER_UP, BROKER_WAITING = 0, 1, 2
BROKER_STATE_NAMES = {BROKER_UNKNOWN: "connecting", BROKER_UP: "up", BROKER_WAITING: "waiting for the broker"}
# The consumer group as the supervisor last saw it (engine/control.py set_group): who else
# holds partitions of the topic. Written by the supervisor only; H_GROUP_CHECKED is -1 while
# it writes them and the time of the look after, so a reader can tell a torn read.
H_GROUP_MEMBERS = 96  # members of the group, this supervisor included; 0 unknown
H_GROUP_CHECKED = 97  # time.time_ns() of the last look; 0 none yet, -1 being written
H_COMMITS_DEFERRED = 98  # periodic commits refused during a rebalance, retried after it
H_GROUP_TEXT_LEN = 99
# A look-up of where assigned partitions start that fails (consumer/rebalance.py; the group
# coordinator refuses or does not answer, or the broker is gone): when the first of the
# failing look-ups was made, on the age clock (0 none, -1 being written), and the last one's
# error, utf-8, cut to LOOKUP_TEXT_MAX: status() and why() say what the partitions wait for.
H_LOOKUP_FAILING_SINCE = 100
H_LOOKUP_TEXT_LEN = 101
H_LOOKUP_TEXT = 104  # words 104..127
LOOKUP_TEXT_MAX = 24 * WORD
H_GROUP_TEXT = 128  # words 128..191: JSON list of the other members (client id, host, instance id)
GROUP_TEXT_MAX = 64 * WORD
H_ELSEWHERE = 256  # words 256..383: a byte per partition, i + 1 for the i-th other member holding it
# The supervisor's handle on each worker (consumer/worker_handle.py): one word per worker
# slot, written by the supervisor alone: bits 0-7 the handle's state (index + 1 in
# WORKER_STATES, 0 none published), bits 8-23 its deaths in a row (capped), bits 24-63 the
# restart due while backing off, in tenths of a second since the epoch (0 none).
H_WORKER_HANDLES = 192  # words 192..255
WORKER_STATES = ("stopped", "starting", "up", "stopping", "backing-off")
# Snapshots (engine/snapshot.py, consumer/snapshots.py). These describe the table's content,
# so they live as long as the segment (a supervisor's start does not zero them).
H_WIRE_FORMAT = 55  # WIRE_FORMATS index + 1 of the topic's format, set by the supervisor; 0 unknown
H_COMMIT_PENDING_SINCE = 56  # the supervisor's commit in flight was sent, on the age clock; 0 none
# 1 when the live supervisor was told to serve a table with retention gaps as ready
# (`run --accept-gaps`); written at its start, so it is the supervisor alive now that says so
H_ACCEPT_GAPS = 57
# The live supervisor's bound on a worker's heartbeat (`worker_heartbeat_timeout`, in ns; 0
# none): a worker whose heartbeat (K_HEARTBEAT) is older is stale, its partitions are not
# caught up, and the supervisor kills and restarts it. Written at the supervisor's start.
H_WORKER_STALE_NS = 58
H_STALE_KILLS = 59  # workers the supervisor killed for a stale heartbeat (a counter, zeroed at its start)
H_START_KILLS = 62  # workers it killed for not coming up within its worker_start_timeout (the same)
WIRE_FORMATS = ("v1", "v2", "kv")
H_RESTORE_STATE = 400  # RESTORE_* below
H_RESTORE_ENTRIES = 401  # entries the restore put in the table
H_RESTORE_NS = 402  # how long the restore took
H_RESTORE_EVICTIONS = 403  # entries a re-insert into a smaller table evicted
H_RESTORE_TAKEN_NS = 404  # time.time_ns() the restored snapshot was taken
H_SNAPSHOT_TAKEN_NS = 405  # time.time_ns() the last snapshot written from this segment was taken
H_SNAPSHOT_BYTES = 406  # its size in bytes
H_SNAPSHOT_NS = 407  # how long it took to write
H_SNAPSHOTS = 408  # snapshots written
H_SNAPSHOT_FAILURES = 409  # snapshots that failed (disk full, ...)
H_GAP_OFFSETS = 410  # offsets that retention deleted before this table had them, summed
# The Kafka topic id (a UUID: its most and least significant 64 bits; both 0 unknown) of the
# topic whose offsets the table holds, set by the supervisor when it first asks the broker
# (consumer/topic_id.py) and by a restore (the snapshot's). A topic deleted and re-created
# under its name gets a new id: offsets alone cannot tell a new log that already holds more
# messages than the table applied, its id can.
H_TOPIC_ID = 411  # words 411, 412
H_GAP_BITS = 448  # words 448..463: a bit per partition, set when that partition has a gap
RESTORE_NONE, RESTORE_RUNNING, RESTORE_DONE, RESTORE_NONE_VALID = 0, 1, 2, 3
RESTORE_STATE_NAMES = {RESTORE_NONE: "none", RESTORE_RUNNING: "restoring", RESTORE_DONE: "restored",
                       RESTORE_NONE_VALID: "no valid snapshot"}
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
# process; 0 none (engine/writer.py: such a lock is never taken). Word 5 once counted takeovers.
W_WAIT = 5
W_UNKNOWN = 6  # entries of an unknown action, skipped
W_CORRUPTIONS = 7  # damaged bucket states this writer met (each one repaired, see _repair.py)

MAX_WORKERS = 64  # consumer worker processes, one row each (written by that worker only)
assert H_WORKER_HANDLES + MAX_WORKERS <= H_ELSEWHERE
K_OWNER = 0  # owner word of the worker process, 0 if none
K_HEARTBEAT = 1  # the worker's last loop, on the age clock (H_AGE_CLOCK)
K_STARTS = 2  # how many times this worker slot was (re)started (written by the supervisor)
K_ADDS = 3  # entries applied, by action
K_DELETES = 4
K_MALFORMED = 5  # messages with damage (their valid prefix was applied)
K_UNKNOWN = 6  # entries skipped for an unknown action
K_MESSAGES = 7  # Kafka messages applied

MAX_PARTITIONS = 1024  # partitions of the cache's topic, row = partition number
P_APPLIED = 0  # next offset to apply: every message before it is in the table; -1 none yet
P_HIGH_WATERMARK = 1  # readiness target: high watermark seen at assignment, raised by the supervisor's own looks
# while the worker is down, stale or restarted (consumer/watermarks.py); -1 unknown
P_OWNER = 2  # worker index + 1 that owns the partition now; 0 unowned
P_CAUGHT_UP = 3  # 1 once applied >= high watermark at assignment
P_COMMITTED = 4  # last offset the supervisor committed to Kafka; -1 none
P_ASSIGNED = 5  # 1 while this node's consumer group assigns the partition here
P_GENERATION = 6  # bumped at each assignment: tells a stale worker's publish from a current one
P_LATEST = 7  # newest high watermark seen: by the supervisor at assignment, then by the owning worker's fetches

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

    @property
    def writers_off(self) -> int:
        return PAGE

    @property
    def workers_off(self) -> int:
        return self.writers_off + MAX_WRITERS * ROW_WORDS * WORD

    @property
    def partitions_off(self) -> int:
        return self.workers_off + MAX_WORKERS * ROW_WORDS * WORD

    @property
    def meta_off(self) -> int:
        return self.partitions_off + MAX_PARTITIONS * ROW_WORDS * WORD

    @property
    def index_off(self) -> int:
        return self.meta_off + NBUCKETS * ROW_WORDS * WORD

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
    segment's header (Geometry.from_header) and a snapshot's (snapshot_format) are
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


_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "kib": 2**10, "m": 10**6, "mb": 10**6,
          "mib": 2**20, "g": 10**9, "gb": 10**9, "gib": 2**30, "t": 10**12, "tb": 10**12,
          "tib": 2**40}


def parse_bytes(value: int | str, *, what: str = "memory") -> int:
    """'256MiB', '1.5GiB', '500MB', 1048576 -> bytes (a fraction of a byte rounded down);
    a clear ValueError otherwise. Exact arithmetic: no float rounding or overflow."""
    if isinstance(value, bool):
        raise ValueError(f"{what}={value!r} is not a size")
    if isinstance(value, int):
        n = value
    else:
        m = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*", str(value), re.ASCII)
        unit = m.group(2).lower() if m else None
        if not m or unit not in _UNITS:
            raise ValueError(f"{what}={value!r} is not a size (examples: 256MiB, 1GiB, 500MB)")
        n = int(Fraction(m.group(1)) * _UNITS[unit])
    if n <= 0:
        raise ValueError(f"{what}={value!r} must be positive")
    if n >= 1 << 63:  # a segment's size is an int64 header word
        raise ValueError(f"{what}={value!r} is more than any machine holds (the limit is 2**63-1 bytes)")
    return n


def topic_id_text(msb: int, lsb: int) -> str:
    """A Kafka topic id from its two 64-bit halves (signed, as the words hold them) as Kafka's
    tools write it: URL-safe base64 of its 16 bytes, unpadded; "" for 0, 0 (unknown)."""
    if msb == 0 and lsb == 0:
        return ""
    raw = (msb & (1 << 64) - 1).to_bytes(8, "big") + (lsb & (1 << 64) - 1).to_bytes(8, "big")
    return base64.urlsafe_b64encode(raw).rstrip(b"=").decode()


def topic_id_words(text: str) -> tuple[int, int]:
    """topic_id_text's inverse: the two signed 64-bit halves ((0, 0) for ""); ValueError
    naming the text if it is not 16 bytes of base64."""
    if not text:
        return 0, 0
    try:
        raw = base64.urlsafe_b64decode(text.replace("+", "-").replace("/", "_") + "=" * (-len(text) % 4))
    except ValueError:
        raw = b""
    if len(raw) != 16:
        raise ValueError(f"topic id {text!r}: not the base64 of 16 bytes")
    return int.from_bytes(raw[:8], "big", signed=True), int.from_bytes(raw[8:], "big", signed=True)


def format_bytes(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")
