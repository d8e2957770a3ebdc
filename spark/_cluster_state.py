"""A running cluster as DIR/cluster.json describes it (spark/cluster.py starts one): its
machines' environments and namespaces, the `shmcache run` replica on each, and `stop`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import psutil

from shmcache.spark._cluster_procs import (HOST, ClusterError, NoClusterError, free_port, http_get, in_namespace,
                                           record, still_ours, stop_pids, wait_for)

STATE = "cluster.json"
READY_TIMEOUT_S = 180.0
STOP_TIMEOUT_S = 60.0


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
            raise NoClusterError(f"no cluster state in {path} "
                                 f"(start one with scripts/cluster start --dir {d})") from None

    @property
    def dir(self) -> Path:
        return Path(self.state["dir"])

    @property
    def master_url(self) -> str:
        return self.state["master_url"]

    @property
    def machines(self) -> list[str]:
        return list(self.state["machines"])

    def save(self) -> None:
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
        m["run"], m["metrics_port"] = record(p), port
        self.save()

    def stop_run(self, machine: str, timeout: float = STOP_TIMEOUT_S) -> None:
        """SIGTERM `machine`'s supervisor (it drains and commits) and wait for it."""
        m = self.state["machines"][machine]
        if m.get("run"):
            stop_pids([m["run"]], timeout)
            m["run"] = None
            self.save()

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
                if rec is None or still_ours(rec["pid"], rec["started"]) is None:
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
            stop_pids([r for r in (m.get("worker"),) if r], STOP_TIMEOUT_S)
            holder = m.get("holder")
            if holder is None:
                continue
            ns = m.get("mnt_ns")
            if ns and still_ours(holder["pid"], holder["started"]) is not None:
                # anything else in the namespace was started in it by this cluster: the children of
                # what was stopped go with it (a pyspark worker the executor forked as it stopped)
                def others() -> list[int]:
                    return [pid for pid in in_namespace(ns) if pid != holder["pid"]]

                try:
                    wait_for(lambda: not others(), STOP_TIMEOUT_S, "")
                except ClusterError:
                    rest = others()  # still there: left over, and killed
                    leftovers += [f"{name}: pid {pid}" for pid in rest]
                    stop_pids([{"pid": pid, "started": psutil.Process(pid).create_time()} for pid in rest
                               if psutil.pid_exists(pid)], 10)
            stop_pids([holder], 10)
            if ns:  # the namespace is gone with its last process: none may be left in it
                try:
                    wait_for(lambda: not in_namespace(ns), 30, "")
                except ClusterError:
                    rest = in_namespace(ns)
                    leftovers += [f"{name}: pid {pid}" for pid in rest]
                    stop_pids([{"pid": pid, "started": psutil.Process(pid).create_time()} for pid in rest
                               if psutil.pid_exists(pid)], 10)
        if self.state.get("master"):
            stop_pids([self.state["master"]], STOP_TIMEOUT_S)
        self.state["stopped"] = True
        self.save()
        return leftovers
