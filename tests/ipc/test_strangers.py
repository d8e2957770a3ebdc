"""/dev/shm is writable by every user: whatever sits at a cache's name (a FIFO, a
directory, a symlink, a file whose creator died), no call blocks, and each refuses
with a named error that says what is there. `list_caches` skips them all.

Calls that used to block forever (a FIFO) run in a child process with a bound, so a
regression fails the test instead of hanging the suite; the child prints one JSON
line per call, so a hang names the call that hung.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

import shmcache
from shmcache.engine import layout as L
from shmcache.engine import reader_stats

REPO = Path(__file__).resolve().parents[2]
CHILD_TIMEOUT = 90.0  # a cold numba cache compiles the kernels in the child

_CALLS = """
    import json, sys
    import shmcache
    name, listed = sys.argv[1], sys.argv[2]
    calls = {
        "attach": lambda: shmcache.attach(name).close(),
        "open": lambda: shmcache.open(name).close(),
        "create_exist_ok": lambda: shmcache.create(name, memory="34MiB", exist_ok=True).close(),
        "destroy": lambda: shmcache.destroy(name),
        "list": lambda: [n for n in shmcache.list_caches() if n in (name, listed)],
        "exists": lambda: shmcache.exists(name),
    }
    for what, fn in calls.items():
        try:
            got = fn()
        except Exception as e:
            print(json.dumps([what, type(e).__name__, isinstance(e, shmcache.NotACacheError), str(e)]), flush=True)
        else:
            print(json.dumps([what, "ok", False, got]), flush=True)
"""


def _run(argv: list[str]) -> subprocess.CompletedProcess:
    """A child with a bound: TimeoutExpired (the child killed and reaped) if it hangs."""
    return subprocess.run(argv, capture_output=True, text=True, timeout=CHILD_TIMEOUT, cwd=REPO,
                          env={**os.environ, "CI": "true"})


def _calls(name: str, listed: str = "") -> dict[str, list]:
    res = _run([sys.executable, "-c", textwrap.dedent(_CALLS), name, listed])
    assert res.returncode == 0, res.stderr
    return {row[0]: row[1:] for row in map(json.loads, res.stdout.splitlines())}


def _cli(*args: str) -> subprocess.CompletedProcess:
    return _run([sys.executable, "-m", "shmcache", *args])


def _one_line_exit_2(res: subprocess.CompletedProcess, *fragments: str) -> None:
    assert res.returncode == 2, (res.returncode, res.stdout, res.stderr)
    assert "Traceback" not in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr
    for f in fragments:
        assert f in res.stderr, res.stderr


@pytest.fixture
def name():
    n = f"t-stranger-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    yield n
    path = f"/dev/shm/{n}"
    if os.path.isdir(path) and not os.path.islink(path):
        os.rmdir(path)
    elif os.path.lexists(path):
        os.unlink(path)
    reader_stats.unlink(n)


@pytest.fixture
def real_cache():
    """A cache with one entry; destroyed after."""
    n = f"t-stranger-real-{uuid.uuid4().hex[:8]}"
    with shmcache.create(n, memory="34MiB") as w:
        w.set(b"k" * 32, b"v")
    yield n
    if shmcache.exists(n):
        shmcache.destroy(n)


def _refused(out: dict, name: str, kind: str) -> None:
    for what in ("attach", "open", "create_exist_ok", "destroy"):
        cls, is_not_a_cache, msg = out[what]
        assert is_not_a_cache, (what, out[what])
        assert f"cache '{name}'" in msg and kind in msg, (what, msg)
    assert out["list"] == ["ok", False, []], out["list"]
    assert out["exists"] == ["ok", False, True]  # something is at the name: create() would fail


def test_a_fifo_at_the_name_blocks_nothing_and_is_refused(name):
    """The FIFO has no writer: a plain open(O_RDONLY) of it blocks forever."""
    os.mkfifo(f"/dev/shm/{name}", 0o600)
    out = _calls(name)
    _refused(out, name, "is a FIFO")
    assert os.path.exists(f"/dev/shm/{name}"), "destroy without force removed a FIFO"
    _one_line_exit_2(_cli("stats", name), f"cache '{name}'", "is a FIFO")
    _one_line_exit_2(_cli("destroy", name), f"cache '{name}'", "is a FIFO", "--force")
    res = _cli("list")
    assert res.returncode == 0 and name not in res.stdout.split(), res.stderr
    shmcache.destroy(name, force=True)
    assert not os.path.lexists(f"/dev/shm/{name}")


def test_a_directory_at_the_name_is_refused_and_never_removed(name):
    os.mkdir(f"/dev/shm/{name}", 0o700)
    _refused(_calls(name), name, "is a directory")
    with pytest.raises(shmcache.NotACacheError, match=f"cache '{name}': .* is a directory"):
        shmcache.destroy(name, force=True)
    assert os.path.isdir(f"/dev/shm/{name}")
    _one_line_exit_2(_cli("destroy", name, "--force"), "is a directory")
    _one_line_exit_2(_cli("stats", name), "is a directory")


def test_a_symlink_to_a_real_cache_is_not_followed(name, real_cache):
    """The hardest link: to a valid cache, which a following open would take as this name's."""
    os.symlink(f"/dev/shm/{real_cache}", f"/dev/shm/{name}")
    out = _calls(name, listed=real_cache)
    for what in ("attach", "open", "create_exist_ok", "destroy"):
        cls, is_not_a_cache, msg = out[what]
        assert is_not_a_cache and f"cache '{name}'" in msg and "is a symbolic link" in msg, (what, msg)
    assert out["list"] == ["ok", False, [real_cache]], out["list"]  # the target, never the link
    _one_line_exit_2(_cli("stats", name), "is a symbolic link")
    shmcache.destroy(name, force=True)  # removes the link, not what it points to
    assert not os.path.lexists(f"/dev/shm/{name}")
    with shmcache.attach(real_cache) as r:
        assert r.get(b"k" * 32) == b"v"


def test_list_caches_skips_every_stranger_and_lists_the_caches(name, real_cache):
    """A FIFO, a directory, a symlink to a cache, a socket and a file with the magic but an
    invalid cache name all at once: list returns (without blocking) exactly the real cache."""
    import socket

    base = f"/dev/shm/{name}"
    made = [base + "-fifo", base + "-dir", base + "-link", base + "-sock", f"/dev/shm/.{name}-magic"]
    os.mkfifo(made[0])
    os.mkdir(made[1])
    os.symlink(f"/dev/shm/{real_cache}", made[2])
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(made[3])
    with open(made[4], "wb") as f:
        f.write(L.MAGIC.to_bytes(8, "little") + bytes(8192))
    try:
        code = f"""
            import shmcache
            print(sorted(n for n in shmcache.list_caches() if n.startswith(({name!r}, {real_cache!r}, ".{name}"))))
        """
        res = _run([sys.executable, "-c", textwrap.dedent(code)])
        assert res.returncode == 0, res.stderr
        assert res.stdout.strip() == repr([real_cache])
        res = _cli("list")
        assert res.returncode == 0 and real_cache in res.stdout.split(), res.stderr
        assert not any(n.startswith((name, f".{name}")) for n in res.stdout.split()), res.stdout
    finally:
        sock.close()
        os.rmdir(made[1])
        for p in made[:1] + made[2:]:
            os.unlink(p)


def test_a_directory_at_the_readers_companion_is_refused_by_create(name):
    """The companion's name is derived from the cache's: a directory put there stops
    create() with an error naming it, and no cache is left half-made."""
    os.mkdir(reader_stats.path_of(name))
    try:
        with pytest.raises(shmcache.NotACacheError, match=f"cache '{name}': .*readers.* is a directory"):
            shmcache.create(name, memory="34MiB")
        assert not os.path.lexists(f"/dev/shm/{name}")
    finally:
        os.rmdir(reader_stats.path_of(name))


def test_a_fifo_at_the_readers_companion_costs_only_the_reader_counters(name):
    with shmcache.create(name, memory="34MiB") as w:
        w.set(b"k" * 32, b"v")
        os.unlink(reader_stats.path_of(name))
        os.mkfifo(reader_stats.path_of(name))
        code = f"""
            import shmcache
            with shmcache.attach({name!r}) as r:
                print(r.get(b"k" * 32), r.stats()["reader_hits"])
        """
        res = _run([sys.executable, "-c", textwrap.dedent(code)])
        assert res.returncode == 0, res.stderr
        assert res.stdout.split() == ["b'v'", "0"]
    shmcache.destroy(name)
    assert not os.path.lexists(reader_stats.path_of(name)), "the companion goes with the cache"


# -- a file whose creator is gone --------------------------------------------------------------------

_CREATOR = """
    import sys, time
    from shmcache.ipc.segment import Segment
    seg = Segment(sys.argv[1], create_size=34 << 20, writable=True)  # create()'s first step: sized, no header
    print("sized", flush=True)
    time.sleep(600)
"""


def test_a_creator_killed_mid_create_is_refused_at_once_a_live_one_waited_for(name, monkeypatch):
    """A creator that has sized the file but not written its header: while it lives,
    attach waits for it (here: a shortened wait, then CacheNotReadyError); once it is
    killed (-9), attach and open refuse at once (not after 30 s + 10 s/GiB), with the
    file left as it was."""
    from shmcache.engine import lifecycle

    child = subprocess.Popen([sys.executable, "-c", textwrap.dedent(_CREATOR), name], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True, cwd=REPO)
    try:
        assert child.stdout.readline().strip() == "sized", child.stderr.read()
        with monkeypatch.context() as m:
            m.setattr(lifecycle, "READY_TIMEOUT", 0.3)  # the wait for a live creator, shortened
            with pytest.raises(shmcache.CacheNotReadyError, match=f"cache '{name}': .* no shmcache magic after waiting"):
                shmcache.attach(name)
        with pytest.raises(shmcache.CacheInUseError, match="being created by a live process"):
            shmcache.destroy(name)
        child.send_signal(signal.SIGKILL)
        assert child.wait(30) == -signal.SIGKILL
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(30)
        child.stdout.close()
        child.stderr.close()
    for fn in (shmcache.attach, shmcache.open):  # the real wait (30 s + ...) stays in force: none is taken
        with pytest.raises(shmcache.NotACacheError, match=f"cache '{name}': .* no shmcache magic and no creator"):
            fn(name)
    assert os.path.getsize(f"/dev/shm/{name}") == 34 << 20
    with pytest.raises(shmcache.NotACacheError, match="no shmcache magic"):
        shmcache.destroy(name)
    shmcache.destroy(name, force=True)
    assert not os.path.lexists(f"/dev/shm/{name}")


def test_a_zeroed_header_is_refused_at_once(real_cache):
    """A live cache whose magic was overwritten (no creator holds its lock): refused at once."""
    w = shmcache.open(real_cache)
    try:
        w._header[L.H_MAGIC] = 0
        for fn in (shmcache.attach, shmcache.open):
            with pytest.raises(shmcache.NotACacheError, match=f"cache '{real_cache}': .* no creator is at work"):
                fn(real_cache)
    finally:
        w._header[L.H_MAGIC] = L.MAGIC
        w.close()
