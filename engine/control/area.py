"""The control area as a model: its words read (ControlView) and written (ControlArea).

The words are engine/control/layout.py's (and the topic's, engine/layout.py's): header
words H_* (topic, supervisor, its counters, the broker's state, the consumer group), a
row per worker (K_*) and a row per partition (P_*). Every handle has one:
`handle.control`, a ControlView (read-only on a Reader's PROT_READ mapping) or, on a
Writer, a ControlArea, which adds the writes the supervisor and the workers make.
Nothing else writes these words, and nothing writes one by its index: each write is a
method named for the fact it publishes.

    view.partitions    (MAX_PARTITIONS, ROW_WORDS) int64 rows, word P_* of partition p
    view.workers       (MAX_WORKERS, ROW_WORDS) int64 rows, word K_* of worker i
    view.topic, view.npartitions, view.supervisor, view.broker_state, view.counters()
    view.status(), view.wait_ready(timeout)
    area.partition_rows, area.worker_row(i)   the rows' writes (engine/control/rows.py)

Who writes what (one writer per word, so no locks are needed):
- the supervisor: topic and partition count, its own counters (commits, commit
  failures, rebalances, lost partitions, stale workers killed), start time,
  heartbeat, metrics port, wire format, the bound on a worker's heartbeat, the
  broker's state, the group words, its handles on the workers and its snapshots;
  its writes to the rows are engine/control/rows.py's;
- a restore (snapshots/restoring.py), on the cache it just created: the restore words,
  the topic, its id, the format and the applied offsets;
- the workers: their rows and their partitions' progress (engine/control/rows.py);
- both, by compare-and-swap: the retention-gap words (H_GAP_BITS, H_GAP_OFFSETS), set by
  the supervisor at assignment and by a worker whose fetch jumped past the log start.
Readers (status, wait_ready, metrics, top) only read. Values are published with
plain 8-byte stores, which x86 makes atomic for aligned words; a reader may see
one partition's row a moment older than another's. The segment is untrusted
(docs/design.md, invariant 8): a word out of its range is named in status's "damaged"
and read as nothing, never raised on. This module reads and writes the words;
engine/control/status.py assembles status() and wait_ready() from its readers.
"""

from __future__ import annotations

import json
import time

import numpy as np

from shmcache.engine import layout as L
from shmcache.engine import owners
from shmcache.engine.control import layout as C
from shmcache.engine.control import status as control_status
from shmcache.engine.control.rows import PartitionRows, WorkerRow
from shmcache.engine.control.status import NO_GROUP, STALE_HEARTBEAT_S
from shmcache.ipc.atomics import cas_word, load_word

__all__ = ["STALE_HEARTBEAT_S", "SUPERVISOR_COUNTERS", "ControlArea", "ControlView"]

SUPERVISOR_COUNTERS = {  # status() key -> header word
    "commits": C.H_COMMITS,
    "commit_failures": C.H_COMMIT_FAILURES,
    "commits_deferred": C.H_COMMITS_DEFERRED,
    "rebalances": C.H_REBALANCES,
    "partitions_lost": C.H_PARTITIONS_LOST,
    "stale_worker_kills": C.H_STALE_KILLS,
    "start_timeout_kills": C.H_START_KILLS,
}


class ControlView:
    """The control area of one mapped segment, read."""

    def __init__(self, name: str, header: np.ndarray, workers: np.ndarray, partitions: np.ndarray,
                 writers: np.ndarray, owners, intact=None):
        """owners: the judge of the segment's owner words (engine/owners.py Owners).
        intact(): raises if the mapping's words are no longer the segment's (its file was cut
        short under it: ipc/sigbus.py); called after each status(), so that neither status()
        nor wait_ready() reports, or waits on, the zero pages put in the file's place."""
        self.name = name
        self._h = header
        self._intact = intact
        self.workers = workers.reshape(L.MAX_WORKERS, L.ROW_WORDS)
        self.partitions = partitions.reshape(L.MAX_PARTITIONS, L.ROW_WORDS)
        self.writers = writers.reshape(L.MAX_WRITERS, L.ROW_WORDS)  # read for L.W_WAIT only
        self.owners = owners

    def release(self) -> None:
        """Drop the views of the mapping (the handle closes)."""
        self._h = self.workers = self.partitions = self.writers = self._intact = self.owners = None

    def word(self, h: int) -> int:
        """Header word h (an H_* index of engine/control/layout.py or engine/layout.py) as it stands."""
        return int(self._h[h])

    def _bytes(self, word: int, n: int) -> np.ndarray:
        return self._h.view(np.uint8)[word * L.WORD:word * L.WORD + n]

    def _text(self, len_word: int, word: int, most: int) -> str:
        """The text in the header's words from `word`, its length in `len_word` (the segment is
        untrusted: a length out of 0..`most` is cut to it)."""
        n = min(max(int(self._h[len_word]), 0), most)
        return self._bytes(word, n).tobytes().decode("utf-8", "replace")

    @property
    def topic(self) -> str:
        n = int(self._h[L.H_TOPIC_LEN])
        if not 0 <= n <= L.TOPIC_MAX:  # the segment is untrusted: a length out of range is no topic (format §14)
            return ""
        return self._bytes(L.H_TOPIC, n).tobytes().decode("utf-8", "replace")

    @property
    def topic_id(self) -> str:
        """The Kafka id of the topic whose offsets the table holds, as Kafka's tools write it
        (URL-safe base64 of its 16 bytes); "" unknown (a table filled by an earlier shmcache,
        or before the supervisor's first look)."""
        return C.topic_id_text(int(self._h[C.H_TOPIC_ID]), int(self._h[C.H_TOPIC_ID + 1]))

    @property
    def npartitions(self) -> int:
        """Partitions of the topic as the supervisor last saw it (0: not yet)."""
        return int(self._h[L.H_PARTITIONS])

    @property
    def supervisor(self) -> int:
        """The supervisor's owner word (ipc/liveness.py), 0 if none."""
        return int(self._h[C.H_SUPERVISOR])

    def supervisor_alive(self) -> bool:
        """The supervisor named by its word runs (engine/owners.py: in any PID namespace)."""
        return self.owners.alive(self.supervisor, C.H_SUPERVISOR)

    def worker_alive(self, i: int) -> bool:
        """The worker named by row i's owner word runs."""
        return self.owners.alive(int(self.workers[i, C.K_OWNER]), owners.worker_row_word(i))

    @property
    def broker_state(self) -> int:
        """C.BROKER_*: the broker's state as the supervisor sees it."""
        return int(self._h[C.H_BROKER_STATE])

    def counters(self) -> dict:
        """The supervisor's counters since it started (SUPERVISOR_COUNTERS)."""
        return {k: int(self._h[w]) for k, w in SUPERVISOR_COUNTERS.items()}

    def age_now_ns(self) -> int:
        """Now, on the clock of this segment's age words (C.H_AGE_CLOCK): CLOCK_MONOTONIC, or the
        wall clock for a segment an earlier shmcache's supervisor wrote them in."""
        if int(self._h[C.H_AGE_CLOCK]) == C.AGE_CLOCK_MONOTONIC:
            return time.monotonic_ns()
        return time.time_ns()

    def broker(self) -> dict:
        """The broker's state as status() shows it: "up", "connecting" or "waiting for the broker",
        and broker_waiting_s: a number while waiting, else None. The supervisor writes the two
        words one after the other (kafka/broker.py), so a look between its stores can see
        "waiting" with no start (0, or damage): that wait is reported as 0 s."""
        state = self.broker_state
        since = int(self._h[C.H_BROKER_SINCE])
        waiting = state == C.BROKER_WAITING
        return {
            "broker": C.BROKER_STATE_NAMES.get(state, "connecting"),
            "broker_waiting_s": (max(0.0, (self.age_now_ns() - since) / 1e9) if since > 0 else 0.0) if waiting else None,
        }

    def lookup_failure(self) -> dict:
        """A failing look-up of where assigned partitions start, as the supervisor published it:
        lookup_error (its text, "" none) and lookup_failing_s (since the first failed look,
        None none); a torn read (the supervisor writing) is retried, then read as none."""
        h = self._h
        for _ in range(5):
            since = int(h[C.H_LOOKUP_FAILING_SINCE])
            if since == 0:
                break
            said = self._text(C.H_LOOKUP_TEXT_LEN, C.H_LOOKUP_TEXT, C.LOOKUP_TEXT_MAX)
            if since > 0 and int(h[C.H_LOOKUP_FAILING_SINCE]) == since:
                return {"lookup_error": said,
                        "lookup_failing_s": max(0.0, (self.age_now_ns() - since) / 1e9)}
        return {"lookup_error": "", "lookup_failing_s": None}

    def resize(self) -> dict:
        """The online resizes of this cache (engine/resizing.py): how many were done, and the last
        one's sizes, time, pause and entries; `resize_asked` the bytes a resize asks for now
        (being done, or waiting for the supervisor), 0 none; `resize_refused` the last refusal's words."""
        h = self._h
        done = max(int(h[C.H_RESIZES]), 0)
        return {
            "resizes": done,
            "resize_asked": abs(int(h[C.H_RESIZE_ASK])),
            "last_resize": {
                "from": int(h[C.H_RESIZE_FROM]),
                "to": int(h[L.H_SIZE]),
                "at_s": int(h[C.H_RESIZE_AT_NS]) / 1e9,
                "pause_s": int(h[C.H_RESIZE_PAUSE_NS]) / 1e9,
                "copy_s": int(h[C.H_RESIZE_COPY_NS]) / 1e9,
                "entries": int(h[C.H_RESIZE_ENTRIES]),
            } if done else None,
            "resize_refused": self._text(C.H_RESIZE_TEXT_LEN, C.H_RESIZE_TEXT, C.RESIZE_TEXT_MAX),
            "memory_max": max(int(h[C.H_MEMORY_MAX]), 0),
        }

    def group(self, nparts: int, damaged: list[str]) -> dict:
        """The group words, read between two looks at their version; a torn read is retried."""
        h = self._h
        for _ in range(5):
            v = int(h[C.H_GROUP_CHECKED])
            if v <= 0:
                return dict(NO_GROUP)
            n = int(h[C.H_GROUP_TEXT_LEN])
            members = int(h[C.H_GROUP_MEMBERS])
            raw = self._bytes(C.H_GROUP_TEXT, C.GROUP_TEXT_MAX).tobytes()[:max(0, min(n, C.GROUP_TEXT_MAX))]
            where = self._bytes(C.H_ELSEWHERE, L.MAX_PARTITIONS)[:nparts].copy()
            if int(h[C.H_GROUP_CHECKED]) != v:
                continue
            try:
                others = json.loads(raw.decode()) if raw else []
                if not isinstance(others, list) or not all(isinstance(o, dict) for o in others):
                    raise ValueError("not a list of members")
            except ValueError as e:
                damaged.append(f"group members text ({e})")
                others = []
            if not 0 <= n <= C.GROUP_TEXT_MAX:
                damaged.append(f"group text length {n} (should be 0..{C.GROUP_TEXT_MAX})")
            others = [{k: str(o.get(k, "")) for k in ("client_id", "host", "instance_id")} for o in others]
            elsewhere = {int(p): int(where[p]) - 1 for p in np.flatnonzero(where)}
            unlisted = []
            for p, i in elsewhere.items():
                if i < len(others):
                    others[i].setdefault("partitions", []).append(p)
                else:
                    unlisted.append(p)
            for o in others:
                o.setdefault("partitions", [])
            if unlisted:
                others.append({"client_id": "?", "host": "?", "instance_id": "", "partitions": unlisted})
            return {"members": members if members > 0 else None, "others": others, "elsewhere": elsewhere,
                    "checked_s": v / 1e9}
        return dict(NO_GROUP)

    def worker_handle(self, i: int) -> tuple[str | None, int, float | None]:
        """Worker i as its supervisor's handle published it (C.H_WORKER_HANDLES): (state or
        None, deaths in a row, the restart due in unix seconds while backing off, else None)."""
        word = int(self._h[C.H_WORKER_HANDLES + i])
        code, failures, at = word & 0xFF, (word >> 8) & 0xFFFF, word >> 24
        state = C.WORKER_STATES[code - 1] if 1 <= code <= len(C.WORKER_STATES) else None
        return state, failures, at / 10 if at > 0 and state == "backing-off" else None

    def has_gap(self, partition: int) -> bool:
        """Retention deleted offsets of this partition before the table had them (C.H_GAP_BITS)."""
        if not 0 <= partition < L.MAX_PARTITIONS:
            return False
        return bool(int(self._h[C.H_GAP_BITS + partition // 64]) >> (partition % 64) & 1)

    def status(self) -> dict:
        """Readiness and progress, from shared memory alone (no broker round trip;
        engine/control/status.py assembles it)."""
        st = control_status.status(self)
        if self._intact is not None:
            self._intact()
        return st

    def wait_ready(self, timeout: float | None = None, poll: float = 0.05, max_lag: int | None = None,
                   max_behind: float | None = None) -> dict:
        """Block until every partition of the topic is assigned here and caught up (DESIGN invariants 7, 10)
        and, with a bound, none more than max_lag messages or max_behind seconds behind.

        Returns the status; raises CacheNotReadyError naming the lagging partitions on timeout."""
        return control_status.wait_ready(self, timeout, poll, max_lag, max_behind)


class ControlArea(ControlView):
    """The control area of a Writer's mapping: the view plus the writes of the supervisor
    and the workers, each named for what it publishes; the rows' writes are
    `partition_rows` and `worker_row(i)` (engine/control/rows.py). Each word has one
    writer: see the module's docstring."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.partition_rows = PartitionRows(self.partitions)

    def release(self) -> None:
        self.partition_rows.detach()
        super().release()

    def worker_row(self, i: int) -> WorkerRow:
        """Worker i's row (a view of the mapping: dropped before the handle closes)."""
        return WorkerRow(self.workers[i], self.owners, owners.worker_row_word(i))

    def clear_workers(self) -> None:
        """A supervisor starts: no worker rows (owners, heartbeats, counters) from the last one."""
        self.workers[:] = 0

    def beat(self) -> None:
        """The supervisor went round its loop (H_SUPERVISOR_HEARTBEAT)."""
        self._h[C.H_SUPERVISOR_HEARTBEAT] = time.monotonic_ns()

    def count(self, counter: str, n: int = 1) -> None:
        """Add `n` to one of the supervisor's counters, by its name in status()
        (SUPERVISOR_COUNTERS: "commits", "rebalances", ...; the supervisor is their only writer).
        KeyError for a name that is none of them."""
        self._h[SUPERVISOR_COUNTERS[counter]] += n

    def set_metrics_port(self, port: int) -> None:
        """The TCP port the supervisor's metrics endpoint serves on; 0: none (it stopped)."""
        self._h[C.H_METRICS_PORT] = port

    def set_wire_format(self, name: str) -> None:
        """The format of the topic the table is filled from (one of C.WIRE_FORMATS); "" or a
        name this shmcache does not know: unknown (0)."""
        self._h[C.H_WIRE_FORMAT] = C.WIRE_FORMATS.index(name) + 1 if name in C.WIRE_FORMATS else 0

    # -- the broker's state, as the supervisor sees it (kafka/broker.py) -------------------

    def broker_connecting(self) -> None:
        """No answer from the broker yet (a supervisor starts)."""
        self._h[C.H_BROKER_STATE] = C.BROKER_UNKNOWN
        self._h[C.H_BROKER_SINCE] = 0

    def broker_waiting(self, since_ns: int) -> None:
        """The broker does not answer, since `since_ns` (time.monotonic_ns(), the age clock):
        the start first, so a reader that sees the state waiting finds when it began."""
        self._h[C.H_BROKER_SINCE] = since_ns
        self._h[C.H_BROKER_STATE] = C.BROKER_WAITING

    def broker_up(self) -> None:
        """The broker answers."""
        self._h[C.H_BROKER_SINCE] = 0
        self._h[C.H_BROKER_STATE] = C.BROKER_UP

    # -- restores and snapshots (snapshots/, consumer/supervisor/snapshot_policy.py) -------

    def restore_started(self) -> None:
        """A restore fills this (new) cache from a snapshot: status says "restoring"."""
        self._h[C.H_RESTORE_STATE] = C.RESTORE_RUNNING

    def restore_done(self, entries: int, evictions: int, took_ns: int, taken_ns: int) -> None:
        """The restore put `entries` in the table (`evictions`: those a smaller table dropped),
        in `took_ns`, from a snapshot taken at `taken_ns` (time.time_ns()); the state last."""
        h = self._h
        h[C.H_RESTORE_ENTRIES] = entries
        h[C.H_RESTORE_EVICTIONS] = evictions
        h[C.H_RESTORE_NS] = took_ns
        h[C.H_RESTORE_TAKEN_NS] = taken_ns
        h[C.H_RESTORE_STATE] = C.RESTORE_DONE

    def no_valid_snapshot(self) -> None:
        """A supervisor with a snapshot directory found no snapshot it could restore: the
        table is filled from the topic's start (status: "no valid snapshot")."""
        self._h[C.H_RESTORE_STATE] = C.RESTORE_NONE_VALID

    def record_snapshot(self, taken_ns: int, nbytes: int, took_ns: int) -> None:
        """A snapshot of this cache was written: taken at `taken_ns` (time.time_ns()), `nbytes`
        long, in `took_ns`. The count last: a status that counts it finds its figures."""
        h = self._h
        h[C.H_SNAPSHOT_TAKEN_NS] = taken_ns
        h[C.H_SNAPSHOT_BYTES] = nbytes
        h[C.H_SNAPSHOT_NS] = took_ns
        h[C.H_SNAPSHOTS] += 1

    def snapshot_failed(self) -> None:
        """A snapshot of this cache could not be written (a full disk, ...)."""
        self._h[C.H_SNAPSHOT_FAILURES] += 1

    def claim_supervisor(self) -> int:
        """Make this process the cache's supervisor: its owner lock on the supervisor word,
        then a compare-and-swap from 0 or a dead owner's word (engine/owners.py): of two
        processes that try at once, in any PID namespace, one wins. Returns 0 when this
        process holds it, else the live owner word that holds it."""
        me = owners.my_word()
        while True:
            if self.owners.claim(self._h, C.H_SUPERVISOR, C.H_SUPERVISOR, me):
                self._h[C.H_AGE_CLOCK] = C.AGE_CLOCK_MONOTONIC
                self._h[C.H_SUPERVISOR_HEARTBEAT] = time.monotonic_ns()  # not the dead one's, stale
                return 0
            cur = int(load_word(self._h, C.H_SUPERVISOR))
            if cur and cur != me and self.supervisor_alive():
                return cur

    def release_supervisor(self) -> None:
        """This process is the supervisor no more (a word another holds is left alone)."""
        self.owners.release(self._h, C.H_SUPERVISOR, C.H_SUPERVISOR, owners.my_word())

    def set_topic(self, name: str, npartitions: int) -> None:
        raw = name.encode()
        if len(raw) > L.TOPIC_MAX:
            raise ValueError(f"topic name {name!r} is longer than {L.TOPIC_MAX} bytes")
        words = np.zeros(L.TOPIC_MAX // L.WORD, np.int64)
        words.view(np.uint8)[: len(raw)] = np.frombuffer(raw, np.uint8)
        h = self._h
        h[L.H_TOPIC:L.H_TOPIC + len(words)] = words
        h[L.H_TOPIC_LEN] = len(raw)
        h[L.H_PARTITIONS] = npartitions

    def set_topic_id(self, text: str) -> None:
        """The topic's Kafka id (as topic_id gives it; "" unknown)."""
        self._h[C.H_TOPIC_ID:C.H_TOPIC_ID + 2] = C.topic_id_words(text)

    def reset_supervisor(self, metrics_port: int = 0, accept_gaps: bool = False,
                         worker_stale_s: float = 0.0) -> None:
        """A supervisor starts: its counters count from zero (as the worker rows do), and
        whether it serves a table with retention gaps as ready, and how old a worker's
        heartbeat may be (0: no bound), are its own say."""
        h = self._h
        h[C.H_ACCEPT_GAPS] = int(accept_gaps)
        h[C.H_WORKER_STALE_NS] = max(0, int(worker_stale_s * 1e9))
        for word in SUPERVISOR_COUNTERS.values():
            h[word] = 0
        h[C.H_ASSIGNING] = 0  # a supervisor killed mid-assignment may have left it set
        h[C.H_COMMIT_PENDING_SINCE] = 0
        self.set_lookup_failure("", 0)
        self.set_group(0, [], {})
        h[C.H_WORKER_HANDLES:C.H_WORKER_HANDLES + L.MAX_WORKERS] = 0
        h[C.H_SUPERVISOR_STARTED] = time.time_ns()  # a time of day (status: supervisor_started_s)
        h[C.H_AGE_CLOCK] = C.AGE_CLOCK_MONOTONIC  # its workers' heartbeats and its own (time.monotonic_ns())
        h[C.H_SUPERVISOR_HEARTBEAT] = time.monotonic_ns()
        h[C.H_METRICS_PORT] = metrics_port

    def set_worker_handle(self, i: int, state: str, failures: int, restart_at_ns: int = 0) -> None:
        """Publish the supervisor's handle on worker i (see C.H_WORKER_HANDLES)."""
        at = max(0, restart_at_ns) // 100_000_000
        self._h[C.H_WORKER_HANDLES + i] = ((at << 24) | (min(max(failures, 0), 0xFFFF) << 8)
                                           | (C.WORKER_STATES.index(state) + 1))

    def flag_gap(self, partition: int, offsets: int, again: bool = False) -> bool:
        """Flag a retention gap of `offsets` offsets on a partition; False if it was flagged
        already, and then its offsets are counted only if `again` (a new gap, not the same one
        seen again). By compare-and-swap: the supervisor flags a gap at assignment and the
        owning worker one that opens while it fetches, each at any time."""
        if not 0 <= partition < L.MAX_PARTITIONS:
            return False
        word, bit = C.H_GAP_BITS + partition // 64, 1 << (partition % 64)
        while True:
            cur = int(load_word(self._h, word))
            bits = (cur & ((1 << 64) - 1)) | bit  # as unsigned
            first = bits != cur & ((1 << 64) - 1)
            new = bits - (1 << 64) if bits >> 63 else bits  # a signed int64 again
            if not first or cas_word(self._h, word, cur, new) == cur:
                break
        if first or again:
            while True:
                total = int(load_word(self._h, C.H_GAP_OFFSETS))
                if cas_word(self._h, C.H_GAP_OFFSETS, total, total + offsets) == total:
                    break
        return bool(first)

    def reset_partitions(self) -> None:
        """A new topic for this segment: forget progress made on another topic."""
        self.partition_rows.reset()

    def disown_partitions(self) -> None:
        """A supervisor starts: nothing the last one assigned is assigned now
        (PartitionRows.disown_all), and no applied time is known until one of its workers
        publishes it; then H_PARTITION_TIMES names this supervisor, the one that keeps them."""
        self.partition_rows.disown_all()
        self.partition_rows.clear_times()
        self._h[C.H_PARTITION_TIMES] = int(load_word(self._h, C.H_SUPERVISOR))

    def set_assigning(self, on: bool) -> None:
        """An assignment is being published (rows half-written) or no longer: not ready meanwhile."""
        self._h[C.H_ASSIGNING] = int(on)

    def set_commit_pending(self, since_ns: int) -> None:
        """The supervisor's commit in flight was sent at `since_ns` (the age clock); 0: none in flight."""
        self._h[C.H_COMMIT_PENDING_SINCE] = since_ns

    def set_lookup_failure(self, text: str, since_ns: int) -> None:
        """Publish a failing look-up (`text`, cut to fit at a character's boundary) failing
        since `since_ns` (time.monotonic_ns(), the age clock); since_ns 0: none fails."""
        h = self._h
        h[C.H_LOOKUP_FAILING_SINCE] = -1  # writing: a reader retries
        self._set_text(C.H_LOOKUP_TEXT_LEN, C.H_LOOKUP_TEXT, C.LOOKUP_TEXT_MAX, text if since_ns else "")
        h[C.H_LOOKUP_FAILING_SINCE] = since_ns

    def _set_text(self, len_word: int, word: int, most: int, text: str) -> None:
        """`text` in the header's words from `word`, cut to `most` bytes at a character's
        boundary, the rest of them zero, its length in `len_word`."""
        raw = text.encode()[:most].decode("utf-8", "ignore").encode()
        area = self._bytes(word, most)
        area[:] = 0
        area[:len(raw)] = np.frombuffer(raw, np.uint8)
        self._h[len_word] = len(raw)

    # -- an online resize (engine/resizing.py) ----------------------------------------------------

    def resize_asked(self) -> int:
        """The bytes `shmcache resize` asks for and no supervisor has taken yet; 0 none."""
        return max(int(load_word(self._h, C.H_RESIZE_ASK)), 0)

    def take_resize(self, nbytes: int) -> bool:
        """The supervisor takes the ask of `nbytes` (the word negated: being done); False if the
        command withdrew it meanwhile."""
        return int(cas_word(self._h, C.H_RESIZE_ASK, nbytes, -nbytes)) == nbytes

    def resize_refused(self, text: str) -> None:
        """The resize taken was refused, for `text` (cut to fit at a character's boundary): the
        words first, then the count the command waits on, then the ask cleared."""
        h = self._h
        self._set_text(C.H_RESIZE_TEXT_LEN, C.H_RESIZE_TEXT, C.RESIZE_TEXT_MAX, text)
        h[C.H_RESIZE_ANSWERED] += 1
        h[C.H_RESIZE_ASK] = 0

    def copy_from(self, other: "ControlView") -> None:
        """A resize's new segment takes every control word of the old one's (`other`): the
        topic, the supervisor's words and counters, the worker and partition rows, the writers'
        counters (not their owner words: each writer takes a row of its own here), the
        restore and snapshot words, the last resizes. Owner words keep their values; their
        owners take their owner locks on this file themselves (claim_supervisor, a worker's
        claim), before the swap. Not the geometry, the creation words, nor an ask."""
        h, o = self._h, other._h
        h[C.H_SUPERVISOR:L.H_OWNER_LOCKS] = o[C.H_SUPERVISOR:L.H_OWNER_LOCKS]
        h[L.H_OWNER_LOCKS + 1:] = o[L.H_OWNER_LOCKS + 1:]
        h[C.H_RESIZE_ASK] = 0
        self.workers[:] = other.workers
        self.partitions[:] = other.partitions
        held = self.writers[:, L.W_OWNER].copy()  # this segment's own writers (its maker's slot)
        self.writers[:] = other.writers
        self.writers[:, L.W_OWNER] = held
        self.writers[:, L.W_WAIT] = 0

    def resized(self, from_size: int, pause_ns: int, copy_ns: int, entries: int) -> None:
        """The resize that made this segment is done: it serves at the name."""
        h = self._h
        h[C.H_RESIZE_FROM] = from_size
        h[C.H_RESIZE_AT_NS] = time.time_ns()
        h[C.H_RESIZE_PAUSE_NS] = pause_ns
        h[C.H_RESIZE_COPY_NS] = copy_ns
        h[C.H_RESIZE_ENTRIES] = entries
        h[C.H_RESIZE_TEXT_LEN] = 0
        h[C.H_RESIZES] += 1

    def set_memory_max(self, nbytes: int) -> None:
        """The live supervisor grows the cache by itself up to `nbytes` (0: it does not)."""
        self._h[C.H_MEMORY_MAX] = nbytes

    def set_resize_pause(self, pause_ns: int) -> None:
        """The last resize's workers applied nothing for `pause_ns` in all (its swap to its resume)."""
        self._h[C.H_RESIZE_PAUSE_NS] = pause_ns

    def set_group(self, members: int, others: list[dict], elsewhere: dict[int, int]) -> None:
        """Publish the consumer group as the supervisor saw it: `members` in all (0 unknown),
        the other members (dicts of client_id, host, instance_id), and the partitions each
        holds ({partition: index in `others`}). Fits what does not fit: drops members from the
        end of the text (their partitions show as held by an unlisted member)."""
        h = self._h
        h[C.H_GROUP_CHECKED] = -1  # writing: a reader ignores what it reads now
        listed = list(others)
        raw = json.dumps(listed, separators=(",", ":")).encode()
        while len(raw) > C.GROUP_TEXT_MAX:
            listed.pop()
            raw = json.dumps(listed, separators=(",", ":")).encode()
        text = self._bytes(C.H_GROUP_TEXT, C.GROUP_TEXT_MAX)
        text[:] = 0
        text[:len(raw)] = np.frombuffer(raw, np.uint8)
        where = self._bytes(C.H_ELSEWHERE, L.MAX_PARTITIONS)
        where[:] = 0
        for p, i in elsewhere.items():
            if 0 <= p < L.MAX_PARTITIONS:
                where[p] = min(i, len(listed)) + 1  # len(listed): a member not in the text
        h[C.H_GROUP_TEXT_LEN] = len(raw)
        h[C.H_GROUP_MEMBERS] = members
        h[C.H_GROUP_CHECKED] = time.time_ns() if members else 0
