"""The control area's words: how a cache is being kept filled from Kafka.

engine/layout.py is the table's contract (geometry, the writers' rows, buckets, records,
and the topic name and partition count that an attach checks). This module names the
rest of the segment's shared words, which the supervisor and its workers write through
engine/control/area.py and engine/control/rows.py alone (and a restore,
snapshots/restoring.py, its offsets and the restore words, through the same), and which
status(), `shmcache top`, the metrics endpoint and the Go and Java readers read:

- header words H_* (indices into the header's int64 words, in index order below);
- a row per worker, K_* (word index within the row of worker i, in layout's workers
  section: MAX_WORKERS rows of ROW_WORDS);
- a row per partition, P_* (word index within the row of partition p, in layout's
  partitions section: MAX_PARTITIONS rows of ROW_WORDS).

Every word is an int64; words that measure an age hold a time on the age clock (H_AGE_CLOCK).
docs/segment-format.md gives the words a reader needs; tests/engine/test_segment_spec.py
checks it against this module and engine/layout.py.
"""

from __future__ import annotations

import base64

from shmcache.engine.layout import MAX_WORKERS, WORD

# -- header words -----------------------------------------------------------------------
H_SUPERVISOR = 10  # owner word (ipc/liveness.py: pid << 32 | start stamp) of the supervisor, 0 if none
# word 11 is unused (reserved)
# words 12, 13 and 16..47 are the topic's length, partition count and name (engine/layout.py)
H_SUPERVISOR_HEARTBEAT = 14  # the supervisor's last loop, on the age clock (status: supervisor_heartbeat_age_s)
# The clock of the words that measure an age (K_HEARTBEAT, H_SUPERVISOR_HEARTBEAT, H_BROKER_SINCE,
# H_COMMIT_PENDING_SINCE, H_LOOKUP_FAILING_SINCE): AGE_CLOCK_MONOTONIC, CLOCK_MONOTONIC ns
# (time.monotonic_ns()), one clock for every process of the machine that a step of the wall
# clock does not move; AGE_CLOCK_WALL, time.time_ns(). Set when the segment is made and when a
# supervisor starts.
H_AGE_CLOCK = 15
AGE_CLOCK_WALL, AGE_CLOCK_MONOTONIC = 0, 1
# The supervisor's counters and facts: written by the supervisor only, zeroed when one starts
# (as the worker rows are).
H_COMMITS = 48  # offset commits Kafka accepted
H_COMMIT_FAILURES = 49  # commits Kafka refused or timed out (the offsets go again next time)
H_REBALANCES = 50  # completed rebalances: assign callbacks, one per group generation, even if empty
H_PARTITIONS_LOST = 51  # partitions lost: taken away without a revoke (nothing committed)
H_SUPERVISOR_STARTED = 52  # time.time_ns() when the current supervisor started
H_METRICS_PORT = 53  # TCP port of the supervisor's Prometheus endpoint, 0 if none
H_ASSIGNING = 54  # 1 while the supervisor publishes an assignment (rows half-written): not ready
H_WIRE_FORMAT = 55  # WIRE_FORMATS index + 1 of the topic's format, set by the supervisor; 0 unknown
# Append only: a segment's word and a snapshot's header keep what was written, so a name's
# place is for good (an older shmcache reads a later name's code as unknown, "")
WIRE_FORMATS = ("v1", "v2", "kv", "proto")
H_COMMIT_PENDING_SINCE = 56  # the supervisor's commit in flight was sent, on the age clock; 0 none
# 1 when the live supervisor was told to serve a table with retention gaps as ready
# (`run --accept-gaps`); written at its start, so it is the supervisor alive now that says so
H_ACCEPT_GAPS = 57
# The live supervisor's bound on a worker's heartbeat (`worker_heartbeat_timeout`, in ns; 0
# none): a worker whose heartbeat (K_HEARTBEAT) is older is stale, its partitions are not
# caught up, and the supervisor kills and restarts it. Written at the supervisor's start.
H_WORKER_STALE_NS = 58
H_STALE_KILLS = 59  # workers the supervisor killed for a stale heartbeat
# The broker's state as the supervisor sees it (kafka/broker.py), written by it alone.
H_BROKER_STATE = 60  # BROKER_* below
H_BROKER_SINCE = 61  # the current wait for the broker began, on the age clock; 0 when it answers
BROKER_UNKNOWN, BROKER_UP, BROKER_WAITING = 0, 1, 2
BROKER_STATE_NAMES = {BROKER_UNKNOWN: "connecting", BROKER_UP: "up", BROKER_WAITING: "waiting for the broker"}
H_START_KILLS = 62  # workers it killed for not coming up within its worker_start_timeout
# The owner word of the supervisor whose workers keep P_APPLIED_TIME, written at its start
# after it cleared those words: a reader trusts them only while this is H_SUPERVISOR's.
H_PARTITION_TIMES = 63
# An online resize (engine/resizing.py, consumer/supervisor/resizing.py). H_RESIZE_ASK is
# `shmcache resize`'s: the bytes it asks for, by a compare-and-swap from 0; the supervisor
# negates it when it takes the ask, and clears it when it refuses (its words in
# H_RESIZE_TEXT, H_RESIZE_ANSWERED counted up); a resize done is answered by the new
# segment at the name, which starts with no ask. The others are the supervisor's, carried
# from segment to segment: the last resize done and how many were.
H_RESIZE_ASK = 64
H_RESIZE_ANSWERED = 65  # refusals answered (the command waits for this to move)
H_RESIZES = 66  # resizes done, this cache's whole life
H_RESIZE_FROM = 67  # the segment's size before the last resize, bytes
H_RESIZE_AT_NS = 68  # time.time_ns() the last resize put its segment at the name
H_RESIZE_PAUSE_NS = 69  # how long the workers applied nothing during it
H_RESIZE_COPY_NS = 70  # how long its copy of the entries took
H_RESIZE_ENTRIES = 71  # entries it copied
H_RESIZE_TEXT_LEN = 72
H_RESIZE_TEXT = 73  # words 73..94: the last refusal's words, utf-8, cut to RESIZE_TEXT_MAX
RESIZE_TEXT_MAX = 22 * WORD
H_MEMORY_MAX = 95  # the live supervisor's ceiling for growing the cache by itself (`run --memory-max`), bytes; 0 none
# The consumer group as the supervisor last saw it (ControlArea.set_group): who else holds
# partitions of the topic. Written by the supervisor only; H_GROUP_CHECKED is -1 while it
# writes them and the time of the look after, so a reader can tell a torn read.
H_GROUP_MEMBERS = 96  # members of the group, this supervisor included; 0 unknown
H_GROUP_CHECKED = 97  # time.time_ns() of the last look; 0 none yet, -1 being written
H_COMMITS_DEFERRED = 98  # periodic commits refused during a rebalance, retried after it
H_GROUP_TEXT_LEN = 99
# A look-up of where assigned partitions start that fails (the group coordinator refuses or
# does not answer, or the broker is gone): when the first of the failing look-ups was made, on
# the age clock (0 none, -1 being written), and the last one's error, utf-8, cut to
# LOOKUP_TEXT_MAX.
H_LOOKUP_FAILING_SINCE = 100
H_LOOKUP_TEXT_LEN = 101
H_LOOKUP_TEXT = 104  # words 104..127
LOOKUP_TEXT_MAX = 24 * WORD
H_GROUP_TEXT = 128  # words 128..191: JSON list of the other members (client id, host, instance id)
GROUP_TEXT_MAX = 64 * WORD
# The supervisor's handle on each worker (consumer/supervisor/worker_handle.py): one word per worker
# slot, written by the supervisor alone: bits 0-7 the handle's state (index + 1 in
# WORKER_STATES, 0 none published), bits 8-23 its deaths in a row (capped), bits 24-63 the
# restart due while backing off, in tenths of a second since the epoch (0 none).
H_WORKER_HANDLES = 192  # words 192..255
WORKER_STATES = ("stopped", "starting", "up", "stopping", "backing-off")
H_ELSEWHERE = 256  # words 256..383: a byte per partition, i + 1 for the i-th other member holding it
assert H_WORKER_HANDLES + MAX_WORKERS <= H_ELSEWHERE
# Restores and snapshots (snapshots/restoring.py, consumer/supervisor/snapshot_policy.py). These describe the
# table's content, so they live as long as the segment (a supervisor's start does not zero them).
H_RESTORE_STATE = 400  # RESTORE_* below
RESTORE_NONE, RESTORE_RUNNING, RESTORE_DONE, RESTORE_NONE_VALID = 0, 1, 2, 3
RESTORE_STATE_NAMES = {RESTORE_NONE: "none", RESTORE_RUNNING: "restoring", RESTORE_DONE: "restored",
                       RESTORE_NONE_VALID: "no valid snapshot"}
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
# (consumer/supervisor/topic_id.py) and by a restore (the snapshot's). A topic deleted and re-created
# under its name gets a new id: offsets alone cannot tell a new log that already holds more
# messages than the table applied, its id can. topic_id_text and topic_id_words convert.
H_TOPIC_ID = 411  # words 411, 412
H_GAP_BITS = 448  # words 448..463: a bit per partition, set when that partition has a gap

# -- a worker's row (written by that worker, except K_STARTS) ---------------------------------
K_OWNER = 0  # owner word of the worker process, 0 if none
K_HEARTBEAT = 1  # the worker's last loop, on the age clock (H_AGE_CLOCK)
K_STARTS = 2  # how many times this worker slot was (re)started (written by the supervisor)
K_ADDS = 3  # entries applied, by action
K_DELETES = 4
K_MALFORMED = 5  # messages with damage (their valid prefix was applied)
K_UNKNOWN = 6  # entries skipped for an unknown action
K_MESSAGES = 7  # Kafka messages applied

# -- a partition's row (row = partition number) -------------------------------------------------
P_APPLIED = 0  # next offset to apply: every message before it is in the table; -1 none yet
# readiness target: the high watermark seen at assignment, raised by the supervisor's own looks
# while the worker is down, stale or restarted (consumer/supervisor/watermarks.py); -1 unknown
P_HIGH_WATERMARK = 1
P_OWNER = 2  # worker index + 1 that owns the partition now; 0 unowned
P_CAUGHT_UP = 3  # 1 once applied >= the readiness target
# What the supervisor alone writes of a partition besides its target, in one word (rows.py
# reads and writes it): the last offset it committed to Kafka, + 1 (0: none), in bits 0-47,
# and the generation of the partition's assignment in bits 48-62, bumped at each assignment
# (modulo 2**15) so that a stale worker's publish is told from a current one. Only the
# Python reader reads it (status's committed). An offset past 2**48 - 2 is shown as none.
P_COMMITTED = 4
COMMITTED_BITS = 48
GENERATION_MOD = 1 << 15
P_ASSIGNED = 5  # 1 while this node's consumer group assigns the partition here
# Kafka timestamp (ms since the epoch) of the last message applied, written by the owning
# worker with P_APPLIED; 0 unknown. Readers trust it only while H_PARTITION_TIMES names the
# live supervisor: an older supervisor wrote its generation here.
P_APPLIED_TIME = 6
P_LATEST = 7  # newest high watermark seen: by the supervisor at assignment, then by the owning worker's fetches


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
