"""Cluster benchmark (issues 14, 40): on a real Spark standalone cluster of 2 machines on this
host (scripts/cluster), each machine with its own replica of the same N entries, 10 * N
keys looked up (all hits), in one run: the JVM lookup (`lookup(engine="jvm")`: the Spark SQL
function in the executors' JVM, its jar sent on spark.jars), the Python lookup
(`engine="python"`: a `mapInArrow`), a broadcast join, the no-op of the JVM lookup's shape
(`constants`: the same job with the lookup replaced by constant columns of its output
types) and the Python round trip of that shape (`columns`); every way writes every row to
the same sink (Spark's `noop` data source). tests/lib/shmtest/bench/spark_ways.py says what each way does.

    SHMCACHE_CLUSTER_BENCH_N=5000000 SHMCACHE_CLUSTER_BENCH_EXECUTOR_MEMORY=2g SHMCACHE_CLUSTER_BENCH_DRIVER_MEMORY=4g SHMCACHE_CLUSTER_BENCH_ROUNDS=3 .venv/bin/python -m pytest bench/test_cluster.py -p no:cacheprovider -s
    SHMCACHE_CLUSTER_BENCH_N=10000000 ... (the issue's two sizes; as memory allows: two replicas of ~5.7 GiB at 10M)
    .venv/bin/python -m pytest bench/test_cluster.py -p no:cacheprovider -s      # smoke, N = 20,000 (scripts/test runs it)

SHMCACHE_CLUSTER_BENCH_N: entries (default 20,000, the smoke size); _EXECUTOR_MEMORY (1g),
_DRIVER_MEMORY (the broadcast is built there; 2g), _ROUNDS (timed runs per way; 1).

The driver is a child process (tests/lib/shmtest/bench/cluster_run.py). Asserted: the JVM and Python
lookups, the no-ops and (when it runs) the join return every row, the lookups and the join
every value byte; the join may fail (that is a finding, printed with its error); never
speed. Printed: rows/s of each way, JVM / Python, JVM / no-op (constants), the per-row cost
of the lookup itself (2 executor cores: 2 * (1/jvm - 1/constants)), and the load average.
Needs root (the machines' private /dev/shm); skipped otherwise.
"""

import json
import os
import shutil
import subprocess
import sys

import pytest

N = int(os.environ.get("SHMCACHE_CLUSTER_BENCH_N", "20000").replace("_", ""))
pytestmark = pytest.mark.timeout(1200 + N // 1_000)


def _fmt(rate) -> str:
    return f"{rate / 1e6:.2f} M" if rate >= 1e6 else f"{rate / 1e3:.0f} k"


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"), reason="the machines need root (unshare)")
def test_cluster_jvm_python_join_and_noop(tmp_path):
    pytest.importorskip("pyspark")
    from shmcache.spark._session import jvm_jar

    if jvm_jar(required=False) is None:
        pytest.skip("the shmcache JVM jar is not built (scripts/setup, or cd jvm && mvn -q package)")
    argv = [sys.executable, "-P", "-m", "shmtest.bench.cluster_run", "--n", str(N), "--dir", str(tmp_path),
            "--rounds", os.environ.get("SHMCACHE_CLUSTER_BENCH_ROUNDS", "1"),
            "--executor-memory", os.environ.get("SHMCACHE_CLUSTER_BENCH_EXECUTOR_MEMORY", "1g"),
            "--driver-memory", os.environ.get("SHMCACHE_CLUSTER_BENCH_DRIVER_MEMORY", "2g")]
    p = subprocess.run(argv, capture_output=True, text=True, timeout=1100 + N // 1_000, stdin=subprocess.DEVNULL)
    out = json.loads(p.stdout.strip().splitlines()[-1]) if p.stdout.strip() else {"error": p.stderr[-3000:]}
    assert p.returncode == 0 and not out.get("error"), out.get("error")
    r = out["results"]
    for w in ("constants", "jvm", "python", "columns"):
        assert r[w]["error"] is None and r[w].get("checked"), (w, r[w])
    assert r["join"]["error"] is not None or r["join"].get("checked"), r["join"]
    rate = {w: r[w].get("rows_per_s") for w in r}
    lookup_ns = 2e9 * (1 / rate["jvm"] - 1 / rate["constants"])
    line = (f"cluster, 2 machines x 1 core, executors {out['executor_memory']}, driver {out['driver_memory']}: "
            f"{out['queries']:,} keys against {out['n']:,} entries, {len(r['jvm']['runs'])} round(s), noop sink; "
            f"rows/s: constants (no-op) {_fmt(rate['constants'])}, jvm {_fmt(rate['jvm'])}, "
            f"python {_fmt(rate['python'])}, columns {_fmt(rate['columns'])}, join "
            + (_fmt(rate["join"]) if r["join"]["error"] is None else f"FAILED ({r['join']['error']})")
            + f"; jvm/python {rate['jvm'] / rate['python']:.2f}x, jvm/no-op {rate['jvm'] / rate['constants']:.2f}x"
            + (f", jvm/join {rate['jvm'] / rate['join']:.2f}x" if r["join"]["error"] is None else "")
            + f", python/columns {rate['python'] / rate['columns']:.2f}x; the lookup itself {lookup_ns:.0f} ns a row "
            f"a core; runs {json.dumps({w: [round(x) for x in r[w]['runs']] for w in r})}"
            f"; load average {out['load_avg_start']:.1f} -> {out['load_avg_end']:.1f}")
    print(line, file=sys.stderr)
