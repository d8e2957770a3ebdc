"""Running `scripts/demo` / `shmcache demo` as a real process and reading what it says
it started, so tests can check that none of it is left (tests/dev/test_demo.py,
tests/dev/test_demo_bootstrap.py)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import psutil

from shmtest import REPO
ENV = {**os.environ, "CI": "true"}  # as in CI: no terminal


@dataclass
class DemoRun:
    code: int
    out: str

    def pids(self) -> list[int]:
        """Every pid the demo says it started (supervisor, workers, broker, reader)."""
        pids = []
        m = re.search(r"stopped supervisor pid (\d+) \(workers ([\d, ]+)\)", self.out)
        if m:
            pids.append(int(m.group(1)))
            pids += [int(x) for x in m.group(2).split(",")]
        pids += [int(x) for x in re.findall(r"broker pid (\d+)", self.out)]
        pids += [int(x) for x in re.findall(r"pid (\d+), batches of", self.out)]  # the reader process
        return pids

    def cache(self) -> str:
        m = re.search(r"cache '(demo-[0-9a-f]+)'", self.out)
        assert m, self.out
        return m.group(1)

    def row(self, label: str) -> str:
        """A value of the summary table."""
        m = re.search(rf"│ {re.escape(label)}\s*│\s*(.*?)\s*│", self.out)
        assert m, f"no row {label!r} in:\n{self.out}"
        return m.group(1)


def alive(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def run_demo(args: list[str], timeout: float, script: bool = True, tmpdir: Path | None = None) -> DemoRun:
    """Run the demo in its own session; on timeout kill that session (the broker's
    watchdog stops the broker once the demo is gone) and fail. `tmpdir`: the demo's
    TMPDIR, where it makes its temporary directory (a test's own, so another run on
    the machine cannot be mistaken for a leftover of this one)."""
    argv = [str(REPO / "scripts" / "demo")] if script else [sys.executable, "-m", "shmcache", "demo"]
    p = subprocess.Popen(argv + args, cwd=REPO, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                         stderr=subprocess.STDOUT, text=True, start_new_session=True,
                         env={**ENV, "TMPDIR": str(tmpdir)} if tmpdir is not None else ENV)
    try:
        out, _ = p.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        out, _ = p.communicate()
        raise AssertionError(f"the demo took over {timeout:.0f} s:\n{out}") from None
    return DemoRun(p.returncode, out)


def demo_tmp_dirs(where: Path) -> set[str]:
    """The demo's temporary directories under `where` (the TMPDIR run_demo gave it)."""
    return {str(d) for d in where.glob("shmcache-demo-*")}


def assert_nothing_left(run: DemoRun, kept: bool = False) -> None:
    left = [pid for pid in run.pids() if alive(pid)]
    assert not left, f"processes the demo started are still alive: {left}"
    name = run.cache()
    if not kept:
        assert not os.path.exists(f"/dev/shm/{name}"), f"/dev/shm/{name} is left"
        assert not os.path.exists(f"/dev/shm/.shmcache-{name}.readers"), "the readers' companion is left"
