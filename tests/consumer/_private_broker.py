"""A broker of a test's own (scripts/kafka on fixed free ports, in the test's tmp dir) that
the test can stop and start again with its data, for broker-outage tests: the session
broker of tests/conftest.py is shared and must stay up.

Always stopped at the end (by the pid scripts/kafka reports), even if the test fails;
--watch-pid stops it too if pytest itself dies."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
KAFKA_SCRIPT = REPO / "scripts" / "kafka"


def free_ports(n: int) -> list[int]:
    socks = []
    try:
        for _ in range(n):
            s = socket.socket()
            s.bind(("127.0.0.1", 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _is_broker(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"kafka.Kafka" in f.read()
    except OSError:
        return False


class PrivateBroker:
    def __init__(self, run_dir: Path):
        self.dir = run_dir
        self.port, self.cport = free_ports(2)
        self.bootstrap = f"127.0.0.1:{self.port}"
        self.pid: int | None = None
        self.starts = 0

    def start(self, timeout: float = 300.0) -> None:
        """Start (again, keeping the topics and offsets of the previous run) and wait until it serves."""
        cmd = [sys.executable, str(KAFKA_SCRIPT), "start", "--dir", str(self.dir), "--port", str(self.port),
               "--controller-port", str(self.cport), "--watch-pid", str(os.getpid())]
        if self.starts:
            cmd.append("--keep-data")
        proc = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True,
                              timeout=timeout, check=False)
        if proc.returncode != 0:
            self.stop()
            raise AssertionError(f"scripts/kafka start failed:\n{proc.stderr[-3000:]}")
        self.pid = json.loads(proc.stdout.strip().splitlines()[-1])["pid"]
        self.starts += 1

    def stop(self) -> None:
        subprocess.run([sys.executable, str(KAFKA_SCRIPT), "stop", "--dir", str(self.dir)],
                       stdin=subprocess.DEVNULL, capture_output=True, timeout=90, check=False)
        if self.pid is not None and _is_broker(self.pid):
            os.kill(self.pid, signal.SIGKILL)
        self.pid = None
