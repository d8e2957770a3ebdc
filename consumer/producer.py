"""Producing txmeta batches the way the consumers expect them (DESIGN invariant 2).

- v1: one message per batch, keyed by the batch's first tx hash, partitioned with
  `partitioner=murmur2_random` (the Java and Go clients' choice, so every client
  agrees where a key goes); keys spread evenly because tx hashes are random.
- v2: a batch is split by bucket range, one message per partition, each sent to
  its partition explicitly: partition p holds buckets [p*8192/P, (p+1)*8192/P).
- kv: one message per entry, Kafka key = cache key, value None = delete.

The same key always lands in the same partition only for v2 and kv; v1 keys by
the batch's first hash, so a later batch can carry the key elsewhere. Order per
key across partitions is then not guaranteed: the producer of v1 must send a
key's ADD and DELETE in one batch or accept it (Teranode's validator does).

On backpressure (the local queue full) the producer waits, never drops.
"""

from __future__ import annotations

import numpy as np

from shmcache.consumer import wire


class TxmetaProducer:
    def __init__(self, bootstrap: str, topic: str, *, format: str = "v1", settings: dict | None = None):
        from confluent_kafka import Producer

        if format not in ("v1", "v2", "kv"):
            raise ValueError(f"format={format!r}: expected v1, v2 or kv")
        self.topic = topic
        self.format = format
        conf = {
            "bootstrap.servers": bootstrap,
            "partitioner": "murmur2_random",
            "linger.ms": 5,
            "enable.idempotence": True,  # retries keep per-partition order
            "compression.type": "lz4",
        }
        conf.update(settings or {})
        self._p = Producer(conf)
        self._errors: list[str] = []
        meta = self._p.list_topics(topic, timeout=15)
        t = meta.topics.get(topic)
        if t is None or t.error is not None:
            raise ValueError(f"topic {topic!r} not found on {bootstrap}")
        self.partitions = len(t.partitions)
        if format == "v2" and wire.V2_BUCKETS % self.partitions:
            raise ValueError(f"topic {topic!r} has {self.partitions} partitions; v2 needs a divisor of {wire.V2_BUCKETS}")
        self.sent_messages = 0

    def _on_delivery(self, err, msg) -> None:
        if err is not None:
            self._errors.append(f"{msg.topic()} [{msg.partition()}]: {err}")

    def _produce(self, value, key=None, partition=None) -> None:
        kw = {"on_delivery": self._on_delivery}
        if partition is not None:
            kw["partition"] = int(partition)
        while True:
            try:
                self._p.produce(self.topic, value, key, **kw)
                break
            except BufferError:  # local queue full: wait for deliveries, then retry
                self._p.poll(0.05)
        self._p.poll(0)
        self.sent_messages += 1

    def send(self, keys: np.ndarray, actions: np.ndarray, values) -> None:
        """Send one batch: keys (n, 32) uint8, actions ADD/DELETE, values as for wire.encode_v1."""
        keys = np.ascontiguousarray(keys, np.uint8)
        actions = np.asarray(actions, np.uint8)
        if len(keys) == 0:
            return
        if self.format == "v1":
            self._produce(wire.encode_v1(keys, actions, values), key=keys[0].tobytes())
        elif self.format == "v2":
            parts = wire.v2_partition(wire.xxh64_keys(keys), self.partitions)
            offsets, data = _as_offsets(values, len(keys))
            for p in np.unique(parts).tolist():
                idx = np.flatnonzero(parts == p)  # keeps wire order within the partition
                sub = [data[offsets[i]:offsets[i + 1]].tobytes() for i in idx.tolist()]
                self._produce(wire.encode_v2(keys[idx], actions[idx], sub), partition=p)
        else:
            offsets, data = _as_offsets(values, len(keys))
            for i in range(len(keys)):
                value = None if actions[i] == wire.DELETE else data[offsets[i]:offsets[i + 1]].tobytes()
                self._produce(value, key=keys[i].tobytes())

    def flush(self, timeout: float = 60.0) -> None:
        """Wait until everything sent is acknowledged; raise if anything failed."""
        left = self._p.flush(timeout)
        if left:
            raise TimeoutError(f"{left} messages to {self.topic!r} not delivered after {timeout:.0f} s")
        if self._errors:
            raise RuntimeError(f"{len(self._errors)} messages failed: {self._errors[:3]}")


def _as_offsets(values, n: int) -> tuple[np.ndarray, np.ndarray]:
    if isinstance(values, tuple):
        return np.asarray(values[0], np.int64), np.asarray(values[1], np.uint8)
    lens = np.fromiter(map(len, values), np.int64, n)
    offsets = np.zeros(n + 1, np.int64)
    np.cumsum(lens, out=offsets[1:])
    return offsets, np.frombuffer(b"".join(values), np.uint8)
