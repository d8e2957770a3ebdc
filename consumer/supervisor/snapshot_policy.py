"""The supervisor's snapshots (`shmcache run --snapshot-dir DIR`): restore at start,
snapshots while running and at a clean stop, and retention gaps.

- At start with no segment: the newest valid snapshot in DIR of this cache is
  restored (snapshots/restoring.py); one that is truncated, fails a checksum or is of
  another topic, format or key size is skipped with a log line naming its error and
  the next older one is tried; none valid means the topic is replayed from its start,
  as without snapshots. The restored control area holds the snapshot's offsets, so
  the supervisor resumes each partition from there (or from the group's committed
  offset if that is lower: re-applying is safe, skipping is not).
- While running: every `snapshot_interval` seconds once the cache was caught up, a
  snapshot is written by a thread (the copy kernel and the file writes release the
  GIL, so the supervisor's loop goes on) that runs at SCHED_IDLE and writes at most
  `snapshot_rate` bytes/s (snapshots/writing.py, lower_priority and SnapshotOut): the readers
  beside it keep their rate (bench/README.md, Snapshots). At a clean stop, after the
  workers drained and the final commit, one more, at full speed and priority (a stop
  is waited for). The `snapshot_keep` newest are kept. A snapshot that fails (disk
  full) is logged and counted; the previous ones stay.
- At a stop: a periodic snapshot being written is told to give up as the stop begins,
  before the drain (`stopping`; snapshots/writing.py write's cancel event, which its rate's
  pauses wait on): at the default rate a large cache's takes minutes, past stop_timeout
  and systemd's TimeoutStopSec. It stops within a chunk, removes its temporary file, is
  logged in one info line and not counted as a failure; the previous snapshots stay, and
  a clean stop's own snapshot, with the offsets final, replaces what it would have been.
  `at_stop` waits for its thread out of the stop's budget (consumer/supervisor/stop.py, at most
  SNAPSHOT_WAIT_S); one still running then (a write stuck on a hung disk) is logged, and
  the supervisor leaves the cache mapped (the thread reads it) to the process's exit,
  with no snapshot at this stop.
- Gaps: when a partition is assigned, the offset the table needs next (its applied
  offset, or 0 for a table without one) is compared with the topic's log start; if
  retention deleted messages the table never had, the partition is flagged in the
  segment (H_GAP_BITS, H_GAP_OFFSETS) and shown by status(), top and the metrics. Such
  a cache is caught up but not ready (ready promises the whole topic), unless the
  supervisor runs with `accept_gaps` (`run --accept-gaps`), the operator's word that
  it may serve the table as it is. Snapshots go on either way: they keep what it has.

The snapshot directory itself (its files, their order, the checks at the start, and
why it is reached through a descriptor) is consumer/supervisor/snapshot_dir.py's.
"""

from __future__ import annotations

import logging
import threading
import time
from pathlib import Path

from shmcache import snapshots
from shmcache.consumer.supervisor.snapshot_dir import check_dir, dir_path, files, next_path, scan, unfinished
from shmcache.engine import layout as L
from shmcache.engine import units
from shmcache.engine.control import layout as C
from shmcache.errors import SnapshotCancelled, SnapshotError

log = logging.getLogger("shmcache.snapshots")

RESTORE_STATES = C.RESTORE_STATE_NAMES


class _LogProgress:
    """A log line at most every few seconds with the rate so far."""

    def __init__(self, what: str, every: float = 5.0):
        self.what, self.every = what, every
        self.t0 = self.last = time.monotonic()

    def __call__(self, done: int, total: int, nbytes: int) -> None:
        now = time.monotonic()
        if now - self.last >= self.every:
            self.last = now
            log.info("%s: %d%% (%s, %s/s)", self.what, 100 * done // total, units.format_bytes(nbytes),
                     units.format_bytes(nbytes / max(now - self.t0, 1e-9)))


class SnapshotPolicy:
    """One supervisor's snapshots; every method is a no-op without a snapshot_dir,
    except the gap check and the wire format word, which every cache keeps."""

    def __init__(self, cfg, dir_fd: int | None = None):
        """`dir_fd`: check_dir's descriptor of cfg.snapshot_dir, if the caller checked it
        already (the supervisor, at its start); else it is checked and opened here."""
        self.cfg = cfg
        self.shown = cfg.snapshot_dir or ""  # the directory as the operator named it, for the log
        if self.shown and dir_fd is None:
            dir_fd = check_dir(self.shown)
        self.dir = dir_path(dir_fd) if self.shown else ""  # used for every file operation
        self.cache = None
        self._thread: threading.Thread | None = None
        self._cancel = threading.Event()  # set as the supervisor's stop begins: the periodic snapshot gives up
        self._next = 0.0
        self._was_ready = False

    # -- at start ------------------------------------------------------------------------

    def restore_at_start(self) -> dict | None:
        """No segment: create it from the newest valid snapshot (None if there is none)."""
        cfg = self.cfg
        if not self.dir:
            return None
        found, refused = scan(self.dir, cfg.name)
        for path, why in refused:
            log.warning("cache %r: not reading %s: %s (a snapshot directory's snapshots are this user's regular "
                        "files)", cfg.name, self.show(path), why)
        for path in found:
            log.info("cache %r: restoring from snapshot %s", cfg.name, self.show(path))
            try:
                # the snapshot's own size unless one was given: a default would shrink a larger table
                out = snapshots.restore(path, cfg.name, memory=cfg.memory or None, max_value=cfg.max_value,
                                       mode=0o600 if cfg.file_mode is None else cfg.file_mode,
                                       key_size=cfg.key_size, topic=cfg.topic, wire_format=cfg.format,
                                       progress=_LogProgress(f"restoring {path.name}"), own=True)
            except (SnapshotError, OSError) as e:  # OSError: gone since listed, unreadable, a disk error
                log.warning("cache %r: skipping snapshot %s: %s: %s", cfg.name, self.show(path), type(e).__name__, e)
                continue
            out["snapshot"]["path"] = str(self.show(path))
            log.info("cache %r: restored %d entries from %s (%s, %.2f s, %d evicted); taken %.0f s ago; resuming "
                     "from its offsets %s", cfg.name, out["entries"], self.show(path), out["mode"], out["seconds"],
                     out["evictions"], (time.time_ns() - out["snapshot"]["taken_ns"]) / 1e9,
                     out["snapshot"]["offsets"])
            if out["evictions"]:
                log.warning("cache %r: the restore evicted %d of the snapshot's %d entries: memory=%s holds less "
                            "than the snapshot's %s, and the partitions resume after the offsets they came from, so "
                            "they are not fetched again (restore at the snapshot's size: leave memory unset)",
                            cfg.name, out["evictions"], out["snapshot"]["entries"], cfg.memory,
                            units.format_bytes(out["snapshot"]["memory"]))
            return out
        log.info("cache %r: no valid snapshot in %s; filling it from the topic's start", cfg.name, self.shown)
        return None

    def opened(self, cache, restored: bool) -> None:
        """The supervisor has its cache: note the wire format and how the table began."""
        self.cache = cache
        ctl = cache.control
        ctl.set_wire_format(self.cfg.format)
        if self.dir and not restored and ctl.word(C.H_RESTORE_STATE) == C.RESTORE_NONE and not _entries(cache):
            ctl.no_valid_snapshot()
        self._next = time.monotonic() + self.cfg.snapshot_interval
        if self.dir:  # what a killed snapshot of this cache left (never read); none still being written
            for tmp in unfinished(self.dir, self.cfg.name):
                if snapshots.remove_if_abandoned(tmp):
                    log.info("removed %s, left by a snapshot that did not finish", self.show(tmp))

    # -- while running -------------------------------------------------------------------

    def tick(self, caught_up) -> None:
        """From the supervisor's loop: start a periodic snapshot when one is due.
        `caught_up()` says whether the cache is caught up: ready, or ready but for a retention
        gap (asked only when one is due)."""
        if not self.dir or self.cache is None or time.monotonic() < self._next or self._cancel.is_set():
            return
        if self._thread is not None and self._thread.is_alive():
            return
        self._next = time.monotonic() + self.cfg.snapshot_interval
        self._was_ready = self._was_ready or caught_up()
        if not self._was_ready:  # a snapshot of a table still filling would only push a better one out
            return
        self._thread = threading.Thread(target=self._periodic, name="shmcache-snapshot", daemon=True)
        self._thread.start()

    def writing(self) -> bool:
        """A periodic snapshot is being written now (its thread reads the cache)."""
        return self._thread is not None and self._thread.is_alive()

    def _periodic(self) -> None:
        how = snapshots.lower_priority()  # this thread only, and it ends with the snapshot
        log.debug("periodic snapshot thread at %s, %s", how,
                  f"{units.format_bytes(self.cfg.snapshot_rate_bytes)}/s" if self.cfg.snapshot_rate_bytes else "unlimited")
        self.take(rate=self.cfg.snapshot_rate_bytes, cancel=self._cancel)

    def stopping(self) -> None:
        """The supervisor's stop begins: a periodic snapshot being written gives up now (within
        a chunk; at once in its rate's pause), and no other starts. Returns at once."""
        self._cancel.set()

    def at_stop(self, clean: bool, wait: float) -> bool:
        """Before the cache closes: wait up to `wait` seconds (the stop's budget, consumer/supervisor/stop.py)
        for a periodic snapshot's thread, told to give up (stopping, done here too if it was not);
        then, after a clean stop (the workers drained, the offsets final), take one more, at full
        speed. False if the thread still runs after `wait` (a write stuck on a hung disk): it is
        logged, no snapshot is taken, and the caller must not close the cache, which the thread
        reads (it stays mapped until the process exits)."""
        self._cancel.set()
        if self._thread is not None:
            self._thread.join(wait)
            if self._thread.is_alive():
                log.warning("cache %r: the periodic snapshot did not give up within %.1f s of the stop (a write "
                            "stuck on the disk?); no snapshot at this stop, and the cache stays mapped until the "
                            "process exits (it stays in /dev/shm either way); the previous snapshots stay",
                            self.cfg.name, wait)
                return False
            self._thread = None
        if self.dir and clean and self.cache is not None and (self._was_ready or _entries(self.cache)):
            self.take()
        return True

    def take(self, rate: int = 0, cancel: threading.Event | None = None) -> Path | None:
        """One snapshot into DIR, the oldest beyond snapshot_keep removed; its path, or None
        if it failed: then it is logged and counted (H_SNAPSHOT_FAILURES), the previous
        ones stay, and nothing is raised (the periodic thread and a clean stop go on).
        `cancel` set (the supervisor stops) abandons it: None, one info line, not a failure."""
        cache = self.cache
        ctl = cache.control
        path = next_path(self.dir, self.cfg.name)
        t0 = time.monotonic()
        try:
            info = snapshots.write(cache, path, progress=_LogProgress(f"snapshot {path.name}"), rate=rate,
                                  cancel=cancel)
        except SnapshotCancelled:
            log.info("cache %r: periodic snapshot abandoned: the supervisor stops (%s not written, its temporary "
                     "file removed; the previous snapshots stay)", self.cfg.name, self.show(path))
            return None
        except (OSError, SnapshotError) as e:
            ctl.snapshot_failed()
            log.error("cache %r: snapshot to %s failed: %s (the previous snapshots stay)", self.cfg.name,
                      self.show(path), e)
            return None
        except Exception:  # noqa: BLE001 - a bug's error: counted and shown whole; the supervisor goes on
            ctl.snapshot_failed()
            log.exception("cache %r: snapshot to %s failed (the previous snapshots stay)", self.cfg.name,
                          self.show(path))
            return None
        took_ns = int((time.monotonic() - t0) * 1e9)
        for old in files(self.dir, self.cfg.name)[max(1, self.cfg.snapshot_keep):]:
            try:
                old.unlink()
                log.info("removed old snapshot %s (keeping %d)", self.show(old), self.cfg.snapshot_keep)
            except OSError as e:
                log.warning("could not remove old snapshot %s: %s", self.show(old), e)
        ctl.record_snapshot(info.taken_ns, info.bytes, took_ns)  # after: a status that counts it finds the old ones gone
        return self.show(path)

    def show(self, path) -> Path:
        """A file of the snapshot directory as the operator named the directory."""
        return Path(self.shown) / Path(path).name


def _entries(cache) -> int:
    return cache.stats()["entries"]


# -- gaps --------------------------------------------------------------------------------------


def note_start(cache, topic: str, partition: int, have: int, log_start: int) -> None:
    """A partition is assigned: flag it if retention deleted offsets the table never had
    (`have` is the table's next offset, -1 none: a new table needs the topic's offset 0)."""
    want = max(have, 0)
    if log_start <= want or not 0 <= partition < L.MAX_PARTITIONS:
        return
    cache.control.flag_gap(partition, log_start - want)
    log.warning("topic %r partition %d: offsets %d..%d were deleted by the topic's retention before this cache "
                "had them: the table lacks what they held (a gap; a snapshot taken before would have kept them); "
                "the cache is not ready unless the supervisor runs with --accept-gaps",
                topic, partition, want, log_start - 1)


def metric_families(st: dict, gauge, counter):
    """The metrics endpoint's snapshot, restore and gap samples (consumer/supervisor/metrics.py)."""
    rs, sn = st["restore"], st["snapshot"]
    yield gauge("restore_state", "How the table began: 0 no restore tried, 1 restoring, 2 restored from a "
                "snapshot, 3 no valid snapshot (filled from the topic).",
                {v: k for k, v in RESTORE_STATES.items()}.get(rs["state"], -1))
    yield gauge("restore_entries", "Entries the restore put in the table.", rs["entries"])
    yield gauge("restore_seconds", "How long the restore took.", rs["seconds"])
    if sn["age_s"] is not None:
        yield gauge("snapshot_age_seconds", "Seconds since the last snapshot of this cache was taken.", sn["age_s"])
    yield gauge("snapshot_bytes", "Size of the last snapshot file.", sn["bytes"])
    yield counter("snapshots", "Snapshots written.", sn["count"])
    yield counter("snapshot_failures", "Snapshots that failed (the previous ones stay).", sn["failures"])
    yield gauge("partition_gap", "1 when retention deleted offsets of the partition before this table had them.",
                None, ["partition"], [((p,), 1) for p in st["gap_partitions"]])
    yield gauge("gap_offsets", "Offsets deleted by retention before this table had them, summed.", st["gap_offsets"])
    yield gauge("gaps_accepted", "1 when the supervisor serves a table with gaps as ready (run --accept-gaps).",
                int(st["gaps_accepted"]))


def warning_lines(st: dict) -> list[str]:
    """What status and top say in red about gaps."""
    if not st.get("gap_partitions"):
        return []
    served = ("served as it is (--accept-gaps)" if st.get("gaps_accepted")
              else "not ready until a supervisor runs with --accept-gaps")
    return [f"retention gap: the topic deleted {st['gap_offsets']:,} offsets of partitions "
            f"{st['gap_partitions'][:32]} before this cache had them; the table lacks what they held; {served}"]


def summary_rows(st: dict) -> list[tuple[str, str, str]]:
    """(what, value, "") rows about the restore and the last snapshot, for status and top."""
    rs, sn = st["restore"], st["snapshot"]
    rows = []
    if rs["state"] != "none":
        age = "" if rs["snapshot_age_s"] is None else f", snapshot {rs['snapshot_age_s']:.0f} s old"
        evicted = f", {rs['evictions']:,} evicted (a smaller table)" if rs.get("evictions") else ""
        rows.append(("restore", f"{rs['state']}: {rs['entries']:,} entries in {rs['seconds']:.2f} s{evicted}{age}"
                     if rs["state"] == "restored" else rs["state"], ""))
    if sn["count"] or sn["age_s"] is not None:
        age = "-" if sn["age_s"] is None else f"{sn['age_s']:.0f} s ago"
        rows.append(("last snapshot", f"{age}, {units.format_bytes(sn['bytes'])} in {sn['seconds']:.2f} s", ""))
    if sn["failures"]:
        rows.append(("snapshot failures", f"{sn['failures']:,}", ""))
    return rows
