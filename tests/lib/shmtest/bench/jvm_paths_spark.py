"""One Spark session of bench/test_jvm_paths.py, on whichever JDK $JAVA_HOME names: the
batched JVM lookup (engine="jvm") and the Python lookup (engine="python") over the keys of
a .npy file (10 N keys, all hits) against the cache, each an action that counts the rows
found and sums their values' lengths, rounds interleaved after a warm-up of each. Prints one
JSON object: the JVM's version, the path its executors take (io.shmcache.Segment.access()),
and each way's rows/s a round and its counts.

    JAVA_HOME=... .venv/bin/python -m shmtest.bench.jvm_paths_spark CACHE KEYS.npy ROUNDS
"""

from __future__ import annotations

import json
import sys
import time

import numpy as np


def main(cache: str, keys_file: str, rounds: int) -> None:
    import pyarrow as pa
    from pyspark.sql import functions as F

    from shmcache.spark import _lookup, _session, lookup

    keys = np.load(keys_file)
    spark = _session.session("bench-jvm-paths", master="local[2]", conf={"spark.driver.memory": "3g"})
    try:
        jvm = spark.sparkContext._jvm
        q = spark.createDataFrame(pa.table({"tx_hash": pa.array([k.tobytes() for k in keys], pa.binary())}))
        q = q.repartition(2).persist()
        assert q.count() == len(keys)
        _lookup.JVM_BATCHED = True
        ways = {"jvm": lambda: lookup(q, cache=cache, engine="jvm"),
                "python": lambda: lookup(q, cache=cache, engine="python")}
        out = {"java": jvm.System.getProperty("java.version"), "access": jvm.io.shmcache.Segment.access(),
               "rows": len(keys), "rates": {w: [] for w in ways}, "counts": {}}

        def run(way):
            r = ways[way]().agg(F.count(F.when(F.col("found"), 1)).alias("n"),
                                F.sum(F.length("value")).alias("b")).collect()[0]
            out["counts"][way] = [r.n, r.b]

        for way in ways:  # warm-up: code generation, Python workers, the handles
            run(way)
        for rnd in range(rounds):
            for way in list(ways)[rnd % 2:] + list(ways)[:rnd % 2]:
                t0 = time.perf_counter()
                run(way)
                out["rates"][way].append(len(keys) / (time.perf_counter() - t0))
        q.unpersist()
        print(json.dumps(out))
    finally:
        spark.stop()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], int(sys.argv[3]))
