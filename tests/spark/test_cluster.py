"""The growth story on a real Spark standalone cluster (spark/cluster.py, `shmcache demo --cluster`):
a master and 2 workers, each worker a "machine" with its own /dev/shm (a mount namespace
with a fresh tmpfs) and its own `shmcache run` (its own consumer group), against the
session's real broker.

The demo runs as a child process (it is the Spark driver; this pytest process may hold a
local session already) and leaves its run directory here; the test then checks for itself:
the lookup (the JVM engine where the shmcache jar is built) output equals the source and
came from tasks on both machines, each machine's replica counted exactly its rows as hits
(each executor read its own /dev/shm), the executors fetched the jar from the driver
(spark.jars: it is in each executor's work directory, not on its launch classpath), the
Python engine gave the same rows; each replica's audit found every hash; with m2's replica
destroyed m1's task succeeded while m2's (and the lookup job, with either engine) failed
naming the cache and m2; after the rebuild all of it passes again; each machine had its
own consumer group; and every process the cluster started is gone, with the namespaces
(and so their tmpfs mounts), and no segment of the cache ever reached the host's
/dev/shm. Needs root (unshare, mount); skipped otherwise."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import psutil
import pyarrow.parquet as pq
import pytest

from shmcache.formats import txmeta

ROWS = 1000
REPO = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare") or not shutil.which("nsenter"),
                    reason="the cluster's machines need root (unshare --mount, mount -t tmpfs)")
def test_two_machines_each_with_its_own_replica(kafka_broker, kafka_admin, tmp_path):
    pytest.importorskip("pyspark")
    run_dir = tmp_path / "cluster-demo"
    p = subprocess.run([sys.executable, "-m", "shmcache", "demo", "--cluster", "--entries", str(ROWS),
                        "--partitions", "2", "--bootstrap", kafka_broker.bootstrap, "--cluster-dir", str(run_dir),
                        "--json"], capture_output=True, text=True, timeout=1500, stdin=subprocess.DEVNULL)
    lines = p.stdout.strip().splitlines()
    assert lines, p.stderr[-4000:]
    rep = json.loads(lines[-1])
    steps = "\n".join(ln for ln in p.stderr.splitlines() if not ln.startswith(("\t", "26/", "WARN")))[-4000:]
    assert p.returncode == 0 and rep["passed"] and "error" not in rep, \
        f"error: {rep.get('error')}; failed checks: {rep.get('failed')}\n{steps}"
    name = rep["name"]

    # lookup on the cluster, before and after the rebuild: every source row, exactly, from both machines,
    # each machine's rows counted as hits in its own replica's companion (the executor read its own /dev/shm)
    from shmcache.spark._session import jvm_jar

    engine = "jvm" if jvm_jar(required=False) else "python"
    assert rep["engine"] == engine
    src = pq.read_table(run_dir / "src").sort_by("tx_hash")
    cols = ["tx_hash"] + [c for c, _ in txmeta.arrow_fields()]
    for step in ("first", "rebuilt"):
        got = pq.read_table(run_dir / f"lookup-{step}").sort_by("tx_hash")
        assert got.num_rows == ROWS and all(got.column("found").to_pylist())
        for c in cols:
            assert got.column(c).equals(src.column(c)), (step, c)
        machines = got.column("machine").to_pylist()
        assert set(machines) == {"m1", "m2"}, step
        assert rep[f"lookup_{step}"]["reader_hits"] == {m: machines.count(m) for m in ("m1", "m2")}, step
        if engine == "jvm":  # the Python engine over the same keys: the same rows, the same columns
            py = pq.read_table(run_dir / f"lookup-{step}-python").sort_by("tx_hash")
            assert py.column_names == got.column_names
            for c in got.column_names:
                if c != "machine":
                    assert py.column(c).equals(got.column(c)), (step, c)

    if engine == "jvm":  # every executor fetched the jar from the driver (spark.jars), none had it on its classpath
        for m in ("m1", "m2"):
            execs = list((run_dir / "cluster" / m / "work" / rep["app_id"]).iterdir())
            assert execs, m
            for ex in execs:
                assert list(ex.glob("shmcache-jvm-*.jar")), (m, ex, sorted(x.name for x in ex.iterdir()))
                log = (ex / "stderr").read_text().splitlines()
                launch = next(ln for ln in log if ln.startswith("Spark Executor Command:"))
                assert "shmcache-jvm" not in launch, launch
                assert any("Fetching spark://127.0.0.1:" in ln and "/jars/shmcache-jvm-" in ln for ln in log), m
                assert any("shmcache-jvm-" in ln and "to class loader" in ln for ln in log), m

    # the audit on each replica: every hash a hit, on both machines, before and after
    for step in ("first", "rebuilt"):
        probes = {x["machine"]: x for x in rep[f"probe_{step}"]}
        assert set(probes) == {"m1", "m2"}
        for m, x in probes.items():
            assert x["error"] is None and x["counts"] == {"hit": ROWS, "miss": 0, "mismatch": 0, "absent": 0,
                                                          "stale": 0}, (step, m, x)

    # m2's replica destroyed: m1's task succeeds, m2's fails naming the cache and the machine; so does the job
    broken = {x["machine"]: x for x in rep["probe_broken"]}
    assert broken["m1"]["error"] is None and broken["m1"]["counts"]["hit"] == ROWS
    assert "CacheNotFoundError" in broken["m2"]["error"]
    assert f"cache {name!r} not found on host 'm2'" in broken["m2"]["error"]
    errors = rep["job_broken_errors"]
    assert set(errors) == {engine, "python"}
    for e in errors.values():
        assert f"cache {name!r} not found on host 'm2'" in e, errors
    if engine == "jvm":  # thrown by the Java reader in m2's executor: the machine is its $SHMCACHE_MACHINE
        assert "ShmcacheException$NotFound" in errors["jvm"], errors

    # each machine filled its replica through its own consumer group
    groups = {g.group_id for g in kafka_admin.list_consumer_groups(request_timeout=30).result().valid}
    assert {f"shmcache-m1-{name}", f"shmcache-m2-{name}"} <= groups

    # everything the cluster started is gone, and the namespaces with their tmpfs
    state = json.loads((run_dir / "cluster" / "cluster.json").read_text())
    assert state["stopped"] and rep["leftover_processes"] == []
    recs = [state["master"]] + [r for m in state["machines"].values() for r in (m["holder"], m["worker"])]
    for rec in recs:
        if psutil.pid_exists(rec["pid"]):
            assert abs(psutil.Process(rec["pid"]).create_time() - rec["started"]) > 0.01, rec
    namespaces = {m["mnt_ns"] for m in state["machines"].values()}
    assert len(namespaces) == 2
    for pid in psutil.pids():
        try:
            assert os.readlink(f"/proc/{pid}/ns/mnt") not in namespaces, pid
        except OSError:
            pass
    assert not os.path.exists(f"/dev/shm/{name}")  # the replicas lived only in the machines' /dev/shm


def test_master_json_of_a_master_still_starting(tmp_path):
    """A master starting up can answer its /json/ with 200 and a page that is not JSON yet:
    that is "not up yet" ({}), polled again, not an error that ends the cluster's start
    (it ended `shmcache demo --cluster` with a JSONDecodeError)."""
    import http.server
    import threading

    from shmcache.spark import cluster as cl

    pages = [b"<html>starting</html>", b'{"status": "ALIVE", "workers": []}']

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = pages[0] if len(pages) > 1 else pages[-1]
            if len(pages) > 1:
                pages.pop(0)
            self.send_response(200)
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        c = cl.Cluster({"dir": str(tmp_path), "master_webui_port": srv.server_address[1]})
        assert c.master_json() == {}
        assert c.master_json()["status"] == "ALIVE"
    finally:
        srv.shutdown()
        srv.server_close()
        t.join(10)


@pytest.mark.parametrize("cmd", [["stop"], ["status"], ["exec", "m1", "--", "true"]])
def test_no_cluster_in_the_dir_is_a_user_mistake(tmp_path, cmd):
    """`scripts/cluster stop` (status, exec) where nothing was started: one line on stderr
    naming the state file and how to start one, exit 2 (a user's mistake), no traceback;
    as a user runs it (the script, a child process) and through main()."""
    from shmcache.spark import cluster as cl

    d = tmp_path / "none"
    argv = [cmd[0], "--dir", str(d), *cmd[1:]]
    p = subprocess.run([str(REPO / "scripts" / "cluster"), *argv], capture_output=True, text=True, timeout=120,
                       stdin=subprocess.DEVNULL)
    assert p.returncode == 2, (p.returncode, p.stderr)
    assert p.stderr.splitlines() == [f"cluster: no cluster state in {d / 'cluster.json'} "
                                     f"(start one with scripts/cluster start --dir {d})"], p.stderr
    assert p.stdout == "" and not d.exists()
    assert cl.main(argv) == 2


def test_a_start_where_a_cluster_runs_is_a_user_mistake(tmp_path):
    """`scripts/cluster start` on a --dir whose cluster was not stopped: one line naming the
    dir and the stop command, exit 2, no traceback, and the state file left as it was."""
    from shmcache.spark import cluster as cl

    d = tmp_path / "busy"
    d.mkdir()
    state = d / "cluster.json"
    state.write_text('{"dir": "%s", "stopped": false, "machines": {}}' % d)
    before = state.read_bytes()
    argv = ["start", "--dir", str(d)]
    p = subprocess.run([str(REPO / "scripts" / "cluster"), *argv], capture_output=True, text=True, timeout=120,
                       stdin=subprocess.DEVNULL)
    assert p.returncode == 2, (p.returncode, p.stderr)
    assert p.stderr.splitlines() == [f"cluster: a cluster is already running from {d} "
                                     f"(scripts/cluster stop --dir {d})"], p.stderr
    assert p.stdout == "" and state.read_bytes() == before and sorted(x.name for x in d.iterdir()) == ["cluster.json"]
    assert cl.main(argv) == 2

