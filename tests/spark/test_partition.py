"""The publisher's partitioners against the reference ones in consumer/wire.py."""

import numpy as np
import pytest

from shmcache.consumer import wire
from shmcache.spark import _partition


@pytest.mark.parametrize("length", [32, 1, 3, 4, 7, 16])
def test_murmur2_rows_equals_wire(length):
    rng = np.random.default_rng(length)
    keys = rng.integers(0, 256, (500, length), np.uint8)
    got = _partition.murmur2_rows(keys)
    want = [wire.murmur2(k.tobytes()) & 0xFFFFFFFF for k in keys]
    assert got.tolist() == want


@pytest.mark.parametrize("partitions", [1, 3, 8, 13])
def test_v1_partitions_equal_kafkas(partitions):
    keys = np.random.default_rng(partitions).integers(0, 256, (2000, 32), np.uint8)
    got = _partition.v1_partitions(keys, partitions)
    assert got.tolist() == [wire.murmur2_partition(k.tobytes(), partitions) for k in keys]
    if partitions > 1:  # random hashes spread over every partition
        assert set(got.tolist()) == set(range(partitions))


def test_java_reference_values():
    # Kafka's own test vectors (clients/.../UtilsTest.testMurmur2) for keys of 1..n bytes
    cases = {b"21": -973932308, b"foobar": -790332482, b"a-little-bit-long-string": -985981536,
             b"a-little-bit-longer-string": -1486304829, b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
             b"abc": 479470107}
    for key, want in cases.items():
        arr = np.frombuffer(key, np.uint8).reshape(1, -1)
        assert int(_partition.murmur2_rows(arr)[0]) == want & 0xFFFFFFFF, key


def test_v2_partitions_equal_wire():
    keys = np.random.default_rng(1).integers(0, 256, (1000, 32), np.uint8)
    got = _partition.v2_partitions(keys, 8)
    assert got.tolist() == wire.v2_partition(wire.xxh64_keys(keys), 8).tolist()
    with pytest.raises(ValueError, match="divisor of 8192"):
        _partition.v2_partitions(keys, 3)
    with pytest.raises(ValueError, match="expected v1 or v2"):
        _partition.partitions_of(keys, 8, "kv")
