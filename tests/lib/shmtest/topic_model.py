"""The data of the end-to-end pipeline tests (real broker, real `shmcache run` processes):
what they send to the topic, and how they check the table it must leave behind.

- `Model`: makes txmeta batches (ADD, re-ADD, DELETE, the same key twice in a batch)
  and keeps the table they must produce. For v1 every batch is built from keys of one
  partition only (murmur2 of each key = the partition), so its first key, which the
  producer keys the message by, sends it to that partition, and every message that
  touches a key lands in that key's partition: per-key order, hence the final table,
  is well defined. v2 and kv route by key in the producer.
- `StreamProducer`: a thread that keeps producing Model batches until stopped.
- `KafkaProbe` (end offsets, a group's committed offsets), producing to the end
  (`produce_and_wait`, `produce_entries`), replaying a topic, and `check_table`.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections import defaultdict

import numpy as np

from shmtest.waits import poll_until
from shmcache.formats import partitioners, registry, wire, wire_batch
from shmcache.produce.producer import TxmetaProducer

ADD, DELETE = wire.ADD, wire.DELETE


class Model:
    """Batches of txmeta entries, and the table they must leave behind."""

    def __init__(self, fmt: str, partitions: int, seed: int):
        self.fmt = fmt
        self.partitions = partitions
        self.rng = np.random.default_rng(seed)
        self.expected: dict[bytes, bytes | None] = {}  # every key ever sent -> final value or None
        self.live: dict[int, list[bytes]] = defaultdict(list)  # partition group -> keys (maybe deleted)
        self.next_part = 0
        self.entries = 0  # entries sent so far
        self.lock = threading.Lock()

    def _value(self) -> bytes:
        n = int(self.rng.integers(61, 142))
        return self.rng.integers(0, 256, n, np.uint8).tobytes()

    def _new_keys(self, n: int, part: int | None) -> list[bytes]:
        out = []
        while len(out) < n:
            k = self.rng.integers(0, 256, 32, np.uint8).tobytes()
            if k in self.expected:
                continue
            if part is not None and partitioners.murmur2_partition(k, self.partitions) != part:
                continue
            out.append(k)
        return out

    def batch(self, n_new: int = 12, n_update: int = 4, n_delete: int = 4, n_twice: int = 2):
        """One batch: new ADDs, re-ADDs with a new value, DELETEs (of live and deleted keys),
        and keys that appear twice in the batch (ADD then DELETE, DELETE then ADD).
        Returns (keys (n, 32) uint8, actions, values) and applies it to the model."""
        with self.lock:
            if registry.get(self.fmt).by_message:  # v1: a message is keyed by its first key
                part = self.next_part
                self.next_part = (self.next_part + 1) % self.partitions
            else:
                part = None
            group = self.live[part]
            entries: list[tuple[bytes, int, bytes]] = []
            for k in self._new_keys(n_new, part):
                entries.append((k, ADD, self._value()))
            if group:
                for i in self.rng.integers(0, len(group), n_update):
                    entries.append((group[int(i)], ADD, self._value()))
                for i in self.rng.integers(0, len(group), n_delete):
                    entries.append((group[int(i)], DELETE, b""))
                for j, i in enumerate(self.rng.integers(0, len(group), n_twice)):
                    k = group[int(i)]
                    if j % 2:
                        entries += [(k, ADD, self._value()), (k, DELETE, b"")]
                    else:
                        entries += [(k, DELETE, b""), (k, ADD, self._value())]
            order = self.rng.permutation(len(entries) - 1) + 1 if len(entries) > 1 else []
            # shuffled (the model applies the order sent); entry 0, a new key of `part`, stays
            # first: the v1 producer keys the message by it
            entries = [entries[0]] + [entries[int(i)] for i in order]
            self.entries += len(entries)
            for k, a, v in entries:
                if k not in self.expected:
                    group.append(k)
                self.expected[k] = v if a == ADD else None
            keys = np.frombuffer(b"".join(k for k, _, _ in entries), np.uint8).reshape(-1, 32)
            actions = np.array([a for _, a, _ in entries], np.uint8)
            values = [v for _, _, v in entries]
            return keys, actions, values

    def snapshot(self) -> dict[bytes, bytes | None]:
        with self.lock:
            return dict(self.expected)


class StreamProducer(threading.Thread):
    """Produces Model batches until stopped; `rate` batches per second (roughly)."""

    def __init__(self, bootstrap: str, topic: str, model: Model, *, rate: float = 20.0,
                 batch_kw: dict | None = None, max_batches: int | None = None):
        super().__init__(daemon=True, name=f"producer-{topic}")
        # each test's topic is its own: the producer accounts for every message (sole_writer)
        self.producer = TxmetaProducer(bootstrap, topic, format=model.fmt, sole_writer=True)
        self.model = model
        self.rate = rate
        self.batch_kw = batch_kw or {}
        self.max_batches = max_batches
        self.stop_event = threading.Event()
        self.wake = threading.Event()
        self.extra = 0  # batches asked for by burst(), sent at once
        self.extra_lock = threading.Lock()
        self.batches = 0
        self.error: BaseException | None = None

    def burst(self, n: int, timeout: float = 30.0) -> None:
        """Send n more batches at once, from this thread: a second producer running at the
        same time would make the order on the topic differ from the model's."""
        with self.extra_lock:
            target = self.batches + n
            self.extra += n
        self.wake.set()
        poll_until(lambda: self.batches >= target or self.error is not None or not self.is_alive(), timeout,
                   f"a burst of {n} batches")

    def run(self) -> None:
        try:
            period = 1.0 / self.rate
            nxt = time.monotonic()
            while not self.stop_event.is_set():
                if self.max_batches is not None and self.batches >= self.max_batches:
                    break
                self.producer.send(*self.model.batch(**self.batch_kw))
                with self.extra_lock:
                    self.batches += 1
                    if self.extra:
                        self.extra -= 1
                        continue
                nxt = max(nxt + period, time.monotonic() - period)
                self.wake.wait(max(0.0, nxt - time.monotonic()))
                self.wake.clear()
            self.producer.flush(60)
        except BaseException as e:  # noqa: BLE001 - reported by finish()
            self.error = e
        finally:
            self.producer = None  # librdkafka handle goes now, not at interpreter exit

    def finish(self, timeout: float = 90.0) -> None:
        """Stop producing (or, with max_batches, let it send them all), wait for every message
        to be acknowledged; raise what went wrong."""
        if self.max_batches is None:
            self.stop_event.set()
            self.wake.set()
        self.join(timeout)
        assert not self.is_alive(), "producer thread did not finish"
        if self.error is not None:
            raise self.error


# -- Kafka probes ---------------------------------------------------------------------------------

class KafkaProbe:
    """Reads end offsets and a group's committed offsets (never joins the group)."""

    def __init__(self, bootstrap: str, topic: str, partitions: int, group: str | None = None):
        from confluent_kafka import Consumer

        self.topic = topic
        self.partitions = partitions
        self.consumer = Consumer({"bootstrap.servers": bootstrap,
                                  "group.id": group or f"t-probe-{uuid.uuid4().hex[:8]}",
                                  "enable.auto.commit": False})

    def end_offsets(self) -> list[int]:
        from confluent_kafka import TopicPartition

        return [self.consumer.get_watermark_offsets(TopicPartition(self.topic, p), timeout=10)[1]
                for p in range(self.partitions)]

    def committed(self) -> list[int]:
        """The group's committed offset per partition; negative if none."""
        from confluent_kafka import TopicPartition

        tps = self.consumer.committed([TopicPartition(self.topic, p) for p in range(self.partitions)], timeout=10)
        return [tp.offset for tp in sorted(tps, key=lambda t: t.partition)]

    def close(self) -> None:
        self.consumer.close()


def produce_and_wait(harness, topic: str, model: "Model", partitions: int, **kw) -> list[int]:
    """Run a producer of `model` batches to its end (`max_batches` in kw) and return the
    topic's end offsets then, per partition."""
    prod = harness.producer(topic, model, **kw)
    prod.start()
    prod.finish()
    probe = KafkaProbe(harness.bootstrap, topic, partitions)
    try:
        return probe.end_offsets()
    finally:
        probe.close()


def produce_entries(bootstrap: str, topic: str, counts: dict[int, int], rng,
                    timestamp_ms: int = 0) -> dict[bytes, bytes]:
    """One-entry v1 messages (ADD of a new random key), counts[p] of them to partition p,
    with that Kafka timestamp (CreateTime, unix ms; 0: now); returns {key: value} sent, once
    every message is acknowledged."""
    from confluent_kafka import Producer

    prod = Producer({"bootstrap.servers": bootstrap, "linger.ms": 5})
    sent = {}
    for p, n in counts.items():
        for _ in range(n):
            key, value = rng.bytes(32), rng.bytes(80)
            prod.produce(topic, wire.encode_v1([key], [ADD], [value]), partition=p, timestamp=timestamp_ms)
            sent[key] = value
    assert prod.flush(30) == 0
    return sent


def check_table(r, expected: dict[bytes, bytes | None]) -> None:
    """Every key: present with exactly its value, or absent."""
    keys = list(expected)
    got = []
    for i in range(0, len(keys), 20000):
        got += r.get_many(keys[i:i + 20000])
    wrong = [(k, expected[k], g) for k, g in zip(keys, got) if g != expected[k]]
    if wrong:
        missing = sum(1 for _, e, g in wrong if g is None)
        stale = sum(1 for _, e, g in wrong if e is None)
        ex = [(k.hex()[:16], None if e is None else e.hex()[:16], None if g is None else g.hex()[:16])
              for k, e, g in wrong[:5]]
        raise AssertionError(f"{len(wrong)} of {len(keys)} keys wrong ({missing} missing, {stale} should be "
                             f"absent, rest wrong value); examples (key, want, got): {ex}")
    assert r.stats()["evictions"] == 0  # the model assumes nothing was evicted


def replay_topic(bootstrap: str, topic: str, upto: list[int], fmt: str) -> dict[bytes, bytes | None]:
    """The table that applying partition p's messages [0, upto[p]) in order gives, from the topic itself."""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"t-replay-{uuid.uuid4().hex[:8]}",
                  "enable.auto.commit": False, "enable.partition.eof": False})
    want = {p: o for p, o in enumerate(upto) if o > 0}
    c.assign([TopicPartition(topic, p, 0) for p in want])
    table: dict[bytes, bytes | None] = {}
    pos = {p: 0 for p in want}
    wf, scratch = registry.get(fmt), wire_batch.Scratch()  # the format's own decoder (formats/registry.py)
    deadline = time.monotonic() + 60
    try:
        while any(pos[p] < want[p] for p in want):
            assert time.monotonic() < deadline, f"replay stuck at {pos}, want {want}"
            for m in c.consume(500, timeout=0.5):
                assert m.error() is None, m.error()
                p, o = m.partition(), m.offset()
                if o >= want[p]:
                    continue
                assert o == pos[p], f"partition {p}: expected offset {pos[p]}, got {o}"
                pos[p] = o + 1
                d = wf.decode([m.value()], [m.key()], key_size=wire.KEY_SIZE, max_value=wire.MAX_VALUE,
                              scratch=scratch)
                assert not d.malformed, f"{fmt} message at {p}/{o}: {d.malformed}"
                for b in d.batches:
                    for i in range(len(b)):
                        k = b.keys[i].tobytes()
                        table[k] = b.value(i) if b.actions[i] == ADD else None
    finally:
        c.close()
    return table
