"""Processes and mount namespaces by pid, for the cluster of spark/cluster.py: ports, waits,
HTTP probes, and stopping what the cluster started (a process is ours only while its pid
has the start time we recorded: a reused pid is someone else's)."""

from __future__ import annotations

import importlib.util
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import psutil

from shmcache.ipc import liveness

HOST = "127.0.0.1"


class ClusterError(RuntimeError):
    """The cluster could not be started, reached or stopped as asked."""


class NoClusterError(ClusterError):
    """No cluster state where one was named (a user's mistake: nothing was started there)."""


class ClusterRunningError(ClusterError):
    """A cluster was started where one still runs (a user's mistake: nothing was changed)."""


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


def still_ours(pid: int, started: float) -> psutil.Process | None:
    """The process `pid` if it is still the one we started (same create time)."""
    try:
        p = psutil.Process(pid)
        return p if abs(p.create_time() - started) < 0.01 else None
    except psutil.Error:
        return None


def record(p: subprocess.Popen) -> dict:
    return {"pid": p.pid, "started": psutil.Process(p.pid).create_time()}


def stop_pids(records: list[dict], timeout: float) -> None:
    """SIGTERM each still-ours process and its descendants, wait, SIGKILL what is left."""
    procs = []
    for rec in records:
        p = still_ours(rec["pid"], rec["started"])
        if p is None:
            continue
        try:
            procs += [p] + p.children(recursive=True)
        except psutil.Error:
            procs.append(p)
    liveness.stop_processes(procs, timeout)


def mnt_ns(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/mnt")
    except OSError:
        return None


def in_namespace(ns: str) -> list[int]:
    """Pids of the processes in mount namespace `ns` (e.g. 'mnt:[4026532...]')."""
    out = []
    for pid in psutil.pids():
        if mnt_ns(pid) == ns:
            out.append(pid)
    return out


def shm_mounted(pid: int, tag: str) -> bool:
    try:
        with open(f"/proc/{pid}/mountinfo") as f:
            return any(line.split(" - ")[0].split()[4] == "/dev/shm" and tag in line for line in f)
    except OSError:
        return False
