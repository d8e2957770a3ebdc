"""Cluster benchmark (issue 14): `lookup` against a broadcast join and the no-op `mapInArrow`s
of bench/_spark_ways.py (noop, columns) on a real Spark standalone cluster of 2 machines on
this host (scripts/cluster), each machine with its own replica of the same N entries, 10 * N keys looked up (all hits).

    SHMCACHE_CLUSTER_BENCH_N=1000000 .venv/bin/python -m pytest bench/test_cluster.py -p no:cacheprovider -s
    SHMCACHE_CLUSTER_BENCH_N=5000000 SHMCACHE_CLUSTER_BENCH_EXECUTOR_MEMORY=2g ... (as memory allows)
    SHMCACHE_CLUSTER_BENCH_DRIVER_MEMORY=4g, SHMCACHE_CLUSTER_BENCH_ROUNDS=3: the driver's memory (the broadcast
    is built there; default 2g), timed runs per way
    CI=true .venv/bin/python -m pytest bench/test_cluster.py -p no:cacheprovider    # smoke, N = 20,000

The driver is a child process (bench/_cluster_run.py; bench/_spark_ways.py says what each way
does). Asserted: lookup and the no-ops return every row (and lookup every value byte); the
join may fail (that is a finding, printed with its error), but when it runs it returns the same bytes;
never speed. Printed: rows/s of each way, lookup / noop, lookup / columns and lookup / join.
Needs root (the machines' private /dev/shm); skipped otherwise.
"""

import json
import os
import shutil
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
N = int(os.environ.get("SHMCACHE_CLUSTER_BENCH_N", "20000").replace("_", ""))
pytestmark = pytest.mark.timeout(1200 + N // 2_000)


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"), reason="the machines need root (unshare)")
def test_cluster_lookup_vs_broadcast_join(tmp_path):
    pytest.importorskip("pyspark")
    argv = [sys.executable, os.path.join(HERE, "_cluster_run.py"), "--n", str(N), "--dir", str(tmp_path),
            "--rounds", os.environ.get("SHMCACHE_CLUSTER_BENCH_ROUNDS", "1"),
            "--executor-memory", os.environ.get("SHMCACHE_CLUSTER_BENCH_EXECUTOR_MEMORY", "1g"),
            "--driver-memory", os.environ.get("SHMCACHE_CLUSTER_BENCH_DRIVER_MEMORY", "2g")]
    p = subprocess.run(argv, capture_output=True, text=True, timeout=1100 + N // 2_000, stdin=subprocess.DEVNULL)
    out = json.loads(p.stdout.strip().splitlines()[-1]) if p.stdout.strip() else {"error": p.stderr[-3000:]}
    assert p.returncode == 0 and not out.get("error"), out.get("error")
    r = out["results"]
    assert all(r[w]["error"] is None for w in ("noop", "columns", "lookup")), r
    rate = {w: r[w].get("rows_per_s") for w in r}
    line = (f"cluster, 2 machines x 1 core, executors {out['executor_memory']}, driver {out['driver_memory']}: "
            f"{out['queries']:,} keys against {out['n']:,} entries; noop {rate['noop']:,.0f} rows/s, "
            f"columns {rate['columns']:,.0f}, lookup {rate['lookup']:,.0f} "
            f"(lookup/noop {rate['lookup'] / rate['noop']:.2f}x, "
            f"lookup/columns {rate['lookup'] / rate['columns']:.2f}x), join "
            + (f"{rate['join']:,.0f} rows/s (lookup/join {rate['lookup'] / rate['join']:.2f}x)" if r["join"]["error"] is None
               else f"FAILED: {r['join']['error']}")
            + f"; load average {out['load_avg_start']:.1f} -> {out['load_avg_end']:.1f}")
    print(line, file=sys.stderr)
