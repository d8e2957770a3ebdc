"""`shmcache run` as a child process of another program (the demo): start, stop, its workers.

The supervisor's output goes to a log file; the workers it reports in status are
remembered by pid, so a stop can make sure none outlives it (by pid, never by name).
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

STOP_TIMEOUT_S = 60.0


def alive(pid: int) -> bool:
    """A process runs as `pid` (a zombie does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie is dead
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return True


class SupervisorProcess:
    """`python -m shmcache run`, its output in a log file; its workers remembered by pid."""

    def __init__(self, argv: list[str], log_path: Path):
        self.argv = argv
        self.log_path = log_path
        self.proc: subprocess.Popen | None = None
        self.worker_pids: set[int] = set()
        self.exit_code: int | None = None

    def start(self) -> None:
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def note_workers(self, status: dict) -> None:
        self.worker_pids.update(w["pid"] for w in status["workers"] if w["pid"])

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> int | None:
        """SIGTERM and wait (the supervisor drains and commits); SIGKILL it and its workers
        if it does not exit in time. Returns its exit code (None if it had to be killed)."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.exit_code = self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
                self.exit_code = None
        elif self.exit_code is None:
            self.exit_code = self.proc.returncode
        deadline = time.monotonic() + 10
        for pid in self.worker_pids:  # they exit with their supervisor; make sure
            while alive(pid) and time.monotonic() < deadline:
                time.sleep(0.05)
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        return self.exit_code

    def log_tail(self, n: int = 30) -> str:
        try:
            return "".join(self.log_path.read_text(errors="replace").splitlines(keepends=True)[-n:])
        except OSError:
            return "(no log)"
