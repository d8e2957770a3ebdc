"""The ways the Spark benchmarks time over the same persisted query (a `tx_hash` column),
each one action that consumes every row (bench/test_spark.py locally, tests/lib/shmtest/bench/cluster_run.py
on the cluster):

- noop: a `mapInArrow` that yields its batches unchanged: what Spark's own JVM <-> Python
  Arrow round trip costs; then count(*) and sum(length(tx_hash)).
- columns: a `mapInArrow` that appends the columns a lookup appends (a found bit and a
  binary value of the same sizes: values from a pool of real txmeta values) without
  looking anything up: the round trip of the lookup's output; then count(found) and
  sum(length(value)).
- lookup: `shmcache.spark.lookup` (its default engine); then count(found) and sum(length(value)).
- jvm, python: `lookup(engine="jvm")` (the Spark SQL function in the executors' JVM), and
  `lookup(engine="python")` (a `mapInArrow`).
- constants: the no-op of the JVM lookup's shape: the same job with the lookup replaced by
  constant columns of its output types (found = true, value = one real txmeta value of
  the pool's mean length), so what is left is Spark's own cost of the rows and columns.
- join: `query.join(broadcast(values), "tx_hash", "left")` (found = value is not null);
  then count(value) and sum(length(value)).

`run` consumes the rows with one of two sinks: "agg" (the default) aggregates as above and
returns (found, bytes) so the callers can check every row came back; "noop" writes every
row, every column, to Spark's `noop` data source (nothing is folded away: a constant
column is written out row by row as a looked-up one is) and returns None. The functions
given to mapInArrow are pickled by value (this module is not importable on executors).
"""

from __future__ import annotations

from functools import partial

import numpy as np

POOL = 20_000  # values in the `columns` way's pool (>= spark.sql.execution.arrow.maxRecordsPerBatch)


def noop(batches):
    yield from batches


def columns(batches, *, offsets: np.ndarray, data: np.ndarray):
    """Each batch with a found column (all true) and value i = pool value i % POOL appended."""
    import pyarrow as pa

    pool = len(offsets) - 1
    for b in batches:
        n = b.num_rows
        reps, rest = divmod(n, pool)
        lens = np.diff(offsets)
        lens = np.concatenate([np.tile(lens, reps), lens[:rest]])
        offs = np.zeros(n + 1, np.int32)
        np.cumsum(lens, out=offs[1:])
        buf = np.concatenate([np.tile(data, reps), data[: offsets[rest]]])
        cols = b.columns + [pa.Array.from_buffers(pa.bool_(), n, [None, pa.py_buffer(np.packbits(
            np.ones(n, np.bool_), bitorder="little"))]),
            pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(offs), pa.py_buffer(buf)])]
        yield pa.RecordBatch.from_arrays(cols, names=b.schema.names + ["found", "value"])


def _by_value() -> None:
    import sys

    from pyspark import cloudpickle

    cloudpickle.register_pickle_by_value(sys.modules[__name__])


def mean_value(pool) -> bytes:
    """The pool's value nearest its mean length (the constants way's value)."""
    offsets, data = pool
    lens = np.diff(offsets)
    i = int(np.argmin(np.abs(lens - lens.mean())))
    return bytes(data[offsets[i]:offsets[i + 1]])


def frame(way: str, query, *, cache: str, values=None, pool=None):
    """`query` with the way's columns: (tx_hash, found, value), or (tx_hash) for noop."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import BinaryType, BooleanType, StructField, StructType

    from shmcache.spark import lookup

    _by_value()
    if way == "noop":
        return query.mapInArrow(noop, query.schema)
    if way == "columns":
        schema = StructType(list(query.schema.fields) + [StructField("found", BooleanType()),
                                                         StructField("value", BinaryType())])
        return query.mapInArrow(partial(columns, offsets=pool[0], data=pool[1]), schema)
    if way in ("lookup", "jvm", "python"):
        return lookup(query, cache=cache, engine=None if way == "lookup" else way)
    if way == "constants":
        return query.select("*", F.lit(True).alias("found"), F.lit(mean_value(pool)).alias("value"))
    if way == "join":
        j = query.join(F.broadcast(values), "tx_hash", "left")
        return j.select("tx_hash", F.col("value").isNotNull().alias("found"), "value")
    raise ValueError(f"unknown way {way!r}")


def run(way: str, query, *, cache: str, values=None, pool=None, sink: str = "agg") -> tuple[int, int] | None:
    """One action over every row of `query`: (rows found, value bytes) (noop: (rows, key bytes)),
    or None with sink="noop". `values` is the join's DataFrame (tx_hash, value); `pool` the
    columns and constants ways' (offsets, data)."""
    from pyspark.sql import functions as F

    out = frame(way, query, cache=cache, values=values, pool=pool)
    if sink == "noop":
        out.write.format("noop").mode("overwrite").save()
        return None
    if way == "noop":
        agg = out.agg(F.count("*").alias("found"), F.sum(F.length("tx_hash")).alias("bytes"))
    else:
        agg = out.agg(F.count(F.when(F.col("found"), 1)).alias("found"), F.sum(F.length("value")).alias("bytes"))
    row = agg.collect()[0]
    return int(row.found), int(row.bytes or 0)
