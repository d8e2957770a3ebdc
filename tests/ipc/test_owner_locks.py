"""Owner locks (ipc/liveness.py, docs/segment-format.md section 13): who holds a word is
alive while its lock is held, seen from any PID namespace, and dead the moment it dies,
however it dies; a reader's passing test (the read lock a JVM takes) is never an owner."""

from __future__ import annotations

import fcntl
import os
import shutil
import struct
import subprocess
import sys
import uuid

import psutil
import pytest

from shmcache.ipc import liveness

# holds the owner lock of word 3 of argv[1], says so, and waits to be killed
_HOLDER = """
import os, sys
from shmcache.ipc import liveness
fd = os.open(sys.argv[1], os.O_RDWR)
assert liveness.lock_word(fd, 3)
print(os.getpid(), flush=True)
sys.stdin.read()
"""


@pytest.fixture
def path():
    p = f"/dev/shm/t-owner-locks-{uuid.uuid4().hex[:10]}"
    with open(p, "wb") as f:
        f.write(bytes(4096))
    yield p
    os.unlink(p)


def _holder(path: str, pod: bool) -> subprocess.Popen:
    argv = [sys.executable, "-c", _HOLDER, path]
    if pod:  # pid 1 of a PID namespace of its own
        argv = ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child", "--", *argv]
    p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    p.pid_inside = int(p.stdout.readline())
    return p


@pytest.mark.parametrize("pod", [False, True], ids=["same namespace", "another PID namespace"])
def test_a_held_word_is_alive_from_anywhere_and_dead_once_its_holder_is_killed(path, pod):
    if pod and (os.geteuid() != 0 or shutil.which("unshare") is None):
        pytest.skip("a PID namespace of its own needs root and unshare")
    fd = os.open(path, os.O_RDONLY)  # a reader's: read-only is enough to test
    try:
        assert not liveness.locked_word(fd, 3)
        p = _holder(path, pod)
        try:
            if pod:
                assert p.pid_inside == 1, "the holder is pid 1 of its namespace, someone else's pid here"
            assert liveness.locked_word(fd, 3)
            assert not liveness.locked_word(fd, 2) and not liveness.locked_word(fd, 4), "one word, not its neighbours"
            wfd = os.open(path, os.O_RDWR)
            try:
                assert not liveness.lock_word(wfd, 3), "a live owner's word is not taken"
            finally:
                os.close(wfd)
        finally:
            holder = psutil.Process(p.pid).children()[0] if pod else psutil.Process(p.pid)  # the python itself
            holder.kill()  # SIGKILL: no handler, no cleanup of its own
            holder.wait(30)
            p.kill()
            p.wait(30)
        assert not liveness.locked_word(fd, 3), "the kernel drops a killed holder's lock"
    finally:
        os.close(fd)


def test_a_readers_passing_read_lock_is_no_owner(path):
    """A JVM tests a word by taking a shared lock on it and dropping it: while one is held,
    the word reads as no owner's, and a claimant waits it out rather than give up."""
    probe = os.open(path, os.O_RDONLY)
    fl = struct.pack("hhqqi4x", fcntl.F_RDLCK, os.SEEK_SET, 3 * 8, 8, 0)
    fcntl.fcntl(probe, fcntl.F_OFD_SETLK, fl)
    fd = os.open(path, os.O_RDWR)
    try:
        assert not liveness.locked_word(fd, 3)
        # the probe goes while the claimant waits: it gets the word
        import threading

        t = threading.Timer(0.05, os.close, (probe,))
        t.start()
        assert liveness.lock_word(fd, 3)
        t.join()
        other = os.open(path, os.O_RDONLY)
        assert liveness.locked_word(other, 3)
        os.close(other)
    finally:
        os.close(fd)
