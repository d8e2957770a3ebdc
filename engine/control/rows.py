"""The control area's rows, written through their owners: a worker's row (WorkerRow) and
the partition rows (PartitionRows) of a Writer's mapping (engine/control/area.py ControlArea:
`control.worker_row(i)`, `control.partition_rows`). Nothing outside engine/ writes the
K_* and P_* words (engine/control/layout.py) but through these methods.

Who writes which word (one writer per word at a time, so no locks are needed):
- a worker's row: that worker (its claim, heartbeat and counters); the supervisor its
  start count;
- a partition's row: the supervisor assigns it (start, readiness target, latest
  watermark, caught-up flag, committed offset and generation (one word), owner, assigned
  flag),
  releases it, records commits, and raises the readiness target and sets or clears the
  caught-up flag while no live worker can be trusted with them (consumer/supervisor/watermarks.py);
  the owning worker, while the row's generation is the one it was assigned with,
  publishes its applied offset (and the Kafka time of the last message applied), latest
  watermark and caught-up flag after each batch,
  and starts the partition over when its log was replaced (consumer/worker/log_replaced.py).

Values are published with plain aligned 8-byte stores, which x86 makes atomic, in the
order each method gives; readers (engine/control/status.py) read the partition rows
before the worker rows, so a worker counts a batch's entries before it publishes the
offsets after it. A method call costs the same stores the words did: the worker makes
a few per batch, none per entry.
"""

from __future__ import annotations

import time

import numpy as np

from shmcache.engine.control import layout as C

_LOW = (1 << C.COMMITTED_BITS) - 1


def committed_of(word: int) -> int:
    """The committed offset P_COMMITTED's word holds; -1 none."""
    return (int(word) & _LOW) - 1


def generation_of(word: int) -> int:
    """The assignment's generation P_COMMITTED's word holds."""
    return (int(word) >> C.COMMITTED_BITS) % C.GENERATION_MOD


def _packed(generation: int, committed: int) -> int:
    low = committed + 1 if 0 <= committed + 1 <= _LOW else 0  # past 2**48 - 2: shown as none
    return (generation % C.GENERATION_MOD) << C.COMMITTED_BITS | low


class WorkerRow:
    """Worker i's row (K_*), a view of the mapping: drop it before the handle closes.
    `owners` judges and holds its owner word, word `index` of the file (engine/owners.py)."""

    __slots__ = ("_r", "_owners", "_index")

    def __init__(self, row: np.ndarray, owners, index: int):
        self._r = row
        self._owners = owners
        self._index = index

    @property
    def owner(self) -> int:
        """The owner word of the worker process in the row, 0 if none."""
        return int(self._r[C.K_OWNER])

    @property
    def heartbeat(self) -> int:
        """The worker's last beat, on the age clock; 0 never."""
        return int(self._r[C.K_HEARTBEAT])

    def claim(self, owner_word: int) -> None:
        """This process is the worker of the row: a beat first, so a row that names a process
        is never seen stale, then its owner lock and word. The supervisor gave the row to this
        process alone, and saw its last holder gone: a live holder is a bug, raised."""
        self._r[C.K_HEARTBEAT] = time.monotonic_ns()
        if not self._owners.claim(self._r, C.K_OWNER, self._index, owner_word):
            raise RuntimeError(f"worker row (file word {self._index}) is held by live process word "
                               f"{int(self._r[C.K_OWNER]):#x}")

    def beat(self) -> None:
        """The worker is alive (its loop went round, or it waits for a live writer's lock)."""
        self._r[C.K_HEARTBEAT] = time.monotonic_ns()

    def release(self) -> None:
        """The worker exits: the row names no process (its counters stay), and its lock goes."""
        self._owners.release(self._r, C.K_OWNER, self._index, int(self._r[C.K_OWNER]))

    def count_messages(self, n: int) -> None:
        """`n` Kafka messages were applied."""
        self._r[C.K_MESSAGES] += n

    def count_entries(self, adds: int, deletes: int) -> None:
        """A batch's entries were applied, by action."""
        self._r[C.K_DELETES] += deletes
        self._r[C.K_ADDS] += adds

    def count_malformed(self, n: int = 1) -> None:
        """`n` messages had damage (their valid prefix was applied) or were skipped."""
        self._r[C.K_MALFORMED] += n

    def count_unknown(self, n: int) -> None:
        """`n` entries of an unknown action were skipped."""
        self._r[C.K_UNKNOWN] += n

    def count_start(self) -> None:
        """The supervisor (re)started the worker of this slot."""
        self._r[C.K_STARTS] += 1


class PartitionRows:
    """The partition rows (P_*) of a Writer's mapping, by partition number."""

    __slots__ = ("_rows",)

    def __init__(self, rows: np.ndarray):
        self._rows = rows  # (MAX_PARTITIONS, ROW_WORDS) int64

    def detach(self) -> None:
        """Drop the view of the mapping (the handle closes)."""
        self._rows = None

    # -- reads ----------------------------------------------------------------------------

    def applied(self, p: int) -> int:
        """The next offset to apply of partition p: every message before it is in the table; -1 none."""
        return int(self._rows[p, C.P_APPLIED])

    def generation(self, p: int) -> int:
        """The generation of partition p's current assignment."""
        return generation_of(self._rows[p, C.P_COMMITTED])

    def committed(self, p: int) -> int:
        """The last offset the supervisor committed of partition p; -1 none."""
        return committed_of(self._rows[p, C.P_COMMITTED])

    def caught_up(self, p: int) -> bool:
        return bool(self._rows[p, C.P_CAUGHT_UP])

    def high_watermark(self, p: int) -> int:
        """Partition p's readiness target; -1 unknown."""
        return int(self._rows[p, C.P_HIGH_WATERMARK])

    def latest(self, p: int) -> int:
        """The newest high watermark partition p's fetches (or the supervisor's looks) saw; -1 none."""
        return int(self._rows[p, C.P_LATEST])

    def uncommitted(self, parts) -> list[tuple[int, int]]:
        """(partition, applied offset) of each of `parts` whose applied offset is not the last committed."""
        rows = self._rows
        return [(p, int(rows[p, C.P_APPLIED])) for p in parts
                if rows[p, C.P_APPLIED] >= 0 and rows[p, C.P_APPLIED] != self.committed(p)]

    # -- the supervisor's writes --------------------------------------------------------------

    def reset(self) -> None:
        """A new topic for this segment: no progress, no target, nothing committed or seen."""
        rows = self._rows
        rows[:] = 0  # nothing committed, generation 0, no applied time
        rows[:, [C.P_APPLIED, C.P_HIGH_WATERMARK, C.P_LATEST]] = -1

    def disown_all(self) -> None:
        """A supervisor starts: nothing the last one assigned is assigned now (DESIGN invariant 10).

        Only the applied offsets stay (they say what the table holds). The generation moves on,
        so a worker of a dead supervisor that is still finishing a batch publishes nothing more,
        and the readiness target is unknown until this supervisor assigns the partition again."""
        rows = self._rows
        rows[:, [C.P_ASSIGNED, C.P_OWNER, C.P_CAUGHT_UP]] = 0
        rows[:, C.P_HIGH_WATERMARK] = -1
        for p in range(len(rows)):
            self._bump(p)

    def assign(self, p: int, start: int, high_watermark: int, committed: int, worker: int) -> int:
        """Publish partition p's assignment to worker index `worker`, from offset `start`, with the
        broker's high watermark as its readiness target and its group's committed offset (-1
        none); caught up if it starts there. Returns the assignment's new generation; the
        assigned flag is written last."""
        row = self._rows[p]
        row[C.P_APPLIED] = start
        row[C.P_HIGH_WATERMARK] = high_watermark
        row[C.P_LATEST] = high_watermark
        row[C.P_CAUGHT_UP] = int(start >= high_watermark)
        row[C.P_COMMITTED] = _packed(self.generation(p) + 1, committed)
        row[C.P_OWNER] = worker + 1
        row[C.P_ASSIGNED] = 1
        return self.generation(p)

    def reassign(self, p: int) -> tuple[int, int]:
        """Partition p goes to its restarted worker again: a new generation. Returns (applied
        offset, generation), where the worker starts and what it is assigned with."""
        self._bump(p)
        return int(self._rows[p, C.P_APPLIED]), self.generation(p)

    def release(self, p: int) -> None:
        """Partition p left this node (revoked or lost): not assigned, no owner, not caught up."""
        row = self._rows[p]
        row[C.P_ASSIGNED] = 0
        row[C.P_OWNER] = 0
        row[C.P_CAUGHT_UP] = 0

    def unassign(self, p: int) -> None:
        """The supervisor stops: partition p is not assigned here any more, and has no owner."""
        row = self._rows[p]
        row[C.P_ASSIGNED] = 0
        row[C.P_OWNER] = 0

    def restore_applied(self, offsets) -> None:
        """A restored snapshot's applied offsets, partition by partition: where a supervisor
        started on the restored cache resumes each partition."""
        self._rows[:len(offsets), C.P_APPLIED] = offsets
        self._rows[:, C.P_APPLIED_TIME] = 0  # unknown: a snapshot does not say

    def forget_applied(self) -> None:
        """The topic was re-created: no partition has anything of the new log applied."""
        self._rows[:, C.P_APPLIED] = -1
        self._rows[:, C.P_APPLIED_TIME] = 0

    def record_commit(self, p: int, offset: int) -> None:
        """Kafka accepted the commit of `offset` for partition p."""
        self._rows[p, C.P_COMMITTED] = _packed(self.generation(p), offset)

    def _bump(self, p: int) -> None:
        """A new generation of partition p's assignment (what it committed stays)."""
        w = self._rows[p, C.P_COMMITTED]
        self._rows[p, C.P_COMMITTED] = _packed(generation_of(w) + 1, committed_of(w))

    def clear_times(self) -> None:
        """A supervisor starts that keeps the applied times: none is known until a worker
        of its publishes one (an older supervisor kept its generations in that word)."""
        self._rows[:, C.P_APPLIED_TIME] = 0

    def worker_restarting(self, p: int) -> None:
        """Partition p's restarted worker is about to get it back: the readiness target is
        unknown until a look after the restart (the last known stays as the latest watermark),
        and it is not caught up."""
        row = self._rows[p]
        row[C.P_LATEST] = max(row[C.P_LATEST], row[C.P_HIGH_WATERMARK])
        row[C.P_HIGH_WATERMARK] = -1
        row[C.P_CAUGHT_UP] = 0

    def worker_lost(self, p: int) -> None:
        """Partition p's worker died: it is applied up to the end no more."""
        if self._rows[p, C.P_CAUGHT_UP]:
            self._rows[p, C.P_CAUGHT_UP] = 0

    def raise_target(self, p: int, high_watermark: int) -> None:
        """The supervisor's own look found partition p's high watermark: its readiness target
        rises to it (never falls)."""
        if high_watermark > self._rows[p, C.P_HIGH_WATERMARK]:
            self._rows[p, C.P_HIGH_WATERMARK] = high_watermark

    def confirm_caught_up(self, p: int) -> bool:
        """Set partition p caught up if its applied offset reached a known readiness target;
        True if it became caught up now."""
        row = self._rows[p]
        if not row[C.P_CAUGHT_UP] and 0 <= row[C.P_HIGH_WATERMARK] <= row[C.P_APPLIED]:
            row[C.P_CAUGHT_UP] = 1
            return True
        return False

    # -- the owning worker's writes -------------------------------------------------------------

    def publish(self, p: int, position: int, high_watermark: int, time_ms: int = 0) -> bool:
        """After a batch: partition p is applied up to `position` (every message before it is
        in the table; never moved back), the last of them with Kafka timestamp `time_ms` (0
        unknown), and its fetches saw `high_watermark` (-1 none: the latest watermark is then
        never below the applied offset). True if it became caught up now. The caller checked
        that the row's generation is its own."""
        row = self._rows[p]
        if position > row[C.P_APPLIED]:
            if time_ms > 0:
                row[C.P_APPLIED_TIME] = time_ms
            row[C.P_APPLIED] = position
        latest = max(high_watermark, int(row[C.P_APPLIED]))
        if latest > row[C.P_LATEST]:
            row[C.P_LATEST] = latest
        if 0 <= row[C.P_HIGH_WATERMARK] <= row[C.P_APPLIED] and not row[C.P_CAUGHT_UP]:
            row[C.P_CAUGHT_UP] = 1
            return True
        return False

    def start_over(self, p: int, start: int, high_watermark: int) -> None:
        """Partition p's log was replaced under its worker: it starts over at `start`, with the
        new log's high watermark as its target. Readers see it lagging (not caught up, the
        new target) before they see the lower applied offset."""
        row = self._rows[p]
        row[C.P_CAUGHT_UP] = 0
        row[C.P_HIGH_WATERMARK] = high_watermark
        row[C.P_LATEST] = high_watermark
        row[C.P_APPLIED_TIME] = 0
        row[C.P_APPLIED] = start
