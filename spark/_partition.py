"""Which Kafka partition each tx hash belongs to, for a whole batch at once.

- v1: Kafka's default partitioner for a keyed record, `toPositive(murmur2(key)) % P`
  (Java `Utils.murmur2`; what Spark's Kafka sink applies to a message's key). A v1
  message is keyed by its first tx hash, so the publisher groups entries by the
  partition of their OWN hash: then every entry of a message lives in the message
  key's partition, and a hash's ADD and DELETE always share a partition (DESIGN
  invariant 2).
- v2: `(xxh64(hash) % 8192) // (8192 // P)`, the bucket-range partition
  (`partitioners.v2_partition`), set explicitly on each message.

Both partitioners live in `formats/wire.py`, the wire contract; this module picks
one by format.
"""

from __future__ import annotations

import numpy as np

from shmcache.formats import partitioners, wire
from shmcache.formats import registry as wire_formats

def v1_partitions(keys: np.ndarray, partitions: int) -> np.ndarray:
    """The partition Kafka's default partitioner gives each key (int32)."""
    _check(partitions)
    return partitioners.murmur2_partitions(keys, partitions).astype(np.int32)


def v2_partitions(keys: np.ndarray, partitions: int) -> np.ndarray:
    """The bucket-range partition of each key (int32); P must divide 8192."""
    return partitioners.v2_partition(wire.xxh64_keys(keys), partitions).astype(np.int32)


def partitions_of(keys: np.ndarray, partitions: int, fmt: str) -> np.ndarray:
    """The partition each entry's message goes to: v1 keys a message by its first hash, so its
    entries are grouped by murmur2 of each (a message a run of one partition); v2 by bucket."""
    return (v1_partitions if wire_formats.get_spark(fmt).by_message else v2_partitions)(keys, partitions)


def _check(partitions) -> None:
    if not isinstance(partitions, int) or partitions <= 0:
        raise ValueError(f"partitions must be a positive int, got {partitions!r}")
