"""A warm-up the supervisor stops (it was asked to stop while the kernels compiled)
leaves nothing behind: not the child process, not its private cache; and one killed
outright (SIGKILL, as a supervisor's whole tree is) is cleaned up by the next start.
And the warm-up compiles the lock takeover's kernel too. A finished warm-up marks the
install warm, for exactly its sources: a supervisor then starts its workers without
waiting for another."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time

import pytest

import shmcache
from shmcache.consumer import warm

# A child that holds a warm-up's private cache and never finishes: the hardest moment to
# stop a warm-up at (the real one holds its cache only while it runs the kernels).
HOLDER = f"""
import os, sys, time, shmcache
shmcache.create(f"{warm.PREFIX}{{os.getpid()}}-t", memory="8MiB", max_value=256)
print("made", flush=True)
time.sleep(600)
"""


def test_a_stopped_warm_up_leaves_no_process_and_no_cache():
    proc = subprocess.Popen([sys.executable, "-c", HOLDER], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            text=True)
    name = f"{warm.PREFIX}{proc.pid}-t"
    try:
        assert proc.stdout.readline().strip() == "made"  # the cache exists now
        assert name in list(shmcache.list_caches())
        beats = []
        assert warm.finish(proc, lambda: beats.append(1), lambda: True) == ""
        assert proc.poll() is not None
        assert not [c for c in shmcache.list_caches() if c.startswith(f"{warm.PREFIX}{proc.pid}-")]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if shmcache.exists(name):
            shmcache.destroy(name, force=True)


def test_a_killed_warm_up_is_cleaned_up_by_the_next_start_a_live_one_kept():
    procs = [subprocess.Popen([sys.executable, "-c", HOLDER], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                              text=True) for _ in range(2)]
    dead, live = procs
    names = [f"{warm.PREFIX}{p.pid}-t" for p in procs]
    nxt = None
    try:
        for p in procs:
            assert p.stdout.readline().strip() == "made"
        dead.kill()  # SIGKILL: no finally of its own ran
        dead.wait()
        assert names[0] in list(shmcache.list_caches())
        # and one killed while its file was being made: sized, no magic yet
        names.append(f"{warm.PREFIX}{dead.pid}-half")
        with open(f"/dev/shm/{names[-1]}", "wb") as f:
            f.truncate(8 << 20)
        nxt = warm.start()
        assert not [n for n in (names[0], names[2]) if os.path.exists(f"/dev/shm/{n}")]
        assert names[1] in list(shmcache.list_caches())  # its process lives: not an orphan
        assert "compiled" in warm.finish(nxt, lambda: None, lambda: False)
    finally:
        for p in procs + [nxt]:
            if p is not None and p.poll() is None:
                p.kill()
                p.wait()
            if p is not None and p.stdout is not None:
                p.stdout.close()
        for name in names:
            if os.path.exists(f"/dev/shm/{name}"):
                shmcache.destroy(name, force=True)


def test_a_terminated_warm_up_removes_its_cache(tmp_path):
    """`shmcache warm` stopped by SIGTERM while it compiles (an empty numba cache: the
    hardest moment, with its private cache whole and minutes of work ahead) exits 143
    and leaves no cache."""
    env = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path / "numba")}
    proc = subprocess.Popen([sys.executable, "-m", "shmcache", "warm"], stdin=subprocess.DEVNULL,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env)
    mine = f"{warm.PREFIX}{proc.pid}-"
    try:
        deadline = time.monotonic() + 300
        while not [c for c in shmcache.list_caches() if c.startswith(mine)]:
            assert proc.poll() is None, proc.stderr.read()[-3000:]
            assert time.monotonic() < deadline, "the warm-up's cache never appeared"
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(300) == 128 + signal.SIGTERM, proc.stderr.read()[-3000:]
        assert not [n for n in os.listdir("/dev/shm") if n.startswith(mine)]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stderr.close()
        for n in os.listdir("/dev/shm"):
            if n.startswith(mine):
                shmcache.destroy(n, force=True)


# Where a SIGTERM's handler may run while the warm-up compiles, each made certain here.
_LANDS = {
    # inside a __del__ (numba's compiler frees objects in finalizers all along): an exception
    # raised there is printed as "Exception ignored in" and dropped
    "in a finalizer": """
        from shmcache.formats import partitioners

        class Finalizer:
            def __del__(self):
                os.kill(os.getpid(), signal.SIGTERM)
                for _ in range(10000):  # the handler runs in here
                    pass

        murmur2 = partitioners.murmur2_partitions

        def step(*args):  # one of the warm-up's steps, during which the stop comes
            Finalizer()
            return murmur2(*args)

        partitioners.murmur2_partitions = step
    """,
    # inside llvmlite's ctypes callback that hands numba a kernel's machine code (where CI
    # caught it, one cold warm-up in 16 stopped at random here): an exception raised there is
    # dropped by ctypes, the kernel is left without its code, and the warm-up died of a
    # RuntimeError, exit 1. In the main thread, where the handler runs at once
    "in llvmlite's compile callback": """
        import threading
        from llvmlite.binding import executionengine

        set_object_cache = executionengine.ExecutionEngine.set_object_cache

        def hooked(self, notify=None, getbuffer=None):
            def compiled(module, buf):
                if threading.current_thread() is threading.main_thread() and \\
                        signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:  # once the warm-up handles it
                    signal.raise_signal(signal.SIGTERM)
                return notify(module, buf)
            return set_object_cache(self, compiled if notify else None, getbuffer)

        executionengine.ExecutionEngine.set_object_cache = hooked
    """,
}


@pytest.mark.parametrize("where", list(_LANDS))
def test_a_stop_wherever_it_lands_stops_the_warm_up(tmp_path, where):
    """A SIGTERM whose handler runs inside the compiler's own code, not between the warm-up's
    steps, still stops it: exit 143, no private cache left, the install left unmarked."""
    env = dict(os.environ)
    if where == "in llvmlite's compile callback":  # an empty numba cache: the kernels compile
        env["NUMBA_CACHE_DIR"] = str(tmp_path / "numba")
        marker = None
    else:  # the install's cache: the steps run quickly up to the finalizer's
        marker = os.path.join(warm._marker_dir() or str(tmp_path), warm.MARKER + warm.package_stamp())
        had_marker = os.path.exists(marker)
    code = "import os, signal, sys\n" + textwrap.dedent(_LANDS[where]) + "\nfrom shmcache.consumer import warm\nsys.exit(warm.main())\n"
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env)
    try:
        _, err = proc.communicate(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 128 + signal.SIGTERM, err[-3000:]
    assert not [n for n in os.listdir("/dev/shm") if n.startswith(f"{warm.PREFIX}{proc.pid}-")]
    if marker is None:
        assert not [f for _, _, fs in os.walk(tmp_path) for f in fs if f.startswith(warm.MARKER)], \
            "a stopped warm-up marked the install warm"
    else:
        assert os.path.exists(marker) == had_marker, "a stopped warm-up marked the install warm"


def _in_child(code: str, env: dict | None = None) -> str:
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=600,
                       env=env)
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout.strip().splitlines()[-1]


def test_a_finished_warm_up_marks_the_install_warm_and_only_for_its_sources(tmp_path):
    """`shmcache warm` leaves a marker that is_warm() finds in a new process; without it
    (removed, or another version's) the install is not warm; a copy of the package with
    one source file edited has another stamp, and with an empty kernel cache is not warm
    (so its supervisor would warm up before starting workers)."""
    assert warm.main() == 0  # loads (compiles only what changed since scripts/setup)
    assert _in_child("from shmcache.consumer import warm; print(warm.is_warm())") == "True"
    marker = os.path.join(warm._marker_dir(), warm.MARKER + warm.package_stamp())
    os.rename(marker, marker + ".away")
    try:
        assert _in_child("from shmcache.consumer import warm; print(warm.is_warm())") == "False"
    finally:
        os.rename(marker + ".away", marker)
    assert warm.is_warm()

    from shmcache.ipc import jitcache

    root = os.path.dirname(os.path.abspath(shmcache.__file__))
    pkg = tmp_path / "src" / "shmcache"
    for path in jitcache._sources(root):
        dest = pkg / os.path.relpath(path, root)
        dest.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, dest)
    env = {k: v for k, v in os.environ.items() if not k.startswith("NUMBA_")}
    env.update(PYTHONPATH=str(tmp_path / "src"), NUMBA_CACHE_DIR=str(tmp_path / "numba-cache"))
    probe = "from shmcache.consumer import warm; print(warm.package_stamp(), warm.is_warm())"
    stamp, warm_there = _in_child(probe, env).split()
    assert stamp == warm.package_stamp() and warm_there == "False"  # same sources; its own, empty cache
    (pkg / "cli/top_view.py").write_text((pkg / "cli/top_view.py").read_text() + "\n# an edit\n")
    assert _in_child(probe, env).split()[0] != stamp


def test_the_warm_up_compiles_the_takeover_kernel():
    """The warm-up runs the lock takeover (engine/writer.py repair_dead_locks ->
    _repair.repair_bucket) too: without it, a machine's first takeover of a dead writer's
    bucket compiled the repair kernel there and then (seconds, with the bucket locked).
    A fresh process, as the supervisor's warm-up child is: after warm(), repair_bucket has
    its signature, loaded from numba's on-disk cache or compiled into it."""
    code = """
import json, os
from shmcache.consumer import warm
from shmcache.engine import _repair
warm.warm()
d = _repair.repair_bucket
print(json.dumps({"pid": os.getpid(), "signatures": len(d.signatures),
                  "cached": sum(d.stats.cache_hits.values()) + sum(d.stats.cache_misses.values())}))
"""
    p = subprocess.run([sys.executable, "-c", code], stdin=subprocess.DEVNULL, capture_output=True, text=True,
                       timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]
    got = json.loads(p.stdout.strip().splitlines()[-1])
    assert got["signatures"] == 1 and got["cached"] == 1, got
    assert not [c for c in shmcache.list_caches() if c.startswith(f"{warm.PREFIX}{got['pid']}-")]
