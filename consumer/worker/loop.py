"""A worker process's loop: fetch assigned partitions, decode, apply in order, publish offsets.

A worker is a plain Kafka consumer with `incremental_assign()` at the offsets the
supervisor gives it; it has no group membership and never commits. Each
`consume()` batch is decoded and applied inline (no queue or thread between the
fetch and the apply), then each partition's applied offset (the next offset to
apply) is published in the segment. Only after that may the supervisor commit it.
Beside it goes the partition's newest high watermark, which every fetch response
carries and librdkafka keeps (get_watermark_offsets(cached=True), no broker round
trip), so lag is current to the last fetch; never below the applied offset.
While the broker is away a worker keeps its partitions and librdkafka reconnects.

Flow control (`max_rate`): past its budget for the current second a worker
pauses all its partitions and resumes them when the next second starts.
Partitions assigned while paused are paused at once, and only partitions still
owned are resumed: a resume that forgets a partition, or a pause that outlives
its reason, stops that partition for good, with no error. librdkafka keeps a
partition's pause flag across unassign and a later assign, so a partition
dropped while paused is resumed before it is unassigned: otherwise it would
come back paused, after the resume that was due, and never be fetched again.

Commands from the supervisor arrive on a pipe between batches, so a revoke or a
stop always finds every fetched message applied:
    ("assign", [(partition, offset, generation), ...])  (no reply)
    ("revoke", [partition, ...])                        -> ("revoked", ({partition: applied}, paused))
    ("stop",)                                           -> ("stopped", {partition: applied})
    ("refetch", [partition, ...])                       (no reply)
    ("hold",)                                           -> ("held", {partition: applied})
    ("switch",)                                         -> ("switched", True)
    ("resume",)                                         (no reply)
An assignment has no reply: the supervisor does not wait for it (a worker still starting,
or hung, would hold its loop), and the pipe's order puts it before any later command.

A refetch comes when the supervisor saw partitions of this worker fetch nothing for a while
though the broker holds more (consumer/supervisor/watermarks.py: librdkafka 2.16's fetcher
can stay stuck after the broker restarts, with no error and the worker beating): the worker
closes its Kafka consumer and fetches every partition it owns through a new one, from the
offset its next message must have. Nothing is applied twice or skipped: the old consumer's
unapplied messages go with it.

An online resize (consumer/supervisor/resizing.py): "hold" makes the worker apply nothing
more once its batch is done (it goes on beating and reading its pipe; librdkafka goes on
fetching into its queue); "switch" moves it to the resize's new segment, at its hidden
name (engine/resizing.py), its row claimed there before the swap; "resume" lets it apply
again, into whatever segment it holds. Its Kafka consumer is untouched throughout.
"""

from __future__ import annotations

import logging
import os
import signal
import time

import numpy as np

from shmcache.kafka import client as kafka_client
from shmcache.consumer.worker import lock_wait, log_replaced
from shmcache.formats import registry as wire_formats
from shmcache.formats import wire, wire_batch
from shmcache.consumer.config import RunConfig
from shmcache.consumer.worker.profile import Profile
from shmcache.engine import resizing
from shmcache.engine.table import open_writer  # imported here: the fork server preloads it for every worker
from shmcache.ipc import heap, liveness

log = logging.getLogger("shmcache.worker")

# A worker that goes idle after a consume() batch of more than this many bytes gives back
# what the burst grew (Worker._idle): ~70 MiB a worker after a catch-up of 1,000,000 entries.
IDLE_RELEASE = 1 << 20


class Worker:
    def __init__(self, cfg: RunConfig, index: int, conn):
        self.cfg = cfg
        self.index = index
        self.conn = conn
        self.parent = os.getppid()  # the fork server, which lives while the supervisor or a worker does
        self.cache = open_writer(cfg.name)
        self.rows = self.cache.control.partition_rows
        self.me = self.cache.control.worker_row(index)
        self.cache.on_wait = lock_wait.LockWait(index, self.me, self.parent)  # beats while a live writer's lock holds it
        self.format = wire_formats.get(cfg.format)  # its decoder (formats/registry.py)
        self.scratch = wire_batch.Scratch()  # the bytes of the consume() batch being applied
        self.busy = False  # applied a batch since it last went idle (_idle)
        self._load_kernels()  # before the row says "up": a worker that shows up can apply at once
        self.me.claim(liveness.owner_word())
        self.consumer = self._consumer()
        self.owned: dict[int, int] = {}  # partition -> generation it was assigned with
        self.next: dict[int, int] = {}  # partition -> the offset its next message must have (consumer/worker/log_replaced.py)
        self.times: dict[int, int] = {}  # partition -> Kafka timestamp (ms) of the last message applied
        self.stopping = False
        self.held = False  # an online resize holds it: it applies nothing until told to resume
        self.retired = None  # (handle, row) of the segment a resize replaced, kept RETIRE_S after its resume
        self.retire_at = 0.0
        self.orphaned = False  # the supervisor died (its pipe closed, or the fork server died with it)
        self.paused_until = 0.0  # flow control: monotonic time to resume at, 0 if running
        self.window_start = time.monotonic()
        self.window_entries = 0
        self.prof = Profile()  # where the loop's time goes, logged at exit (consumer/worker/profile.py)

    def _consumer(self):
        """A Kafka consumer of this worker's: group.id only because librdkafka wants one (assign()
        never joins the group); named as the supervisor's clients are, then /worker-<index>, so a
        broker's logs tell them apart; librdkafka's log and errors to debug (the supervisor
        reports the broker's state)."""
        from confluent_kafka import Consumer

        return Consumer(self.cfg.consumer_settings(**{"group.id": f"{self.cfg.group}.worker",
                                                      "client.id": f"{self.cfg.client_id}/worker-{self.index}",
                                                      **kafka_client.client_settings()}))

    def _load_kernels(self) -> None:
        """Decode and apply an empty batch of this worker's format: numba loads the decode and
        apply kernels for exactly these argument types (compiled once by `shmcache warm`, which
        the supervisor ran before starting workers; see consumer/warm.py); no entry changes."""
        for batch in self.format.warm(self.scratch):  # batch and message-by-message paths
            apply_batch(self.cache, batch)

    # -- commands ---------------------------------------------------------------------------

    def _commands(self, wait: float) -> None:
        try:
            while self.conn.poll(wait):
                wait = 0
                cmd = self.conn.recv()
                getattr(self, "_cmd_" + cmd[0])(*cmd[1:])
        except (EOFError, OSError):  # the supervisor's end of the pipe is gone: it died
            self.orphaned = True

    def _cmd_assign(self, items) -> None:
        from confluent_kafka import TopicPartition

        tps = []
        for p, offset, gen in items:
            if p in self.owned:  # re-assigned to us: restart it at the given offset
                self.consumer.incremental_unassign([TopicPartition(self.cfg.topic, p)])
            self.owned[p] = gen
            self.next[p] = offset
            tps.append(TopicPartition(self.cfg.topic, p, offset))
        if tps:
            self.consumer.incremental_assign(tps)
            if self.paused_until:
                self.consumer.pause(tps)  # paused now: new partitions wait with the others
        log.info("worker %d: fetching partitions %s", self.index, [(p, o) for p, o, _ in items])

    def _drop(self, parts) -> dict[int, int]:
        from confluent_kafka import TopicPartition

        mine = [p for p in parts if p in self.owned]
        if mine:
            tps = [TopicPartition(self.cfg.topic, p) for p in mine]
            self.consumer.resume(tps)  # or a pause flag outlives the assignment (see above); else a no-op
            self.consumer.incremental_unassign(tps)
        for p in mine:
            del self.owned[p], self.next[p]
            self.times.pop(p, None)
        return {p: self.rows.applied(p) for p in mine}

    def _cmd_revoke(self, parts) -> None:
        paused = bool(self.paused_until)  # flow control had them paused: the case _drop's resume is for
        applied = self._drop(parts)
        log.info("worker %d: released partitions %s at applied offsets %s%s", self.index, list(applied), applied,
                 " (paused by flow control)" if paused else "")
        self.conn.send(("revoked", (applied, paused)))

    def _cmd_refetch(self, stalled) -> None:
        """Fetch every owned partition through a new consumer (see the module's doc), each from
        the offset after the last message applied (past a transaction's marker, if position()
        is there already); `stalled`: the partitions the supervisor saw stalled."""
        from confluent_kafka import TopicPartition

        if not self.owned:
            return
        tps = [TopicPartition(self.cfg.topic, p) for p in self.owned]
        at = {tp.partition: tp.offset for tp in self.consumer.position(tps)}
        starts = {p: max(self.next[p], at.get(p, -1)) for p in self.owned}
        self.consumer.close()  # its fetched, unapplied messages with it
        self.consumer = self._consumer()
        self.consumer.incremental_assign([TopicPartition(self.cfg.topic, p, o) for p, o in starts.items()])
        if self.paused_until:
            self.consumer.pause(tps)  # flow control's pause goes on
        log.warning("worker %d: partitions %s fetched nothing while the broker held more: fetching %s through a new "
                    "Kafka consumer from offsets %s", self.index, list(stalled), sorted(self.owned), starts)

    def _cmd_hold(self) -> None:
        self.held = True
        self.conn.send(("held", {p: self.rows.applied(p) for p in self.owned}))

    def _cmd_switch(self) -> None:
        """Move to the resize's new segment: its row there claimed (the supervisor copied it, this
        process's owner word in it), then the old mapping closed."""
        new = resizing.open_beside(self.cfg.name)
        me = new.control.worker_row(self.index)
        me.claim(liveness.owner_word())
        if self.retired is not None:  # the resize before this one's, still kept
            self.retired[0].close()
        self.retired = (self.cache, self.me)  # beaten in until RETIRE_S after the resume, then closed
        self.cache, self.rows, self.me = new, new.control.partition_rows, me
        new.on_wait = lock_wait.LockWait(self.index, me, self.parent)
        self.conn.send(("switched", True))

    def _cmd_resume(self) -> None:
        self.held = False
        self.retire_at = time.monotonic() + resizing.RETIRE_S

    def _retire(self) -> None:
        """Beat in the segment a resize replaced until RETIRE_S after the resume (a reader that
        still maps it finds this worker up), then close it."""
        cache, me = self.retired
        if self.held or time.monotonic() < self.retire_at:  # engine/resizing.py RETIRE_S
            me.beat()
            return
        self.retired = None
        cache.close()

    def _cmd_stop(self) -> None:
        applied = self._drop(list(self.owned))
        self.conn.send(("stopped", applied))
        self.stopping = True

    # -- the loop ---------------------------------------------------------------------------

    def run(self) -> None:
        prof = self.prof
        try:
            while not self.stopping:
                wait = 0 if self.owned else 0.1
                self._commands(wait)
                prof.mark("idle" if wait else "publish")
                if self.stopping:
                    break
                if self.orphaned or os.getppid() != self.parent:
                    # not an error of ours: exit 0, in one line (a restarted supervisor starts new workers)
                    log.warning("worker %d: its supervisor is gone; exiting without publishing more", self.index)
                    return
                if self.held:
                    self._commands(0.05)  # beats below; applies nothing until "resume"
                elif self.owned:
                    msgs = self.consumer.consume(num_messages=self.cfg.batch_messages, timeout=0.05)
                    prof.mark("fetch" if msgs else "idle")
                    if msgs:
                        self._apply(msgs)
                        self.busy = True
                    elif self.busy:
                        self._idle()
                    self._publish()
                    self._flow_control()
                self.me.beat()
                if self.retired is not None:
                    self._retire()
                prof.mark("publish")
        finally:
            prof.report(self.index)
            self.consumer.close()
            self.me.release()
            del self.me, self.rows  # views of the mapping
            self.cache.close()
            if self.retired is not None:
                self.retired[0].close()

    def _idle(self) -> None:
        """The topic is drained for now: give back what a burst grew (the decode's buffers,
        and the C heap librdkafka and numpy freed: ipc/heap.py), once a burst of more than
        IDLE_RELEASE bytes; a trickle of small batches keeps its small buffers."""
        self.busy = False
        if self.scratch.buf.nbytes > IDLE_RELEASE:
            self.scratch.release()
            heap.trim()

    def _tps(self):
        from confluent_kafka import TopicPartition

        return [TopicPartition(self.cfg.topic, p) for p in self.owned]

    def _flow_control(self) -> None:
        if not self.cfg.max_rate:
            return
        now = time.monotonic()
        if self.paused_until and now >= self.paused_until:
            self.consumer.resume(self._tps())  # every partition owned now, whenever it came
            self.paused_until = 0.0
        if now - self.window_start >= 1.0:
            self.window_start, self.window_entries = now, 0
        elif not self.paused_until and self.window_entries >= self.cfg.max_rate:
            self.consumer.pause(self._tps())
            self.paused_until = self.window_start + 1.0

    def _apply(self, msgs) -> None:
        fetched = []
        for m in msgs:
            err = m.error()
            if err is not None:
                log.warning("worker %d: %s [%d]: %s", self.index, m.topic(),
                            -1 if m.partition() is None else m.partition(), err)  # partition 0 is 0
                continue
            fetched.append(m)
        # a message fetched just before a revoke is not ours; one below its partition's offset
        # comes from a new log (a re-created topic): that partition starts over after this batch
        found = log_replaced.jumps(fetched, self.next)
        if found:  # a retention gap is flagged before what came after it is applied and published
            log_replaced.note_gaps(self.consumer, self.cache, self.cfg.topic, found,
                                   lambda p: self.rows.generation(p) == self.owned.get(p), self.index)
        good, replaced = log_replaced.split(fetched, self.next)
        if good:
            self._apply_messages(good)
            for m in good:  # a message, not an entry: what _publish says with the offset after it
                self.times[m.partition()] = m.timestamp()[1]
            self.me.count_messages(len(good))
            self.prof.messages += len(good)
            self.prof.batches += 1
        for p, offset in replaced.items():
            current = self.rows.generation(p) == self.owned[p]
            self.next[p] = log_replaced.start_over(self.consumer, self.cfg.topic, self.rows, p, offset,
                                                   self.next[p], current, bool(self.paused_until), self.index)

    def _apply_messages(self, msgs) -> None:
        """The whole consume() batch through the format's decoder (formats/registry.py) in one
        go, then applied: the fixed cost of a decode and an apply is paid once per batch, not
        once per message. Each malformed message is counted and logged at its offset; the
        entries the format keeps of it, and the messages around it, are applied."""
        fmt = self.format
        decoded = fmt.decode([m.value() for m in msgs], [m.key() for m in msgs] if fmt.keyed else None,
                             key_size=self.cfg.key_size, max_value=self.cache.max_value, scratch=self.scratch)
        for i, why in decoded.malformed:
            m = msgs[i]
            self.me.count_malformed()
            log.warning("malformed message %s [%d] @ %d: %s", m.topic(), m.partition(), m.offset(), why)
        for batch in decoded.batches:
            self.me.count_unknown(batch.unknown_actions)
        self.prof.mark("decode")
        for batch in decoded.batches:
            self._apply_batch(batch)
        self.prof.mark("apply")

    def _apply_batch(self, batch) -> None:
        n = len(batch.actions)
        if n:
            apply_batch(self.cache, batch)
            deletes = int(np.count_nonzero(batch.actions == wire.DELETE))
            self.me.count_entries(n - deletes, deletes)
            self.window_entries += n
            self.prof.entries += n

    def _publish(self) -> None:
        """Publish each owned partition's position (every message before it has been applied)
        and the newest high watermark its fetches brought (for lag; never below the position)."""
        from confluent_kafka import KafkaException, TopicPartition

        rows = self.rows
        tps = self.consumer.position([TopicPartition(self.cfg.topic, p) for p in self.owned])
        for tp in tps:
            p, pos = tp.partition, tp.offset
            if pos < 0 or rows.generation(p) != self.owned.get(p):
                continue  # nothing fetched yet, or the partition was given to someone else
            try:
                _, hi = self.consumer.get_watermark_offsets(tp, cached=True)  # -1001 until a fetch brought one
            except KafkaException:
                hi = -1
            if rows.publish(p, pos, hi, max(0, self.times.get(p, 0))):
                log.info("partition %d caught up at offset %d", p, rows.applied(p))


def apply_batch(cache, batch) -> None:
    """Apply a decoded batch (formats/wire.py's Batch) to the cache. A v2 batch's hashes
    go along, so its keys are hashed once: decode verified every one against its key
    (a message with a wrong one is not v2), and the writer trusts what it is given."""
    cache.apply(batch.keys, batch.actions, (batch.value_starts, batch.value_lens, batch.data), hashes=batch.hashes)


def main(cfg_dict: dict, index: int, conn) -> None:
    """Process entry point: forked by the workers' fork server (consumer/worker/forkserver.py), which
    imported this module once, before any fork (consumer/worker/_preload.py)."""
    liveness.set_process_name(f"shmcache-w{index}")  # what ps, top and the tests see
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C goes to the supervisor, which drains us
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # and a terminal's hangup
    signal.signal(signal.SIGTERM, signal.SIG_DFL)  # not the fork server's handler (consumer/worker/forkserver.py)
    logging.basicConfig(level=cfg_dict.pop("_log_level", logging.INFO),
                        format="%(asctime)s %(levelname)s %(name)s[%(process)d]: %(message)s")
    worker = Worker(RunConfig(**cfg_dict), index, conn)
    worker.run()


def load_decoders(fmts) -> None:
    """Each format's decode paths run on empty batches, so numba loads their kernels: the fork
    server's preload (consumer/worker/_preload.py) on a warm install, so that a forked worker
    starts with them loaded."""
    for fmt in fmts:
        fmt.warm(wire_batch.Scratch())
