"""The wire formats a topic may hold, each one entry: what the worker decodes, what the
producer and the load generator send, how an entry finds its partition, its bytes on the
wire besides a value, its key rule, whether Spark writes it, and what it needs installed.

Every place that takes a format (the run's settings, the worker, the producer, the load
generator, Spark's publish, the command line) takes it from here, through `get`: a name
not here is a ValueError naming the formats there are, never a branch that falls into
another format's `else`. The order is the codes' the segment and a snapshot keep
(engine/control/layout.py WIRE_FORMATS, append only); a test holds the two equal.

A format's functions run over whole batches (numpy arrays in, the wire module's Batch out);
the only per-message objects are the messages themselves, as Kafka hands them over.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, NamedTuple

import numpy as np

from shmcache.engine.control.layout import WIRE_FORMATS
from shmcache.formats import partitioners, proto, wire, wire_batch

__all__ = ["WireFormat", "Decoded", "Message", "FORMATS", "NAMES", "SPARK", "get", "get_spark", "as_offsets", "take"]


class Decoded(NamedTuple):
    """What a batch of messages decodes to: batches to apply in order, and the messages that
    were malformed, (index among the messages, what was wrong), for a log line each."""

    batches: list
    malformed: list


class Message(NamedTuple):
    """A message to send: its value (None: a tombstone), its Kafka key, the partition it is
    sent to (None: the producer's partitioner picks, by the key) and the partition murmur2
    gives its key (checked against the one the broker acknowledges; None: not checked)."""

    value: bytes | None
    key: bytes | None
    partition: int | None
    expect: int | None


@dataclass(frozen=True)
class WireFormat:
    name: str
    about: str
    # the key size the format carries (the txmeta formats: 32-byte tx hashes); None: any, the cache's
    key_size: int | None
    keyed: bool  # the decoder needs the messages' Kafka keys (kv: the key is the cache's key)
    decode: Callable[..., Decoded]  # (values, keys, *, key_size, max_value, scratch) -> Decoded
    encode: Callable[..., list]  # (keys, actions, offsets, data, partitions, hash_form) -> [Message]
    partitions_of: Callable[..., np.ndarray]  # (keys, partitions, hash_form) -> each entry's partition
    overhead: Callable[[str], int]  # (hash_form) -> bytes on the wire an entry besides its value
    warm: Callable[..., list]  # (scratch) -> empty batches through each decode path (numba loads its kernels)
    check_topic: Callable[[int], None] = lambda partitions: None  # ValueError if a topic of so many cannot carry it
    require: Callable[[], None] = lambda: None  # ImportError, saying what to install, if what it needs is missing
    # a message's entries all go to its partition, the one its first entry's key gives (v1): a
    # DELETE reaches its ADD's partition only if a producer keeps a pool of keys a partition
    by_message: bool = False
    header: int = 0  # bytes a message besides its entries (the batched formats' count and magic)
    encode_message: Callable[..., bytes] | None = None  # batched formats: (keys, actions, values) -> one message
    preload: bool = False  # the fork server loads its kernels before any fork (consumer/worker/_preload.py)

    @property
    def batched(self) -> bool:
        """Many entries a message (and one decode a consume() batch, formats/wire_batch.py)."""
        return self.encode_message is not None

    @property
    def spark(self) -> bool:
        """Spark's publish and streaming write it (spark/publish.py): a batched format, a
        message at a time by encode_message."""
        return self.batched

    @property
    def code(self) -> int:
        """Its code in the segment's header and a snapshot's (0 is "unknown")."""
        return WIRE_FORMATS.index(self.name) + 1


def as_offsets(values, n: int) -> tuple[np.ndarray, np.ndarray]:
    """n values as (offsets, data), value i = data[offsets[i]:offsets[i + 1]]: given so, or as
    n bytes (None = empty)."""
    if isinstance(values, tuple):
        return np.asarray(values[0], np.int64), np.asarray(values[1], np.uint8)
    values = [b"" if v is None else v for v in values]
    lens = np.fromiter(map(len, values), np.int64, n)
    offsets = np.zeros(n + 1, np.int64)
    np.cumsum(lens, out=offsets[1:])
    return offsets, np.frombuffer(b"".join(values), np.uint8)


# -- decoding --------------------------------------------------------------------------------


def _decode_txmeta(values, keys, *, key_size, max_value, scratch) -> Decoded:
    """v1 and v2: the whole batch as one decode (formats/wire_batch.py); message by message
    when any is not clean, so that damage is found and told per message, and the entries
    before it in its message still applied."""
    batch = wire_batch.decode_many(values, scratch, max_value=max_value)
    if batch is not None:
        return Decoded([batch], [])
    batches, malformed = [], []
    for i, v in enumerate(values):
        b = wire.decode(v if v is not None else b"", max_value=max_value)
        if b.error is not None:
            malformed.append((i, f"{b.error}; applied the {len(b.actions)} entries before the damage"))
        batches.append(b)
    return Decoded(batches, malformed)


def _decode_kv(values, keys, *, key_size, max_value, scratch) -> Decoded:
    batch = wire.decode_kv(keys, values, key_size=key_size, max_value=max_value)
    return Decoded([batch], [(i, f"key of {len(keys[i] or b'')} bytes or value over {max_value} bytes; skipped")
                             for i in batch.skipped.tolist()])


def _decode_proto(values, keys, *, key_size, max_value, scratch) -> Decoded:
    batch, reasons = proto.decode_many(values, max_value=max_value)
    return Decoded([batch], [(i, f"{why}; skipped") for i, why in zip(batch.skipped.tolist(), reasons)])


# -- encoding --------------------------------------------------------------------------------


def _encode_v1(keys, actions, offsets, data, partitions, hash_form) -> list:
    """One message, keyed by its first key (where murmur2 sends it)."""
    key = keys[0].tobytes()
    return [Message(wire.encode_v1(keys, actions, (offsets, data)), key, None,
                    partitioners.murmur2_partition(key, partitions))]


def _encode_v2(keys, actions, offsets, data, partitions, hash_form) -> list:
    """A message a partition the entries go to, by their xxh64 bucket, in wire order."""
    parts = _partitions_v2(keys, partitions, hash_form)
    out = []
    for p in np.unique(parts).tolist():
        idx = np.flatnonzero(parts == p)
        out.append(Message(wire.encode_v2(keys[idx], actions[idx], take(offsets, data, idx)), None, p, None))
    return out


def _encode_kv(keys, actions, offsets, data, partitions, hash_form) -> list:
    """A message an entry: its key the Kafka key, its value the message's (a DELETE a tombstone)."""
    expect = _by_key(keys, partitions).tolist()
    deletes = (actions == wire.DELETE).tolist()
    buf, o = data.tobytes(), offsets.tolist()  # slicing bytes, not numpy, per entry
    return [Message(None if deletes[i] else buf[o[i]:o[i + 1]], keys[i].tobytes(), None, expect[i])
            for i in range(len(keys))]


def _encode_proto(keys, actions, offsets, data, partitions, hash_form) -> list:
    """A KafkaTxMetaTopicMessage an entry, keyed by its txHash as sent (raw or hex)."""
    fields = proto.hash_fields(keys, hash_form)
    expect = _by_key(fields, partitions).tolist()
    flat, width = fields.tobytes(), fields.shape[1]
    return [Message(msg, flat[i * width:(i + 1) * width], None, expect[i])
            for i, msg in enumerate(proto.encode(keys, actions, (offsets, data), form=hash_form))]


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


# -- partitions ------------------------------------------------------------------------------


def _partitions_v1(keys, partitions, hash_form) -> np.ndarray:
    """All of a message's entries go where its first key does."""
    return np.full(len(keys), partitioners.murmur2_partition(keys[0].tobytes(), partitions) if len(keys) else 0,
                   np.int32)


def _partitions_v2(keys, partitions, hash_form) -> np.ndarray:
    return partitioners.v2_partition(wire.xxh64_keys(keys), partitions).astype(np.int32)


def _by_key(rows, partitions) -> np.ndarray:
    """The partition the producer's partitioner gives a message of each Kafka key (a row)."""
    return partitioners.murmur2_partitions(rows, partitions).astype(np.int32)


def _partitions_kv(keys, partitions, hash_form) -> np.ndarray:
    return _by_key(keys, partitions)


def _partitions_proto(keys, partitions, hash_form) -> np.ndarray:  # keyed by the txHash as sent
    return _by_key(proto.hash_fields(keys, hash_form), partitions)


# -- what else a format asks ------------------------------------------------------------------


def _warm_txmeta(scratch) -> list:
    """The batch path and the message-by-message path a damaged batch takes (count 0)."""
    return [wire_batch.decode_many([bytes(4)], scratch), wire.decode(bytes(4))]


def _warm_kv(scratch) -> list:
    return [wire.decode_kv([], [])]


def _warm_proto(scratch) -> list:  # its batches have kv's array types: the same apply kernel
    return [proto.decode_many([])[0]]


def _v2_topic(partitions: int) -> None:
    if wire.V2_BUCKETS % partitions:
        raise ValueError(f"the topic has {partitions} partitions; v2 needs a divisor of {wire.V2_BUCKETS}")


def _protobuf() -> None:
    if not proto.available():
        raise ImportError("format='proto': the protobuf package is not installed (pip install 'shmcache[kafka]')")


# -- the formats -----------------------------------------------------------------------------

# proto's bytes besides a value: its message key (the txHash as sent), the txHash field, and the
# framing (txHash's tag and length; content's tag and length, 2 B for values of 128 B..16 KiB;
# a DELETE's action field, 2 B, is not counted: its missing content's framing makes up for it)
_PROTO_FRAMING = 1 + 1 + 1 + 2

FORMATS: dict[str, WireFormat] = {f.name: f for f in (
    WireFormat("v1", "Teranode's txmeta batch: entries a message, keyed by the first entry's key",
               key_size=32, keyed=False, decode=_decode_txmeta, encode=_encode_v1,
               partitions_of=_partitions_v1, overhead=lambda form: wire.V1_ENTRY_HEADER, warm=_warm_txmeta,
               by_message=True, preload=True, header=wire.V1_HEADER, encode_message=wire.encode_v1),
    WireFormat("v2", f"v1 with each entry's xxh64; a partition a range of its {wire.V2_BUCKETS} xxh64 buckets",
               key_size=32, keyed=False, decode=_decode_txmeta, encode=_encode_v2,
               partitions_of=_partitions_v2, overhead=lambda form: wire.V2_ENTRY_HEADER, warm=_warm_txmeta,
               check_topic=_v2_topic, header=wire.V2_HEADER, encode_message=wire.encode_v2),
    WireFormat("kv", "a message an entry: the Kafka key is the cache's key, a tombstone a DELETE",
               key_size=None, keyed=True, decode=_decode_kv, encode=_encode_kv,
               partitions_of=_partitions_kv, overhead=lambda form: 32, warm=_warm_kv, preload=True),
    WireFormat("proto", "the upstream Teranode topic: a KafkaTxMetaTopicMessage a transaction",
               key_size=32, keyed=False, decode=_decode_proto, encode=_encode_proto,
               partitions_of=_partitions_proto,
               overhead=lambda form: 2 * (proto.RAW_SIZE if form == "raw" else proto.HEX_SIZE) + _PROTO_FRAMING,
               warm=_warm_proto, require=_protobuf),
)}
NAMES = tuple(FORMATS)
SPARK = tuple(f.name for f in FORMATS.values() if f.spark)  # the formats Spark's publish writes


def get(name: str) -> WireFormat:
    """The format of that name; ValueError naming the formats there are, if none."""
    try:
        return FORMATS[name]
    except (KeyError, TypeError):
        raise ValueError(f"format={name!r}: expected one of {', '.join(NAMES)}") from None


def get_spark(name: str) -> WireFormat:
    """The format of that name if Spark writes it; ValueError naming those it writes, if not."""
    fmt = get(name) if name in FORMATS else None
    if fmt is None or not fmt.spark:
        why = "" if fmt is None else f" ({name} is a message an entry, not a batch)"
        raise ValueError(f"format={name!r}: Spark writes {', '.join(SPARK)}{why}")
    return fmt
