"""Which partition a producer sends each entry to: the two partitioners of the wire format.

- v2: `v2_partition`, `(xxh64 % 8192) // (8192 // P)`, so a partition owns a
  contiguous range of the table's buckets (formats/wire.py, the contract).
- v1 and kv: Kafka's default partitioner for a keyed record (`murmur2_partition`,
  Java `Utils.murmur2`, librdkafka `partitioner=murmur2_random`), one key at a
  time or vectorised over the rows of a key array (`murmur2_partitions`).
"""

from __future__ import annotations

import struct

import numpy as np

from shmcache.formats.wire import V2_BUCKETS

# Kafka's default partitioner (Java Utils.murmur2, librdkafka rd_murmur2).
MURMUR2_SEED = 0x9747B28C
_M2_M = 0x5BD1E995
_M32 = np.uint32(_M2_M)  # the same multiplier for numpy uint32 arithmetic (wraps like Java ints)
_U32 = 0xFFFFFFFF


def v2_partition(hashes, partitions: int) -> np.ndarray:
    """The v2 producer's partition for each xxh64: `(h % 8192) // (8192 // P)`, so
    partition p owns buckets [p * 8192/P, (p + 1) * 8192/P). P must divide 8192."""
    if not isinstance(partitions, int) or partitions <= 0 or V2_BUCKETS % partitions:
        raise ValueError(f"partitions must be a positive divisor of {V2_BUCKETS}, "
                         f"got {partitions!r}")
    h = np.asarray(hashes, dtype=np.uint64)  # stays uint64: no float64 promotion
    return ((h % np.uint64(V2_BUCKETS)) // np.uint64(V2_BUCKETS // partitions)).astype(np.int64)


def murmur2(key: bytes) -> int:
    """Kafka's murmur2 (Java `Utils.murmur2`), as the signed 32-bit int Java returns."""
    length = len(key)
    h = (MURMUR2_SEED ^ length) & _U32
    body = length - length % 4
    for (k,) in struct.iter_unpack("<I", key[:body]):
        k = (k * _M2_M) & _U32
        k ^= k >> 24
        k = (k * _M2_M) & _U32
        h = ((h * _M2_M) & _U32) ^ k
    tail = key[body:]
    if tail:
        for i in range(len(tail) - 1, -1, -1):  # Java's switch falls through 3, 2, 1
            h ^= tail[i] << (8 * i)
        h = (h * _M2_M) & _U32
    h ^= h >> 13
    h = (h * _M2_M) & _U32
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def murmur2_rows(keys: np.ndarray) -> np.ndarray:
    """Kafka's murmur2 of each row of an (n, k) uint8 array, as uint32 (Java's int bits)."""
    keys = np.ascontiguousarray(keys, np.uint8)
    if keys.ndim != 2:
        raise ValueError(f"keys must be a 2-d uint8 array, got shape {keys.shape}")
    n, length = keys.shape
    body = length - length % 4
    with np.errstate(over="ignore"):
        h = np.full(n, (MURMUR2_SEED ^ length) & 0xFFFFFFFF, np.uint32)
        if body:
            words = np.ascontiguousarray(keys[:, :body]).view("<u4")  # (n, body // 4), little-endian
            for j in range(words.shape[1]):
                k = words[:, j] * _M32
                k ^= k >> np.uint32(24)
                k *= _M32
                h *= _M32
                h ^= k
        tail = length - body
        if tail:  # Java's switch falls through 3, 2, 1
            for i in range(tail - 1, -1, -1):
                h ^= keys[:, body + i].astype(np.uint32) << np.uint32(8 * i)
            h *= _M32
        h ^= h >> np.uint32(13)
        h *= _M32
        h ^= h >> np.uint32(15)
    return h


def murmur2_partitions(keys: np.ndarray, partitions: int) -> np.ndarray:
    """`murmur2_partition` of every row of an (n, k) uint8 array (int64)."""
    if not isinstance(partitions, int) or partitions <= 0:
        raise ValueError(f"partitions must be a positive int, got {partitions!r}")
    return ((murmur2_rows(keys) & np.uint32(0x7FFFFFFF)) % np.uint32(partitions)).astype(np.int64)


def murmur2_partition(key: bytes, partitions: int) -> int:
    """The partition Kafka's default partitioner gives a keyed record: Java's
    `toPositive(murmur2(key)) % P`, librdkafka's `partitioner=murmur2_random`."""
    if not isinstance(key, (bytes, bytearray, memoryview)):
        raise TypeError(f"key must be bytes, got {type(key).__name__}")
    if not isinstance(partitions, int) or partitions <= 0:
        raise ValueError(f"partitions must be a positive int, got {partitions!r}")
    return (murmur2(bytes(key)) & 0x7FFFFFFF) % partitions
