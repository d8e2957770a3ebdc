"""The fault suite's own broker: scripts/kafka in a run dir of its own, on a free port, killed
and restarted on the same port and data, stopped by pid at the end."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil

REPO = Path(__file__).resolve().parents[2]


def alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


class Broker:
    """scripts/kafka's broker in a run dir of our own; restarted on the same port and data."""

    def __init__(self, run_dir: Path):
        self.dir = run_dir
        self.bootstrap = ""
        self.port = self.cport = 0
        self.proc: psutil.Process | None = None
        self.seen: list[psutil.Process] = []  # brokers and watchdogs, for the leftover check

    def start(self, timeout: float = 900.0) -> None:  # the first start on a machine fetches the jars
        cmd = [sys.executable, str(REPO / "scripts" / "kafka"), "start", "--dir", str(self.dir),
               "--watch-pid", str(os.getpid()), "--timeout", "180"]
        if self.port:
            cmd += ["--port", str(self.port), "--controller-port", str(self.cport), "--keep-data"]
        p = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=timeout)
        if p.returncode != 0:
            raise RuntimeError(f"scripts/kafka start failed:\n{p.stderr[-3000:]}")
        info = json.loads(p.stdout.strip().splitlines()[-1])
        self.bootstrap = info["bootstrap"]
        self.port = int(self.bootstrap.rsplit(":", 1)[1])
        self.cport = int(info["controller"].rsplit(":", 1)[1])
        self.proc = psutil.Process(info["pid"])
        self.seen.append(self.proc)
        with contextlib.suppress(OSError, ValueError, psutil.Error):
            self.seen.append(psutil.Process(int((self.dir / "watchdog.pid").read_text())))

    def signal(self, sig: int, timeout: float = 60.0) -> None:
        """Send sig and wait until the broker is gone (SIGKILL after `timeout`)."""
        self.proc.send_signal(sig)
        try:
            self.proc.wait(timeout)
        except psutil.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(15)

    def stop(self) -> None:
        """At the end: SIGKILL by pid (its data is thrown away), then scripts/kafka stop for the
        watchdog and the pid files."""
        if self.proc is not None and alive(self.proc):
            self.signal(signal.SIGKILL)
        subprocess.run([sys.executable, str(REPO / "scripts" / "kafka"), "stop", "--dir", str(self.dir)],
                       stdin=subprocess.DEVNULL, capture_output=True, timeout=90, check=False)
        for p in self.seen:
            with contextlib.suppress(psutil.Error):
                if alive(p):
                    p.kill()
