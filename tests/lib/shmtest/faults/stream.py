"""The fault suite's data: a seeded plan of what is produced, self-checking values, the
producer thread that streams the plan, the reader process that checks every value it
reads, and the model of the table Kafka's order per partition implies.

Values: value(key, seq) = [u64 first 8 bytes of the key][u32 seq][u32 body length][body],
the body a function of (key, seq). A value read from the cache is right only if its
header names the key it was looked up by (else it is a foreign value), its bytes equal
value(key, seq) (else it is torn), the plan's entry `seq` is an ADD of that key, and
entry `seq` had been handed to the producer before the lookup (else it was never
written). That is "the set of values ever written for the key", checked in batches.

Plan: batches of entries (new keys, overwrites, deletes of live and deleted keys,
re-adds, the same key twice in a batch), built as produce/loadgen.py builds them so
that every message touching a key lands in one partition: v1 batches are built for one
partition (round robin; the first key, which the message is keyed by, murmur2s there,
and later entries only use keys first written for that partition); v2 and kv route by
key. A few batches are malformed on the wire (v1 and v2: the last entry cut short; kv:
keys of 31 bytes): per the wire contract (formats/wire.py) v1 and v2 keep the entries
before the damage (a damaged v2 message keeps none: `kept_entries`), a kv message with a
bad key is skipped. Their keys are used nowhere else.

Run as a script, this file is the reader process:
    python -m shmtest.faults.stream reader PLAN.npz NAME PROGRESS STOPFILE LOOKUPS_PER_S
It prints a JSON line of counts every second and a last one (final=true) when STOPFILE
appears or its parent dies.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time

import numpy as np

ADD, DELETE = 0, 1  # wire.ADD, wire.DELETE (pinned by the producer, which uses wire's)
HEAD = 16
_C1 = np.uint64(0x9E3779B97F4A7C15)


def _mix64(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def key_ids(keys: np.ndarray) -> np.ndarray:
    """The u64 a value's header carries for its key: the key's first 8 bytes."""
    return np.ascontiguousarray(keys[:, :8]).view("<u8").reshape(-1)


def make_values(ids: np.ndarray, seqs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(offsets, data) of value(key, seq) for keys with these ids at these seqs (40..135 B each)."""
    ids = np.asarray(ids, np.uint64)
    seqs = np.asarray(seqs, np.uint64)
    n = len(ids)
    with np.errstate(over="ignore"):
        s = _mix64(ids ^ (seqs * _C1))
    blen = (24 + s % np.uint64(96)).astype(np.int64)
    offsets = np.zeros(n + 1, np.int64)
    np.cumsum(HEAD + blen, out=offsets[1:])
    data = np.empty(int(offsets[-1]), np.uint8)
    head = np.empty((n, 4), np.uint32)
    head[:, 0:2] = ids.view(np.uint32).reshape(n, 2)
    head[:, 2] = seqs.astype(np.uint32)
    head[:, 3] = blen.astype(np.uint32)
    starts = offsets[:-1]
    data[(starts[:, None] + np.arange(HEAD)).reshape(-1)] = head.view(np.uint8).reshape(-1)
    nb = int(blen.sum())
    if nb:
        j = np.arange(nb, dtype=np.int64) - np.repeat(np.cumsum(blen) - blen, blen)
        with np.errstate(over="ignore"):
            body = (np.repeat(s, blen) + j.astype(np.uint64) * _C1) >> np.uint64(56)
        data[np.repeat(starts + HEAD, blen) + j] = body.astype(np.uint8)
    return offsets, data


def check_values(found, offsets, data, key_idx, plan: "Plan", sent: int) -> tuple[int, np.ndarray, str]:
    """Check the hits of a lookup of plan keys `key_idx`. Returns (bad count, seq of each
    lookup (-1: miss or bad), first problem)."""
    found = np.asarray(found, bool)
    offsets = np.asarray(offsets, np.int64)
    data = np.asarray(data, np.uint8)
    seqs = np.full(len(found), -1, np.int64)
    hits = np.flatnonzero(found)
    if not len(hits):
        return 0, seqs, ""
    starts = offsets[hits]
    lens = offsets[hits + 1] - starts
    ok = lens >= HEAD
    head = np.zeros((len(hits), HEAD), np.uint8)
    hs = starts[ok]
    head[ok] = data[(hs[:, None] + np.arange(HEAD)).reshape(-1)].reshape(-1, HEAD)
    hv = head.view(np.uint32)
    got_id = np.ascontiguousarray(hv[:, 0:2]).view(np.uint64).reshape(-1)
    got_seq = hv[:, 2].astype(np.int64)
    kidx = np.asarray(key_idx, np.int64)[hits]
    ok &= got_id == plan.ids[kidx]
    ok &= got_seq < min(sent, len(plan.entry_key))
    sq = np.where(ok, got_seq, 0)
    ok &= (plan.entry_key[sq] == kidx) & (plan.entry_action[sq] == ADD)
    cand = np.flatnonzero(ok)
    if len(cand):
        eo, ed = make_values(plan.ids[kidx[cand]], got_seq[cand].astype(np.uint64))
        elens = np.diff(eo)
        same_len = elens == lens[cand]
        ok[cand[~same_len]] = False
        c2 = cand[same_len]
        if len(c2):
            cl = lens[c2]
            rel = np.arange(int(cl.sum())) - np.repeat(np.cumsum(cl) - cl, cl)
            got = data[np.repeat(starts[c2], cl) + rel]
            exp = ed[np.repeat(eo[:-1][same_len], cl) + rel]
            diff = np.add.reduceat((got != exp).astype(np.int64), np.cumsum(cl) - cl)
            ok[c2[diff > 0]] = False
    bad = np.flatnonzero(~ok)
    seqs[hits[ok]] = got_seq[ok]
    problem = ""
    if len(bad):
        j = int(bad[0])
        problem = (f"key #{int(kidx[j])}: value of {int(lens[j])} B, header id "
                   f"{'matches' if got_id[j] == plan.ids[kidx[j]] else 'does NOT match'} the key, seq {int(got_seq[j])} "
                   f"(sent so far {sent}), first bytes {data[starts[j]:starts[j] + 24].tobytes().hex()}")
    return len(bad), seqs, problem


# -- the plan ------------------------------------------------------------------------------------

class Plan:
    """keys (K, 32) in order of first use; per entry (seq): key index and action; per batch:
    its entries [batch_start[b], batch_start[b+1]), its partition (v1) and whether it is malformed."""

    def __init__(self, fmt, partitions, keys, entry_key, entry_action, batch_start, batch_part, batch_bad):
        self.fmt, self.partitions = fmt, int(partitions)
        self.keys = keys
        self.ids = key_ids(keys)
        self.entry_key, self.entry_action = entry_key, entry_action
        self.batch_start, self.batch_part, self.batch_bad = batch_start, batch_part, batch_bad
        first = np.full(len(keys), np.iinfo(np.int64).max, np.int64)
        np.minimum.at(first, entry_key, np.arange(len(entry_key)))
        self.first_seq = first  # increasing: keys are numbered by first use

    @property
    def entries(self) -> int:
        return len(self.entry_key)

    def save(self, path) -> None:
        np.savez(path, fmt=self.fmt, partitions=self.partitions, keys=self.keys, entry_key=self.entry_key,
                 entry_action=self.entry_action, batch_start=self.batch_start, batch_part=self.batch_part,
                 batch_bad=self.batch_bad)

    @classmethod
    def load(cls, path) -> "Plan":
        z = np.load(path)
        return cls(str(z["fmt"]), int(z["partitions"]), z["keys"], z["entry_key"], z["entry_action"],
                   z["batch_start"], z["batch_part"], z["batch_bad"])


def make_plan(fmt: str, partitions: int, entries: int, seed: int, batch_size: int, malformed: int) -> Plan:
    from shmcache.formats import partitioners, wire

    rng = np.random.default_rng(seed)
    groups = partitions if fmt == "v1" else 1
    pools: list[list[int]] = [[] for _ in range(groups)]
    key_blocks: list[np.ndarray] = []
    nkeys = 0
    ek, ea, starts, parts, bad = [], [], [0], [], []
    nbatches = max(1, entries // batch_size)
    bad_at = set(np.linspace(nbatches * 0.1, nbatches * 0.9, malformed).astype(int).tolist()) if malformed else set()
    seq, b = 0, 0
    while seq < entries:
        g = b % groups
        part = g if fmt == "v1" else -1
        is_bad = b in bad_at
        n = 3 if is_bad else min(entries - seq, int(rng.integers(batch_size // 2, batch_size * 3 // 2 + 1)))
        pool = pools[g]
        u = rng.random(n)
        new = (u < 0.55) | (len(pool) == 0) | is_bad
        new[0] = True
        m = int(new.sum())
        fresh = rng.integers(0, 256, (m, 32), np.uint8)
        if fmt == "v1":  # the message is keyed by its first key: it must murmur2 to the batch's partition
            while True:
                cand = rng.integers(0, 256, (16 * partitions, 32), np.uint8)
                hit = np.flatnonzero(partitioners.murmur2_partitions(cand, partitions) == part)
                if len(hit):
                    fresh[0] = cand[hit[0]]
                    break
        key_blocks.append(fresh)
        kidx = np.empty(n, np.int64)
        kidx[new] = np.arange(nkeys, nkeys + m)
        nkeys += m
        old = np.flatnonzero(~new)
        if len(old):
            kidx[old] = [pool[i] for i in rng.integers(0, len(pool), len(old)).tolist()]
        act = np.where(new | (u < 0.82), ADD, DELETE).astype(np.uint8)
        if not is_bad:
            pool.extend(range(nkeys - m, nkeys))
        ek.append(kidx)
        ea.append(act)
        seq += n
        starts.append(seq)
        parts.append(part)
        bad.append(is_bad)
        b += 1
    return Plan(fmt, partitions, np.concatenate(key_blocks), np.concatenate(ek), np.concatenate(ea),
                np.array(starts, np.int64), np.array(parts, np.int16), np.array(bad, bool))


def kept_entries(fmt: str, n: int, message_len: int) -> int:
    """Entries of a malformed message (its last entry cut short) that the wire contract keeps
    (formats/wire.py): v1 the entries before the damage; v2 none (a message is v2 only if
    the whole v2 parse holds, and cut short it is not v1 either); kv messages with a bad key
    are skipped."""
    if fmt == "v1":
        return n - 1
    return 0


def model(plan: Plan, msg_entries: list[np.ndarray], msg_part: np.ndarray, msg_offset: np.ndarray,
          kept: dict[int, int]):
    """The table the topic implies: apply each partition's messages in offset order (a key lives
    in one partition, so the last applied entry of a key, by (offset, position), decides);
    `kept[m]`: how many leading entries of malformed message m are applied.
    Returns (present (K,) bool, seq (K,) int64 of the value that must be there)."""
    msg_entries = [e[:kept[m]] if m in kept else e for m, e in enumerate(msg_entries)]
    seqs = np.concatenate(msg_entries) if msg_entries else np.empty(0, np.int64)
    offs = np.repeat(msg_offset, [len(e) for e in msg_entries])
    order = np.lexsort((seqs, offs))
    seqs = seqs[order]
    keys = plan.entry_key[seqs]
    # the last occurrence of each key
    rev_keys = keys[::-1]
    _, first_in_rev = np.unique(rev_keys, return_index=True)
    last = len(keys) - 1 - first_in_rev
    present = np.zeros(len(plan.keys), bool)
    seq_of = np.full(len(plan.keys), -1, np.int64)
    k = keys[last]
    present[k] = plan.entry_action[seqs[last]] == ADD
    seq_of[k] = np.where(present[k], seqs[last], -1)
    return present, seq_of


# -- the producer -------------------------------------------------------------------------------

class StreamProducer(threading.Thread):
    """Streams the plan over `duration` seconds (entries spread evenly in time), `burst(n)` sends
    n entries ahead of that schedule. Every message's (partition, offset) comes from its delivery
    report. Before a batch is handed to librdkafka, the count of entries sent so far is stored in
    the progress file (the reader's bound on which seqs can exist)."""

    def __init__(self, plan: Plan, bootstrap: str, topic: str, duration: float, progress_path: str):
        super().__init__(daemon=True, name="fault-producer")
        from confluent_kafka import Producer

        self.plan, self.topic, self.duration = plan, topic, duration
        self._p = Producer({"bootstrap.servers": bootstrap, "partitioner": "murmur2_random",
                            "enable.idempotence": True, "linger.ms": 5, "compression.type": "lz4",
                            "message.timeout.ms": 900_000, "log_level": 2})
        self.progress = np.memmap(progress_path, np.int64, "w+", shape=(1,))
        self.progress[0] = 0
        self.msg_entries: list[np.ndarray] = []
        self.msg_part: list[int] = []
        self.msg_offset: list[int] = []
        self.malformed: dict[int, int] = {}  # message id -> entries the wire contract keeps
        self.acked_end = np.zeros(plan.partitions, np.int64)
        self.acked = 0
        self.errors: list[str] = []
        self.extra = 0
        self.sent = 0  # entries handed to librdkafka
        self.started = 0.0
        self.stop_event = threading.Event()
        self.error: BaseException | None = None
        self.done = threading.Event()

    def burst(self, n: int) -> int:
        """Send n entries ahead of schedule; returns the entry count to wait for (see sent)."""
        self.extra += n
        return min(self.plan.entries, self.sent + n)

    def _delivered(self, err, msg, mid: int) -> None:
        if err is not None:
            self.errors.append(f"message {mid} to partition {msg.partition()}: {err}")
            return
        p, o = msg.partition(), msg.offset()
        self.msg_part[mid], self.msg_offset[mid] = p, o
        self.acked += 1
        if o + 1 > self.acked_end[p]:
            self.acked_end[p] = o + 1

    def _send(self, value, entries, key=None, partition=None, bad=False) -> None:
        mid = len(self.msg_entries)
        self.msg_entries.append(entries)
        self.msg_part.append(-1)
        self.msg_offset.append(-1)
        if bad:
            self.malformed[mid] = kept_entries(self.plan.fmt, len(entries), len(value))
        from shmcache.produce.producer import produce_waiting

        produce_waiting(self._p, self.topic, value, key, partition, lambda err, msg: self._delivered(err, msg, mid),
                        stop=self.stop_event.is_set)

    def _batch(self, b: int) -> None:
        from shmcache.formats import partitioners, wire
        from shmcache.formats.registry import take

        pl = self.plan
        s, e = int(pl.batch_start[b]), int(pl.batch_start[b + 1])
        seqs = np.arange(s, e, dtype=np.int64)
        kidx = pl.entry_key[s:e]
        keys = pl.keys[kidx]
        act = pl.entry_action[s:e]
        lens = np.zeros(e - s, np.int64)
        vo, vd = make_values(pl.ids[kidx], seqs.astype(np.uint64))
        adds = act == ADD
        lens[adds] = np.diff(vo)[adds]
        offsets = np.zeros(e - s + 1, np.int64)
        np.cumsum(lens, out=offsets[1:])
        data = take(vo, vd, np.flatnonzero(adds))[1]
        bad = bool(pl.batch_bad[b])
        self.sent = e
        self.progress[0] = e  # before the entries can reach the cache
        if pl.fmt == "v1":
            msg = wire.encode_v1(keys, act, (offsets, data))
            self._send(msg[:-5] if bad else msg, seqs, key=keys[0].tobytes(), bad=bad)
        elif pl.fmt == "v2":
            if bad:
                p = int(partitioners.v2_partition(wire.xxh64_keys(keys[:1]), pl.partitions)[0])
                self._send(wire.encode_v2(keys, act, (offsets, data))[:-5], seqs, partition=p, bad=True)
                return
            parts = partitioners.v2_partition(wire.xxh64_keys(keys), pl.partitions)
            for p in np.unique(parts).tolist():
                idx = np.flatnonzero(parts == p)
                self._send(wire.encode_v2(keys[idx], act[idx], take(offsets, data, idx)), seqs[idx], partition=p)
        else:
            buf, o = data.tobytes(), offsets.tolist()
            kb = [k.tobytes() for k in keys]
            for i in range(e - s):
                if bad:
                    self._send(buf[o[i]:o[i + 1]], seqs[i:i + 1], key=kb[i][:31], bad=True)
                else:
                    self._send(None if act[i] == DELETE else buf[o[i]:o[i + 1]], seqs[i:i + 1], key=kb[i])
        self._p.poll(0)

    def run(self) -> None:
        try:
            pl = self.plan
            self.started = time.monotonic()
            for b in range(len(pl.batch_part)):
                end = int(pl.batch_start[b + 1])
                while not self.stop_event.is_set():
                    due = pl.entries * (time.monotonic() - self.started) / self.duration + self.extra
                    if due >= int(pl.batch_start[b]) or end <= due:
                        break
                    self._p.poll(0.01)
                if self.stop_event.is_set():
                    break
                self._batch(b)
                if self.errors:
                    raise RuntimeError(f"{len(self.errors)} deliveries failed: {self.errors[:3]}")
            while self._p.flush(1.0) and not self.stop_event.is_set():
                pass
            if self.errors:
                raise RuntimeError(f"{len(self.errors)} deliveries failed: {self.errors[:3]}")
        except BaseException as e:  # noqa: BLE001 - reported by the run
            self.error = e
        finally:
            self.done.set()

    def close(self) -> None:
        self.stop_event.set()
        self.join(60)
        self._p = None
        del self.progress


# -- the reader process ----------------------------------------------------------------------------

def reader_main(plan_path, name, progress_path, stop_path, rate) -> None:
    import shmcache

    plan = Plan.load(plan_path)
    rate = float(rate)
    parent = os.getppid()
    progress = np.memmap(progress_path, np.int64, "r", shape=(1,))
    rng = np.random.default_rng(os.getpid())
    r = None
    deadline = time.monotonic() + 300
    while r is None:
        try:
            r = shmcache.attach(name)
        except (FileNotFoundError, shmcache.ShmcacheError):
            if time.monotonic() > deadline or os.getppid() != parent:
                sys.exit(f"reader: cache {name} never appeared")
            time.sleep(0.1)
    lookups = hits = bad = 0
    problems: list[str] = []
    batch = 1000
    t0 = last = time.monotonic()

    def say(final=False):
        sys.stdout.write(json.dumps(dict(lookups=lookups, hits=hits, bad=bad, problems=problems[:5],
                                         final=final)) + "\n")
        sys.stdout.flush()

    while not os.path.exists(stop_path) and os.getppid() == parent:
        sent = int(progress[0])
        nk = int(np.searchsorted(plan.first_seq, sent))
        if nk == 0:
            time.sleep(0.05)
            continue
        idx = rng.integers(0, nk, batch)
        p = r.get_many_packed(plan.keys[idx])
        sent_after = int(progress[0])  # every value in the cache was sent before this read
        nb, _, prob = check_values(p.found, p.offsets, p.data, idx, plan, sent_after)
        lookups += batch
        hits += int(np.count_nonzero(p.found))
        bad += nb
        if prob and len(problems) < 5:
            problems.append(prob)
        now = time.monotonic()
        if now - last >= 1.0:
            say()
            last = now
        ahead = lookups / rate - (now - t0)
        if ahead > 0:
            time.sleep(min(ahead, 0.2))
    say(final=True)
    r.close()


if __name__ == "__main__":
    if sys.argv[1] == "reader":
        reader_main(*sys.argv[2:])
