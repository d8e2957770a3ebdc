"""`shmcache demo` whose terminal closes mid-run (issue 39 item 12): a tmux or ssh session
that ends hangs up the demo's terminal, and the kernel sends it SIGHUP. It stopped its
supervisor and left its cache in /dev/shm (2.3 GiB after an 8M-entry run); Ctrl-C
cleaned up. Now a hangup stops it as Ctrl-C does: its supervisor and workers are
stopped, its cache and topic removed. The demo runs on a pseudo-terminal of the test's
own, as its controlling terminal, and the test closes the terminal's master side."""

import contextlib
import fcntl
import os
import pty
import re
import select
import signal
import subprocess
import sys
import termios
import time
import uuid

import shmcache

from shmtest.demo_run import REPO, alive

ANSI = re.compile(r"\x1b\[[0-9;?]*[a-zA-Z]")
STOP_BOUND_S = 240  # the demo's cleanup steps' own bounds (tests/dev/test_demo_bootstrap.py)


def _controlling_tty() -> None:  # in the child, after setsid (start_new_session): fd 0 becomes its terminal
    fcntl.ioctl(0, termios.TIOCSCTTY, 0)


def _topics(admin) -> set[str]:
    return set(admin.list_topics(timeout=10).topics)


def test_a_closed_terminal_stops_the_demo_and_removes_its_cache(kafka_broker, kafka_admin):
    name = f"demo-hup-{uuid.uuid4().hex[:8]}"
    master, slave = pty.openpty()
    env = {k: v for k, v in os.environ.items() if k != "CI"}  # a terminal: rich draws its live view
    p = subprocess.Popen([sys.executable, "-m", "shmcache", "demo", "--entries", "5000000", "--memory", "256MiB",
                          "--sample", "1000", "--name", name, "--bootstrap", kafka_broker.bootstrap],
                         cwd=REPO, stdin=slave, stdout=slave, stderr=slave, start_new_session=True,
                         preexec_fn=_controlling_tty, env={**env, "TERM": "xterm-256color"})
    os.close(slave)
    out = b""
    pids: list[int] = []
    closed = False
    try:
        deadline = time.monotonic() + 180
        while True:  # read what it prints (a terminal that is not read blocks its writer) until it applies
            r, _, _ = select.select([master], [], [], 0.1)
            if r:
                with contextlib.suppress(OSError):
                    out += os.read(master, 65536)
            text = ANSI.sub("", out.decode(errors="replace"))  # rich colours a terminal's numbers
            m = re.search(r"supervisor pid (\d+) with \d+ workers \(pids (\d+), (\d+)\)", text)
            if m and not pids:
                pids = [int(x) for x in m.groups()]
            if pids and shmcache.exists(name):
                with shmcache.attach(name) as c:
                    if c.stats()["entries"] > 0:
                        break  # mid-run: the producer is sending, the workers applying
            assert p.poll() is None, f"the demo exited with {p.returncode}:\n{text}"
            assert time.monotonic() < deadline, f"the demo did not start applying:\n{text}"
        topic = re.search(r"topic '(shmcache-demo-[0-9a-f]+)'", text).group(1)
        os.close(master)  # the terminal closes: SIGHUP
        closed = True
        try:
            code = p.wait(STOP_BOUND_S)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"the demo did not stop within {STOP_BOUND_S} s of its terminal closing") from None
        assert code != -signal.SIGHUP, "the demo died of the SIGHUP, without its cleanup"
        assert not os.path.exists(f"/dev/shm/{name}"), "the demo's cache was left in /dev/shm"
        assert not [pid for pid in pids if alive(pid)]
        assert topic not in _topics(kafka_admin)
    finally:
        if not closed:
            os.close(master)
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
        for pid in pids:  # what a demo killed without its cleanup left: its supervisor and workers, by pid
            if alive(pid):
                os.kill(pid, signal.SIGKILL)
        if shmcache.exists(name):
            shmcache.destroy(name, force=True)
