"""An online resize, the supervisor's side: `shmcache resize NAME --memory SIZE` asks for it in
the cache's header (engine/resizing.py), the supervisor's loop takes the ask and does it.

The steps, each with the promise it keeps:

1. Checks: every worker up, no snapshot being written, a size other than the cache's
   own, and room beside the cache for the new segment (in /dev/shm, and in this
   process's memory limit); else refused, nothing changed.
2. The new segment, made at its hidden name (engine/resizing.py create_beside), before
   anything pauses: its pages are zeroed while the workers still apply.
3. Hold: each worker finishes its batch and applies nothing more (it keeps beating and
   fetching into librdkafka's queue): the old segment stops changing. Readers read it as
   before; readiness stays (the workers are up and beating).
4. Copy: every live entry (snapshots/copying.py), each bucket's oldest first, then the
   control area (the offsets applied, committed, the readiness flags and targets, the
   counters; engine/control/area.py copy_from); this supervisor takes its word there.
   A copy that would evict an entry (a shrink below what the entries need) is refused:
   a resize never loses a live entry. The new segment is thrown away, the workers resume.
5. Switch: each worker maps the new segment and claims its row there (its owner lock),
   still holding. The old segment is still the one at the name.
6. Swap: rename(2) of the new segment over the name: an attacher finds the old cache or
   the new, each whole. This handle becomes the new one's (engine/writer.py take_over),
   so the commits, watermarks, metrics and snapshots carry on over it.
7. Resume: the workers apply into the new segment from where they were. No message was
   fetched twice or skipped (their Kafka consumers never moved), and the commits, which
   are of what the rows say was applied, never ran ahead of it.

A supervisor killed (SIGKILL) before step 6 leaves the old cache at the name, whole, and
its half at the hidden name, which its next start removes (startup); after step 6 the new
one, whole; its workers, orphaned, exit either way, and a restart goes on from the
offsets in the cache at the name. A worker that does not hold or switch within
drain_timeout is killed, the resize given up, and it restarts on the old segment from
what that holds.
"""

from __future__ import annotations

import logging
import threading
import time

from shmcache.engine import resizing
from shmcache.engine.resizing import RETIRE_S
from shmcache.engine import units
from shmcache.errors import ShmcacheError
from shmcache.ipc.segment import identity
from shmcache.snapshots.copying import copy_entries
from shmcache.consumer.supervisor.worker_handle import WorkerState, request_all

log = logging.getLogger("shmcache.supervisor")


GROW_LOOK_S = 5.0  # between two looks at the evictions, with memory_max set
GROW_RETRY_S = 60.0  # after a growth that was refused (no room), before the next try


class Refused(Exception):
    """The resize cannot be done: its words go back to the command that asked."""


class Resizer:
    def __init__(self, sup):
        self.sup = sup  # consumer/supervisor/policy.py Supervisor: its cache, workers, snapshots, config
        self.retired = None  # the segment the last resize replaced, kept mapped RETIRE_S
        self.retire_at = 0.0
        self.grow_next = 0.0  # monotonic time of the next look at the evictions (memory_max)
        self.seen: tuple[float, int] | None = None  # (monotonic time, evictions) at the last look

    def tick(self) -> None:
        """From the supervisor's loop: do the resize asked for, if one is; beat in a retired
        segment, closed RETIRE_S after its swap (an ask waits until then)."""
        if self.retired is not None:
            if time.monotonic() < self.retire_at:
                self.retired.control.beat()
                return  # an ask waits until it is closed
            self.close()
        sup = self.sup
        ctl = sup.cache.control
        asked = ctl.resize_asked()
        if asked and ctl.take_resize(asked):
            why = self._try(asked)
            if why:
                log.warning("cache %r: resize to %s refused: %s", sup.cfg.name, units.format_bytes(asked), why)
                sup.cache.control.resize_refused(why)
            return
        grow = self._grow_due()
        if grow:
            why = self._try(grow)
            if why:
                log.warning("cache %r: could not grow to %s: %s; trying again in %.0f s", sup.cfg.name,
                            units.format_bytes(grow), why, GROW_RETRY_S)
                self.grow_next = time.monotonic() + GROW_RETRY_S

    def _try(self, nbytes: int) -> str:
        """Resize to `nbytes`; "" if done, else why not. An error of the resize's own (a damaged
        segment, a full disk) gives it up, logged with its traceback: the supervisor goes on
        serving the cache at the name, which is whole either way."""
        try:
            self.resize(nbytes)
            return ""
        except Refused as e:
            return str(e)
        except Exception as e:  # noqa: BLE001 - said, and the supervisor goes on
            log.exception("cache %r: the resize to %s failed", self.sup.cfg.name, units.format_bytes(nbytes))
            return f"it failed: {type(e).__name__}: {e}"

    def _grow_due(self) -> int:
        """With memory_max: the memory to grow to now, else 0. The rule: an entry is evicted
        about live entries / evictions a second after it was written (each bucket evicts its
        oldest first); when that is less than grow_below, the cache grows to twice its size,
        at most memory_max. Looked at every GROW_LOOK_S, over the time since the last look."""
        cfg, cache = self.sup.cfg, self.sup.cache
        ceiling = cfg.memory_max_bytes
        now = time.monotonic()
        if not ceiling or now < self.grow_next:
            return 0
        self.grow_next = now + GROW_LOOK_S
        st = cache.stats()
        was, self.seen = self.seen, (now, st["evictions"])
        if was is None or st["evictions"] <= was[1]:  # none since (or a new segment's count, from 0)
            return 0
        lifetime = st["entries"] / ((st["evictions"] - was[1]) / (now - was[0]))
        size = cache.geometry.size
        target = min(2 * size, ceiling)
        if lifetime >= cfg.grow_below or resizing.plan(cache, target).size <= size:
            return 0
        log.info("cache %r: entries are evicted %.0f s after they are written, under grow_below (%g s): growing "
                 "from %s to %s (memory_max %s)", cfg.name, lifetime, cfg.grow_below, units.format_bytes(size),
                 units.format_bytes(target), units.format_bytes(ceiling))
        return target

    def close(self) -> None:
        """Unmap the retired segment, if one is kept (its file went with the swap's rename)."""
        if self.retired is not None:
            self.retired.close()
            self.retired = None

    def resize(self, nbytes: int) -> None:
        sup = self.sup
        cache = sup.cache
        name = sup.cfg.name
        t0 = time.monotonic()
        try:
            geo = resizing.plan(cache, nbytes)
        except ShmcacheError as e:
            raise Refused(str(e)) from None
        old_size = cache.geometry.size
        if geo.size == old_size:
            raise Refused(f"the cache is {units.format_bytes(old_size)} already")
        down = [f"worker {w.index} is {w.state.value}" for w in sup.workers if w.state is not WorkerState.UP]
        if down:
            raise Refused(f"{', '.join(down)}: a resize moves every worker; ask again once all are up")
        if sup.snapshots.writing():
            raise Refused("a snapshot is being written: ask again once it is done")
        try:
            new = self._make(cache, geo)
        except (ShmcacheError, OSError) as e:
            raise Refused(str(e)) from None
        log.info("cache %r: resizing from %s to %s: the new segment is made; holding the workers", name,
                 units.format_bytes(old_size), units.format_bytes(geo.size))
        try:
            self._move(new, old_size, t0)
        except BaseException:
            new.close()
            resizing.remove_leftover(name)
            raise

    @staticmethod
    def _make(cache, geo):
        """resizing.create_beside in a thread of its own, the loop's heartbeat going on meanwhile:
        zeroing the pages of a 4 GiB segment took 9 s here, near the 10 s after which a
        supervisor that does not beat is stale (and the cache not ready)."""
        out: dict = {}

        def make():
            try:
                out["new"] = resizing.create_beside(cache, geo)
            except BaseException as e:  # noqa: BLE001 - raised in the loop's thread below
                out["error"] = e

        t = threading.Thread(target=make, name="shmcache-resize-make", daemon=True)
        t.start()
        while t.is_alive():
            t.join(0.5)
            cache.control.beat()
        if "error" in out:
            raise out["error"]
        return out["new"]

    def _move(self, new, old_size: int, t0: float) -> None:
        sup = self.sup
        cache, name, timeout = sup.cache, sup.cfg.name, sup.cfg.drain_timeout
        held_at = time.monotonic()
        if not self._ask_all(("hold",), "held", timeout):
            self._resume()
            raise Refused(f"a worker did not pause within {timeout:g} s (drain_timeout); it was killed and "
                          "restarts; ask again")
        try:
            copied = copy_entries(cache, new, progress=lambda done, all_: cache.control.beat())
            if copied["evictions"]:
                live = cache.stats()["entries"]
                raise Refused(f"a cache of {units.format_bytes(new.geometry.size)} holds {copied['entries']:,} of "
                              f"its {live:,} live entries (its rings are smaller, and a resize never evicts a live "
                              "entry): ask for more")
            new.control.copy_from(cache.control)
            new.control.claim_supervisor()
            new.control.beat()
        except BaseException:
            self._resume()
            raise
        if not self._ask_all(("switch",), "switched", timeout):
            # some workers map the new segment, others the old: every one is killed and
            # restarts on the old segment, which holds everything applied
            self._kill_all("did not move to the resized segment")
            raise Refused(f"a worker did not move to the new segment within {timeout:g} s (drain_timeout); the "
                          "workers restart on the old one; ask again")
        # what the command reads once the name holds the new segment: written before it does
        new.control.resized(old_size, int((time.monotonic() - held_at) * 1e9), int(copied["seconds"] * 1e9),
                            copied["entries"])
        try:
            resizing.swap(new, sup.segment_id)
        except (ShmcacheError, OSError) as e:
            self._kill_all("was on a resized segment that never reached the name")
            raise Refused(str(e)) from None
        self.retired = cache.take_over(new)  # the old segment, still mapped: see RETIRE_S
        self.retire_at = time.monotonic() + RETIRE_S
        sup.segment_id = identity(name)
        self._resume()
        pause = time.monotonic() - held_at
        cache.control.set_resize_pause(int(pause * 1e9))
        self.seen = (time.monotonic(), 0)  # the new segment counts its evictions from 0, from now
        log.info("cache %r: resized from %s to %s in %.2f s: %d entries copied in %.2f s, the workers paused "
                 "%.2f s", name, units.format_bytes(old_size), units.format_bytes(cache.geometry.size),
                 time.monotonic() - t0, copied["entries"], copied["seconds"], pause)

    def _ask_all(self, cmd: tuple, reply: str, timeout: float) -> bool:
        """Every worker told `cmd` and answered `reply` within `timeout`; those that did not are
        killed (they restart from what the cache at the name holds)."""
        workers = self.sup.workers
        answers = request_all([(w, cmd) for w in workers], reply, timeout)
        late = [w for w, a in zip(workers, answers) if a is None]
        for w in late:
            w.kill_unanswered(f"a resize's {cmd[0]!r}", timeout)
        return not late

    def _resume(self) -> None:
        for w in self.sup.workers:
            w.tell(("resume",))
        self.sup.watermarks.paused()  # held on purpose: what they did before says nothing of a stalled fetch

    def _kill_all(self, why: str) -> None:
        for w in self.sup.workers:
            w.kill_unanswered(f"a resize's switch ({why})", self.sup.cfg.drain_timeout)
