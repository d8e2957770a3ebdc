"""The topics of bench/test_consume.py: the same N entries in each wire format.

Entries come from one seeded generator, chunk by chunk, so every format carries the
same keys and values in the same order: random 32-byte tx hashes, random 61-141-byte
values, all ADD. Per format, as its producers send it (produce/producer.py):
- v1: messages of BATCH entries keyed by their first hash, placed by murmur2_random;
- v2: each entry to `partitioners.v2_partition(xxh64)`, so every partition owns a
  range of the table's buckets; within a partition, in generation order, messages of
  up to BATCH entries (the producer's own `send` splits each batch per partition; fed
  batches of PARTITIONS * BATCH entries its messages would average BATCH / 1 too, but
  pre-encoding keeps the encoding out of the produce time);
- kv: one message per entry, Kafka key = the hash (murmur2_random), value = the value;
- proto: one KafkaTxMetaTopicMessage per entry (formats/proto.py, raw txHash, written by
  the protobuf library), Kafka key = the hash (murmur2_random), as the load generator sends it.
Messages go out uncompressed (random bytes do not compress). v1 and v2 are encoded
before producing starts; kv is sliced as it is produced, proto encoded a chunk at a time.
"""

from __future__ import annotations

import sys
import time
import uuid
from dataclasses import dataclass, field

import numpy as np

from shmcache.formats import partitioners, proto, wire

BATCH = 1024  # entries per v1/v2 message
SAMPLE = 10_000  # keys read back per run
SEED = 20240612
VALUE_MIN, VALUE_MAX = 61, 141  # inclusive, Teranode txmeta sizes (as tests/lib/shmtest/bench/peers.py)
CHUNK = 64 * BATCH


@dataclass
class Topic:
    name: str
    fmt: str
    n: int
    messages: int
    high: dict[int, int]  # partition -> high watermark (low is 0: a fresh topic)
    sample_keys: np.ndarray  # (k, 32) uint8
    sample_offsets: np.ndarray  # (k + 1,) int64
    sample_data: np.ndarray  # uint8
    sample_list: list[bytes] = field(default_factory=list)  # the sampled keys as bytes
    sample_values: list[bytes] = field(default_factory=list)
    meta: dict = field(default_factory=dict)  # bytes, encode and produce seconds


def chunks(n: int, seed: int = SEED):
    """(first index, keys (m, 32), offsets (m + 1,), data) for the N entries, CHUNK at a time."""
    rng = np.random.default_rng(seed)
    for c0 in range(0, n, CHUNK):
        m = min(CHUNK, n - c0)
        keys = np.frombuffer(rng.bytes(m * wire.KEY_SIZE), np.uint8).reshape(m, wire.KEY_SIZE)
        offsets = np.zeros(m + 1, np.int64)
        np.cumsum(rng.integers(VALUE_MIN, VALUE_MAX + 1, m), out=offsets[1:])
        data = np.frombuffer(rng.bytes(int(offsets[-1])), np.uint8)
        yield c0, keys, offsets, data


def messages_of(fmt: str, keys, offsets, data, partitions: int):
    """(key, value, partition) of one chunk's v1 or v2 messages."""
    actions = np.zeros(BATCH, np.uint8)  # all ADD
    m = len(keys)
    if fmt == "v1":
        for s in range(0, m, BATCH):
            e = min(s + BATCH, m)
            yield keys[s].tobytes(), wire.encode_v1(keys[s:e], actions[: e - s],
                                                    (offsets[s:e + 1] - offsets[s], data[offsets[s]:offsets[e]])), None
        return
    parts = partitioners.v2_partition(wire.xxh64_keys(keys), partitions)
    for p in range(partitions):
        idx = np.flatnonzero(parts == p)  # generation order within the partition
        for s in range(0, len(idx), BATCH):
            sel = idx[s:s + BATCH]
            starts, ends = offsets[sel], offsets[sel + 1]
            vals = [data[a:b] for a, b in zip(starts.tolist(), ends.tolist())]
            voff = np.zeros(len(sel) + 1, np.int64)
            np.cumsum(ends - starts, out=voff[1:])
            yield None, wire.encode_v2(keys[sel], actions[: len(sel)], (voff, np.concatenate(vals))), p


def produce_topic(bootstrap: str, name: str, fmt: str, n: int, partitions: int, timeout: float) -> Topic:
    """Generate, encode, produce and flush the N entries in format `fmt` to the (new,
    empty) topic `name`; read back the high watermarks."""
    from confluent_kafka import Consumer, Producer, TopicPartition

    rng = np.random.default_rng(SEED + 1)
    sample = np.sort(rng.choice(n, min(SAMPLE, n), replace=False))
    skeys, svals, messages = [], [], []
    topic_bytes = 0
    errors: list[str] = []

    def on_delivery(err, msg):
        if err is not None:
            errors.append(f"[{msg.partition()}]: {err}")

    # TxmetaProducer's settings, without compression (random bytes do not compress)
    p = Producer({"bootstrap.servers": bootstrap, "partitioner": "murmur2_random", "linger.ms": 5,
                  "enable.idempotence": True, "compression.type": "none"})

    def send(p, value, key, part) -> None:
        kw = {"on_delivery": on_delivery} if part is None else {"on_delivery": on_delivery, "partition": part}
        while True:
            try:
                p.produce(name, value, key, **kw)
                break
            except BufferError:  # local queue full: let deliveries drain
                p.poll(0.05)
        p.poll(0)

    t0 = time.perf_counter()
    encode_s = 0.0
    nmsg = 0
    for c0, keys, offsets, data in chunks(n):
        for i in (sample[(sample >= c0) & (sample < c0 + len(keys))] - c0).tolist():
            skeys.append(keys[i].tobytes())
            svals.append(data[offsets[i]:offsets[i + 1]].tobytes())
        if fmt == "kv":  # one message per entry, sliced as it goes out
            buf, o = data.tobytes(), offsets.tolist()
            for i in range(len(keys)):
                send(p, buf[o[i]:o[i + 1]], keys[i].tobytes(), None)
            topic_bytes += len(buf) + keys.size
            nmsg += len(keys)
        elif fmt == "proto":  # one message per entry, a chunk encoded at a time (the encoding is timed apart)
            t_enc = time.perf_counter()
            values = proto.encode(keys, np.zeros(len(keys), np.uint8), (offsets, data))
            encode_s += time.perf_counter() - t_enc
            flat = keys.tobytes()
            for i, v in enumerate(values):
                send(p, v, flat[i * wire.KEY_SIZE:(i + 1) * wire.KEY_SIZE], None)
            topic_bytes += sum(map(len, values)) + keys.size
            nmsg += len(keys)
        else:
            messages.extend(messages_of(fmt, keys, offsets, data, partitions))
    if fmt not in ("kv", "proto"):
        encode_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        for key, value, part in messages:
            send(p, value, key, part)
        topic_bytes = sum(len(v) for _, v, _ in messages)
        nmsg = len(messages)
        del messages
    left = p.flush(timeout)
    del p  # the producer and its connections go now, not at the broker's stop
    produce_s = time.perf_counter() - t0 - (encode_s if fmt == "proto" else 0.0)
    assert left == 0 and not errors, f"{left} messages not delivered; errors: {errors[:3]}"

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-consume-probe-{uuid.uuid4().hex[:8]}"})
    try:
        high = {}
        for part in range(partitions):
            lo, hi = c.get_watermark_offsets(TopicPartition(name, part), timeout=15)
            assert lo == 0
            high[part] = hi
    finally:
        c.close()
    assert sum(high.values()) == nmsg, (high, nmsg)

    offs = np.zeros(len(svals) + 1, np.int64)
    np.cumsum([len(v) for v in svals], out=offs[1:])
    print(f"\nproduced {n:,} entries in {nmsg:,} {fmt} messages ({topic_bytes / 1e6:.0f} MB) to {name}: "
          f"{encode_s:.1f} s encoding, {produce_s:.1f} s producing; per partition {high}", file=sys.stderr)
    return Topic(name, fmt, n, nmsg, high,
                 np.frombuffer(b"".join(skeys), np.uint8).reshape(len(skeys), wire.KEY_SIZE),
                 offs, np.frombuffer(b"".join(svals), np.uint8), skeys, svals,
                 meta=dict(messages=nmsg, topic_mb=topic_bytes / 1e6, bytes_per_entry=topic_bytes / n,
                           encode_s=encode_s, produce_s=produce_s, per_partition=high))

