"""The JVM lookup (issue 40) on local mode, in one run: the batched lookup that
engine="jvm" takes (io.shmcache.spark.BatchLookups: a partition's rows looked up 256 at a
time, their cache misses overlapped), the Spark SQL function as a native Catalyst
expression (shmcache_get: a StaticInvoke compiled into the stage's generated code, a row
at a time; what SQL calls; here _lookup.JVM_BATCHED = False), the same
lookup as a Java UDF (spark.udf.registerJavaFunction), today's Python lookup (mapInArrow)
and a no-op of the same shape (the lookup replaced by constant columns of its output
types); and with decode="txmeta", the lookup and the decoding both in the JVM
(shmcache_txmeta; the lookup batched, or the expression), the expression's lookup with the
decoding in a Python worker (what engine="jvm" did before shmcache_txmeta: a mapInArrow
over the values, kept here as `_decoder`), and the Python engine. Each way is one action
consuming every row: count(found) and sum(length(value)) (and sum(fee),
sum(size(parents)) where decoded) over Q = 10 * N keys (all hits, each key 10 times in a
scattered order) against N entries; rounds are interleaved, the order rotating, and each
way's median rows/s and ratio to the no-op's are reported.

    SHMCACHE_SPARK_BENCH_N=1000000 .venv/bin/python -m pytest bench/test_jvm_lookup.py -p no:cacheprovider -s
    CI=true .venv/bin/python -m pytest bench/test_jvm_lookup.py -p no:cacheprovider     # smoke, N = 20,000

N: SHMCACHE_SPARK_BENCH_N, else SHMCACHE_BENCH_N (scripts/test's smoke size), else 20,000
under CI=true, else 1,000,000; rounds: SHMCACHE_SPARK_BENCH_ROUNDS (3); ways: all, or those
named in SHMCACHE_SPARK_BENCH_WAYS (e.g. "batch,expr,python"; the no-op always). Asserted:
every way returns every row, the lookups find every key with the cache's bytes, and the
decoding ways the records' fees and parents; never speed.
Skipped where the shmcache JVM jar is not built.
"""

from __future__ import annotations

import hashlib
import os
import statistics
import time
import uuid

import numpy as np
import pytest

from shmtest.bench import peers as P
import shmcache
from shmcache.formats import txmeta
from shmcache.spark import _lookup, _session, lookup

REPEAT, STRIDE = 10, 7919
CI = os.environ.get("CI", "").lower() in ("true", "1")
N = next((int(os.environ[v].replace("_", "")) for v in ("SHMCACHE_SPARK_BENCH_N", "SHMCACHE_BENCH_N")
          if os.environ.get(v)), 20_000 if CI else 1_000_000)
ROUNDS = int(os.environ.get("SHMCACHE_SPARK_BENCH_ROUNDS", "3"))
ONLY = [w for w in os.environ.get("SHMCACHE_SPARK_BENCH_WAYS", "").split(",") if w]  # e.g. noop,expr,python
WAYS = [("noop", "no-op: constant found + value columns"), ("batch", "JVM: batched (BatchLookups, engine=jvm)"),
        ("expr", "JVM: Catalyst expression (shmcache_get)"),
        ("udf", "JVM: Java UDF"), ("python", "Python: mapInArrow lookup"),
        ("batch-txmeta", "txmeta, JVM batched lookup + JVM decode"),
        ("expr-txmeta", "txmeta, JVM expression lookup + JVM decode"), ("expr-pydecode", "txmeta, JVM lookup + Python-worker decode"),
        ("python-txmeta", "txmeta, Python: mapInArrow lookup + decode")]
WAYS = [w for w in WAYS if not ONLY or w[0] in ONLY or w[0] == "noop"]
RESULTS: dict[str, list[float]] = {}
pytestmark = [pytest.mark.skipif(_session.jvm_jar(required=False) is None, reason="the shmcache JVM jar is not built"),
              pytest.mark.timeout(900 + N // 1000)]


@pytest.fixture(scope="module")
def setup():
    from pyspark.sql import functions as F
    from pyspark.sql.types import BinaryType
    import pyarrow as pa

    name = f"bench-jvm-{uuid.uuid4().hex[:8]}"
    keys = np.frombuffer(b"".join(hashlib.sha256(str(i).encode()).digest() for i in range(N)), np.uint8).reshape(N, 32)
    offsets, data = txmeta.encode(txmeta.generate(N, np.random.default_rng(40)))
    from pyspark.sql import SparkSession

    w = shmcache.create(name, memory=2 * P.memory_for(N))  # room: nothing evicted
    spark, q = None, None
    started = SparkSession.getActiveSession() is None  # a running session (the suite's) is not ours to stop
    try:
        w.set_many(keys, (offsets, data))
        spark = _session.session("bench-jvm", master="local[2]", conf={"spark.driver.memory": "3g"})
        spark.udf.registerJavaFunction("shmcache_get_udf", "io.shmcache.spark.JavaUdfs$Get", BinaryType())
        order = (np.arange(REPEAT * N, dtype=np.int64) * STRIDE) % N
        q = spark.createDataFrame(pa.table({"tx_hash": pa.array([keys[i].tobytes() for i in order], pa.binary())}))
        q = q.repartition(2).persist()
        assert q.count() == REPEAT * N
        meta = txmeta.decode(offsets, data)
        total = (int(np.diff(offsets)[order].sum()), int(meta.fee[order].astype(np.int64).sum()),
                 int(np.diff(meta.parent_offsets)[order].sum()))
        yield spark, q, name, total, F
    finally:
        try:  # the cache goes whatever Spark's teardown raises (a failed Python worker's job)
            if q is not None:
                q.unpersist()
            if spark is not None and started:
                spark.stop()
        finally:
            w.close()
            shmcache.destroy(name, force=True)


def _decoder(value_col: str):
    """mapInArrow's function of the JVM lookup's decode="txmeta" before shmcache_txmeta: the
    txmeta columns decoded in a Python worker from the value column's buffers. Nested, so
    that it is pickled by value (the worker cannot import this module)."""
    def decode_batches(batches):
        import numpy as np
        import pyarrow as pa

        from shmcache.formats import txmeta

        for batch in batches:
            values = batch.column(value_col)
            n = len(values)
            found = ~values.is_null().to_numpy(zero_copy_only=False) if n else np.zeros(0, np.bool_)
            bufs = values.buffers()
            width = np.int64 if pa.types.is_large_binary(values.type) else np.int32
            offsets = np.frombuffer(bufs[1], width, n + 1, values.offset * np.dtype(width).itemsize).astype(np.int64) \
                if n else np.zeros(1, np.int64)
            data = np.frombuffer(bufs[2], np.uint8) if n and bufs[2] is not None else np.zeros(0, np.uint8)
            fields = txmeta.to_arrow(txmeta.decode(offsets, data, found))
            yield pa.RecordBatch.from_arrays(batch.columns + list(fields.values()),
                                             names=batch.schema.names + list(fields))

    return decode_batches


def _run(way, spark, q, name, F):
    from pyspark.sql.types import StructType

    from shmcache.spark._lookup import decoded_fields

    _lookup.JVM_BATCHED = way.startswith("batch")  # the expression ways take the row-at-a-time path
    lit_value = F.lit(b"\0" * 100)
    if way in ("expr-txmeta", "batch-txmeta"):
        out = lookup(q, cache=name, decode="txmeta", engine="jvm")
    elif way == "python-txmeta":
        out = lookup(q, cache=name, decode="txmeta", engine="python")
    elif way == "expr-pydecode":
        staged = lookup(q, cache=name, engine="jvm")
        out = staged.mapInArrow(_decoder("value"), StructType(list(staged.schema.fields) + decoded_fields()))
    if way.endswith("txmeta") or way.endswith("pydecode"):
        r = out.agg(F.count(F.when(F.col("found"), 1)).alias("n"), F.sum(F.length("value")).alias("b"),
                    F.sum("fee").alias("fee"), F.sum(F.size("parents")).alias("parents")).collect()[0]
        return r.n, (r.b, r.fee, r.parents)
    if way == "noop":
        out = q.select("tx_hash", F.lit(True).alias("found"), lit_value.alias("value"))
    elif way in ("expr", "batch"):
        out = lookup(q, cache=name, engine="jvm")
    elif way == "udf":
        v = F.expr(f"shmcache_get_udf('{name}', tx_hash, 'tx_hash')")
        staged = q.select("tx_hash", v.alias("value"))
        out = staged.select("tx_hash", F.col("value").isNotNull().alias("found"), "value")
    else:
        out = lookup(q, cache=name, engine="python")
    r = out.agg(F.count(F.when(F.col("found"), 1)).alias("n"), F.sum(F.length("value")).alias("b")).collect()[0]
    return r.n, (r.b,)


def test_jvm_lookup_against_python_and_a_noop(setup, monkeypatch):
    spark, q, name, total, F = setup
    monkeypatch.setattr(_lookup, "JVM_BATCHED", _lookup.JVM_BATCHED)  # _run sets it per way; restored after
    for way, _ in WAYS:  # warm-up: codegen, Python workers, numba kernels, the handles
        _run(way, spark, q, name, F)
    for rnd in range(ROUNDS):
        for way, _ in WAYS[rnd % len(WAYS):] + WAYS[:rnd % len(WAYS)]:
            t0 = time.perf_counter()
            n, b = _run(way, spark, q, name, F)
            RESULTS.setdefault(way, []).append(REPEAT * N / (time.perf_counter() - t0))
            assert n == REPEAT * N
            if way != "noop":
                assert b[0] == total[0], way
            if "txmeta" in way or "pydecode" in way:
                assert b == total, way
    noop = statistics.median(RESULTS["noop"])
    print(f"\nJVM lookup bench: {REPEAT * N:,} keys against {N:,} entries, local[2], {ROUNDS} interleaved rounds, "
          f"load average {os.getloadavg()[0]:.1f}")
    for way, label in WAYS:
        med = statistics.median(RESULTS[way])
        print(f"  {label:45s} {med / 1e6:6.2f} M rows/s  {med / noop:5.2f}x no-op  "
              f"{1e9 / med:7.0f} ns/row  runs {', '.join(f'{x / 1e6:.2f}M' for x in RESULTS[way])}")
