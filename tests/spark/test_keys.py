"""Key columns -> (n, 32) uint8: binary, fixed-size binary, hex in either case, nulls, errors."""

import numpy as np
import pyarrow as pa
import pytest

from shmcache.errors import KeySizeError
from shmcache.spark import _keys

KEYS = np.random.default_rng(3).integers(0, 256, (50, 32), np.uint8)


def _conv(arr, key_size=32):
    return _keys.from_arrow(arr, key_size, "tx_hash", "test")


@pytest.mark.parametrize("typ", [pa.binary(), pa.large_binary(), pa.binary(32)])
def test_binary_keys(typ):
    arr = pa.array([k.tobytes() for k in KEYS], typ)
    keys, valid = _conv(arr)
    assert valid.all() and np.array_equal(keys, KEYS)
    keys, valid = _conv(arr.slice(7, 20))  # a slice keeps its parent's offsets
    assert np.array_equal(keys, KEYS[7:27])


@pytest.mark.parametrize("typ", [pa.string(), pa.large_string()])
@pytest.mark.parametrize("upper", [False, True])
def test_hex_keys(typ, upper):
    texts = [k.tobytes().hex().upper() if upper else k.tobytes().hex() for k in KEYS]
    keys, valid = _conv(pa.array(texts, typ))
    assert valid.all() and np.array_equal(keys, KEYS)


def test_nulls_are_invalid_rows_not_errors():
    vals = [k.tobytes() for k in KEYS[:5]]
    vals[2] = None
    keys, valid = _conv(pa.array(vals, pa.binary()))
    assert valid.tolist() == [True, True, False, True, True]
    assert np.array_equal(keys[[0, 1, 3, 4]], KEYS[[0, 1, 3, 4]])
    hexes = [None, KEYS[0].tobytes().hex()]
    keys, valid = _conv(pa.array(hexes, pa.string()))
    assert valid.tolist() == [False, True] and np.array_equal(keys[1], KEYS[0])


def test_wrong_lengths_name_the_column_and_row():
    vals = [k.tobytes() for k in KEYS[:4]]
    vals[3] = vals[3][:31]
    with pytest.raises(KeySizeError, match=r"key column 'tx_hash', row 3 of this batch: .* is 31 bytes; .* 32 bytes"):
        _conv(pa.array(vals, pa.binary()))
    with pytest.raises(KeySizeError, match="63 hex characters"):
        _conv(pa.array([KEYS[0].tobytes().hex()[:63]], pa.string()))
    with pytest.raises(KeySizeError, match="holds 16-byte keys"):
        _conv(pa.array([b"x" * 16], pa.binary(16)))


def test_bad_hex_and_bad_type():
    bad = KEYS[0].tobytes().hex()[:-1] + "g"
    with pytest.raises(KeySizeError, match="row 1 of this batch.*not 64 hex characters"):
        _conv(pa.array([KEYS[1].tobytes().hex(), bad], pa.string()))
    with pytest.raises(TypeError, match="key column 'tx_hash' is int64"):
        _conv(pa.array([1, 2], pa.int64()))


def test_empty():
    keys, valid = _conv(pa.array([], pa.binary()))
    assert keys.shape == (0, 32) and valid.shape == (0,)
