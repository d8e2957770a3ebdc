"""The ways the Spark benchmarks time over the same persisted query (a `tx_hash` column),
each one action that consumes every row (bench/test_spark.py locally, bench/_cluster_run.py
on the cluster):

- noop: a `mapInArrow` that yields its batches unchanged: what Spark's own JVM <-> Python
  Arrow round trip costs; then count(*) and sum(length(tx_hash)).
- columns: a `mapInArrow` that appends the columns a lookup appends (a found bit and a
  binary value of the same sizes: values from a pool of real txmeta values) without
  looking anything up: the round trip of the lookup's output; then count(found) and
  sum(length(value)).
- lookup: `shmcache.spark.lookup`; then count(found) and sum(length(value)).
- join: `query.join(broadcast(values), "tx_hash", "left")`; then count(value) and
  sum(length(value)).

`run` returns (found, bytes) so the callers can check every row came back. The functions
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


def run(way: str, query, *, cache: str, values=None, pool=None) -> tuple[int, int]:
    """One action over every row of `query`: (rows found, value bytes) (noop: (rows, key bytes)).
    `values` is the join's DataFrame (tx_hash, value); `pool` the columns way's (offsets, data)."""
    from pyspark.sql import functions as F
    from pyspark.sql.types import BinaryType, BooleanType, StructField, StructType

    from shmcache.spark import lookup

    _by_value()
    if way == "noop":
        agg = query.mapInArrow(noop, query.schema).agg(F.count("*").alias("found"),
                                                       F.sum(F.length("tx_hash")).alias("bytes"))
    elif way == "columns":
        schema = StructType(list(query.schema.fields) + [StructField("found", BooleanType()),
                                                         StructField("value", BinaryType())])
        fn = partial(columns, offsets=pool[0], data=pool[1])
        agg = query.mapInArrow(fn, schema).agg(F.count(F.when(F.col("found"), 1)).alias("found"),
                                               F.sum(F.length("value")).alias("bytes"))
    elif way == "lookup":
        agg = lookup(query, cache=cache).agg(F.count(F.when(F.col("found"), 1)).alias("found"),
                                             F.sum(F.length("value")).alias("bytes"))
    elif way == "join":
        agg = query.join(F.broadcast(values), "tx_hash", "left").agg(F.count("value").alias("found"),
                                                                     F.sum(F.length("value")).alias("bytes"))
    else:
        raise ValueError(f"unknown way {way!r}")
    row = agg.collect()[0]
    return int(row.found), int(row.bytes or 0)

