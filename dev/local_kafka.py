"""The project's local Kafka broker (scripts/kafka) as a process: start, stop, start again.

One place for what the demo and the tests do with it: `scripts/kafka start` in a run
directory of the caller's (free ports the first time; the same ports and data with
`keep_data`), `--watch-pid` so a watchdog stops the broker if the caller dies without
cleaning up, the one line of JSON it prints (bootstrap, pid, controller), and a stop
that is sure of it: `scripts/kafka stop`, then SIGKILL by the pid it reported if a
Kafka broker still runs there.

scripts/kafka belongs to the repository, not to an installed package: a checkout
has it beside the package; without it, `LocalKafkaError` says so.
"""

from __future__ import annotations

import json
import os
import random
import signal
import socket
import subprocess
import sys
from pathlib import Path

KAFKA_SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "kafka"


class LocalKafkaError(RuntimeError):
    """scripts/kafka is missing or its start failed (`returncode`, `stderr` when captured)."""

    def __init__(self, message: str, returncode: int | None = None, stderr: str = ""):
        super().__init__(message)
        self.returncode = returncode
        self.stderr = stderr


def is_broker(pid: int) -> bool:
    """A Kafka broker (a JVM running kafka.Kafka) runs as `pid`."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"kafka.Kafka" in f.read()
    except OSError:
        return False


def free_ports(n: int) -> list[int]:
    """n TCP ports on 127.0.0.1 that nothing listened on a moment ago, drawn below the kernel's
    ephemeral range: a port the kernel handed out for a bind to 0 is one it hands out again
    as the local port of the next outgoing connection (a Kafka client's, anyone's), which
    then holds it when our server binds it (seen: "Address already in use" for a metrics
    port, with two test runs on the machine)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            low = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768  # Linux's default
    rng = random.SystemRandom()
    socks: list[socket.socket] = []
    try:
        while len(socks) < n:
            s = socket.socket()
            try:
                s.bind(("127.0.0.1", rng.randrange(10000, max(low, 10001))))
            except OSError:  # taken: draw again
                s.close()
                continue
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


class LocalBroker:
    """scripts/kafka's broker in `run_dir`; `port`/`controller_port` 0: free ones on first start.

    After a start the ports are kept, so a later `start(keep_data=True)` comes back on the
    same address with the topics and offsets of the run before."""

    def __init__(self, run_dir: Path, port: int = 0, controller_port: int = 0, advertised_port: int = 0):
        self.dir = Path(run_dir)
        self.port, self.cport = port, controller_port
        self.advertised_port = advertised_port  # clients are told to connect there (a test's proxy); 0: `port`
        self.info: dict | None = None
        self.pid: int | None = None
        self.bootstrap = f"127.0.0.1:{port}" if port else ""

    def start(self, *, timeout: float | None = None, keep_data: bool = False, ready_timeout: float | None = None,
              capture_stderr: bool = True) -> dict:
        """Start and wait until it serves; returns scripts/kafka's JSON line.

        Raises LocalKafkaError (after a stop: it may be half up), or subprocess.TimeoutExpired
        past `timeout` (the caller stops it)."""
        if not KAFKA_SCRIPT.exists():
            raise LocalKafkaError(f"{KAFKA_SCRIPT} not found (an installed shmcache has no scripts/)")
        cmd = [sys.executable, str(KAFKA_SCRIPT), "start", "--dir", str(self.dir), "--watch-pid", str(os.getpid())]
        if self.port:
            cmd += ["--port", str(self.port), "--controller-port", str(self.cport)]
        if keep_data:
            cmd.append("--keep-data")
        if self.advertised_port:
            cmd += ["--advertised-port", str(self.advertised_port)]
        if ready_timeout is not None:
            cmd += ["--timeout", f"{ready_timeout:g}"]
        p = subprocess.run(cmd, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE if capture_stderr else None, text=True, timeout=timeout,
                           check=False)
        if p.returncode != 0:
            self.stop()
            raise LocalKafkaError(f"scripts/kafka start failed (exit {p.returncode})", p.returncode, p.stderr or "")
        self.info = json.loads(p.stdout.strip().splitlines()[-1])
        self.pid = int(self.info["pid"])
        self.bootstrap = self.info["bootstrap"]
        self.port = int(self.bootstrap.rsplit(":", 1)[1])
        if self.info.get("controller"):
            self.cport = int(str(self.info["controller"]).rsplit(":", 1)[1])
        return self.info

    def stop(self, timeout: float = 90.0) -> None:
        """scripts/kafka stop (SIGTERM, then SIGKILL, and its watchdog), then make sure of it by pid."""
        subprocess.run([sys.executable, str(KAFKA_SCRIPT), "stop", "--dir", str(self.dir)],
                       stdin=subprocess.DEVNULL, capture_output=True, timeout=timeout, check=False)
        if self.pid is not None and is_broker(self.pid):
            os.kill(self.pid, signal.SIGKILL)
