"""The load generator (`shmcache produce`): Teranode-shaped txmeta on a Kafka topic.

What it sends: batches of up to `batch_size` entries (default 1024, the
validator's batch size), each entry a random 32-byte tx hash with a MetaBytes
value (txmeta.generate: fee, size, flags, 1-3 parents with their vouts, a block
height on half of them; parents drawn from the previous batch's hashes, as a
transaction spends recent outputs), and a `delete_share` of DELETEs of hashes
sent earlier. Every hash is ADDed once and DELETEd at most once. A batch goes
out when it is full or, under `rate`, when `linger` has passed since its first
entry was due (the validator's batch size and timeout).

Per-key order (DESIGN invariant 2), which is what makes the final table well
defined:
- v1 keys a message by its FIRST hash and the producer's murmur2 partitioner
  places it, so a DELETE of h riding in a message keyed by another hash could
  land in another partition than h's ADD and be applied first. So each v1 batch
  is built for one target partition p (round robin): its first hash is drawn
  until murmur2 gives p, and its DELETEs are of hashes ADDed in earlier batches
  for p. Every message that touches h is then in one partition, in order.
- v2 sends each entry to `partitioners.v2_partition(xxh64(h), P)`: deletes follow their
  key. Its DELETEs are of hashes from any earlier batch.
- kv sends each entry as its own message keyed by h (murmur2: deletes follow their
  key, as in v2), value None for a DELETE. One produce() call per entry makes it
  several times slower than v1/v2 per entry; it exists to feed `--format kv` caches.
- proto sends each entry as its own KafkaTxMetaTopicMessage (formats/proto.py), the
  upstream Teranode topic, its txHash raw (32 bytes) or hex (`proto_hash`), keyed by
  that txHash as sent: deletes follow their key, as in kv. As slow per entry as kv.

Ground truth (`ground_truth=PATH`): a Parquet file of every entry sent, in send
order, written to PATH.tmp and renamed to PATH only once every message was
acknowledged (a file at PATH is complete). Columns: txmeta.table_schema() plus

    deleted    bool   the entry was a DELETE (its value columns are null)
    seq        int64  the entry's number in send order, from 0
    partition  int32  the Kafka partition the entry was sent to

The state the topic leaves (and a cache fed from it, if nothing was evicted): for
each tx_hash the row with the highest seq wins; the hash is present with that
row's value unless `deleted` (`final_state()` computes it). Since every hash is
ADDed once and DELETEd at most once, after its ADD, reading it as "a hash with a
deleted row is absent" (as the Spark audit reads a `deleted` column) gives the
same state.

Generation works on whole batches (numpy, txmeta.encode, wire.encode_v1/v2), not
entry by entry in Python. On backpressure it waits (poll), never drops;
any failed delivery, or a v1, kv or proto message the broker placed elsewhere than
murmur2 says, fails the run at the next batch or at the final flush.

Not guaranteed: `rate` is a target (sleeps between batches), not a bound on
burstiness within a batch; the delete share is reached only once there are
earlier hashes to delete (the first batches of each partition are all ADDs).
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from shmcache.formats import partitioners, proto, txmeta, wire
from shmcache.formats import registry as wire_formats
# the ground truth is part of what the load generator offers (produce/ground_truth.py)
from shmcache.produce.ground_truth import GroundTruthWriter, final_state, ground_truth_schema, hashes_of  # noqa: F401
from shmcache.produce.producer import BROKER_WAIT_S, TxmetaProducer

ADD, DELETE = wire.ADD, wire.DELETE
# 4096 entries of at most 8+32+1+4 + 21+3*(32+4+4)+4 = 194 B stay under Kafka's
# 1 MB default message.max.bytes.
MAX_BATCH = 4096

# Producer settings for throughput, as Teranode's validator produces: no
# compression (tx hashes are random bytes), batches of whole messages with a
# short linger, a bounded local queue so a slow broker pushes back (BufferError,
# then we wait) instead of buffering gigabytes.
PRODUCER_SETTINGS = {
    "compression.type": "none",
    "linger.ms": 10,
    "batch.size": 1_000_000,
    "queue.buffering.max.kbytes": 128 * 1024,
}


@dataclass
class LoadConfig:
    bootstrap: str
    topic: str
    count: int = 1_000_000  # entries to send
    format: str = "v1"
    proto_hash: str = "raw"  # proto: txHash as 32 raw bytes, or "hex" (chainhash's String())
    rate: float = 0.0  # entries/s; 0 = as fast as it can
    batch_size: int = 1024
    linger: float = 0.01  # seconds a partial batch waits under `rate`
    delete_share: float = 0.1  # share of entries that delete an earlier hash
    seed: int | None = None
    create_topic: bool = False
    partitions: int = 8  # of a topic it creates
    sole_writer: bool = False  # nothing else writes to the topic meanwhile (true of a topic it creates)
    ground_truth: str | None = None  # Parquet path
    settings: dict = field(default_factory=dict)  # librdkafka producer settings, over PRODUCER_SETTINGS
    broker_wait: float = BROKER_WAIT_S  # seconds for the broker's first answer (the topic's creation, its metadata)

    def validate(self) -> None:
        wire_formats.get(self.format)
        if self.proto_hash not in proto.HASH_FORMS:
            raise ValueError(f"proto_hash={self.proto_hash!r}: expected one of {', '.join(proto.HASH_FORMS)}")
        if self.count < 0:
            raise ValueError(f"count={self.count}: must be >= 0")
        if not 1 <= self.batch_size <= MAX_BATCH:
            raise ValueError(f"batch_size={self.batch_size}: expected 1..{MAX_BATCH}")
        if self.rate < 0:
            raise ValueError(f"rate={self.rate}: must be >= 0 (0 = as fast as it can)")
        if self.linger < 0:
            raise ValueError(f"linger={self.linger}: must be >= 0 seconds")
        if not 0.0 <= self.delete_share < 1.0:
            raise ValueError(f"delete_share={self.delete_share}: expected 0 <= share < 1")
        if self.partitions < 1:
            raise ValueError(f"partitions={self.partitions}: must be >= 1")
        if not self.broker_wait > 0:
            raise ValueError(f"broker_wait={self.broker_wait}: must be > 0 seconds")


# -- generating ---------------------------------------------------------------------------


class _Pool:
    """Hashes that may still be deleted: a growable (n, 32) array, random removal."""

    def __init__(self):
        self.keys = np.empty((1024, 32), np.uint8)
        self.n = 0

    def add(self, keys: np.ndarray) -> None:
        need = self.n + len(keys)
        if need > len(self.keys):
            grown = np.empty((max(need, 2 * len(self.keys)), 32), np.uint8)
            grown[: self.n] = self.keys[: self.n]
            self.keys = grown
        self.keys[self.n:need] = keys
        self.n = need

    def take(self, d: int, rng: np.random.Generator) -> np.ndarray:
        """Remove d random hashes (d <= n) and return them."""
        idx = np.sort(rng.choice(self.n, d, replace=False))
        out = self.keys[idx].copy()
        # Fill the holes below the new end with the survivors above it (swap-remove, vectorised).
        end = self.n - d
        holes = idx[idx < end]
        tail = np.arange(end, self.n)
        movers = tail[~np.isin(tail, idx)]
        self.keys[holes] = self.keys[movers]
        self.n = end
        return out


@dataclass(eq=False)
class GenBatch:
    """One batch as sent: entry i is keys[i], actions[i], value data[offsets[i]:offsets[i+1]]."""

    keys: np.ndarray  # (n, 32) uint8
    actions: np.ndarray  # (n,) uint8
    offsets: np.ndarray  # (n + 1,) int64; DELETEs are empty
    data: np.ndarray  # uint8
    meta: txmeta.Meta  # the ADDs' values, in entry order
    partition: int | None  # v1: the partition it is built for; v2: None (split per entry)

    def __len__(self) -> int:
        return len(self.actions)


class Generator:
    """Batches of Teranode-shaped entries, without a broker (see the module docstring)."""

    def __init__(self, fmt: str, partitions: int, delete_share: float, rng: np.random.Generator,
                 proto_hash: str = "raw"):
        self.wire = wire_formats.get(fmt)
        self.fmt = fmt
        self.proto_hash = proto_hash  # proto: the Kafka key is the txHash as sent, raw or hex
        self.partitions = partitions
        self.delete_share = delete_share
        self.rng = rng
        # v1: one pool per target partition; v2, kv, proto: one pool (deletes follow their key)
        self.pools = [_Pool() for _ in range(partitions if self.wire.by_message else 1)]
        self.next_partition = 0
        self.recent: np.ndarray | None = None  # the last batch's hashes: parents of the next

    def _first_key(self, p: int) -> np.ndarray:
        """A fresh hash that murmur2 sends to partition p (about P draws)."""
        while True:
            k = self.rng.integers(0, 256, 32, np.uint8)
            if partitioners.murmur2_partition(k.tobytes(), self.partitions) == p:
                return k

    def batch(self, n: int) -> GenBatch:
        if n < 1:
            raise ValueError(f"batch of {n} entries: must be >= 1")
        rng = self.rng
        if self.wire.by_message:
            part = self.next_partition
            self.next_partition = (part + 1) % self.partitions
            pool = self.pools[part]
        else:
            part, pool = None, self.pools[0]
        # Entry 0 is always a new hash (v1 keys the message by it); DELETEs go at random
        # places among the rest, of hashes from earlier batches (this batch's join the pool after).
        d = min(int(rng.binomial(n - 1, self.delete_share)) if n > 1 else 0, pool.n)
        is_delete = np.zeros(n, np.bool_)
        is_delete[1 + rng.choice(n - 1, d, replace=False)] = True
        a = n - d
        new = rng.integers(0, 256, (a, 32), np.uint8)
        if part is not None:
            new[0] = self._first_key(part)
        keys = np.empty((n, 32), np.uint8)
        keys[~is_delete] = new
        if d:
            keys[is_delete] = pool.take(d, rng)
        meta = txmeta.generate(a, rng, parent_pool=self.recent)
        add_offsets, data = txmeta.encode(meta)
        lens = np.zeros(n, np.int64)
        lens[~is_delete] = np.diff(add_offsets)  # the ADDs' values, back to back, in entry order
        offsets = np.zeros(n + 1, np.int64)
        np.cumsum(lens, out=offsets[1:])
        pool.add(new)
        self.recent = new
        actions = np.where(is_delete, DELETE, ADD).astype(np.uint8)
        return GenBatch(keys, actions, offsets, data, meta, part)

    def partitions_of(self, b: GenBatch) -> np.ndarray:
        """The partition each entry of `b` is sent to."""
        if b.partition is not None:
            return np.full(len(b), b.partition, np.int32)
        return self.wire.partitions_of(b.keys, self.partitions, self.proto_hash)


# -- producing -----------------------------------------------------------------------------


@dataclass
class LoadStats:
    """What was sent so far; `progress` callbacks get this object after every batch."""

    total: int  # entries to send
    entries: int = 0
    adds: int = 0
    deletes: int = 0
    bytes: int = 0  # message payload bytes
    messages: int = 0  # produced
    delivered: int = 0  # acknowledged by the broker
    started: float = 0.0  # time.monotonic()
    seconds: float = 0.0  # from the start to the last acknowledgement (set at the end)
    partitions: int = 0
    end_offsets: dict = field(default_factory=dict)  # partition -> last acknowledged offset + 1
    ground_truth: str | None = None


def produce(cfg: LoadConfig, progress: Callable[[LoadStats], None] | None = None) -> LoadStats:
    """Send cfg.count entries to cfg.topic; returns when every message is acknowledged.
    Raises on any failed delivery (after flushing what it can)."""
    cfg.validate()
    sole_writer = cfg.sole_writer
    if cfg.create_topic:
        from shmcache.kafka.topics import create_topic

        sole_writer |= create_topic(cfg.bootstrap, cfg.topic, cfg.partitions, broker_wait=cfg.broker_wait)
    producer = TxmetaProducer(cfg.bootstrap, cfg.topic, format=cfg.format, sole_writer=sole_writer,
                              settings={**PRODUCER_SETTINGS, **cfg.settings}, broker_wait=cfg.broker_wait,
                              proto_hash=cfg.proto_hash)
    gen = Generator(cfg.format, producer.partitions, cfg.delete_share, np.random.default_rng(cfg.seed),
                    proto_hash=cfg.proto_hash)
    overhead = gen.wire.overhead(cfg.proto_hash)  # bytes on the wire an entry besides its value
    truth = GroundTruthWriter(cfg.ground_truth) if cfg.ground_truth else None
    st = LoadStats(total=cfg.count, partitions=producer.partitions, started=time.monotonic())
    try:
        while st.entries < cfg.count:
            n = min(cfg.batch_size, cfg.count - st.entries)
            if cfg.rate:
                n = _pace(producer, cfg, st, n)
            b = gen.batch(n)
            producer.send(b.keys, b.actions, (b.offsets, b.data))
            producer.check()
            if truth is not None:
                truth.add(b, gen.partitions_of(b), st.entries)
            d = int(np.count_nonzero(b.actions == DELETE))
            st.entries += n
            st.deletes += d
            st.adds += n - d
            st.bytes += int(b.offsets[-1]) + n * overhead
            st.messages, st.delivered = producer.sent_messages, producer.delivered_messages
            if progress is not None:
                progress(st)
        producer.flush(max(60.0, st.messages * 0.05))
        st.seconds = time.monotonic() - st.started
        if truth is not None:
            truth.commit()
            st.ground_truth = truth.path
            truth = None
    finally:
        if truth is not None:
            truth.discard()
    st.messages, st.delivered = producer.sent_messages, producer.delivered_messages
    st.end_offsets = dict(sorted(producer.end_offsets.items()))
    if progress is not None:
        progress(st)
    return st


def _pace(producer: TxmetaProducer, cfg: LoadConfig, st: LoadStats, n: int) -> int:
    """Under `rate`: wait until n entries are due, or `linger` after the first of them was
    due, serving delivery reports meanwhile; return how many are due then (1..n)."""
    first_due = st.started + (st.entries + 1) / cfg.rate
    send_at = min(st.started + (st.entries + n) / cfg.rate, first_due + cfg.linger)
    while (left := send_at - time.monotonic()) > 0:
        producer.poll(min(left, 0.1))
    due = int((time.monotonic() - st.started) * cfg.rate) - st.entries
    return max(1, min(n, due))
