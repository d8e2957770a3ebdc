"""destroy() removes only a shmcache segment no other live process uses (unless forced),
with its readers' companion; and no mode lets anyone but the owner write a cache, or
its companion wider than the group that may read it.

Users of a cache are real child processes (a writer through shmcache.open; a
supervisor's registration as consumer/supervisor/policy.py makes it: its owner word in the
header), stopped by pid at the end of each test.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

import shmcache
from shmcache.engine import reader_stats

REPO = Path(__file__).resolve().parents[2]
TIMEOUT = 90.0

_USER = """
    import sys
    import shmcache
    name, role = sys.argv[1], sys.argv[2]
    w = shmcache.open(name)
    if role == "supervisor":  # registered as consumer/supervisor/startup.py does, its handle kept open
        assert w.control.claim_supervisor() == 0
    print("ready", flush=True)
    sys.stdin.readline()
"""


class User:
    """A child process using the cache as `role`; killed and reaped by stop()."""

    def __init__(self, name: str, role: str):
        self.p = subprocess.Popen([sys.executable, "-c", textwrap.dedent(_USER), name, role], cwd=REPO,
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = self.p.stdout.readline()
        if line.strip() != "ready":
            self.stop()
            raise AssertionError(self.p.stderr.read())
        self.pid = self.p.pid

    def stop(self) -> None:
        if self.p.poll() is None:
            self.p.send_signal(signal.SIGKILL)  # no goodbye: its row or header word stays behind
        self.p.wait(TIMEOUT)
        for f in (self.p.stdin, self.p.stdout, self.p.stderr):
            f.close()


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "shmcache", *args], capture_output=True, text=True,
                          timeout=TIMEOUT, cwd=REPO, env={**os.environ, "CI": "true"})


def _path(name: str) -> str:
    return f"/dev/shm/{name}"


@pytest.fixture
def name():
    n = f"t-destroy-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    yield n
    if os.path.lexists(_path(n)):
        os.unlink(_path(n))
    reader_stats.unlink(n)


@pytest.fixture
def cache(name):
    with shmcache.create(name, memory="34MiB") as w:
        w.set(b"k" * 32, b"v")
    return name


def test_a_file_that_is_not_a_cache_is_destroyed_only_by_force(name):
    data = os.urandom(1 << 20)
    with open(_path(name), "wb") as f:
        f.write(data)
    with pytest.raises(shmcache.NotACacheError, match=f"cache '{name}': .*no shmcache magic.*force"):
        shmcache.destroy(name)
    res = _cli("destroy", name)
    assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1, res.stderr
    assert "--force" in res.stderr and "Traceback" not in res.stderr
    with open(_path(name), "rb") as f:
        assert f.read() == data, "a refused destroy must not touch the file"
    res = _cli("destroy", name, "--force")
    assert res.returncode == 0, res.stderr
    assert not os.path.lexists(_path(name))


@pytest.mark.parametrize("role", ["writer", "supervisor"])
def test_destroy_is_refused_while_a_live_process_uses_the_cache(cache, role):
    """Refused naming the pid, by the API and the command line; forced, it goes, with its
    companion; a user that died (killed -9, its word left behind) does not count."""
    user = User(cache, role)
    try:
        with pytest.raises(shmcache.CacheInUseError, match=f"cache '{cache}' is in use by a live {role} pid {user.pid}"):
            shmcache.destroy(cache)
        res = _cli("destroy", cache)
        assert res.returncode == 2 and len(res.stderr.strip().splitlines()) == 1, res.stderr
        assert f"{role} pid {user.pid}" in res.stderr and "Traceback" not in res.stderr
        assert os.path.exists(_path(cache)) and os.path.exists(reader_stats.path_of(cache))
        with shmcache.attach(cache) as r:
            assert r.get(b"k" * 32) == b"v"
    finally:
        user.stop()
    shmcache.destroy(cache)  # its owner word is still there, its process is not
    assert not os.path.lexists(_path(cache)) and not os.path.lexists(reader_stats.path_of(cache))


def test_force_destroys_a_cache_in_use(cache):
    user = User(cache, "writer")
    try:
        res = _cli("destroy", cache, "--force")
        assert res.returncode == 0, res.stderr
        assert not os.path.lexists(_path(cache)) and not os.path.lexists(reader_stats.path_of(cache))
    finally:
        user.stop()


def test_the_callers_own_writer_does_not_keep_it_from_destroying(name):
    """create then destroy in one process, the writer still open: destroyed; the handle
    keeps its mapping (as readers do) until it closes."""
    w = shmcache.create(name, memory="34MiB")
    try:
        w.set(b"k" * 32, b"v")
        shmcache.destroy(name)
        assert not shmcache.exists(name) and not os.path.lexists(reader_stats.path_of(name))
        assert w.get(b"k" * 32) == b"v"
        with pytest.raises(shmcache.CacheNotFoundError):
            shmcache.attach(name)
    finally:
        w.close()


# -- modes -----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", [0o666, 0o660, 0o620, 0o602, 0o622])
def test_a_mode_that_lets_others_write_is_refused(name, mode):
    with pytest.raises(ValueError, match=f"cache '{name}': mode={mode:#o} must give .* no one else write"):
        shmcache.create(name, memory="34MiB", mode=mode)
    assert not os.path.lexists(_path(name)) and not os.path.lexists(reader_stats.path_of(name))


@pytest.mark.parametrize("mode, companion", [(0o600, 0o600), (0o640, 0o660), (0o644, 0o664), (0o604, 0o604)])
def test_the_companion_is_never_wider_than_the_group_that_may_read(name, mode, companion):
    old = os.umask(0)
    try:
        shmcache.create(name, memory="34MiB", mode=mode).close()
    finally:
        os.umask(old)
    assert os.stat(_path(name)).st_mode & 0o777 == mode
    assert os.stat(reader_stats.path_of(name)).st_mode & 0o777 == companion


@pytest.mark.parametrize("mode", [0o666, 0o620, 0o602])
def test_a_segment_others_may_write_is_refused_by_writers_and_readers(cache, mode):
    """A cache made wider by hand (or a file planted with the magic): a writer will not
    write memory someone else can change under it, and a reader will not serve what
    anyone could have put there (docs/segment-format.md section 4), owner named or not."""
    os.chmod(_path(cache), mode)
    for fn in (shmcache.open, lambda n: shmcache.create(n, memory="34MiB", exist_ok=True)):
        with pytest.raises(shmcache.CachePermissionError, match=f"cache '{cache}': .* has mode {mode:04o}"):
            fn(cache)
    for owner in (None, "root", os.geteuid()):
        with pytest.raises(shmcache.UnsafeModeError, match=f"cache '{cache}': .* has mode {mode:04o} .* refusing"):
            shmcache.attach(cache, owner=owner)
    os.chmod(_path(cache), 0o600)
    with shmcache.attach(cache) as r:
        assert r.get(b"k" * 32) == b"v"
    with shmcache.open(cache) as w:
        w.set(b"k" * 32, b"w")


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to give the file to another user")
def test_a_writer_refuses_a_segment_another_user_owns(cache):
    os.chown(_path(cache), 65534, -1)
    with pytest.raises(shmcache.CachePermissionError, match=f"cache '{cache}': .* owner uid 65534"):
        shmcache.open(cache)
    with shmcache.attach(cache) as r:
        assert r.get(b"k" * 32) == b"v"
