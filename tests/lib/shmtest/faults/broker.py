"""The fault suite's own broker: scripts/kafka in a run dir of its own, on a free port, killed
and restarted on the same port and data, stopped by pid at the end."""

from __future__ import annotations

import contextlib
import signal
from pathlib import Path

import psutil

from shmcache.dev.local_kafka import LocalBroker, LocalKafkaError


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
        self._local = LocalBroker(run_dir)  # start/stop of scripts/kafka (dev/local_kafka.py)

    def start(self, timeout: float = 900.0) -> None:  # the first start on a machine fetches the jars
        self._local.port, self._local.cport = self.port, self.cport
        try:
            info = self._local.start(timeout=timeout, keep_data=bool(self.port), ready_timeout=180)
        except LocalKafkaError as e:
            raise RuntimeError(f"scripts/kafka start failed:\n{e.stderr[-3000:]}") from None
        self.bootstrap, self.port, self.cport = self._local.bootstrap, self._local.port, self._local.cport
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
        self._local.stop()  # scripts/kafka stop; the broker is gone already
        for p in self.seen:
            with contextlib.suppress(psutil.Error):
                if alive(p):
                    p.kill()
