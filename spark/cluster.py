"""N machines on one host: a Spark standalone cluster whose workers each hold their own replica.

    scripts/cluster start --dir DIR [--workers 2] [--bootstrap B --topic T --name N]
    scripts/cluster status --dir DIR        # the state as JSON, and each replica's /ready
    scripts/cluster exec --dir DIR m2 -- shmcache destroy txmeta   # a command on machine m2
    scripts/cluster stop --dir DIR

What `start` runs (every process from the installed PySpark or this Python, loopback only):
- a Spark master (`spark-class org.apache.spark.deploy.master.Master`, 127.0.0.1);
- per machine m1..mN, a mount namespace (`unshare --mount`, propagation private) with a
  fresh tmpfs on /dev/shm, held open by one `sleep infinity` process; inside it (nsenter
  into that process's namespace) a Spark worker with SHMCACHE_MACHINE=mN in its
  environment (its executors and their Python workers inherit it), and with --topic a
  `shmcache run --machine mN` whose default consumer group `shmcache-mN-<name>` is that
  machine's own. A process in m1 cannot see m2's caches: each has its own /dev/shm.
- It returns once the master lists every worker ALIVE (its /json) and, with --topic,
  every replica answers 200 on /ready (consumer/supervisor/http_endpoint.py).

The state (pids with their start times, ports, the master URL) is in DIR/cluster.json;
`stop` ends every process by pid (the supervisors first, with SIGTERM: they drain and
make their final commit), and the tmpfs mounts go away with their namespaces once the
last process in each is gone (checked: stop scans /proc for anything left in them).
Logs are in DIR/<machine>/ and DIR/master.log.

Not guaranteed: isolation beyond /dev/shm. The machines share the host's network,
CPU, memory and file system (the same Parquet path reads the same files everywhere).

This module starts a cluster and is scripts/cluster's command line; a running cluster
(its state file, the replicas, stop) is spark/_cluster_state.py's Cluster, and the
processes and namespaces by pid are spark/_cluster_procs.py's.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import psutil

from shmcache.ipc import liveness
from shmcache.formats import registry as wire_formats
from shmcache.spark._cluster_procs import (HOST, ClusterError, ClusterRunningError, NoClusterError, free_port,
                                           mnt_ns, record, shm_mounted, spark_home, wait_for)
from shmcache.spark._cluster_state import READY_TIMEOUT_S, STATE, STOP_TIMEOUT_S, Cluster

__all__ = ["HOST", "READY_TIMEOUT_S", "STATE", "STOP_TIMEOUT_S", "Cluster", "ClusterError", "ClusterRunningError",
           "NoClusterError",
           "driver_env", "main", "spark_conf", "start", "wait_for"]

MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
START_TIMEOUT_S = 180.0
WARM_TIMEOUT_S = 900.0  # compiling every kernel after any edit of the package took > 180 s at load 10


def start(d, *, workers: int = 2, cores: int = 1, memory: str = "1g", shm: str = "512m",
          run: dict | None = None) -> Cluster:
    """Start the master, `workers` machines and (with `run`: name, bootstrap, topic, memory,
    workers, format) a supervisor on each; returns once all are up (ready)."""
    d = Path(d).resolve()
    d.mkdir(parents=True, exist_ok=True)
    if (d / STATE).exists() and not json.loads((d / STATE).read_text()).get("stopped"):
        raise ClusterRunningError(f"a cluster is already running from {d} (scripts/cluster stop --dir {d})")
    for tool in ("unshare", "nsenter", "mount"):
        if not any(os.access(os.path.join(p, tool), os.X_OK) for p in os.environ.get("PATH", "").split(os.pathsep)):
            raise ClusterError(f"{tool} not found on PATH (util-linux)")
    if os.geteuid() != 0:
        raise ClusterError("scripts/cluster needs root: each machine mounts its own tmpfs on /dev/shm "
                           "in a mount namespace (unshare --mount)")
    home = spark_home()
    port, webui = free_port(), free_port()
    c = Cluster({"dir": str(d), "spark_home": home, "master_url": f"spark://{HOST}:{port}",
                 "master_webui_port": webui, "master": None, "run": run,
                 "machines": {f"m{i + 1}": {} for i in range(workers)}})
    c.save()
    spark_class = os.path.join(home, "bin", "spark-class")
    try:
        env = c.env("master")
        env.pop("SHMCACHE_MACHINE")
        # no REST submission server: it binds a fixed port (6066) and nothing here uses it
        env["SPARK_MASTER_OPTS"] = (env.get("SPARK_MASTER_OPTS", "") + " -Dspark.master.rest.enabled=false").strip()
        (d / "master").mkdir(exist_ok=True)
        with open(d / "master.log", "ab") as log:
            p = subprocess.Popen([spark_class, MASTER_CLASS, "--host", HOST, "--port", str(port),
                                  "--webui-port", str(webui)], env=env, stdin=subprocess.DEVNULL,
                                 stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        c.state["master"] = record(p)
        c.save()
        wait_for(lambda: c.master_json().get("status") == "ALIVE", START_TIMEOUT_S,
                 f"the Spark master to answer on its /json (log: {d / 'master.log'})")
        for name, m in c.state["machines"].items():
            (d / name / "work").mkdir(parents=True, exist_ok=True)
            tag = f"shmcache-{name}-{os.getpid()}"
            holder = subprocess.Popen(
                ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c",
                 f"mount -t tmpfs -o size={shm},mode=1777 {tag} /dev/shm && exec sleep infinity"],
                stdin=subprocess.DEVNULL, start_new_session=True)
            m["holder"] = record(holder)
            c.save()
            wait_for(lambda: shm_mounted(holder.pid, tag) or holder.poll() is not None, 30,
                     f"{name}'s tmpfs on /dev/shm")
            if holder.poll() is not None:
                raise ClusterError(f"{name}: unshare/mount failed (exit {holder.returncode})")
            m["mnt_ns"] = mnt_ns(holder.pid)
            m["webui_port"] = free_port()
            with open(d / name / "worker.log", "ab") as log:
                w = subprocess.Popen(c.nsenter(name) + [
                    spark_class, WORKER_CLASS, "--host", HOST, "--cores", str(cores), "--memory", memory,
                    "--webui-port", str(m["webui_port"]), "--work-dir", str(d / name / "work"), c.master_url],
                    env=c.env(name), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                    start_new_session=True)
            m["worker"] = record(w)
            c.save()
        wait_for(lambda: len(c.alive_workers()) >= workers, START_TIMEOUT_S,
                 lambda: f"{workers} workers ALIVE at the master (have {len(c.alive_workers())}; logs in {d}/m*/)")
        if run:
            _warm(d)
            for name in c.machines:
                c.start_run(name)
            c.wait_ready()
        return c
    except BaseException:
        c.stop()
        raise


def _warm(d: Path) -> None:
    """Compile the kernels into numba's on-disk cache once, on the host, before the
    machines' supervisors start: each runs the same warm-up, and N of them compiling the
    same kernels at once on a busy host could outlast READY_TIMEOUT_S (a no-op when the
    cache is warm; the cache is a directory, not in /dev/shm, so every machine sees it)."""
    from shmcache.consumer import warm

    with open(d / "warm.log", "ab") as log:
        p = subprocess.Popen([sys.executable, "-m", "shmcache", "warm"], stdin=subprocess.DEVNULL, stdout=log,
                             stderr=subprocess.STDOUT)
    try:
        p.wait(WARM_TIMEOUT_S)
    finally:
        if p.poll() is None:  # timed out or interrupted: stop it by pid, remove its private cache
            liveness.stop_processes([psutil.Process(p.pid)], 10)
            p.wait()
            warm.remove_leftovers(p.pid)
    if p.returncode:
        raise ClusterError(f"shmcache warm failed (exit {p.returncode}; see {d / 'warm.log'})")


def driver_env() -> None:
    """Environment a driver of this cluster needs before its JVM starts: loopback, and the
    executors' Python (the driver's PYSPARK_PYTHON travels with each Python function and
    wins over the workers' environment): this interpreter, which has shmcache."""
    os.environ["SPARK_LOCAL_IP"] = HOST
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)


def spark_conf(c: Cluster) -> dict[str, str]:
    """Settings for a driver on this cluster: one single-core executor per machine, small
    memory, and the first job held until every executor registered."""
    n = len(c.machines)
    return {
        "spark.executor.cores": "1",
        "spark.cores.max": str(n),
        "spark.executor.memory": "512m",
        "spark.driver.memory": "768m",
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": str(n),
        "spark.driver.host": HOST,
        "spark.driver.bindAddress": HOST,
        "spark.pyspark.python": sys.executable,
        "spark.scheduler.minRegisteredResourcesRatio": "1.0",
        "spark.scheduler.maxRegisteredResourcesWaitingTime": "120s",
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="scripts/cluster", description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("start", help="start the master, the machines and (with --topic) a replica on each")
    s.add_argument("--dir", required=True, help="state, logs and work directories")
    s.add_argument("--workers", type=int, default=2, help="machines (default 2)")
    s.add_argument("--cores", type=int, default=1, help="cores per worker (default 1)")
    s.add_argument("--memory", default="1g", help="executor memory per worker (default 1g)")
    s.add_argument("--shm", default="512m", help="size of each machine's /dev/shm tmpfs (default 512m)")
    s.add_argument("--bootstrap", help="Kafka bootstrap servers for the replicas")
    s.add_argument("--topic", help="fill a replica from this topic on every machine")
    s.add_argument("--name", default="txmeta", help="cache name (default txmeta)")
    s.add_argument("--cache-memory", default="256MiB", help="each replica's size (default 256MiB)")
    s.add_argument("--run-workers", type=int, default=1, help="worker processes per shmcache run (default 1)")
    s.add_argument("--format", default="v1", choices=wire_formats.SPARK)
    for name, help_ in (("stop", "stop everything by pid"), ("status", "the state and each replica's /ready")):
        x = sub.add_parser(name, help=help_)
        x.add_argument("--dir", required=True)
    e = sub.add_parser("exec", help="run a command on a machine (in its mount namespace)")
    e.add_argument("--dir", required=True)
    e.add_argument("machine")
    e.add_argument("argv", nargs=argparse.REMAINDER)
    a = ap.parse_args(argv)
    try:
        if a.cmd == "start":
            if bool(a.topic) != bool(a.bootstrap):
                ap.error("give --bootstrap and --topic together")
            run = ({"name": a.name, "bootstrap": a.bootstrap, "topic": a.topic, "memory": a.cache_memory,
                    "workers": a.run_workers, "format": a.format} if a.topic else None)
            c = start(a.dir, workers=a.workers, cores=a.cores, memory=a.memory, shm=a.shm, run=run)
            print(json.dumps({"master": c.master_url, "machines": {
                m: {"worker_pid": v["worker"]["pid"], "run_pid": (v.get("run") or {}).get("pid"),
                    "metrics": f"http://{HOST}:{v['metrics_port']}" if v.get("metrics_port") else None}
                for m, v in c.state["machines"].items()}}))
            return 0
        c = Cluster.load(a.dir)
        if a.cmd == "stop":
            left = c.stop()
            if left:
                print("cluster: killed processes left in the namespaces: " + ", ".join(left), file=sys.stderr)
            return 0
        if a.cmd == "status":
            print(json.dumps({"master": c.master_url, "alive_workers": len(c.alive_workers()),
                              "ready": {m: c.ready(m) for m in c.machines}}))
            return 0
        argv = a.argv[1:] if a.argv[:1] == ["--"] else a.argv
        if a.machine not in c.machines:
            ap.error(f"no machine {a.machine!r}; the cluster has {c.machines}")
        if argv[:1] == ["shmcache"]:
            argv = [sys.executable, "-m", "shmcache", *argv[1:]]
        return c.exec(a.machine, argv).returncode
    except (NoClusterError, ClusterRunningError) as e:  # nothing started in that --dir, or one runs: a mistake
        print(f"cluster: {e}", file=sys.stderr)
        return 2
    except ClusterError as e:
        print(f"cluster: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
