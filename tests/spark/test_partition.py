"""The publisher's partitioners against the reference ones in formats/wire.py."""

import numpy as np
import pytest

from shmcache.formats import partitioners, registry, wire
from shmcache.spark import _partition


@pytest.mark.parametrize("partitions", [1, 3, 8, 13])
def test_v1_partitions_equal_kafkas(partitions):
    keys = np.random.default_rng(partitions).integers(0, 256, (2000, 32), np.uint8)
    got = _partition.v1_partitions(keys, partitions)
    assert got.tolist() == [partitioners.murmur2_partition(k.tobytes(), partitions) for k in keys]
    if partitions > 1:  # random hashes spread over every partition
        assert set(got.tolist()) == set(range(partitions))


def test_v2_partitions_equal_wire():
    keys = np.random.default_rng(1).integers(0, 256, (1000, 32), np.uint8)
    got = _partition.v2_partitions(keys, 8)
    assert got.tolist() == partitioners.v2_partition(wire.xxh64_keys(keys), 8).tolist()
    with pytest.raises(ValueError, match="divisor of 8192"):
        _partition.v2_partitions(keys, 3)
    for fmt in set(registry.NAMES) - set(registry.SPARK):  # a message an entry: not Spark's to write
        with pytest.raises(ValueError, match=f"format='{fmt}': Spark writes v1, v2 \\({fmt} is a message an entry"):
            _partition.partitions_of(keys, 8, fmt)
    with pytest.raises(ValueError, match="format='v3': Spark writes v1, v2$"):
        _partition.partitions_of(keys, 8, "v3")
