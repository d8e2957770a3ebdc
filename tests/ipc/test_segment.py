"""The segment as the OS sees it: read-only mappings, file modes, permissions, and what
attach/create do with names and files that are not (or not yet, or no longer) a cache.

Children are separate interpreters (`sys.executable -c`), never forks of pytest.
"""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import textwrap
import uuid

import numpy as np
import psutil
import pytest

import shmcache
from shmcache.engine import layout as L
from shmcache.engine import reader_stats

KEY = b"k" * 32
VALUE = b"the value " * 10
CHILD_TIMEOUT = 60.0  # a cold numba cache compiles the kernels in the child


def _path(name: str) -> str:
    return os.path.join("/dev/shm", name)


@pytest.fixture
def name():
    n = f"t-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    yield n
    if os.path.lexists(_path(n)):
        os.unlink(_path(n))
    reader_stats.unlink(n)  # the readers' companion segment, made by create()


@pytest.fixture
def cache(name):
    """A small cache holding KEY -> VALUE and 1000 other keys; yields its writer."""
    w = shmcache.create(name, memory="34MiB")
    keys = np.random.default_rng(5).integers(0, 256, (1000, 32), dtype=np.uint8)
    w.set_many(keys, [bytes([i % 251]) * (i % 300) for i in range(1000)])
    w.set(KEY, VALUE)
    yield w
    w.close()


def _digest(name: str) -> str:
    with open(_path(name), "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def _child(code: str, *args, timeout: float = CHILD_TIMEOUT) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code), *map(str, args)],
                          capture_output=True, text=True, timeout=timeout)


# -- (a) a reader cannot write ------------------------------------------------------------------


def test_reader_cannot_write_through_the_api_numpy_or_mmap(cache):
    r = shmcache.attach(cache.name)
    try:
        for method in ("set", "set_many", "delete", "delete_many", "apply", "repair_dead_locks"):
            assert not hasattr(r, method), method  # a reader has no write methods at all
        assert not hasattr(r.control, "set_word") and not hasattr(r.control, "set_topic")
        for arr in (r._ring8, r._ring64, r._meta, r._index, r._header, r._writers, r.control.partitions,
                    r.control.workers):
            assert not arr.flags.writeable
            with pytest.raises(ValueError, match="read-only"):
                arr[0] = 1
            with pytest.raises(ValueError):
                arr.flags.writeable = True  # the buffer itself is read-only: numpy refuses
        del arr  # a live view keeps the mapping from closing
        with pytest.raises(TypeError):
            r._seg.mm[0:1] = b"x"
        assert r.get(KEY) == VALUE
    finally:
        r.close()


def test_raw_write_through_a_readers_mapping_is_a_segfault(cache):
    before = _digest(cache.name)
    res = _child("""
        import ctypes, resource, sys
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))  # no core file
        import shmcache
        r = shmcache.attach(sys.argv[1])
        assert r.get(b"k" * 32) is not None
        print("attached", flush=True)
        ctypes.memset(r._ring8.ctypes.data, 0xAB, 64)
        print("wrote", flush=True)
    """, cache.name)
    assert res.stdout.split() == ["attached"], res.stderr
    assert res.returncode == -signal.SIGSEGV, (res.returncode, res.stderr)
    assert _digest(cache.name) == before, "the segment changed"
    assert shmcache.attach(cache.name).get(KEY) == VALUE
    cache.set(b"n" * 32, b"new")  # and it still takes writes
    assert shmcache.attach(cache.name).get(b"n" * 32) == b"new"


# -- (b) readers that come and go leave the segment alone -----------------------------------------

_READER = """
    import multiprocessing.resource_tracker as rt, os, sys, time
    import numpy as np
    import shmcache
    r = shmcache.attach(sys.argv[1])
    keys = np.random.default_rng(5).integers(0, 256, (1000, 32), dtype=np.uint8)
    assert r.contains_many(keys).all() and r.get(b"k" * 32) == b"the value " * 10
    tracker = rt._resource_tracker._pid
    print("read", tracker, flush=True)
    if sys.argv[2] == "wait":
        time.sleep(600)
    r.close()
"""


def test_reader_exit_leaves_segment_intact(cache):
    before = _digest(cache.name)
    for _ in range(2):
        res = _child(_READER, cache.name, "exit")
        assert res.returncode == 0, res.stderr
        assert res.stdout.split() == ["read", "None"], "a reader must not start a resource tracker"
        assert res.stderr == "", f"reader printed to stderr: {res.stderr}"
        assert os.path.exists(_path(cache.name))
        assert _digest(cache.name) == before
    assert shmcache.attach(cache.name).get(KEY) == VALUE


def test_reader_sigkill_leaves_segment_intact(cache, tmp_path):
    before = _digest(cache.name)
    err = open(tmp_path / "stderr", "w+")
    p = subprocess.Popen([sys.executable, "-c", textwrap.dedent(_READER), cache.name, "wait"],
                         stdout=subprocess.PIPE, stderr=err, text=True)
    try:
        line = p.stdout.readline()
        assert line.split() == ["read", "None"], open(tmp_path / "stderr").read()
        assert psutil.Process(p.pid).children(recursive=True) == []  # no tracker to clean up after it
        p.send_signal(signal.SIGKILL)
        assert p.wait(10) == -signal.SIGKILL
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(10)
        p.stdout.close()
        err.close()
    err_text = open(tmp_path / "stderr").read()
    assert "leaked" not in err_text and "resource_tracker" not in err_text, err_text
    assert os.path.exists(_path(cache.name))
    assert _digest(cache.name) == before
    assert shmcache.attach(cache.name).get(KEY) == VALUE


# -- (c) file modes ------------------------------------------------------------------------------------


def test_default_mode_is_0600_and_mode_is_kept_whatever_the_umask(name):
    shmcache.create(name, memory="34MiB").close()
    assert os.stat(_path(name)).st_mode & 0o777 == 0o600
    shmcache.destroy(name)
    old = os.umask(0o077)  # would narrow 0640 to 0600 without the explicit fchmod
    try:
        shmcache.create(name, memory="34MiB", mode=0o640).close()
    finally:
        os.umask(old)
    assert os.stat(_path(name)).st_mode & 0o777 == 0o640
    shmcache.destroy(name)
    old = os.umask(0)
    try:
        shmcache.create(name, memory="34MiB").close()
    finally:
        os.umask(old)
    assert os.stat(_path(name)).st_mode & 0o777 == 0o600


# -- (d) other users --------------------------------------------------------------------------------------

_AS_NOBODY = """
    import os, sys
    import shmcache
    name = sys.argv[1]
    with shmcache.attach(name) as r:  # load the kernels while still root
        r.get(b"k" * 32)
    os.setgroups([65534])
    os.setgid(65534)
    os.setuid(65534)
    for what, fn in (("attach", shmcache.attach), ("open", shmcache.open)):
        try:
            h = fn(name)
        except Exception as e:
            print(what, type(e).__name__, isinstance(e, PermissionError), str(e), sep="|", flush=True)
        else:
            print(what, "ok", h.get(b"k" * 32).decode(), "", sep="|", flush=True)
            h.close()
"""


def _as_nobody(name: str) -> dict[str, list[str]]:
    res = _child(_AS_NOBODY, name)
    assert res.returncode == 0, res.stderr
    return {line.split("|")[0]: line.split("|")[1:] for line in res.stdout.splitlines()}


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a child as another user")
def test_another_user_is_refused_with_a_message_naming_the_cache(cache):
    out = _as_nobody(cache.name)
    for what in ("attach", "open"):
        kind, is_perm, msg = out[what]
        assert kind == "CachePermissionError" and is_perm == "True", out
        assert f"cache '{cache.name}'" in msg and "permission denied" in msg and "0600" in msg, msg


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run a child as another user")
def test_reader_group_may_attach_but_not_write(name):
    with shmcache.create(name, memory="34MiB", mode=0o640) as w:
        w.set(KEY, VALUE)
    os.chown(_path(name), -1, 65534)
    out = _as_nobody(name)
    assert out["attach"] == ["ok", VALUE.decode(), ""], out
    assert out["open"][0] == "CachePermissionError" and "read-write" in out["open"][2], out


# -- (e) what is not a (current) cache ---------------------------------------------------------------------


def test_other_layout_version(cache):
    cache._header[L.H_VERSION] = L.LAYOUT_VERSION + 1
    for fn in (shmcache.attach, shmcache.open):
        with pytest.raises(shmcache.LayoutVersionError, match=rf"cache '{cache.name}' has layout version {L.LAYOUT_VERSION + 1}"):
            fn(cache.name)
    cache._header[L.H_VERSION] = L.LAYOUT_VERSION
    assert shmcache.attach(cache.name).get(KEY) == VALUE


def test_foreign_and_empty_files_are_not_caches(name):
    with open(_path(name), "wb") as f:
        f.write(os.urandom(1 << 20))
    for fn in (shmcache.attach, shmcache.open):
        with pytest.raises(shmcache.NotACacheError, match=f"cache '{name}'") as e:
            fn(name)
        assert isinstance(e.value, ValueError)
    with pytest.raises(shmcache.CacheExistsError):
        shmcache.create(name, memory="34MiB")
    with pytest.raises(shmcache.NotACacheError):
        shmcache.create(name, memory="34MiB", exist_ok=True)
    assert name not in list(shmcache.list_caches())
    open(_path(name), "wb").close()
    for fn in (shmcache.attach, shmcache.open):
        with pytest.raises(shmcache.NotACacheError, match=f"cache '{name}'"):
            fn(name)
    assert os.path.getsize(_path(name)) == 0, "a failed attach must not touch the file"


def test_a_sized_file_without_magic_is_refused_at_once(name):
    """Sized but without the magic (shmcache never names a segment before its magic is
    in): attach and open refuse at once, naming the way to remove it; the file is left as
    it was."""
    with open(_path(name), "wb") as f:
        f.truncate(1 << 20)
    for fn in (shmcache.attach, shmcache.open):
        with pytest.raises(shmcache.NotACacheError, match=f"cache '{name}': .* no shmcache magic .* destroy --force"):
            fn(name)
    assert os.path.getsize(_path(name)) == 1 << 20


def test_missing_cache(name):
    for fn in (shmcache.attach, shmcache.open, shmcache.destroy):
        with pytest.raises(shmcache.CacheNotFoundError, match=f"cache '{name}' does not exist") as e:
            fn(name)
        assert isinstance(e.value, FileNotFoundError)
    assert not shmcache.exists(name)


def test_create_existing(cache):
    with pytest.raises(shmcache.CacheExistsError, match=f"cache '{cache.name}' already exists") as e:
        shmcache.create(cache.name, memory="34MiB")
    assert isinstance(e.value, FileExistsError)
    assert cache.get(KEY) == VALUE, "a refused create must not touch the cache"
    with shmcache.create(cache.name, memory="64MiB", exist_ok=True) as again:
        assert isinstance(again, shmcache.Writer)
        assert again.geometry.size == cache.geometry.size, "exist_ok opens the cache as it is"
        assert again.get(KEY) == VALUE
        again.set(b"a" * 32, b"from the second writer")
    assert cache.get(b"a" * 32) == b"from the second writer"


@pytest.mark.parametrize("bad", ["", "a/b", "../x", "..", ".hidden", "x" * 201, "a\0b", "a b"])
def test_bad_names(bad):
    for fn in (shmcache.create, shmcache.attach, shmcache.open, shmcache.destroy, shmcache.exists):
        with pytest.raises(ValueError, match="is not valid"):
            fn(bad)
