"""Which Kafka partition each tx hash belongs to, for a whole batch at once.

- v1: Kafka's default partitioner for a keyed record, `toPositive(murmur2(key)) % P`
  (Java `Utils.murmur2`; what Spark's Kafka sink applies to a message's key). A v1
  message is keyed by its first tx hash, so the publisher groups entries by the
  partition of their OWN hash: then every entry of a message lives in the message
  key's partition, and a hash's ADD and DELETE always share a partition (DESIGN
  invariant 2).
- v2: `(xxh64(hash) % 8192) // (8192 // P)`, the bucket-range partition
  (`wire.v2_partition`), set explicitly on each message.

`murmur2_rows` is `wire.murmur2` over the rows of an (n, k) uint8 array in numpy
uint32 arithmetic (products wrap mod 2**32 as Java's ints do); tests pin it to
`wire.murmur2_partition` key by key.
"""

from __future__ import annotations

import numpy as np

from shmcache.consumer import wire

_M = np.uint32(0x5BD1E995)


def murmur2_rows(keys: np.ndarray) -> np.ndarray:
    """Kafka's murmur2 of each row of an (n, k) uint8 array, as uint32 (Java's int bits)."""
    keys = np.ascontiguousarray(keys, np.uint8)
    if keys.ndim != 2:
        raise ValueError(f"keys must be a 2-d uint8 array, got shape {keys.shape}")
    n, length = keys.shape
    body = length - length % 4
    with np.errstate(over="ignore"):
        h = np.full(n, (wire.MURMUR2_SEED ^ length) & 0xFFFFFFFF, np.uint32)
        if body:
            words = np.ascontiguousarray(keys[:, :body]).view("<u4")  # (n, body // 4), little-endian
            for j in range(words.shape[1]):
                k = words[:, j] * _M
                k ^= k >> np.uint32(24)
                k *= _M
                h *= _M
                h ^= k
        tail = length - body
        if tail:  # Java's switch falls through 3, 2, 1
            for i in range(tail - 1, -1, -1):
                h ^= keys[:, body + i].astype(np.uint32) << np.uint32(8 * i)
            h *= _M
        h ^= h >> np.uint32(13)
        h *= _M
        h ^= h >> np.uint32(15)
    return h


def v1_partitions(keys: np.ndarray, partitions: int) -> np.ndarray:
    """The partition Kafka's default partitioner gives each key (int32)."""
    _check(partitions)
    return ((murmur2_rows(keys) & np.uint32(0x7FFFFFFF)) % np.uint32(partitions)).astype(np.int32)


def v2_partitions(keys: np.ndarray, partitions: int) -> np.ndarray:
    """The bucket-range partition of each key (int32); P must divide 8192."""
    return wire.v2_partition(wire.xxh64_keys(keys), partitions).astype(np.int32)


def partitions_of(keys: np.ndarray, partitions: int, fmt: str) -> np.ndarray:
    if fmt == "v1":
        return v1_partitions(keys, partitions)
    if fmt == "v2":
        return v2_partitions(keys, partitions)
    raise ValueError(f"format={fmt!r}: expected v1 or v2")


def _check(partitions) -> None:
    if not isinstance(partitions, int) or partitions <= 0:
        raise ValueError(f"partitions must be a positive int, got {partitions!r}")
