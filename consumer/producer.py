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
key's ADD and DELETE in one batch, or build each batch for one partition from
keys that belong there (consumer/loadgen.py does), or accept it (Teranode's
validator does).

On backpressure (the local queue full) the producer waits, never drops. Every
delivery report is checked: `flush()` raises if any message failed, and for v1
each v1 or kv message's partition is compared with the one murmur2 gives its
key (`misrouted`), so a client whose partitioner disagrees is caught, not trusted.
"""

from __future__ import annotations

import numpy as np

from shmcache.consumer import broker, partitioners, wire
from shmcache.consumer.config import FORMATS
from shmcache.errors import BrokerUnavailableError, KafkaRequestError

BROKER_WAIT_S = 15.0  # for the topic's metadata, asked once as the producer starts


class TxmetaProducer:
    def __init__(self, bootstrap: str, topic: str, *, format: str = "v1", settings: dict | None = None,
                 broker_wait: float = BROKER_WAIT_S):
        """`broker_wait`: seconds for the topic's metadata, the broker's first answer; past it,
        BrokerUnavailableError."""
        from confluent_kafka import KafkaException, Producer

        if format not in FORMATS:
            raise ValueError(f"format={format!r}: expected one of {', '.join(FORMATS)}")
        self.topic = topic
        self.format = format
        conf = {
            "bootstrap.servers": bootstrap,
            "partitioner": "murmur2_random",
            "linger.ms": 5,
            "enable.idempotence": True,  # retries keep per-partition order
            "compression.type": "lz4",
        }
        conf.update(broker.client_settings())  # librdkafka's log and errors to the shmcache.kafka logger
        conf["log_level"] = 2  # critical only: an absent broker is said once, below
        conf.update(settings or {})
        self._p = Producer(conf)
        self._bootstrap, self._conf = bootstrap, conf  # an AdminClient's too, should the ends be asked (_ask_ends)
        self._errors: list[str] = []
        self._untold: set[int] = set()  # partitions with a message acknowledged without its offset
        try:
            meta = self._p.list_topics(topic, timeout=broker_wait)
        except KafkaException as e:
            raise BrokerUnavailableError(f"no Kafka broker answered at {bootstrap} within {broker_wait:g} s "
                                         f"({broker.error_text(e)})") from None
        t = meta.topics.get(topic)
        if t is None or t.error is not None:
            raise ValueError(f"topic {topic!r} not found on {bootstrap}")
        self.partitions = len(t.partitions)
        if format == "v2" and wire.V2_BUCKETS % self.partitions:
            raise ValueError(f"topic {topic!r} has {self.partitions} partitions; v2 needs a divisor of {wire.V2_BUCKETS}")
        self.sent_messages = 0
        self.delivered_messages = 0  # acknowledged by the broker
        self.misrouted = 0  # v1/kv messages acknowledged on another partition than murmur2(key) gives
        self.end_offsets: dict[int, int] = {}  # partition -> highest acknowledged offset + 1

    def delivered(self, err, msg, expect: int | None = None) -> None:
        """A delivery report (librdkafka's on_delivery, served by poll and flush): `msg` was
        acknowledged (err None) or failed; `expect` the partition murmur2 gives its key. Never
        raises: confluent-kafka 2.16 on Python < 3.12 turns an error raised by C code inside a
        callback (a TypeError, say) into a SystemError out of flush() that names nothing
        (seen: "exception <class 'str'> is not a BaseException subclass"); it is a failed
        delivery report here, raised by flush() with its own words."""
        try:
            self._report(err, msg, expect)
        except Exception as e:  # noqa: BLE001 - see above
            self._errors.append(f"{self.topic}: a delivery report could not be read: {e!r}")

    def _report(self, err, msg, expect: int | None) -> None:
        if err is not None:
            self._errors.append(f"{msg.topic()} [{msg.partition()}]: {err}")
            return
        self.delivered_messages += 1
        p, offset = msg.partition(), msg.offset()
        if offset is None:  # acknowledged without its offset (librdkafka: an idempotent retry the broker had)
            self._untold.add(p)
        else:
            self.end_offsets[p] = max(self.end_offsets.get(p, 0), offset + 1)
        if expect is not None and p != expect:
            self.misrouted += 1
            self._errors.append(f"{msg.topic()} [{p}] @ {offset}: keyed for partition {expect} by murmur2")

    def _produce(self, value, key=None, partition=None, expect=None) -> None:
        produce_waiting(self._p, self.topic, value, key, partition,
                        lambda err, msg: self.delivered(err, msg, expect))
        self._p.poll(0)
        self.sent_messages += 1

    def send(self, keys: np.ndarray, actions: np.ndarray, values) -> None:
        """Send one batch: keys (n, 32) uint8, actions ADD/DELETE, values as for wire.encode_v1."""
        keys = np.ascontiguousarray(keys, np.uint8)
        actions = np.asarray(actions, np.uint8)
        if len(keys) == 0:
            return
        if self.format == "v1":
            key = keys[0].tobytes()
            self._produce(wire.encode_v1(keys, actions, values), key=key,
                          expect=partitioners.murmur2_partition(key, self.partitions))
        elif self.format == "v2":
            parts = partitioners.v2_partition(wire.xxh64_keys(keys), self.partitions)
            offsets, data = _as_offsets(values, len(keys))
            for p in np.unique(parts).tolist():
                idx = np.flatnonzero(parts == p)  # keeps wire order within the partition
                self._produce(wire.encode_v2(keys[idx], actions[idx], take(offsets, data, idx)), partition=p)
        else:
            offsets, data = _as_offsets(values, len(keys))
            expect = partitioners.murmur2_partitions(keys, self.partitions).tolist()
            deletes = (actions == wire.DELETE).tolist()
            buf, o = data.tobytes(), offsets.tolist()  # slicing bytes, not numpy, per entry
            for i in range(len(keys)):
                value = None if deletes[i] else buf[o[i]:o[i + 1]]
                self._produce(value, key=keys[i].tobytes(), expect=expect[i])

    def poll(self, timeout: float = 0.0) -> None:
        """Serve delivery reports for up to `timeout` seconds (e.g. while pacing)."""
        self._p.poll(timeout)

    def check(self) -> None:
        """Raise now if any delivery failed (rather than at the end)."""
        if self._errors:
            raise KafkaRequestError(f"{len(self._errors)} messages to {self.topic!r} failed: {self._errors[:3]}")

    def flush(self, timeout: float = 60.0) -> None:
        """Wait until everything sent is acknowledged; raise if anything failed. A partition
        with a message acknowledged without its offset gets the broker's high watermark as
        its end (the end of what this producer sent there, or beyond, with other producers)."""
        left = self._p.flush(timeout)
        if left:
            raise TimeoutError(f"{left} messages to {self.topic!r} not delivered after {timeout:.0f} s")
        self.check()
        if self._untold:
            self._ask_ends(timeout)

    def _ask_ends(self, timeout: float) -> None:
        from confluent_kafka import TopicPartition
        from confluent_kafka.admin import OffsetSpec

        parts = sorted(self._untold)
        admin = broker.quiet_admin(self._bootstrap, self._conf)
        futures = admin.list_offsets({TopicPartition(self.topic, p): OffsetSpec.latest() for p in parts},
                                     request_timeout=timeout)
        for tp, fut in futures.items():
            hi = fut.result(timeout).offset
            if hi < 0:  # librdkafka's -1001: the request timed out
                raise TimeoutError(f"{self.topic!r} [{tp.partition}]: no end offset from the broker in {timeout:.0f} s")
            self.end_offsets[tp.partition] = max(self.end_offsets.get(tp.partition, 0), hi)
        self._untold.clear()


def produce_waiting(producer, topic: str, value, key, partition, on_delivery, stop=None) -> None:
    """producer.produce(), waiting while librdkafka's local queue is full (BufferError: serve
    delivery reports, retry); never drops. `stop()` true while waiting: RuntimeError."""
    kw = {"on_delivery": on_delivery}
    if partition is not None:
        kw["partition"] = int(partition)
    while True:
        try:
            producer.produce(topic, value, key, **kw)
            return
        except BufferError:  # local queue full: wait for deliveries, then retry
            producer.poll(0.05)
            if stop is not None and stop():
                raise RuntimeError("stopped while the local queue was full")


def take(offsets: np.ndarray, data: np.ndarray, idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Values idx[0], idx[1], ... of (offsets, data) as a new (offsets, data) pair,
    gathered with array operations (no per-value Python objects)."""
    offsets = np.asarray(offsets, np.int64)
    idx = np.asarray(idx, np.int64)
    starts = offsets[idx]
    lens = offsets[idx + 1] - starts
    out = np.zeros(len(idx) + 1, np.int64)
    np.cumsum(lens, out=out[1:])
    # byte j of the result comes from data[starts[i] + (j - out[i])] for the value i holding j
    src = np.repeat(starts - out[:-1], lens) + np.arange(out[-1], dtype=np.int64)
    return out, np.asarray(data, np.uint8)[src]


def _as_offsets(values, n: int) -> tuple[np.ndarray, np.ndarray]:
    if isinstance(values, tuple):
        return np.asarray(values[0], np.int64), np.asarray(values[1], np.uint8)
    values = [b"" if v is None else v for v in values]
    lens = np.fromiter(map(len, values), np.int64, n)
    offsets = np.zeros(n + 1, np.int64)
    np.cumsum(lens, out=offsets[1:])
    return offsets, np.frombuffer(b"".join(values), np.uint8)
