"""Producing txmeta batches the way the consumers expect them (DESIGN invariant 2).

- v1: one message per batch, keyed by the batch's first tx hash, partitioned with
  `partitioner=murmur2_random` (the Java and Go clients' choice, so every client
  agrees where a key goes); keys spread evenly because tx hashes are random.
- v2: a batch is split by bucket range, one message per partition, each sent to
  its partition explicitly: partition p holds buckets [p*8192/P, (p+1)*8192/P).
- kv: one message per entry, Kafka key = cache key, value None = delete.
- proto: one KafkaTxMetaTopicMessage per entry (formats/proto.py), its txHash raw or hex
  (`proto_hash`), keyed by that txHash as sent (as Teranode's hex releases key it), so
  murmur2 sends a hash's DELETE where its ADD went.

The same key always lands in the same partition only for v2, kv and proto; v1 keys by
the batch's first hash, so a later batch can carry the key elsewhere. Order per
key across partitions is then not guaranteed: the producer of v1 must send a
key's ADD and DELETE in one batch, or build each batch for one partition from
keys that belong there (produce/loadgen.py does), or accept it (Teranode's
validator does).

On backpressure (the local queue full) the producer waits, never drops. Every
delivery report is checked: `flush()` raises if any message failed, and for v1
each v1, kv or proto message's partition is compared with the one murmur2 gives its
key (`misrouted`), so a client whose partitioner disagrees is caught, not trusted.

An acknowledgement is not proof that a message is in the topic. librdkafka acknowledges
some messages without an offset: a retry the broker already had (a duplicate), and also
messages it never wrote, when a later request of their partition succeeded after theirs
was refused (its "implicit ack"; kafka/topics.py says when that happens). `flush()`
checks what it cannot otherwise trust, and raises KafkaRequestError naming the partition:
- with `sole_writer` (nobody else writes to the topic meanwhile: a topic the caller just
  made), every partition must have grown by exactly the messages acknowledged there;
- otherwise each message acknowledged without an offset is looked for in its partition,
  between the end it had when the producer started and its end now.
"""

from __future__ import annotations

from collections import Counter, defaultdict

import numpy as np
import xxhash

from shmcache.kafka import client as kafka_client
from shmcache.kafka import topics
from shmcache.formats import proto
from shmcache.formats import registry as wire_formats
from shmcache.formats.registry import as_offsets
from shmcache.errors import BrokerUnavailableError, KafkaRequestError

BROKER_WAIT_S = 15.0  # for the topic's metadata, asked once as the producer starts


class TxmetaProducer:
    def __init__(self, bootstrap: str, topic: str, *, format: str = "v1", settings: dict | None = None,
                 broker_wait: float = BROKER_WAIT_S, sole_writer: bool = False, proto_hash: str = "raw"):
        """`broker_wait`: seconds for the topic's metadata and its partitions' end offsets, the
        broker's first answers; past it, BrokerUnavailableError. `sole_writer`: nothing else
        writes to the topic while this producer does (flush() then accounts for every message).
        `proto_hash`: how the proto format writes txHash, "raw" (32 bytes) or "hex"."""
        from confluent_kafka import KafkaException, Producer

        self.wire = wire_formats.get(format)
        if proto_hash not in proto.HASH_FORMS:
            raise ValueError(f"proto_hash={proto_hash!r}: expected one of {', '.join(proto.HASH_FORMS)}")
        self.wire.require()  # ImportError now, saying what to install, not at the first send
        self.topic = topic
        self.format = format
        self.proto_hash = proto_hash
        conf = {
            "bootstrap.servers": bootstrap,
            "partitioner": "murmur2_random",
            "linger.ms": 5,
            "enable.idempotence": True,  # retries keep per-partition order
            "compression.type": "lz4",
        }
        conf.update(kafka_client.client_settings())  # librdkafka's log and errors to the shmcache.kafka logger
        conf["log_level"] = 2  # critical only: an absent broker is said once, below
        conf.update(settings or {})
        self._p = Producer(conf)
        self._bootstrap, self._conf = bootstrap, conf  # an AdminClient's and a consumer's too (_ends, read_digests)
        self._errors: list[str] = []
        self._untold: dict[int, list[int]] = defaultdict(list)  # partition -> digests of messages acked without offset
        self._acked: Counter[int] = Counter()  # partition -> messages acknowledged there
        self.sole_writer = sole_writer
        try:
            meta = self._p.list_topics(topic, timeout=broker_wait)
        except KafkaException as e:
            raise BrokerUnavailableError(f"no Kafka broker answered at {bootstrap} within {broker_wait:g} s "
                                         f"({kafka_client.error_text(e)})") from None
        t = meta.topics.get(topic)
        if t is None or t.error is not None:
            raise ValueError(f"topic {topic!r} not found on {bootstrap}")
        self.partitions = len(t.partitions)
        try:
            self.wire.check_topic(self.partitions)
        except ValueError as e:
            raise ValueError(f"topic {topic!r}: {e}") from None
        self.sent_messages = 0
        self.delivered_messages = 0  # acknowledged with their offset, or found in the topic by flush()
        self.misrouted = 0  # v1/kv/proto messages acknowledged on another partition than murmur2(key) gives
        self.end_offsets: dict[int, int] = {}  # partition -> highest acknowledged offset + 1
        # where this producer's messages begin; -2 (the log's start) where the leader did not say
        self.start_offsets = self._ends(range(self.partitions), broker_wait, strict=sole_writer)

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
        p, offset = msg.partition(), msg.offset()
        self._acked[p] += 1
        if offset is None:  # a duplicate the broker had, or one it never wrote: checked by flush()
            self._untold[p].append(_digest(msg.key(), msg.value()))
        else:
            self.delivered_messages += 1
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
        offsets, data = as_offsets(values, len(keys))
        for m in self.wire.encode(keys, actions, offsets, data, self.partitions, self.proto_hash):
            self._produce(m.value, key=m.key, partition=m.partition, expect=m.expect)

    def poll(self, timeout: float = 0.0) -> None:
        """Serve delivery reports for up to `timeout` seconds (e.g. while pacing)."""
        self._p.poll(timeout)

    def check(self) -> None:
        """Raise now if any delivery failed (rather than at the end)."""
        if self._errors:
            raise KafkaRequestError(f"{len(self._errors)} messages to {self.topic!r} failed: {self._errors[:3]}")

    def flush(self, timeout: float = 60.0) -> None:
        """Wait until everything sent is acknowledged; raise if anything failed, or if a message
        acknowledged is not in the topic (see the module's docstring). A partition with a
        message acknowledged without its offset gets the broker's end offset as its end."""
        left = self._p.flush(timeout)
        if left:
            raise TimeoutError(f"{left} messages to {self.topic!r} not delivered after {timeout:.0f} s")
        self.check()
        asked = range(self.partitions) if self.sole_writer else sorted(self._untold)
        if not asked:
            return
        ends = self._ends(asked, timeout)
        lost = self._count_check(ends) if self.sole_writer else self._look_for_untold(ends, timeout)
        if lost:
            raise KafkaRequestError(f"{self.topic!r} does not hold what the broker acknowledged in {len(lost)} "
                                    f"partitions (librdkafka acknowledges some messages it never wrote, without "
                                    f"an offset): {'; '.join(lost[:5])}")
        for p in self._untold:
            self.end_offsets[p] = ends[p]
            self.delivered_messages += len(self._untold[p])
        self._untold.clear()

    def _ends(self, parts, timeout: float, strict: bool = True) -> dict[int, int]:
        """The partitions' end offsets, each leader asked again until it answers or `timeout`
        passes (BrokerUnavailableError naming the silent ones); not `strict`: asked once, -2
        for a partition whose leader did not answer."""
        admin = kafka_client.quiet_admin(self._bootstrap, self._conf)
        if not strict:
            ends = topics.end_offsets(admin, self.topic, parts, timeout)
            return {p: -2 if isinstance(e, str) else e for p, e in ends.items()}
        try:  # asked again while a leader's answer is an error (one just thawed: its epoch not yet known)
            return topics.wait_answering(admin, self.topic, parts, timeout)
        except TimeoutError as e:
            raise BrokerUnavailableError(f"{self.topic!r}: no end offset from the broker at {self._bootstrap}: {e}") \
                from None

    def _count_check(self, ends: dict[int, int]) -> list[str]:
        """As the sole writer: each partition grew by exactly the messages acknowledged there."""
        lost = []
        for p, end in ends.items():
            start, acked = self.start_offsets[p], self._acked[p]
            if end - start != acked:
                lost.append(f"[{p}] {acked} acknowledged, but it grew by {end - start} ({start} -> {end})")
        return lost

    def _look_for_untold(self, ends: dict[int, int], timeout: float) -> list[str]:
        """Each message acknowledged without an offset is in its partition, read back from the
        end it had when this producer started to its end now."""
        found = read_digests(self._bootstrap, self._conf, self.topic,
                             {p: (self.start_offsets[p], ends[p]) for p in self._untold}, timeout)
        lost = []
        for p, digests in self._untold.items():
            missing = sum(1 for d in digests if d not in found[p])
            if missing:
                lost.append(f"[{p}] {missing} of {len(digests)} acknowledged without an offset are not in "
                            f"offsets {self.start_offsets[p]}..{ends[p]}")
        return lost


def _digest(key, value) -> int:
    """What tells a message from the others of its partition: its key and value."""
    h = xxhash.xxh64()
    for part in (key, value):
        h.update(b"\x00" if part is None else b"\x01%d:" % len(part))
        h.update(part or b"")
    return h.intdigest()


def read_digests(bootstrap: str, conf: dict, topic: str, ranges: dict[int, tuple[int, int]],
                 timeout: float) -> dict[int, set[int]]:
    """The digests (_digest) of partition p's messages at offsets [start, end) for each
    p: (start, end) of `ranges`, read with a consumer of no group; TimeoutError past `timeout`."""
    import time

    from confluent_kafka import Consumer, TopicPartition

    found: dict[int, set[int]] = {p: set() for p in ranges}
    todo = {p: r for p, r in ranges.items() if r[0] < r[1]}  # a start of -2: the log's start
    if not todo:
        return found
    c = Consumer({**kafka_client.connection_settings(conf), **kafka_client.client_settings(), "log_level": 2,
                  "bootstrap.servers": bootstrap, "group.id": "shmcache-producer-check",
                  "enable.auto.commit": False, "enable.partition.eof": False})
    deadline = time.monotonic() + timeout
    try:
        c.assign([TopicPartition(topic, p, start) for p, (start, _) in todo.items()])
        while todo:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{topic!r}: partitions {sorted(todo)} not read back within {timeout:.0f} s")
            for m in c.consume(500, timeout=0.5):
                p = m.partition()
                if m.error() is not None or p not in todo:
                    continue
                if m.offset() < todo[p][1]:
                    found[p].add(_digest(m.key(), m.value()))
                if m.offset() + 1 >= todo[p][1]:
                    del todo[p]
    finally:
        c.close()
    return found


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
