"""MetaBytes (formats/txmeta.py): golden bytes, encode/decode round trips, hostile input, and
the golden values every decoder (this, go/txmeta, the JVM's TxMeta) is held to."""

import json
import struct

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from shmcache.formats import txmeta

from shmtest import golden_txmeta as golden


def _one(fee, size, flags, parents, vouts, height):
    """A hand-built record, the way Teranode's MetaBytes lays it out."""
    b = struct.pack("<QQBI", fee, size, flags, len(parents)) + b"".join(parents)
    for vs in vouts:
        b += struct.pack("<I", len(vs)) + b"".join(struct.pack("<I", v) for v in vs)
    if height is not None:
        b += struct.pack(">I", height)
    return b


def _meta_of(records):
    """A Meta from python tuples (fee, size, flags, parents, vouts, height)."""
    n = len(records)
    po = np.zeros(n + 1, np.int64)
    po[1:] = np.cumsum([len(r[3]) for r in records])
    flat_vouts = [vs for r in records for vs in r[4]]
    vo = np.zeros(len(flat_vouts) + 1, np.int64)
    vo[1:] = np.cumsum([len(v) for v in flat_vouts]) if flat_vouts else []
    parents = b"".join(p for r in records for p in r[3])
    return txmeta.Meta(
        fee=np.array([r[0] for r in records], np.uint64), size=np.array([r[1] for r in records], np.uint64),
        flags=np.array([r[2] for r in records], np.uint8), parent_offsets=po,
        parents=np.frombuffer(parents, np.uint8).reshape(-1, 32).copy(), vout_offsets=vo,
        vouts=np.array([v for vs in flat_vouts for v in vs], np.uint32),
        block_height=np.array([-1 if r[5] is None else r[5] for r in records], np.int64),
        valid=np.ones(n, np.bool_))


GOLDEN = [
    (1234, 225, 0, [bytes(range(32))], [[1]], None),  # the smallest record: 61 B
    (2**64 - 1, 7, 1, [b"\xaa" * 32, b"\xbb" * 32, b"\xcc" * 32], [[0], [5], [2]], 850_123),
    (0, 0, 0, [b"\x01" * 32], [[0, 1, 2, 3]], 0),
]


def test_golden_bytes():
    offsets, data = txmeta.encode(_meta_of(GOLDEN))
    want = [_one(*r) for r in GOLDEN]
    got = [data[offsets[i]:offsets[i + 1]].tobytes() for i in range(len(GOLDEN))]
    assert got == want
    assert len(want[0]) == txmeta.MIN_SIZE == 61
    assert len(_one(1, 1, 0, [b"x" * 32] * 3, [[0]] * 3, None)) == 141  # the typical largest
    assert want[1][-4:] == struct.pack(">I", 850_123)  # block height is big-endian


def test_decode_golden():
    recs = [_one(*r) for r in GOLDEN]
    offsets = np.cumsum([0] + [len(r) for r in recs])
    m = txmeta.decode(offsets, np.frombuffer(b"".join(recs), np.uint8))
    assert m.valid.all()
    assert m.fee.tolist() == [r[0] for r in GOLDEN]
    assert m.size.tolist() == [r[1] for r in GOLDEN]
    assert m.block_height.tolist() == [-1, 850_123, 0]
    assert bytes(m.parents[m.parent_offsets[1]]) == b"\xaa" * 32
    assert m.vouts[m.vout_offsets[4]:m.vout_offsets[5]].tolist() == [0, 1, 2, 3]


@settings(max_examples=60, deadline=None)
@given(n=st.integers(0, 200), seed=st.integers(0, 2**32 - 1), max_parents=st.integers(1, 5),
       max_vouts=st.integers(1, 4), height_share=st.floats(0, 1))
def test_round_trip(n, seed, max_parents, max_vouts, height_share):
    m = txmeta.generate(n, np.random.default_rng(seed), max_parents=max_parents, max_vouts=max_vouts,
                        height_share=height_share)
    offsets, data = txmeta.encode(m)
    assert (np.diff(offsets) == txmeta.encoded_sizes(m)).all()
    d = txmeta.decode(offsets, data)
    assert d.valid.all()
    for f in ("fee", "size", "flags", "parent_offsets", "parents", "vout_offsets", "vouts", "block_height"):
        assert np.array_equal(getattr(d, f), getattr(m, f)), f


def test_generated_sizes_are_teranode_shaped():
    m = txmeta.generate(20_000, np.random.default_rng(1))
    sizes = txmeta.encoded_sizes(m)
    assert sizes.min() == 61 and sizes.max() == 145  # 61-141 B, plus 4 with a block height
    assert 0.4 < (m.block_height >= 0).mean() < 0.6


@settings(max_examples=300, deadline=None)
@given(blob=st.binary(max_size=400), cuts=st.lists(st.integers(0, 400), max_size=6))
def test_random_bytes_never_raise(blob, cuts):
    """Hostile bytes decode to valid=False (or a record that re-encodes to the same bytes)."""
    bounds = sorted({0, len(blob), *[c for c in cuts if c <= len(blob)]})
    offsets = np.array(bounds, np.int64)
    data = np.frombuffer(blob, np.uint8)
    m = txmeta.decode(offsets, data)
    o2, d2 = txmeta.encode(m)
    for i in np.flatnonzero(m.valid).tolist():
        assert d2[o2[i]:o2[i + 1]].tobytes() == blob[bounds[i]:bounds[i + 1]]
    assert not m.fee[~m.valid].any() and (np.diff(m.parent_offsets)[~m.valid] == 0).all()


def test_damaged_records_are_invalid_not_errors():
    good = _one(*GOLDEN[0])
    bad = [
        good[:20],  # shorter than the fixed part
        good[:-1],  # vout cut short
        good + b"\x00",  # one stray byte (neither 0 nor 4 trailing)
        struct.pack("<QQBI", 1, 1, 0, 2**32 - 1) + b"\x00" * 40,  # a parent count that cannot fit
        good[:17] + struct.pack("<I", 1) + b"\x00" * 32 + struct.pack("<I", 2**31) + b"\x00" * 8,  # huge vout count
    ]
    recs = [good, *bad, good]
    offsets = np.cumsum([0] + [len(r) for r in recs])
    m = txmeta.decode(offsets, np.frombuffer(b"".join(recs), np.uint8))
    assert m.valid.tolist() == [True] + [False] * len(bad) + [True]
    present = np.array([True] * (len(recs) - 1) + [False])
    assert txmeta.decode(offsets, np.frombuffer(b"".join(recs), np.uint8), present).valid[-1] == False  # noqa: E712


def test_bad_arguments_raise():
    with pytest.raises(ValueError, match="offsets"):
        txmeta.decode(np.array([0, 10]), np.zeros(5, np.uint8))
    with pytest.raises(ValueError, match="present"):
        txmeta.decode(np.array([0, 1]), np.zeros(5, np.uint8), np.ones(3, bool))
    with pytest.raises(ValueError, match="max_parents"):
        txmeta.generate(5, np.random.default_rng(0), max_parents=0)


def test_to_arrow():
    pa = pytest.importorskip("pyarrow")
    recs = [_one(*GOLDEN[0]), b"junk", _one(*GOLDEN[1])]
    offsets = np.cumsum([0] + [len(r) for r in recs])
    cols = txmeta.to_arrow(txmeta.decode(offsets, np.frombuffer(b"".join(recs), np.uint8)))
    t = pa.table(cols)
    rows = t.to_pylist()
    assert rows[0]["fee"] == 1234 and rows[0]["block_height"] is None
    assert rows[0]["parents"] == [bytes(range(32))] and rows[0]["parent_vouts"] == [[1]]
    assert rows[1] == {k: None for k in cols}
    assert rows[2]["block_height"] == 850_123 and rows[2]["parent_vouts"] == [[0], [5], [2]]
    assert rows[2]["fee"] == -1  # u64 max shows as int64 -1: Spark has no unsigned types
    assert t.schema == pa.schema(txmeta.arrow_fields())
    empty = pa.table(txmeta.to_arrow(txmeta.decode(np.zeros(1, np.int64), np.zeros(0, np.uint8))))
    assert empty.num_rows == 0 and empty.schema == t.schema


@settings(max_examples=30, deadline=None)
@given(n=st.integers(0, 100), seed=st.integers(0, 2**32 - 1), start=st.integers(0, 20))
def test_arrow_round_trip(n, seed, start):
    pa = pytest.importorskip("pyarrow")
    m = txmeta.generate(n + start, np.random.default_rng(seed), max_vouts=3)
    m.fee[:] %= 2**63  # what a signed column can carry
    t = pa.table(txmeta.to_arrow(m)).slice(start)  # a slice: offsets that do not start at 0
    back = txmeta.from_arrow(t)
    o1, d1 = txmeta.encode(back)
    o0, d0 = txmeta.encode(m)
    assert d1.tobytes() == d0[o0[start]:].tobytes()


def test_from_arrow_errors():
    pa = pytest.importorskip("pyarrow")
    good = pa.table(txmeta.to_arrow(txmeta.generate(3, np.random.default_rng(0))))
    with pytest.raises(ValueError, match="no column 'fee'"):
        txmeta.from_arrow(good.drop(["fee"]))
    with pytest.raises(ValueError, match="'size' has a null at row 1"):
        txmeta.from_arrow(good.set_column(1, "size", pa.array([1, None, 3], pa.int64())))
    short = pa.array([[b"x" * 32], [b"y" * 31], [b"z" * 32]], pa.list_(pa.binary()))
    with pytest.raises(ValueError, match="row 1 has a parent hash of 31 bytes"):
        txmeta.from_arrow(good.set_column(3, "parents", short))


# -- the golden values (golden/txmeta/cases.json, made by tests/lib/shmtest/golden_txmeta.py) ------------------


def test_committed_golden_values_are_what_the_generator_makes():
    assert golden.PATH.read_text() == golden.render(golden.build()), \
        "golden/txmeta/cases.json is stale: rerun .venv/bin/python -m shmtest.golden_txmeta"


def test_the_decoder_gives_every_golden_decode():
    """formats/txmeta.decode, and record (the object `get --decode txmeta` prints), give every
    golden case's expected decode."""
    cases = json.loads(golden.PATH.read_text())["cases"]
    assert sum(c["expect"] == {"valid": False} for c in cases) >= 400
    values = [bytes.fromhex(c["value"]) for c in cases]
    offsets = np.cumsum([0] + [len(v) for v in values])
    m = txmeta.decode(offsets, np.frombuffer(b"".join(values), np.uint8))
    wrong = [(c["name"], c["value"], got) for i, c in enumerate(cases) if (got := txmeta.record(m, i)) != c["expect"]]
    assert not wrong, f"{len(wrong)} golden txmeta values decoded otherwise; the first: {wrong[:3]}"
    for i, c in enumerate(cases):  # and each record valid alone re-encodes to its bytes
        if m.valid[i]:
            o, d = txmeta.encode(txmeta.decode(offsets[i:i + 2] - offsets[i], np.frombuffer(values[i], np.uint8)))
            assert d.tobytes() == values[i], c["name"]
