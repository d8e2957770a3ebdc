"""The publisher's executor-side steps without Spark: rows -> entries -> Kafka records.

What must hold for the consumers (DESIGN invariant 2): every entry of a v1 message
lives in the partition Kafka's partitioner gives the message key; every v2 record
names its entries' bucket-range partition; messages hold at most 1024 entries and
stay under the byte limit; entries keep the order they were sorted in (ADDs before
DELETEs of a partition), also when a partition's run spans Arrow batches."""

import numpy as np
import pyarrow as pa
import pytest

from shmcache.formats import partitioners, registry, txmeta, wire
from shmcache.spark import _messages as M
from shmcache.spark import _partition

P = 4


def _rows(n, seed=0):
    rng = np.random.default_rng(seed)
    keys = rng.integers(0, 256, (n, 32), np.uint8)
    meta = txmeta.generate(n, rng)
    cols = txmeta.to_arrow(meta)
    table = pa.table({"tx_hash": pa.array([k.tobytes() for k in keys], pa.binary()), **cols})
    return keys, meta, table


def _entries(table, action, fmt, batch=700):
    return pa.Table.from_batches(list(M.entry_batches(table.to_batches(batch), action=action, partitions=P, fmt=fmt)))


def _sorted_batches(entries, size):
    """What Spark hands step 2 for one Spark partition: sorted by (kpart, action), in batches."""
    t = entries.sort_by([("kpart", "ascending"), ("action", "ascending")])
    return t.to_batches(size)


def _decode(records):
    out = []
    for rb in records:
        for key, value, part in zip(rb.column("key").to_pylist(), rb.column("value").to_pylist(),
                                    rb.column("partition").to_pylist()):
            b = wire.decode(value)
            assert b.error is None
            out.append((key, part, b))
    return out


def test_entries_carry_the_metabytes_and_partition():
    keys, meta, table = _rows(1500)
    e = _entries(table, wire.ADD, "v1")
    assert e.column("tx_hash").to_pylist() == [k.tobytes() for k in keys]
    offsets, data = txmeta.encode(meta)
    want = [data[offsets[i]:offsets[i + 1]].tobytes() for i in range(len(keys))]
    assert e.column("content").to_pylist() == want
    assert e.column("kpart").to_pylist() == _partition.v1_partitions(keys, P).tolist()
    assert set(e.column("action").to_pylist()) == {wire.ADD}
    d = _entries(table.select(["tx_hash"]), wire.DELETE, "v2")
    assert set(d.column("content").to_pylist()) == {b""}
    assert d.column("kpart").to_pylist() == _partition.v2_partitions(keys, P).tolist()


@pytest.mark.parametrize("fmt", registry.SPARK)
@pytest.mark.parametrize("batch", [333, 5000])
def test_messages_keep_order_partition_and_limits(fmt, batch):
    keys, meta, table = _rows(5000, seed=1)
    adds = _entries(table, wire.ADD, fmt)
    dels = _entries(table.select(["tx_hash"]).slice(0, 800), wire.DELETE, fmt)  # some hashes deleted again
    allents = pa.concat_tables([adds, dels])
    ordered = allents.sort_by([("kpart", "ascending"), ("action", "ascending")])
    msgs = _decode(M.message_batches(_sorted_batches(allents, batch), fmt=fmt))

    got = [(b.keys[i].tobytes(), int(b.actions[i]), b.value(i)) for _, _, b in msgs for i in range(len(b))]
    want = list(zip(ordered.column("tx_hash").to_pylist(), ordered.column("action").to_pylist(),
                    ordered.column("content").to_pylist()))
    assert got == want  # every entry once, in the sorted order
    for key, part, b in msgs:
        assert 1 <= len(b) <= M.MAX_ENTRIES
        own = (_partition.v1_partitions if fmt == "v1" else _partition.v2_partitions)(b.keys, P)
        assert set(own.tolist()) == {part}
        if fmt == "v1":
            assert key == b.keys[0].tobytes() and partitioners.murmur2_partition(key, P) == part
        else:
            assert key is None and b.version == 2
    # runs are cut only by the limit, also across batch boundaries
    counts = np.bincount(ordered.column("kpart").to_numpy(), minlength=P)
    assert len(msgs) == sum(-(-int(c) // M.MAX_ENTRIES) for c in counts)


def test_byte_limit_cuts_messages():
    keys, meta, table = _rows(3000, seed=2)
    e = _entries(table, wire.ADD, "v1")
    msgs = _decode(M.message_batches(_sorted_batches(e, 1000), fmt="v1", max_bytes=20_000))
    assert sum(len(b) for _, _, b in msgs) == 3000
    sizes = [len(wire.encode_v1(b.keys, b.actions, [b.value(i) for i in range(len(b))])) for _, _, b in msgs]
    assert max(sizes) <= 20_000 and max(len(b) for _, _, b in msgs) < M.MAX_ENTRIES


def test_cut_kernel():
    kparts = np.array([0, 0, 0, 1, 1, 2], np.int32)
    sizes = np.full(6, 10, np.int64)
    assert M.cut(kparts, sizes, 2, 1000, 4).tolist() == [0, 2, 3, 5, 6]
    assert M.cut(kparts, sizes, 1024, 25, 4).tolist() == [0, 2, 3, 5, 6]
    assert M.cut(kparts[:0], sizes[:0], 2, 1000, 4).tolist() == [0]


def test_bad_rows_are_named():
    keys, meta, table = _rows(10, seed=3)
    short = table.set_column(0, "tx_hash", pa.array([k.tobytes()[:31] for k in keys], pa.binary()))
    with pytest.raises(ValueError, match="row 0 of this batch.*31 bytes"):
        _entries(short, wire.ADD, "v1")
    nulls = table.set_column(0, "tx_hash", pa.array([None] + [k.tobytes() for k in keys[1:]], pa.binary()))
    with pytest.raises(ValueError, match="null at row 0"):
        _entries(nulls, wire.ADD, "v1")
    big = txmeta.generate(1, np.random.default_rng(0), max_parents=1, max_vouts=1)
    big.parents = np.zeros((120, 32), np.uint8)
    big.parent_offsets = np.array([0, 120])
    big.vout_offsets = np.arange(121)
    big.vouts = np.zeros(120, np.uint32)
    t = pa.table({"tx_hash": pa.array([b"\1" * 32]), **txmeta.to_arrow(big)})
    with pytest.raises(ValueError, match=f"encodes to .* bytes of MetaBytes; .*limit is {wire.MAX_VALUE}"):
        _entries(t, wire.ADD, "v1")


def test_large_binary_content():
    """Spark sends large types when spark.sql.execution.arrow.useLargeVarTypes is on."""
    keys, meta, table = _rows(1200, seed=4)
    e = _entries(table, wire.ADD, "v1")
    large = e.cast(e.schema.set(3, pa.field("content", pa.large_binary())))
    want = _decode(M.message_batches(_sorted_batches(e, 500), fmt="v1"))
    got = _decode(M.message_batches(_sorted_batches(large, 500), fmt="v1"))
    assert [(k, p, bytes(b.data)) for k, p, b in got] == [(k, p, bytes(b.data)) for k, p, b in want]
