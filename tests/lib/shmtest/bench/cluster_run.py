"""The cluster benchmark's driver (bench/test_cluster.py runs it as a child process: it is a
Spark driver of its own, whatever session the pytest process holds).

    python -m shmtest.bench.cluster_run --n 1000000 [--rounds 3] [--executor-memory 2g] [--dir DIR]

Starts scripts/cluster's 2 machines (spark/cluster.py, no Kafka), fills each machine's
replica with the same N entries (sha256 of the index -> txmeta values, as
bench/test_spark.py), writes the same data as Parquet (tx_hash, value), and times the
ways of tests/lib/shmtest/bench/spark_ways.py (constants, jvm, python, columns, join) over 10 * N keys
(each key 10 times, scattered), persisted on the executors first, each a full pass that
writes every row, every column, to Spark's `noop` sink; with --rounds > 1 the ways take
turns in each round (the order alternating). The session is shmcache.spark.session()'s:
the JVM jar reaches the executors on spark.jars. After the timed rounds, each way runs
once more with an aggregating sink, checked: every row back, every value byte (the
lookups and the join).

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
from shmtest.bench import spark_ways as ways
REPEAT = 10
WAYS = ("constants", "jvm", "python", "columns", "join")
STRIDE = 7919


def data(n: int):
    import hashlib

    from shmcache.formats import txmeta

    keys = np.empty((n, 32), np.uint8)
    for i in range(n):
        keys[i] = np.frombuffer(hashlib.sha256(str(i).encode()).digest(), np.uint8)
    offsets, values = txmeta.encode(txmeta.generate(n, np.random.default_rng(1)))
    return keys, offsets, values


def fill(name: str, n: int) -> None:
    """In a machine's namespace: create cache `name` and write the N entries."""
    import shmcache

    from shmtest.bench import peers as P

    keys, offsets, values = data(n)
    with shmcache.create(name, memory=P.cache_memory(n)) as w:
        w.set_many(keys, (offsets, values))
        assert w.stats()["entries"] == n


def _short(e: Exception) -> str:
    msg = str(e).strip().splitlines()
    return f"{type(e).__name__}: " + next((ln for ln in msg if "Exception" in ln or "Error" in ln),
                                          msg[0] if msg else "")[:400]


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
            p = c.exec(m, [sys.executable, "-P", "-m", "shmtest.bench.cluster_run", "--fill", name, str(n)],
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
        offsets_pool, values_pool = offsets[: ways.POOL + 1].copy(), values[: int(offsets[min(ways.POOL, n)])].copy()
        del keys, offsets, values
        out["fill_s"] = time.perf_counter() - t0

        from pyspark.sql import functions as F

        from shmcache.spark import session

        cl.driver_env()
        conf = {**cl.spark_conf(c), "spark.executor.memory": a.executor_memory,
                "spark.driver.memory": a.driver_memory}
        spark = session("shmcache-cluster-bench", master=c.master_url, conf=conf)
        idx = (F.col("id") * STRIDE) % n
        query = (spark.range(0, q, numPartitions=4).select(F.unhex(F.sha2(idx.cast("string"), 256)).alias("tx_hash"))
                 .persist())
        vals = spark.read.parquet(vpath)
        assert query.count() == q

        pool = (offsets_pool.astype(np.int32), values_pool)
        order = list(WAYS)
        kw = {"cache": name, "values": vals, "pool": pool}
        for way in order:
            out["results"][way] = {"runs": [], "error": None}
            try:  # warm-up: code generation, Python workers, kernels, the handles
                ways.run(way, query.limit(min(q, 20_000)), sink="noop", **kw)
            except Exception as e:  # noqa: BLE001 - the benchmark reports where a way fails
                out["results"][way]["error"] = _short(e)
        for i in range(a.rounds):
            for way in (order if i % 2 == 0 else order[::-1]):
                res = out["results"][way]
                if res["error"] is not None:
                    continue
                try:
                    t0 = time.perf_counter()
                    ways.run(way, query, sink="noop", **kw)
                    res["runs"].append(q / (time.perf_counter() - t0))
                except Exception as e:  # noqa: BLE001
                    res["error"] = _short(e)
        const_bytes = len(ways.mean_value(pool)) * q
        for way in order:  # every row back (and every value byte), once, outside the timing
            res = out["results"][way]
            if res["error"] is not None:
                continue
            try:
                found, nbytes = ways.run(way, query, **kw)
            except Exception as e:  # noqa: BLE001
                res["error"] = _short(e)
                continue
            want = (q, {"constants": const_bytes, "columns": nbytes}.get(way, value_bytes))
            if (found, nbytes) != want:
                raise AssertionError(f"{way}: got {(found, nbytes)}, expected {want}")
            res["checked"] = True
        for res in out["results"].values():
            if res["runs"]:
                res["rows_per_s"] = statistics.median(res["runs"])
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
