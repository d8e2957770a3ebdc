"""lookup(engine="jvm") (the batched lookup of jvm/, a node of the query's plan,
and the row-at-a-time Spark SQL functions, in the executors' JVM) against lookup(engine="python") on a
local[2] session, over a real cache filled by the Python writer: identical rows for every
key, misses, null keys and decoded columns included, keys as binary and hex; the SQL
functions from SQL; errors naming the column, the cache and the host; a re-created cache
re-attached; hits and misses in the readers' companion; a jar built for another Spark
refused; owner= checked by the JVM reader (a cache of another uid refused naming both, at
attach and at re-attach); the JVM's txmeta decoder against the Python one on malformed
values. Skipped where the jar is not built (scripts/setup)."""

import decimal
import os
import pwd
import socket
import zipfile

import numpy as np
import pyarrow as pa
import pytest

import shmcache
from shmcache.formats import txmeta
from shmcache.spark import lookup
from shmcache.spark import _session

N = 2000
pytestmark = pytest.mark.skipif(_session.jvm_jar(required=False) is None,
                                reason="the shmcache JVM jar is not built (scripts/setup, or cd jvm && mvn -q package)")


@pytest.fixture
def filled(cache_names):
    """A cache of N txmeta values, a quarter of them deleted again, and a few empty values."""
    name = cache_names("jvm")
    rng = np.random.default_rng(40)
    keys = rng.integers(0, 256, (N, 32), np.uint8)
    offsets, data = txmeta.encode(txmeta.generate(N, rng))
    with shmcache.create(name, memory="64MiB") as w:
        w.set_many(keys, (offsets, data))
        w.delete_many(keys[::4])
        w.set_many(keys[1:40:4], [b""] * 10)  # empty values are hits, not misses
    return name, keys


def _query(spark, keys, as_hex=False, nulls=0):
    col = [k.tobytes().hex() if as_hex else k.tobytes() for k in keys] + [None] * nulls
    typ = pa.string() if as_hex else pa.binary()
    return spark.createDataFrame(pa.table({"tx_hash": pa.array(col, typ), "row": pa.array(range(len(col)))}))


def _rows(df):
    """The rows as tuples (binary as bytes), in the order of the `row` column."""
    rows = [tuple(bytes(v) if isinstance(v, (bytes, bytearray)) else v for v in r) for r in df.collect()]
    return sorted(rows, key=lambda r: r[1])


@pytest.mark.parametrize("batched", [True, False], ids=["batched", "expression"])
@pytest.mark.parametrize("as_hex", [False, True])
@pytest.mark.parametrize("decode,value_col", [(None, "value"), (None, None), ("txmeta", "value"), ("txmeta", None)])
def test_jvm_and_python_give_identical_rows(spark, filled, as_hex, decode, value_col, batched, monkeypatch):
    """Both JVM paths: the batched lookup (BatchLookups, engine="jvm"'s own; partitions of
    about 735 rows, so chunks of 256 end mid-partition) and the row-at-a-time SQL functions
    (shmcache_get, shmcache_contains)."""
    from shmcache.spark import _lookup

    monkeypatch.setattr(_lookup, "JVM_BATCHED", batched)
    name, keys = filled
    misses = np.random.default_rng(41).integers(0, 256, (200, 32), np.uint8)
    df = _query(spark, np.concatenate([keys, misses]), as_hex, nulls=5).repartition(3)
    jvm = lookup(df, cache=name, decode=decode, value_col=value_col, engine="jvm")
    py = lookup(df, cache=name, decode=decode, value_col=value_col, engine="python")
    assert [(f.name, f.dataType) for f in jvm.schema] == [(f.name, f.dataType) for f in py.schema]
    got, want = _rows(jvm), _rows(py)
    assert len(got) == N + 200 + 5
    assert got == want
    found = jvm.columns.index("found")
    assert sum(r[found] for r in got) == N - N // 4  # the deletes, the misses and the nulls are misses
    plan = jvm._jdf.queryExecution().executedPlan().toString()
    assert "MapInArrow" not in plan and "BatchEvalPython" not in plan, plan  # no Python worker, decode included
    assert ("shmcache lookup of 'tx_hash'" in plan) == batched, plan


def test_jvm_and_python_agree_on_a_cache_filled_by_shmcache_run(spark, harness, kafka_topic):
    """A real `shmcache run` (kv format, 2 workers) fills the cache from a topic of adds,
    overwrites and tombstones; both engines give the same rows for every key sent and for
    keys never sent, and the JVM's hits are exactly the keys left live."""
    from confluent_kafka import Producer

    from shmtest.topic_model import KafkaProbe
    from shmtest.waits import wait_applied

    topic = kafka_topic(2)
    rng = np.random.default_rng(43)
    keys = rng.integers(0, 256, (1500, 32), np.uint8)
    offsets, data = txmeta.encode(txmeta.generate(len(keys), rng))
    p = Producer({"bootstrap.servers": harness.bootstrap, "partitioner": "murmur2_random"})
    for i, k in enumerate(keys):
        p.produce(topic, key=k.tobytes(), value=data[offsets[i]:offsets[i + 1]].tobytes())
    for k in keys[::5]:
        p.produce(topic, key=k.tobytes(), value=None)  # a tombstone: deleted
    for k in keys[1::5]:
        p.produce(topic, key=k.tobytes(), value=b"overwritten")
    assert p.flush(60) == 0
    name = harness.cache_name("jvm")
    sup = harness.supervisor(name, topic, harness.group("jvm"), fmt="kv", memory="64MiB")
    r = harness.attach(name, sup=sup)
    probe = KafkaProbe(harness.bootstrap, topic, 2)
    try:
        ends = probe.end_offsets()
    finally:
        probe.close()
    wait_applied(r, ends, 120, sup)
    misses = rng.integers(0, 256, (100, 32), np.uint8)
    df = _query(spark, np.concatenate([keys, misses]), nulls=2).repartition(2)
    for decode in (None, "txmeta"):
        jvm, py = (_rows(lookup(df, cache=name, decode=decode, engine=e)) for e in ("jvm", "python"))
        assert jvm == py
        assert sum(row[2] for row in jvm) == len(keys) - len(keys[::5])


def test_every_other_column_passes_through_the_batched_lookup_unchanged(spark, filled):
    """The batched lookup copies each input row's bytes into one buffer and joins the value
    to them as UnsafeRows: columns of every kind before and after the key, nulls among
    them, rows from a few bytes to 20 KB (the buffer grows mid-chunk), come out as they
    went in, beside the Python engine's rows."""
    name, keys = filled
    rng = np.random.default_rng(42)
    n = 700  # one partition: chunks of 256 end mid-partition
    rows = []
    for i in range(n):
        key = keys[i % N].tobytes() if i % 7 else None
        note = None if i % 11 == 0 else "x" * int(rng.integers(0, 20_000 if i % 50 == 0 else 40))
        tags = None if i % 13 == 0 else [f"t{j}" for j in range(i % 5)] + [None]
        info = None if i % 17 == 0 else (i, None if i % 2 else "b" * (i % 9))
        rows.append((note, decimal.Decimal(i) / 8, tags, key, info, i % 3 == 0, i))  # i / 8: exact in 4 places
    schema = "note string, amount decimal(20,4), tags array<string>, tx_hash binary, info struct<a:int,b:string>, flag boolean, row long"
    df = spark.createDataFrame(rows, schema).coalesce(1)
    jvm = lookup(df, cache=name, engine="jvm")
    py = lookup(df, cache=name, engine="python")
    assert [(f.name, f.dataType) for f in jvm.schema] == [(f.name, f.dataType) for f in py.schema]
    got, want = jvm.collect(), py.collect()
    assert sorted(got, key=lambda r: r.row) == sorted(want, key=lambda r: r.row)
    assert [tuple(r)[:7] for r in sorted(got, key=lambda r: r.row)] == rows
    assert "shmcache lookup of 'tx_hash'" in jvm._jdf.queryExecution().executedPlan().toString()


def test_spark_plans_through_the_batched_lookup(spark, filled, tmp_path):
    """The lookup is a node of the query's plan: the input's columns the query does not use
    are not read (the Parquet scan's schema), a filter on the input's columns reaches the
    scan and its rows are never looked up (the readers' companion counts only the others),
    a filter on the looked-up column stays above the lookup; the rows are the Python
    engine's."""
    from pyspark.sql import functions as F

    name, keys = filled
    path = str(tmp_path / "in.parquet")
    _query(spark, keys).withColumn("note", F.lit("x" * 100)).write.parquet(path)
    src = spark.read.parquet(path)

    def query(engine):
        out = lookup(src, cache=name, engine=engine)
        return out.where((F.col("row") < 500) & F.col("found")).select("row", "value")

    with shmcache.attach(name) as r:
        before = r.stats()
        got = sorted((x.row, bytes(x.value)) for x in query("jvm").collect())
        after = r.stats()
    assert got == sorted((x.row, bytes(x.value)) for x in query("python").collect())
    assert len(got) == sum(1 for i in range(500) if i % 4)  # the deleted quarter are misses
    looked = after["reader_hits"] + after["reader_misses"] - before["reader_hits"] - before["reader_misses"]
    assert looked == 500, "only the rows the filter keeps are looked up"
    lines = query("jvm")._jdf.queryExecution().executedPlan().toString().splitlines()
    at = next(i for i, line in enumerate(lines) if "ShmcacheLookup shmcache lookup of 'tx_hash'" in line)
    scan = next(line for line in lines[at:] if "FileScan parquet" in line)
    assert "ReadSchema: struct<tx_hash:binary,row:bigint>" in scan, scan  # note: pruned
    assert "LessThan(row,500)" in scan, scan
    assert any("isnotnull(value" in line for line in lines[:at]), lines  # found: above the lookup
    # a shuffle after the lookup serializes the physical plan around it (the codegen's references)
    counts = {e: sorted(tuple(x) for x in lookup(src, cache=name, engine=e).groupBy("found").count().collect())
              for e in ("jvm", "python")}
    assert counts["jvm"] == counts["python"] == [(False, N // 4), (True, N - N // 4)]


def test_the_batched_lookup_runs_nothing_before_an_action(spark, filled):
    """lookup() of a shuffled DataFrame plans, but runs no job (an adaptive plan's shuffle
    stages would, were the input's rows asked for at once): the action runs everything."""
    name, keys = filled
    df = _query(spark, keys).repartition(3)
    st = spark.sparkContext.statusTracker()
    before = set(st.getJobIdsForGroup(None))
    out = lookup(df, cache=name, engine="jvm")
    assert set(st.getJobIdsForGroup(None)) == before
    assert out.filter("found").count() == N - N // 4
    assert set(st.getJobIdsForGroup(None)) > before  # the tracker does see this session's jobs


def test_the_default_engine_is_the_jvm_and_sql_calls_the_functions(spark, filled):
    name, keys = filled
    df = _query(spark, keys[:10]).repartition(2)  # executors (a local table's projection runs in the driver)
    plan = lookup(df, cache=name)._jdf.queryExecution().executedPlan().toString()
    assert "shmcache" in plan.lower() and "PythonMapInArrow" not in plan and "MapInArrow" not in plan, plan
    one = keys[1].tobytes()
    with shmcache.attach(name) as r:
        want = r.get(one)
    row = spark.sql(f"SELECT shmcache_get('{name}', unhex('{one.hex()}')) AS v, "
                    f"shmcache_contains('{name}', '{one.hex()}') AS c, "
                    f"shmcache_contains('{name}', CAST(NULL AS BINARY)) AS n").collect()[0]
    assert bytes(row.v) == want and row.c is True and row.n is False


def test_errors_name_the_column_the_cache_and_the_host(spark, filled, cache_names):
    name, keys = filled
    short = spark.createDataFrame(pa.table({"k": pa.array([keys[0].tobytes(), keys[1].tobytes()[:31]])}))
    with pytest.raises(Exception, match=r"key column 'k', row \d+ of this batch.*: .* is 31 bytes; .*32 bytes"):
        lookup(short, key_col="k", cache=name, engine="jvm").collect()
    badhex = spark.createDataFrame(pa.table({"k": pa.array(["zz" * 32])}))
    with pytest.raises(Exception, match="key column 'k'.* is not 64 hex characters"):
        lookup(badhex, key_col="k", cache=name, engine="jvm").collect()
    with pytest.raises(TypeError, match="key column 'id' is bigint; expected binary"):
        lookup(spark.range(3), key_col="id", cache=name, engine="jvm")
    missing = cache_names("missing")  # never created
    with pytest.raises(Exception) as e:
        lookup(_query(spark, keys[:2]), cache=missing, engine="jvm").collect()
    assert f"cache {missing!r} not found on host {socket.gethostname()!r}" in str(e.value)
    assert "shmcache run" in str(e.value)


def test_a_recreated_cache_is_reattached(spark, cache_names):
    name = cache_names("again")
    keys = np.random.default_rng(42).integers(0, 256, (100, 32), np.uint8)
    df = _query(spark, keys).coalesce(1)
    for generation in (b"first", b"second"):
        with shmcache.create(name, memory="64MiB") as w:
            w.set_many(keys, [generation] * len(keys))
        assert {bytes(r.value) for r in lookup(df, cache=name, engine="jvm").collect()} == {generation}
        shmcache.destroy(name)
    with pytest.raises(Exception, match=f"cache '{name}' not found on host"):
        lookup(df, cache=name, engine="jvm").collect()


def test_hits_and_misses_are_counted_in_the_readers_companion(spark, filled):
    name, keys = filled
    with shmcache.attach(name) as r:
        before = r.stats()
        df = _query(spark, keys, nulls=3).repartition(2)
        assert lookup(df, cache=name, engine="jvm").filter("found").count() == N - N // 4
        after = r.stats()
    assert after["reader_hits"] - before["reader_hits"] == N - N // 4
    assert after["reader_misses"] - before["reader_misses"] == N // 4 + 3


def test_a_session_without_the_jar_falls_back_to_python_unless_jvm_is_asked(filled, tmp_path, repo):
    """A SparkSession started without shmcache.spark.session() (no jar on spark.jars): the
    default engine is the Python one, and engine='jvm' is an error saying how to fix it."""
    import subprocess
    import sys
    import textwrap

    name, keys = filled
    script = tmp_path / "plain.py"
    script.write_text(textwrap.dedent(f"""
        import pyarrow as pa
        from pyspark.sql import SparkSession
        from shmcache.spark import lookup
        from shmcache.spark._session import SparkSetupError
        spark = (SparkSession.builder.master("local[1]").config("spark.ui.enabled", "false")
                 .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
                 .getOrCreate())
        keys = [bytes.fromhex(h) for h in {[k.tobytes().hex() for k in keys[:8]]!r}]
        df = spark.createDataFrame(pa.table({{"tx_hash": pa.array(keys, pa.binary())}})).repartition(1)
        print("FOUND", lookup(df, cache={name!r}).filter("found").count())
        try:
            lookup(df, cache={name!r}, engine="jvm")
        except SparkSetupError as e:
            print("SETUP-ERROR", e)
        spark.stop()
    """))
    env = {**os.environ, "PYSPARK_PYTHON": sys.executable, "SPARK_LOCAL_IP": "127.0.0.1"}
    out = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=repo, env=env)
    assert out.returncode == 0, out.stderr[-3000:]
    with shmcache.attach(name) as r:
        assert f"FOUND {sum(v is not None for v in r.get_many([k.tobytes() for k in keys[:8]]))}" in out.stdout
    assert "SETUP-ERROR" in out.stdout and "spark.jars" in out.stdout, out.stdout


def test_a_jar_built_for_another_spark_is_refused(tmp_path):
    jar = tmp_path / "shmcache-jvm-0.0.jar"
    with zipfile.ZipFile(jar, "w") as z:
        z.writestr("META-INF/MANIFEST.MF", "Manifest-Version: 1.0\nShmcache-Spark-Version: 3.5.1\n")
    with pytest.raises(_session.SparkSetupError, match=r"built for Spark 3\.5\.1.*mvn -q package -Dspark.version="):
        _session.check_jvm_jar(str(jar))


STRANGER = 12345  # a uid with no user here: the other owner


def test_owner_is_checked_by_the_jvm_reader_at_attach_and_reattach(spark, filled):
    """owner= with engine="jvm" (and by default): the cache's owner, by name or uid, reads as
    the Python engine does; another user refuses it naming both; a cache destroyed and made
    again by another uid is refused at the executor's re-attach, and read when told that uid."""
    if os.geteuid() != 0:
        pytest.skip("a cache of another uid (chown): needs root")
    name, keys = filled
    me = pwd.getpwuid(os.geteuid()).pw_name
    df = _query(spark, keys[:60], nulls=2).repartition(2)
    want = _rows(lookup(df, cache=name, owner=me, engine="python"))
    for owner in (me, os.geteuid(), str(os.geteuid())):
        assert _rows(lookup(df, cache=name, owner=owner, engine="jvm")) == want
    plan = lookup(df, cache=name, owner=me)._jdf.queryExecution().executedPlan().toString()
    assert "MapInArrow" not in plan, plan  # owner= no longer takes the Python engine
    one = keys[1].tobytes()
    with shmcache.attach(name) as r:
        value = r.get(one)
    row = spark.sql(f"SELECT shmcache_get('{name}', unhex('{one.hex()}'), '{me}') AS v, "
                    f"shmcache_contains('{name}', '{one.hex()}', {os.geteuid()}) AS c").collect()[0]  # a uid as an int
    assert bytes(row.v) == value and row.c is True
    with pytest.raises(Exception, match=f"belongs to uid 0 \\(root\\), not to uid {STRANGER} "):
        spark.sql(f"SELECT shmcache_contains('{name}', '{one.hex()}', {STRANGER})").collect()
    for wrong, said in (("nobody", "not to uid 65534 (nobody)"), (STRANGER, f"not to uid {STRANGER}")):
        with pytest.raises(Exception) as e:
            lookup(df, cache=name, owner=wrong, engine="jvm").collect()
        assert f"/dev/shm/{name} belongs to uid 0 (root), {said} as its reader was told (owner={wrong})" in str(e.value)
    with pytest.raises(Exception, match="no such user"):
        lookup(df, cache=name, owner="no-such-user-shmcache-40", engine="jvm").collect()
    shmcache.destroy(name)  # made again at the name by another user: the executors' handle follows the name
    try:
        with shmcache.create(name, memory="64MiB") as w:
            w.set_many(keys[:60], [b"a squatter's value"] * 60)
        os.chown(f"/dev/shm/{name}", STRANGER, -1)
        with pytest.raises(Exception) as e:
            lookup(df, cache=name, owner=me, engine="jvm").collect()
        assert f"/dev/shm/{name} belongs to uid {STRANGER}, not to uid 0 (root)" in str(e.value)
        rows = lookup(df, cache=name, owner=STRANGER, engine="jvm").collect()
        assert {bytes(r.value) for r in rows if r.found} == {b"a squatter's value"}
        assert _rows(lookup(df, cache=name, owner=STRANGER, engine="jvm")) == \
            _rows(lookup(df, cache=name, owner=STRANGER, engine="python"))
    finally:
        if shmcache.exists(name):
            shmcache.destroy(name, force=True)


def _malformed_values(rng):
    """Values of every shape the decoder must refuse or accept: Teranode-shaped records,
    and the same cut short, with bytes appended (4 of them are a height), with a parent or
    vout count past the end (up to 2**32-1), with fee and size past 2**63, byte flips,
    random bytes, and the edges (empty, 20 and 21 bytes, no parents)."""
    n = 400
    offsets, data = txmeta.encode(txmeta.generate(n, rng, max_parents=4, max_vouts=3))
    good = [data[offsets[i]:offsets[i + 1]].tobytes() for i in range(n)]
    out = good[:40] + [b"", bytes(20), bytes(21), bytes(25), bytes(24), bytes(26), b"\xff" * 21,
                       bytes(17) + (0xFFFFFFFF).to_bytes(4, "little"),
                       bytes(17) + (1).to_bytes(4, "little") + bytes(32) + (0xFFFFFFFF).to_bytes(4, "little")]
    for v in good[40:]:
        b = bytearray(v)
        kind = int(rng.integers(0, 8))
        if kind == 0:
            b = b[:int(rng.integers(0, len(b)))]
        elif kind == 1:
            b += bytes(rng.integers(0, 256, int(rng.integers(1, 9)), np.uint8))
        elif kind == 2:
            b[17:21] = int(rng.choice([0, 1, 2, 5, 1000, 0x7FFFFFFF, 0xFFFFFFFF])).to_bytes(4, "little")
        elif kind == 3:  # the first parent's vout count
            at = 21 + 32 * int.from_bytes(b[17:21], "little")
            b[at:at + 4] = int(rng.choice([0, 2, 3, 100, 0xFFFFFFFF])).to_bytes(4, "little")
        elif kind == 4:
            b[0:16] = bytes(rng.integers(128, 256, 16, np.uint8))  # fee and size >= 2**63 as u64
        elif kind == 5:
            for _ in range(int(rng.integers(1, 4))):
                b[int(rng.integers(0, len(b)))] ^= 1 << int(rng.integers(0, 8))
        elif kind == 6:
            b = bytearray(rng.integers(0, 256, int(rng.integers(0, 200)), np.uint8).tobytes())
        out.append(bytes(b))
    return out


def test_the_jvm_txmeta_decoder_matches_the_python_one_on_malformed_values(spark):
    """shmcache_txmeta(value) in the executors' JVM against txmeta.decode + to_arrow, row for
    row: the same fields, the same nulls (a value that does not parse, a null value, a missing
    height), whatever the bytes say."""
    rng = np.random.default_rng(4040)
    values = _malformed_values(rng) + [None]
    py_vals = [v if v is not None else b"" for v in values]
    offsets = np.zeros(len(py_vals) + 1, np.int64)
    np.cumsum([len(v) for v in py_vals], out=offsets[1:])
    data = np.frombuffer(b"".join(py_vals), np.uint8)
    present = np.array([v is not None for v in values])
    want = pa.table(txmeta.to_arrow(txmeta.decode(offsets, data, present))).to_pylist()
    assert sum(r["fee"] is not None for r in want) > 60 and sum(r["fee"] is None for r in want) > 100  # both kinds
    df = spark.createDataFrame(pa.table({"row": pa.array(range(len(values))), "v": pa.array(values, pa.binary())}))
    got = df.repartition(3).selectExpr("row", "shmcache_txmeta(v) AS m").select("row", "m.*").collect()
    got = sorted(got, key=lambda r: r.row)
    fields = [f for f, _ in txmeta.arrow_fields()]
    assert len(got) == len(values)
    for r, w in zip(got, want):
        g = {f: r[f] for f in fields}
        g["parents"] = None if g["parents"] is None else [bytes(p) for p in g["parents"]]
        assert g == w, (r.row, values[r.row].hex() if values[r.row] is not None else None)
