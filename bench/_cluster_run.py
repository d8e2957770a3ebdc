"""The cluster benchmark's driver (bench/test_cluster.py runs it as a child process: it is a
Spark driver of its own, whatever session the pytest process holds).

    python bench/_cluster_run.py --n 1000000 [--rounds 3] [--executor-memory 2g] [--dir DIR]

Starts scripts/cluster's 2 machines (spark/cluster.py, no Kafka), fills each machine's
replica with the same N entries (sha256 of the index -> txmeta values, as
bench/test_spark.py), writes the same data as Parquet (tx_hash, value), and times three
Spark actions over 10 * N keys (each key 10 times, scattered), persisted on the executors
first, each a full pass that consumes every row:

- noop: `mapInArrow` that yields its batches unchanged (Spark's own cost of shipping
  the batches to Python and back), then count and sum(length(tx_hash));
- lookup: `shmcache.spark.lookup`, then count(found) and sum(length(value));
- join: `query.join(broadcast(values), "tx_hash", "left")`, then count(value) and
  sum(length(value)).

A way that fails (e.g. the broadcast does not fit) is reported with its error, not
raised. Prints one line of JSON; everything it started is stopped by pid.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
import traceback
import uuid

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPEAT = 10
STRIDE = 7919


def data(n: int):
    import hashlib

    from shmcache import txmeta

    keys = np.empty((n, 32), np.uint8)
    for i in range(n):
        keys[i] = np.frombuffer(hashlib.sha256(str(i).encode()).digest(), np.uint8)
    offsets, values = txmeta.encode(txmeta.generate(n, np.random.default_rng(1)))
    return keys, offsets, values


def fill(name: str, n: int) -> None:
    """In a machine's namespace: create cache `name` and write the N entries."""
    import shmcache

    sys.path.insert(0, HERE)
    import _peers as P

    keys, offsets, values = data(n)
    with shmcache.create(name, memory=P.cache_memory(n)) as w:
        w.set_many(keys, (offsets, values))
        assert w.stats()["entries"] == n


def _noop(batches):
    yield from batches


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=20_000)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--executor-memory", default="1g")
    ap.add_argument("--driver-memory", default="2g")
    ap.add_argument("--dir")
    ap.add_argument("--fill", nargs=2, metavar=("NAME", "N"), help=argparse.SUPPRESS)
    a = ap.parse_args(argv)
    if a.fill:
        fill(a.fill[0], int(a.fill[1]))
        return 0

    import pyarrow as pa
    import pyarrow.parquet as pq

    from shmcache.spark import cluster as cl

    n, q = a.n, REPEAT * a.n
    d = a.dir or tempfile.mkdtemp(prefix="shmcache-cluster-bench-")
    name = f"bench-cluster-{uuid.uuid4().hex[:8]}"
    out = {"n": n, "queries": q, "executor_memory": a.executor_memory, "driver_memory": a.driver_memory,
           "machines": 2, "results": {}, "load_avg_start": os.getloadavg()[0]}
    c = spark = None
    try:
        shm = int(max(64 << 20, n * 512) * 1.1) + (64 << 20)  # the cache (bench/_peers.cache_memory) and slack
        c = cl.start(os.path.join(d, "cluster"), workers=2, memory=a.executor_memory, shm=f"{shm >> 20}m")
        t0 = time.perf_counter()
        for m in c.machines:
            p = c.exec(m, [sys.executable, os.path.abspath(__file__), "--fill", name, str(n)],
                       capture_output=True, text=True)
            if p.returncode:
                raise RuntimeError(f"filling {m}: {p.stderr[-2000:]}")
        keys, offsets, values = data(n)
        value_bytes = int(offsets[-1]) * REPEAT
        vpath = os.path.join(d, "values.parquet")
        pq.write_table(pa.table({
            "tx_hash": pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(
                np.arange(0, 32 * (n + 1), 32, dtype=np.int32)), pa.py_buffer(keys)]),
            "value": pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(offsets.astype(np.int32)),
                                                            pa.py_buffer(values)])}), vpath)
        del keys, offsets, values
        out["fill_s"] = time.perf_counter() - t0

        from pyspark.sql import functions as F

        from shmcache.spark import lookup, session

        cl.driver_env()
        conf = {**cl.spark_conf(c), "spark.executor.memory": a.executor_memory,
                "spark.driver.memory": a.driver_memory}
        spark = session("shmcache-cluster-bench", master=c.master_url, conf=conf)
        idx = (F.col("id") * STRIDE) % n
        query = (spark.range(0, q, numPartitions=4).select(F.unhex(F.sha2(idx.cast("string"), 256)).alias("tx_hash"))
                 .persist())
        vals = spark.read.parquet(vpath)
        assert query.count() == q

        def run(way, limit=None):
            qq = query if limit is None else query.limit(limit)
            if way == "noop":
                agg = qq.mapInArrow(_noop, qq.schema).agg(F.count("*").alias("found"),
                                                          F.sum(F.length("tx_hash")).alias("bytes"))
            elif way == "lookup":
                agg = lookup(qq, cache=name).agg(F.count(F.when(F.col("found"), 1)).alias("found"),
                                                 F.sum(F.length("value")).alias("bytes"))
            else:
                agg = qq.join(F.broadcast(vals), "tx_hash", "left").agg(F.count("value").alias("found"),
                                                                        F.sum(F.length("value")).alias("bytes"))
            row = agg.collect()[0]
            return int(row.found), int(row.bytes or 0)

        for way in ("noop", "lookup", "join"):
            res = {"runs": [], "error": None}
            out["results"][way] = res
            try:
                run(way, limit=min(q, 20_000))  # warm-up: Python workers, kernels, codegen
                for _ in range(a.rounds):
                    t0 = time.perf_counter()
                    found, nbytes = run(way)
                    res["runs"].append(q / (time.perf_counter() - t0))
                    want = (q, 32 * q) if way == "noop" else (q, value_bytes)
                    if (found, nbytes) != want:
                        raise AssertionError(f"{way}: got {(found, nbytes)}, expected {want}")
                res["rows_per_s"] = statistics.median(res["runs"])
            except Exception as e:  # noqa: BLE001 - the benchmark reports where a way fails
                msg = str(e).strip().splitlines()
                res["error"] = f"{type(e).__name__}: " + next((ln for ln in msg if "Exception" in ln or "Error" in ln),
                                                              msg[0] if msg else "")[:400]
                if isinstance(e, AssertionError):
                    raise
    except Exception:  # noqa: BLE001
        out["error"] = traceback.format_exc()[-3000:]
    finally:
        if spark is not None:
            spark.stop()
        if c is not None:
            c.stop()
    out["load_avg_end"] = os.getloadavg()[0]
    print(json.dumps(out))
    return 1 if out.get("error") else 0


if __name__ == "__main__":
    sys.exit(main())
