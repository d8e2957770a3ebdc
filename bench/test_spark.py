"""Spark benchmark (issues "Spark pipeline" and 14): looking keys up from Spark executors
through `shmcache.spark.lookup`, against the usual Spark way, a broadcast hash join with
the same data as a DataFrame, and against Spark's own Arrow round trip (no-op
`mapInArrow`s: tests/lib/shmtest/bench/spark_ways.py says what each way does).

    SHMCACHE_SPARK_BENCH_N=1000000 .venv/bin/python -m pytest bench/test_spark.py -p no:cacheprovider --benchmark-enable -s
    CI=true .venv/bin/python -m pytest bench/test_spark.py -p no:cacheprovider     # smoke, N = 20,000

N cache entries (32-byte keys: sha256 of the decimal index, 61-141-byte txmeta values
from txmeta.generate) and 10 * N lookups, all hits, each key 10 times in a scattered
order ((i * 7919) mod N). One local[2] session (driver memory 6g, so the join's
broadcast fits at full size); the query DataFrame (tx_hash only) and the value
DataFrame (tx_hash, value: the broadcast side, read from Parquet) are persisted in
memory and counted before anything is timed, so every way reads the same in-memory
input. A timed run is one Spark action that consumes every result (the broadcast is
built inside each run, as it is for every query that joins against a DataFrame).

Rows/s = 10 * N / wall seconds of the action (median of the runs). An untimed
warm-up of each way runs first (Python workers, numba kernels, codegen). Asserted:
the lookup and the join find every key and return the same value bytes; the no-ops
return every row; never speed.

`test_lookup_over_noop_interleaved` times noop, columns and lookup back to back in
each round (the order alternating), keeps each round's ratios to the noop, and the CPU
time per row of this session's JVM and of its Python workers (psutil, summed over the
processes under this one: on a shared machine, CPU time moves far less than wall time).

SHMCACHE_SPARK_BENCH_N sets N (else SHMCACHE_BENCH_N, which scripts/test sets to a
smoke size; else 20,000 when CI=true, else 1,000,000). With --benchmark-enable each
way runs SHMCACHE_SPARK_BENCH_ROUNDS times (default 3) and the figures go to
.benchmarks/spark-<time>.json; otherwise once. SHMCACHE_SPARK_BENCH_BATCH sets
spark.sql.execution.arrow.maxRecordsPerBatch (Spark's default, 10,000, otherwise).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import statistics
import sys
import time
import uuid

import numpy as np
import pytest

from shmtest.bench import peers as P
from shmtest.bench import summary as S
from shmtest.bench import spark_ways as ways
import psutil
import shmcache
from shmcache.formats import txmeta

REPEAT = 10  # lookups per cache entry
STRIDE = 7919  # a prime: (i * STRIDE) mod N visits every key in a scattered order
DRIVER_MEMORY = "6g"
CI = os.environ.get("CI", "").lower() in ("true", "1")


def spark_bench_n() -> int:
    for var in ("SHMCACHE_SPARK_BENCH_N", "SHMCACHE_BENCH_N"):
        if os.environ.get(var):
            return int(os.environ[var].replace("_", ""))
    return 20_000 if CI else 1_000_000


N = spark_bench_n()
Q = REPEAT * N
pytestmark = pytest.mark.timeout(900 + Q // 10_000)

RESULTS: dict[str, dict] = {}  # way -> figures
META: dict = {}
WAYS = [("noop", "no-op mapInArrow (batches unchanged)"),
        ("columns", "mapInArrow appending found + values, no lookup"),
        ("lookup", "shmcache.spark.lookup (mapInArrow)"), ("join", "broadcast hash join")]
BATCH = os.environ.get("SHMCACHE_SPARK_BENCH_BATCH", "10000")
INTERLEAVED: dict = {}  # way -> per-round rows/s, ratio to noop, CPU ns per row


# -- the summary ---------------------------------------------------------------------------------


def render() -> str:
    if not RESULTS:
        return ""
    from rich import box
    from rich.console import Console
    from rich.table import Table

    buf = io.StringIO()
    con = Console(file=buf, width=120, force_terminal=False, color_system=None)
    t = Table(title=f"Spark lookups: {Q:,} keys (all hits) against {N:,} entries, {META.get('master')}, "
                    f"{META.get('mode')}, {os.cpu_count()} CPUs\nrows/s = keys / wall seconds of one action, "
                    "higher is better", title_justify="left", box=box.ASCII2)
    for c in ("way", "rows/s", "best run", "seconds", "runs (rows/s)"):
        t.add_column(c, justify="left" if c in ("way", "runs (rows/s)") else "right")
    for key, label in WAYS:
        r = RESULTS.get(key)
        if r is None:
            t.add_row(label, "-", "", "", "not run")
            continue
        t.add_row(label, S.fmt_rate(r["rows_per_s"]), S.fmt_rate(max(r["runs"])), f"{r['seconds']:.2f}",
                  ", ".join(S.fmt_rate(x) for x in r["runs"]))
    con.print(t)
    if "lookup" in RESULTS and "join" in RESULTS:
        ratio = RESULTS["lookup"]["rows_per_s"] / RESULTS["join"]["rows_per_s"]
        con.print(f"lookup / broadcast join: {ratio:.2f}x (median runs)")
    if INTERLEAVED:
        t2 = Table(title=f"interleaved rounds (maxRecordsPerBatch {BATCH}): ratio to the no-op per round and "
                         "CPU ns per row, medians", title_justify="left", box=box.ASCII2)
        for c in ("way", "rows/s", "/ noop", "JVM CPU ns/row", "Python CPU ns/row", "rounds (rows/s)"):
            t2.add_column(c, justify="left" if c in ("way", "rounds (rows/s)") else "right")
        for key, label in WAYS:
            r = INTERLEAVED.get(key)
            if r:
                t2.add_row(label, S.fmt_rate(statistics.median(r["runs"])), f"{statistics.median(r['ratio']):.2f}x",
                           f"{statistics.median(r['jvm']):.0f}", f"{statistics.median(r['py']):.0f}",
                           ", ".join(S.fmt_rate(x) for x in r["runs"]))
        con.print(t2)
    con.print(f"setup: cache filled in {META['fill_s']:.1f} s, inputs persisted in {META['persist_s']:.1f} s; "
              f"load average (1 min) at start {META['load_avg_start']:.2f}, at end {os.getloadavg()[0]:.2f}")
    return buf.getvalue()


def save(directory) -> object:
    if not RESULTS or not META.get("enabled"):
        return None
    directory.mkdir(exist_ok=True)
    path = directory / f"spark-{time.strftime('%Y%m%d-%H%M%S')}.json"
    ratio = (RESULTS["lookup"]["rows_per_s"] / RESULTS["join"]["rows_per_s"]
             if "lookup" in RESULTS and "join" in RESULTS else None)
    path.write_text(json.dumps({"meta": {**META, "n": N, "queries": Q, "cpus": os.cpu_count()},
                                "results": RESULTS, "interleaved": INTERLEAVED,
                                "lookup_over_join": ratio}, indent=1, default=str))
    return path


S.SUMMARIES.append(("shmcache Spark lookup benchmark summary", render, save))


# -- the data --------------------------------------------------------------------------------------


def _keys(n: int) -> np.ndarray:
    """sha256 of "0", "1", ...: the keys Spark's sha2(cast(i as string), 256) makes."""
    out = np.empty((n, 32), np.uint8)
    for i in range(n):  # setup, not timed: ~1 s per million
        out[i] = np.frombuffer(hashlib.sha256(str(i).encode()).digest(), np.uint8)
    return out


class World:
    """The cache, the Parquet of (tx_hash, value), the session and the persisted inputs."""

    def __init__(self, tmp_dir):
        from pyspark.sql import SparkSession

        self.name = f"bench-spark-{uuid.uuid4().hex[:8]}"
        self.spark = self.writer = self.query = self.values = None
        self.started = SparkSession.getActiveSession() is None
        try:
            self._make(tmp_dir)
        except BaseException:
            self.close()  # the cache goes even when the session or the inputs could not be made
            raise

    def _make(self, tmp_dir) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq
        from pyspark.sql import functions as F

        from shmcache.spark import session

        META["load_avg_start"] = os.getloadavg()[0]
        t0 = time.perf_counter()
        keys = _keys(N)
        offsets, data = txmeta.encode(txmeta.generate(N, np.random.default_rng(P.SEED)))
        self.value_bytes = int(offsets[-1]) * REPEAT
        self.writer = shmcache.create(self.name, memory=P.cache_memory(N))
        self.writer.set_many(keys, (offsets, data))
        assert self.writer.stats()["entries"] == N
        META["fill_s"] = time.perf_counter() - t0
        self.pool = (offsets[: ways.POOL + 1].astype(np.int32), data[: int(offsets[ways.POOL])].copy()) \
            if N >= ways.POOL else (offsets.astype(np.int32), data.copy())
        table = pa.table({"tx_hash": pa.Array.from_buffers(pa.binary(), N, [None, pa.py_buffer(
                              np.arange(0, 32 * (N + 1), 32, dtype=np.int32)), pa.py_buffer(keys)]),
                          "value": pa.Array.from_buffers(pa.binary(), N, [None, pa.py_buffer(
                              offsets.astype(np.int32)), pa.py_buffer(data)])})
        values_path = os.path.join(tmp_dir, "values.parquet")
        pq.write_table(table, values_path)

        self.spark = session("shmcache-bench", conf={"spark.driver.memory": DRIVER_MEMORY,
                                                     "spark.sql.shuffle.partitions": "4"})
        self.spark.conf.set("spark.sql.execution.arrow.maxRecordsPerBatch", BATCH)
        META["master"] = self.spark.sparkContext.master
        META["driver_memory"] = self.spark.conf.get("spark.driver.memory", "1g (default)")
        t0 = time.perf_counter()
        idx = (F.col("id") * STRIDE) % N
        self.query = (self.spark.range(0, Q, numPartitions=2 * self.spark.sparkContext.defaultParallelism)
                      .select(F.unhex(F.sha2(idx.cast("string"), 256)).alias("tx_hash")).persist())
        self.values = self.spark.read.parquet(values_path).persist()
        assert self.query.count() == Q and self.values.count() == N
        META["persist_s"] = time.perf_counter() - t0

    def run(self, way: str, limit: int | None = None) -> tuple[int, int]:
        """One action over every query row (or the first `limit`): (found, value bytes)."""
        q = self.query if limit is None else self.query.limit(limit)
        return ways.run(way, q, cache=self.name, values=self.values, pool=self.pool)

    def check(self, way: str, found: int, nbytes: int) -> None:
        want = {"noop": (Q, 32 * Q), "lookup": (Q, self.value_bytes), "join": (Q, self.value_bytes)}.get(way)
        got = (found, nbytes) if want else (found,)
        assert got == (want or (Q,)), f"{way}: found {found} of {Q}, {nbytes} value bytes"

    def close(self) -> None:
        try:
            for df in (self.query, self.values):
                if df is not None:
                    df.unpersist()
            if self.spark is not None and self.started:
                self.spark.stop()
        finally:  # whatever Spark's teardown raises
            if self.writer is not None:
                self.writer.close()
                shmcache.destroy(self.name)


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    pytest.importorskip("pyspark")
    w = World(str(tmp_path_factory.mktemp("spark-bench")))
    try:
        for way, _ in WAYS:  # warm-up: workers, numba kernels, codegen
            w.run(way, limit=min(Q, 20_000))
        yield w
    finally:
        w.close()


@pytest.mark.parametrize("way", [w for w, _ in WAYS])
def test_spark_lookup(benchmark, world, way):
    rounds = int(os.environ.get("SHMCACHE_SPARK_BENCH_ROUNDS", "3")) if benchmark.enabled else 1
    META.update(enabled=benchmark.enabled,
                mode=f"median of {rounds} runs" if benchmark.enabled else "1 run each (benchmarks disabled)")
    runs: list[float] = []

    def one():
        t0 = time.perf_counter()
        found, nbytes = world.run(way)
        runs.append(Q / (time.perf_counter() - t0))
        world.check(way, found, nbytes)

    benchmark.pedantic(one, rounds=rounds, iterations=1)
    med = statistics.median(runs)
    RESULTS[way] = {"rows_per_s": med, "seconds": Q / med, "runs": runs}
    benchmark.extra_info.update(rows_per_s=med, n=N, queries=Q, runs=runs)
    print(f"{way}: {S.fmt_rate(med)} rows/s (runs: {', '.join(S.fmt_rate(x) for x in runs)})", file=sys.stderr)


def _cpu_s() -> dict[str, float]:
    """CPU seconds of the processes under this one: the session's JVM and its Python workers."""
    out = {"jvm": 0.0, "py": 0.0}
    for p in psutil.Process().children(recursive=True):
        try:
            t = p.cpu_times()
            out["jvm" if "java" in p.name() else "py"] += t.user + t.system
        except psutil.Error:  # a worker that ended in between
            pass
    return out


def test_lookup_over_noop_interleaved(world):
    """noop, columns and lookup back to back each round: per-round ratios and CPU per row."""
    order = ["noop", "columns", "lookup"]
    rounds = int(os.environ.get("SHMCACHE_SPARK_BENCH_ROUNDS", "3"))
    res = {w: {"runs": [], "ratio": [], "jvm": [], "py": []} for w in order}
    for i in range(rounds):
        this = {}
        for way in (order if i % 2 == 0 else order[::-1]):
            c0 = _cpu_s()
            t0 = time.perf_counter()
            found, nbytes = world.run(way)
            dt = time.perf_counter() - t0
            c1 = _cpu_s()
            world.check(way, found, nbytes)
            this[way] = Q / dt
            res[way]["runs"].append(Q / dt)
            for k in ("jvm", "py"):
                res[way][k].append((c1[k] - c0[k]) / Q * 1e9)
        for way in order:
            res[way]["ratio"].append(this[way] / this["noop"])
    INTERLEAVED.update(res)
    print("interleaved: " + "; ".join(f"{w} {statistics.median(r['ratio']):.2f}x noop, CPU ns/row JVM "
                                     f"{statistics.median(r['jvm']):.0f} Python {statistics.median(r['py']):.0f}"
                                     for w, r in res.items()), file=sys.stderr)
