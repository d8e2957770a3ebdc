"""A file cut short under its mapping (ipc/sigbus.py): whoever may write a cache's file
(its owner; for the readers' companion, any reader of the group) can truncate it while
other processes map it, and the next touch of the lost pages raised SIGBUS, which killed
them. Now a reader or writer busy on the cache gets CorruptCacheError naming it, one whose
companion was cut short goes on without reader counters, and a SIGBUS that is not ours
still reaches the handler that was there before (faulthandler here) or kills the process
as it always did: the guard must never swallow a fault it does not own.

Each process under test is a child with a bound: a hang or a swallowed fault that loops
fails the test instead of stalling the suite.
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
BOUND = 120.0
N = 20_000


@pytest.fixture
def cache():
    name = f"t-sigbus-{uuid.uuid4().hex[:10]}"
    keys = [i.to_bytes(32, "little") for i in range(N)]
    with shmcache.create(name, memory="64MiB") as w:
        w.set_many(keys, [b"v%d" % i for i in range(N)])
    yield name
    if shmcache.exists(name):
        shmcache.destroy(name, force=True)
    reader_stats.unlink(name)


def _child(code: str, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-X", "faulthandler", "-c", textwrap.dedent(code), *args], cwd=REPO,
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _finish(p: subprocess.Popen) -> tuple[int, str, str]:
    try:
        out, err = p.communicate(timeout=BOUND)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    return p.returncode, out, err


_BUSY = """
    import sys
    import numpy as np
    import shmcache
    name, role, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    h = shmcache.attach(name) if role == "reader" else shmcache.open(name)
    keys = np.arange(n, dtype="<u8").view(np.uint8).reshape(n, 8)
    keys = np.hstack([keys, np.zeros((n, 24), np.uint8)])
    vals = [b"w"] * n
    assert h.get_many_packed(keys).found.all()
    print("busy", flush=True)
    try:
        while True:  # lookups (or writes) of 20,000 keys back to back: the cut lands inside one
            if role == "reader":
                h.get_many_packed(keys)
            else:
                h.set_many(keys, vals)
    except shmcache.CorruptCacheError as e:
        print("refused", e, flush=True)
    for call in (h.stats, h.status, h.wait_ready):  # wait_ready(None) waited forever on the zero pages
        try:
            call()
        except shmcache.CorruptCacheError:
            print("refused", call.__name__, flush=True)
"""


@pytest.mark.parametrize("role", ["reader", "writer"])
def test_a_cache_cut_short_under_a_busy_process_is_an_error_not_a_sigbus(cache, role):
    p = _child(_BUSY, cache, role, str(N))
    assert p.stdout.readline().strip() == "busy", p.stderr.read()
    os.truncate(f"/dev/shm/{cache}", 4096)  # its owner shrinks it (truncate, `> file`)
    code, out, err = _finish(p)
    assert code == 0, (code, out, err)  # before: -SIGBUS
    lines = out.splitlines()
    assert lines[0].startswith(f"refused cache '{cache}': /dev/shm/{cache} was cut short"), out
    assert lines[1:] == ["refused stats", "refused status", "refused wait_ready"], out
    with pytest.raises(shmcache.CorruptCacheError, match="the size of the file"):
        shmcache.attach(cache)  # and a new attach says what is wrong with it


_COUNTING = """
    import sys
    import shmcache
    name = sys.argv[1]
    r = shmcache.attach(name)
    w = shmcache.open(name)
    key = (7).to_bytes(32, "little")
    r.get(key)
    print(r.stats()["reader_hits"], flush=True)
    sys.stdin.readline()  # the companion is cut short now
    print(r.get(key), w.get(key), flush=True)
    print(r.stats()["reader_hits"], w.stats()["entries"], flush=True)
"""


def test_a_companion_cut_short_costs_only_the_reader_counters(cache):
    """Any reader of the group may write the companion: cutting it short must not kill the
    readers, writers and supervisors that map it, nor touch the cache."""
    p = _child(_COUNTING, cache)
    assert p.stdout.readline().strip() == "1", p.stderr.read()
    os.truncate(reader_stats.path_of(cache), 0)
    p.stdin.write("go\n")
    p.stdin.flush()
    code, out, err = _finish(p)
    assert code == 0, (code, out, err)  # before: -SIGBUS
    assert out.splitlines() == ["b'v7' b'v7'", f"0 {N}"], out
    assert "readers' companion" in err and "cut short" in err, err


_FOREIGN = """
    import mmap, os, sys, tempfile
    import shmcache
    r = shmcache.attach(sys.argv[1])  # our guard is installed, over faulthandler's
    with tempfile.TemporaryFile(dir="/dev/shm", prefix="t-sigbus-foreign-") as f:
        f.truncate(2 * mmap.PAGESIZE)
        m = mmap.mmap(f.fileno(), 2 * mmap.PAGESIZE)
        f.truncate(0)
        print("touching", flush=True)
        m[mmap.PAGESIZE]  # a fault in a mapping that is not ours
    print("survived", flush=True)
"""


def test_a_sigbus_that_is_not_ours_goes_where_it_went_before(cache):
    """The trap's hardest case for the guard: a real fault in the same process, in a mapping
    it does not guard. It must reach faulthandler (its traceback printed) and kill the
    process by SIGBUS, not be swallowed, retried forever, or turned into zero pages."""
    code, out, err = _finish(_child(_FOREIGN, cache))
    assert code == -signal.SIGBUS, (code, out, err)
    assert out.splitlines() == ["touching"], out
    assert "Fatal Python error: Bus error" in err, err


def test_a_sigbus_sent_by_kill_still_kills(cache):
    p = _child("""
        import sys, shmcache
        r = shmcache.attach(sys.argv[1])
        print("attached", flush=True)
        sys.stdin.readline()
    """, cache)
    assert p.stdout.readline().strip() == "attached", p.stderr.read()
    p.send_signal(signal.SIGBUS)
    code, _, err = _finish(p)
    assert code == -signal.SIGBUS, (code, err)


def test_closed_mappings_give_their_guard_back(cache):
    """Every closed handle releases its ranges: after more handles than the guard has
    entries were opened and closed, a new one is still guarded."""
    code, out, err = _finish(_child("""
        import os, sys, shmcache
        from shmcache.ipc import sigbus
        name = sys.argv[1]
        for _ in range(sigbus.MAX_RANGES // 2 + 10):  # two mappings each: the segment and its companion
            shmcache.attach(name).close()
        r = shmcache.attach(name)
        os.truncate("/dev/shm/" + name, 4096)
        try:
            r.get(bytes(32))
        except shmcache.CorruptCacheError:
            print("guarded", flush=True)
    """, cache))
    assert code == 0 and out.strip() == "guarded", (code, out, err)


def test_a_snapshot_of_a_cache_cut_short_is_not_written(cache, tmp_path):
    """What a snapshot copies after the cut is zero pages: written out, it would be an empty
    table that a supervisor's next restore takes for the cache. It must fail, leaving the
    previous snapshot as it was and no temporary file."""
    code, out, err = _finish(_child("""
        import os, sys, shmcache
        name, path = sys.argv[1], sys.argv[2]
        r = shmcache.attach(name)
        shmcache.snapshot(r, path)
        first = open(path, "rb").read()
        os.truncate("/dev/shm/" + name, 4096)
        try:
            shmcache.snapshot(r, path)
        except shmcache.CorruptCacheError as e:
            print("refused", "cut short" in str(e), flush=True)
        print(open(path, "rb").read() == first, sorted(os.listdir(os.path.dirname(path))), flush=True)
    """, cache, str(tmp_path / "t.snap")))
    assert code == 0 and out.splitlines() == ["refused True", "True ['t.snap']"], (code, out, err)
