"""Helpers for the benchmarks of a Teranode node (bench/test_teranode.py,
bench/test_node_memory.py): the Go side's program (go/bench/teranodebench), the PSS of a
process, the processes a benchmark starts (stopped by pid), and a `shmcache run` daemon
polled until ready and stopped with its whole tree."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil

from shmtest import REPO

GO = shutil.which("go")
GO_BENCH_DIR = REPO / "go" / "bench"  # its own module: fastcache stays out of go/'s


def build_program(into: Path) -> str:
    """go/bench/teranodebench built into `into`: its path."""
    exe = into / "teranodebench"
    subprocess.run([GO, "build", "-o", str(exe), "./teranodebench"], cwd=GO_BENCH_DIR, check=True,
                   env={**os.environ, "CGO_ENABLED": "0"}, timeout=300)
    return str(exe)


def pss(pid: int) -> dict[str, int]:
    """The PSS fields of /proc/PID/smaps_rollup, in bytes (Pss, Pss_Anon, Pss_File, Pss_Shmem, ...)."""
    out = {}
    for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
        k, _, v = line.partition(":")
        if k.startswith("Pss"):
            out[k] = int(v.split()[0]) * 1024
    return out


def sum_pss(pids, gone_ok: bool = False) -> dict[str, int]:
    """pss() summed over the processes `pids`; one that exited meanwhile is left out if
    gone_ok, else its error is raised."""
    total: dict[str, int] = {}
    for pid in pids:
        try:
            for k, v in pss(pid).items():
                total[k] = total.get(k, 0) + v
        except (FileNotFoundError, ProcessLookupError):
            if not gone_ok:
                raise
    return total


def tree_pss(pid: int) -> dict[str, int]:
    """pss() summed over process pid and all its descendants (those that exit meanwhile left out)."""
    root = psutil.Process(pid)
    return sum_pss([pid, *(p.pid for p in root.children(recursive=True))], gone_ok=True)


def mib(b: float) -> str:
    return f"{b / 2**20:.1f} MiB"


class Procs:
    """Child processes a benchmark started, stopped by pid (stdin closed, then killed)."""

    def __init__(self):
        self.procs: list[subprocess.Popen] = []

    def start(self, argv: list[str]) -> tuple[subprocess.Popen, list[str]]:
        """Start one and wait for its first line (its "ready"): (the process, the line's words)."""
        p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self.procs.append(p)
        line = p.stdout.readline()  # the line, or "" once it died
        assert line, f"{argv[1]} exited with {p.wait()} before saying ready"
        return p, line.split()

    def stop(self) -> None:
        for p in self.procs:
            if p.stdin:
                p.stdin.close()
        for p in self.procs:
            try:
                p.wait(30)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.procs.clear()


def supervisor(name: str, topic: str, bootstrap: str, log: Path, memory: int, workers: int = 2):
    """`shmcache run` on a fresh cache, polled until ready: (the process, a reader, seconds to ready)."""
    import shmcache

    argv = [sys.executable, "-m", "shmcache", "run", "--name", name, "--bootstrap", bootstrap, "--topic", topic,
            "--group", f"bench-node-{uuid.uuid4().hex[:12]}", "--workers", str(workers),
            "--memory", str(memory), "--format", "v1"]
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=open(log, "wb"), stderr=subprocess.STDOUT)
    deadline = t0 + 1200
    r = None
    while True:
        assert proc.poll() is None, f"shmcache run exited with {proc.returncode}: {log.read_text()[-3000:]}"
        assert time.perf_counter() < deadline, "shmcache run not ready in 1200 s"
        if r is None:
            try:
                r = shmcache.attach(name)
            except (OSError, shmcache.ShmcacheError):
                pass
        if r is not None and r.status()["ready"]:
            return proc, r, time.perf_counter() - t0
        time.sleep(0.02)


def stop_tree(proc: subprocess.Popen, wait: float = 60) -> int | None:
    """SIGTERM the supervisor, wait; then kill whatever of its tree is left, by pid. Its exit code."""
    kids = psutil.Process(proc.pid).children(recursive=True) if proc.poll() is None else []
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        rc = proc.wait(wait)
    except subprocess.TimeoutExpired:
        proc.kill()
        rc = proc.wait(10)
    for k in kids:
        try:
            if k.is_running():
                k.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(kids, timeout=10)
    return rc


def remove(kafka_admin, topics: list[str], caches: list[str]) -> None:
    """A benchmark's caches destroyed and its topics deleted, whatever is left of them."""
    import shmcache

    for c in caches:
        if shmcache.exists(c):
            shmcache.destroy(c, force=True)
    for fut in kafka_admin.delete_topics(topics, operation_timeout=10).values():
        try:
            fut.result(timeout=15)
        except Exception:  # noqa: BLE001 - gone already, or the broker going: nothing left to do
            pass
