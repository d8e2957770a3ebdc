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
  every replica answers 200 on /ready (consumer/ready.py).

The state (pids with their start times, ports, the master URL) is in DIR/cluster.json;
`stop` ends every process by pid (the supervisors first, with SIGTERM: they drain and
make their final commit), and the tmpfs mounts go away with their namespaces once the
last process in each is gone (checked: stop scans /proc for anything left in them).
Logs are in DIR/<machine>/ and DIR/master.log.

Not guaranteed: isolation beyond /dev/shm. The machines share the host's network,
CPU, memory and file system (the same Parquet path reads the same files everywhere).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import psutil

from shmcache.ipc import liveness

STATE = "cluster.json"
HOST = "127.0.0.1"
MASTER_CLASS = "org.apache.spark.deploy.master.Master"
WORKER_CLASS = "org.apache.spark.deploy.worker.Worker"
START_TIMEOUT_S = 180.0
READY_TIMEOUT_S = 180.0
STOP_TIMEOUT_S = 60.0
WARM_TIMEOUT_S = 900.0  # compiling every kernel after any edit of the package took > 180 s at load 10


class ClusterError(RuntimeError):
    """The cluster could not be started, reached or stopped as asked."""


# -- small helpers ---------------------------------------------------------------------------------


def spark_home() -> str:
    spec = importlib.util.find_spec("pyspark")
    if spec is None or not spec.submodule_search_locations:
        raise ClusterError(f"pyspark is not installed for {sys.executable} (run scripts/setup)")
    return list(spec.submodule_search_locations)[0]


def free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


def wait_for(cond, timeout: float, what, interval: float = 0.1):
    """cond() until truthy; ClusterError naming `what` after `timeout` s."""
    deadline = time.monotonic() + timeout
    while True:
        got = cond()
        if got:
            return got
        if time.monotonic() > deadline:
            raise ClusterError(f"timed out after {timeout:.0f} s waiting for {what() if callable(what) else what}")
        time.sleep(interval)


def http_get(url: str, timeout: float = 5.0) -> tuple[int, str]:
    """(status, body) of GET url; (0, error) when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()
    except (urllib.error.URLError, OSError) as e:
        return 0, str(e)


def _proc(pid: int, started: float) -> psutil.Process | None:
    """The process `pid` if it is still the one we started (same create time)."""
    try:
        p = psutil.Process(pid)
        return p if abs(p.create_time() - started) < 0.01 else None
    except psutil.Error:
        return None


def _record(p: subprocess.Popen) -> dict:
    return {"pid": p.pid, "started": psutil.Process(p.pid).create_time()}


def _stop_pids(records: list[dict], timeout: float) -> None:
    """SIGTERM each still-ours process and its descendants, wait, SIGKILL what is left."""
    procs = []
    for rec in records:
        p = _proc(rec["pid"], rec["started"])
        if p is None:
            continue
        try:
            procs += [p] + p.children(recursive=True)
        except psutil.Error:
            procs.append(p)
    liveness.stop_processes(procs, timeout)


def _mnt_ns(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/mnt")
    except OSError:
        return None


def _in_namespace(ns: str) -> list[int]:
    """Pids of the processes in mount namespace `ns` (e.g. 'mnt:[4026532...]')."""
    out = []
    for pid in psutil.pids():
        if _mnt_ns(pid) == ns:
            out.append(pid)
    return out


def _shm_mounted(pid: int, tag: str) -> bool:
    try:
        with open(f"/proc/{pid}/mountinfo") as f:
            return any(line.split(" - ")[0].split()[4] == "/dev/shm" and tag in line for line in f)
    except OSError:
        return False


# -- the cluster -----------------------------------------------------------------------------------


class Cluster:
    """A running cluster as DIR/cluster.json describes it."""

    def __init__(self, state: dict):
        self.state = state

    @classmethod
    def load(cls, d) -> "Cluster":
        path = Path(d) / STATE
        try:
            return cls(json.loads(path.read_text()))
        except FileNotFoundError:
            raise ClusterError(f"no cluster state in {path} (start one with scripts/cluster start --dir {d})") from None

    @property
    def dir(self) -> Path:
        return Path(self.state["dir"])

    @property
    def master_url(self) -> str:
        return self.state["master_url"]

    @property
    def machines(self) -> list[str]:
        return list(self.state["machines"])

    def _save(self) -> None:
        (self.dir / STATE).write_text(json.dumps(self.state, indent=1))

    def master_json(self) -> dict:
        """The master's /json/ state; {} while it does not answer it (a master still starting
        can answer 200 with a page that is not its JSON yet)."""
        code, body = http_get(f"http://{HOST}:{self.state['master_webui_port']}/json/")
        try:
            return json.loads(body) if code == 200 else {}
        except ValueError:
            return {}

    def alive_workers(self) -> list[dict]:
        return [w for w in self.master_json().get("workers", []) if w.get("state") == "ALIVE"]

    def env(self, machine: str) -> dict:
        """The environment of the processes started on `machine`."""
        env = dict(os.environ, SPARK_HOME=self.state["spark_home"], SPARK_LOCAL_IP=HOST,
                   SPARK_LOG_DIR=str(self.dir / machine), SPARK_DAEMON_MEMORY="256m",
                   PYSPARK_PYTHON=sys.executable, SHMCACHE_MACHINE=machine)
        env.pop("PYSPARK_DRIVER_PYTHON", None)
        return env

    def nsenter(self, machine: str) -> list[str]:
        """The argv prefix that runs a command in `machine`'s mount namespace."""
        return ["nsenter", "--target", str(self.state["machines"][machine]["holder"]["pid"]), "--mount", "--"]

    def exec(self, machine: str, argv: list[str], **kw) -> subprocess.CompletedProcess:
        """Run `argv` on `machine` (its /dev/shm) and wait for it."""
        return subprocess.run(self.nsenter(machine) + argv, env=self.env(machine), stdin=subprocess.DEVNULL, **kw)

    def shmcache(self, machine: str, *args: str, **kw) -> subprocess.CompletedProcess:
        """`python -m shmcache ARGS` on `machine`, output captured."""
        return self.exec(machine, [sys.executable, "-m", "shmcache", *args], capture_output=True, text=True, **kw)

    # -- the replicas ------------------------------------------------------------------------

    def start_run(self, machine: str) -> None:
        """Start `shmcache run` on `machine` with the cluster's --topic settings."""
        run = self.state["run"]
        m = self.state["machines"][machine]
        port = m.get("metrics_port") or free_port()
        argv = [sys.executable, "-m", "shmcache", "run", "--name", run["name"], "--bootstrap", run["bootstrap"],
                "--topic", run["topic"], "--machine", machine, "--memory", run["memory"],
                "--workers", str(run["workers"]), "--format", run["format"], "--metrics-port", str(port)]
        log = open(self.dir / machine / "run.log", "ab")
        p = subprocess.Popen(self.nsenter(machine) + argv, env=self.env(machine), stdin=subprocess.DEVNULL,
                             stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        log.close()
        m["run"], m["metrics_port"] = _record(p), port
        self._save()

    def stop_run(self, machine: str, timeout: float = STOP_TIMEOUT_S) -> None:
        """SIGTERM `machine`'s supervisor (it drains and commits) and wait for it."""
        m = self.state["machines"][machine]
        if m.get("run"):
            _stop_pids([m["run"]], timeout)
            m["run"] = None
            self._save()

    def ready(self, machine: str) -> tuple[int, str]:
        """GET /ready of `machine`'s supervisor: (200, ...) when its replica is ready."""
        port = self.state["machines"][machine].get("metrics_port")
        if not port:
            return 0, "no shmcache run on this machine"
        return http_get(f"http://{HOST}:{port}/ready")

    def applied(self, machine: str) -> dict[int, int] | None:
        """Next offset to apply per partition of `machine`'s replica, from its supervisor's
        /metrics (an HTTP GET: no process started per poll); None when it does not answer."""
        from prometheus_client.parser import text_string_to_metric_families

        port = self.state["machines"][machine].get("metrics_port")
        code, body = http_get(f"http://{HOST}:{port}/metrics") if port else (0, "")
        if code != 200:
            return None
        return {int(smp.labels["partition"]): int(smp.value) for fam in text_string_to_metric_families(body)
                if fam.name == "shmcache_partition_applied_offset" for smp in fam.samples}

    def wait_ready(self, machines: list[str] | None = None, timeout: float = READY_TIMEOUT_S) -> None:
        todo = machines or self.machines

        def all_ready():
            for m in todo:
                rec = self.state["machines"][m].get("run")
                if rec is None or _proc(rec["pid"], rec["started"]) is None:
                    raise ClusterError(f"shmcache run on {m} is not running (see {self.dir / m / 'run.log'})")
            return all(self.ready(m)[0] == 200 for m in todo)

        wait_for(all_ready, timeout, lambda: "replicas ready: " + "; ".join(
            f"{m}: {self.ready(m)[1].strip()}" for m in todo))

    # -- stop --------------------------------------------------------------------------------

    def stop(self) -> list[str]:
        """Stop everything by pid; returns what was left over and had to be killed (should be empty)."""
        leftovers = []
        for name in self.machines:
            self.stop_run(name)
        for name, m in self.state["machines"].items():
            _stop_pids([r for r in (m.get("worker"),) if r], STOP_TIMEOUT_S)
            holder = m.get("holder")
            if holder is None:
                continue
            ns = m.get("mnt_ns")
            if ns and _proc(holder["pid"], holder["started"]) is not None:
                # anything else still in the namespace was started in it by this cluster
                rest = [pid for pid in _in_namespace(ns) if pid != holder["pid"]]
                if rest:
                    leftovers += [f"{name}: pid {pid}" for pid in rest]
                    _stop_pids([{"pid": pid, "started": psutil.Process(pid).create_time()} for pid in rest
                                if psutil.pid_exists(pid)], 10)
            _stop_pids([holder], 10)
        if self.state.get("master"):
            _stop_pids([self.state["master"]], STOP_TIMEOUT_S)
        self.state["stopped"] = True
        self._save()
        return leftovers


def start(d, *, workers: int = 2, cores: int = 1, memory: str = "1g", shm: str = "512m",
          run: dict | None = None) -> Cluster:
    """Start the master, `workers` machines and (with `run`: name, bootstrap, topic, memory,
    workers, format) a supervisor on each; returns once all are up (ready)."""
    d = Path(d).resolve()
    d.mkdir(parents=True, exist_ok=True)
    if (d / STATE).exists() and not json.loads((d / STATE).read_text()).get("stopped"):
        raise ClusterError(f"a cluster is already running from {d} (scripts/cluster stop --dir {d})")
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
    c._save()
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
        c.state["master"] = _record(p)
        c._save()
        wait_for(lambda: c.master_json().get("status") == "ALIVE", START_TIMEOUT_S,
                 f"the Spark master to answer on its /json (log: {d / 'master.log'})")
        for name, m in c.state["machines"].items():
            (d / name / "work").mkdir(parents=True, exist_ok=True)
            tag = f"shmcache-{name}-{os.getpid()}"
            holder = subprocess.Popen(
                ["unshare", "--mount", "--propagation", "private", "--", "sh", "-c",
                 f"mount -t tmpfs -o size={shm},mode=1777 {tag} /dev/shm && exec sleep infinity"],
                stdin=subprocess.DEVNULL, start_new_session=True)
            m["holder"] = _record(holder)
            c._save()
            wait_for(lambda: _shm_mounted(holder.pid, tag) or holder.poll() is not None, 30,
                     f"{name}'s tmpfs on /dev/shm")
            if holder.poll() is not None:
                raise ClusterError(f"{name}: unshare/mount failed (exit {holder.returncode})")
            m["mnt_ns"] = _mnt_ns(holder.pid)
            m["webui_port"] = free_port()
            with open(d / name / "worker.log", "ab") as log:
                w = subprocess.Popen(c.nsenter(name) + [
                    spark_class, WORKER_CLASS, "--host", HOST, "--cores", str(cores), "--memory", memory,
                    "--webui-port", str(m["webui_port"]), "--work-dir", str(d / name / "work"), c.master_url],
                    env=c.env(name), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                    start_new_session=True)
            m["worker"] = _record(w)
            c._save()
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
    from shmcache import warm

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
    s.add_argument("--format", default="v1", choices=("v1", "v2"))
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
    except ClusterError as e:
        print(f"cluster: {e}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
