"""shmcache.spark.lookup from the executors of a local[2] session, against a cache
filled in this process: values and found flags equal the cache's, decoded columns
equal the source rows, keys as binary or hex, clear errors for bad key columns and a
missing cache, a re-created cache is re-attached, and executors never remove a cache."""

import socket
import subprocess
import sys
import textwrap

import numpy as np
import pyarrow as pa
import pytest

import shmcache
from shmcache.formats import txmeta
from shmcache.spark import datagen, lookup

N = 3000


@pytest.fixture
def filled(cache_names):
    """A cache holding N txmeta values; returns (name, keys, meta, values)."""
    name = cache_names("lookup")
    rng = np.random.default_rng(7)
    keys = rng.integers(0, 256, (N, 32), np.uint8)
    meta = txmeta.generate(N, rng)
    offsets, data = txmeta.encode(meta)
    with shmcache.create(name, memory="64MiB") as w:
        w.set_many(keys, (offsets, data))
    values = [data[offsets[i]:offsets[i + 1]].tobytes() for i in range(N)]
    return name, keys, meta, values


def _query(spark, keys, as_hex=None, nulls=0):
    """A DataFrame of the given keys (binary, or hex in 'lower'/'upper' case) plus `nulls` null keys."""
    if as_hex:
        col = [k.tobytes().hex() for k in keys]
        col = [c.upper() for c in col] if as_hex == "upper" else col
        typ = pa.string()
    else:
        col, typ = [k.tobytes() for k in keys], pa.binary()
    col += [None] * nulls
    return spark.createDataFrame(pa.table({"tx_hash": pa.array(col, typ), "row": pa.array(range(len(col)))}))


@pytest.mark.parametrize("as_hex", [None, "lower", "upper"])
def test_values_and_found(spark, filled, as_hex):
    name, keys, meta, values = filled
    misses = np.random.default_rng(8).integers(0, 256, (300, 32), np.uint8)
    q = np.concatenate([keys[::2], misses])
    df = lookup(_query(spark, q, as_hex, nulls=3), cache=name)
    assert df.columns == ["tx_hash", "row", "found", "value"]
    rows = {r.row: r for r in df.collect()}
    assert len(rows) == len(q) + 3
    for i in range(len(q)):
        want = values[2 * i] if i < len(keys[::2]) else None
        assert rows[i].found == (want is not None)
        assert (None if rows[i].value is None else bytes(rows[i].value)) == want
    assert all(not rows[len(q) + j].found and rows[len(q) + j].value is None for j in range(3))


def test_decode_txmeta(spark, filled):
    name, keys, meta, values = filled
    q = np.concatenate([keys, np.zeros((1, 32), np.uint8)])  # the last is a miss
    df = lookup(_query(spark, q), cache=name, decode="txmeta", value_col=None)
    assert df.columns == ["tx_hash", "row", "found", "fee", "size", "flags", "parents", "parent_vouts", "block_height"]
    got = df.orderBy("row").toArrow()
    want = txmeta.to_arrow(meta)
    for col, arr in want.items():
        assert got.column(col).to_pylist()[:N] == arr.to_pylist(), col
        assert got.column(col).to_pylist()[N] is None
    assert got.column("found").to_pylist() == [True] * N + [False]


def test_bad_key_columns(spark, filled):
    name, keys, _, _ = filled
    ints = spark.range(3).withColumnRenamed("id", "tx_hash")
    with pytest.raises(TypeError, match="key column 'tx_hash' is bigint; expected binary"):
        lookup(ints, cache=name)
    with pytest.raises(ValueError, match="no key column 'nope'"):
        lookup(_query(spark, keys[:3]), key_col="nope", cache=name)
    with pytest.raises(ValueError, match="clash"):
        lookup(_query(spark, keys[:3]), cache=name, found_col="row")
    short = spark.createDataFrame(pa.table({"tx_hash": pa.array([keys[0].tobytes(), keys[1].tobytes()[:31]])}))
    with pytest.raises(Exception, match=r"key column 'tx_hash', row \d+ of this batch: .* is 31 bytes; .*32 bytes"):
        lookup(short, cache=name).collect()
    badhex = spark.createDataFrame(pa.table({"tx_hash": pa.array(["zz" * 32])}))
    with pytest.raises(Exception, match="is not 64 hex characters"):
        lookup(badhex, cache=name).collect()


def test_missing_cache_names_cache_and_host(spark, cache_names):
    name = cache_names("missing")  # never created
    df = lookup(_query(spark, np.zeros((2, 32), np.uint8)), cache=name)
    with pytest.raises(Exception) as e:
        df.collect()
    text = str(e.value)
    assert f"cache {name!r} not found on host {socket.gethostname()!r}" in text
    assert "shmcache run" in text


def test_recreated_cache_is_reattached(spark, cache_names):
    name = cache_names("again")
    keys = np.random.default_rng(9).integers(0, 256, (100, 32), np.uint8)
    df = _query(spark, keys).coalesce(1)
    for generation in (b"first", b"second"):
        with shmcache.create(name, memory="64MiB") as w:
            w.set_many(keys, [generation] * len(keys))
        got = {bytes(r.value) for r in lookup(df, cache=name).collect()}
        assert got == {generation}
        shmcache.destroy(name)  # the workers still map the old table; the next batch must not read it


def test_cache_survives_the_session(filled, tmp_path, repo, kafka_broker, kafka_topic):
    """Executors attach in a Spark session of a child process, which stops its session and
    exits: the cache is still there, intact, and its readers' counters show the executors read it.
    (The child's session has no Kafka jars, so it also checks publish's error for that, to a
    real topic whose partitions answer.)"""
    name, keys, _, values = filled
    datagen.write(tmp_path / "src", 10)
    script = tmp_path / "child.py"
    script.write_text(textwrap.dedent(f"""
        import pyarrow as pa
        from shmcache.spark import lookup, publish, session
        from shmcache.spark._session import SparkSetupError
        spark = session("child", master="local[2]")
        keys = [bytes.fromhex(h) for h in {[k.tobytes().hex() for k in keys[:500]]!r}]
        df = spark.createDataFrame(pa.table({{"tx_hash": pa.array(keys, pa.binary())}})).repartition(2)
        print("FOUND", lookup(df, cache={name!r}).filter("found").count())
        try:
            publish.publish(spark, {str(tmp_path / "src")!r}, {kafka_broker.bootstrap!r}, {kafka_topic(4)!r},
                            partitions=4)
        except SparkSetupError as e:
            print("SETUP-ERROR", e)
        except Exception as e:
            print("OTHER-ERROR", type(e).__name__, e)
        spark.stop()
    """))
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=repo)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "FOUND 500" in out.stdout
    assert "SETUP-ERROR shmcache.spark.publish: this SparkSession cannot load Spark's Kafka sink" in out.stdout, \
        out.stdout
    assert shmcache.exists(name)
    with shmcache.attach(name) as r:
        assert r.get_many(list(k.tobytes() for k in keys)) == values
        assert r.stats()["reader_hits"] >= 500  # the executors' lookups, from their own processes
