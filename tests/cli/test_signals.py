"""Commands that make something remove it when stopped by SIGTERM or SIGHUP, as they do
on Ctrl-C (issue 39 item 12): killed by those signals' default action, `shmcache restore`
left a half-filled cache in /dev/shm and `shmcache snapshot` its temporary file. The
dispatcher turns both into the KeyboardInterrupt their cleanup already handles: one
line, exit 128 + the signal. (The demo's hangup: tests/dev/test_demo_hangup.py.)"""

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import shmcache
from shmcache.engine.control import layout as C
from shmcache import snapshots as S

REPO = Path(__file__).resolve().parents[2]
SIGNALS = [signal.SIGTERM, signal.SIGHUP]
# `shmcache ARGS...` started as from a terminal: SIGHUP and SIGTERM at their default
# action, whatever this test runner inherited (a run under nohup ignores SIGHUP, and an
# ignored signal stays ignored across exec: the command then rightly keeps ignoring it)
_AS_FROM_A_TERMINAL = ("import os, signal, sys; signal.signal(signal.SIGHUP, signal.SIG_DFL); "
                       "signal.signal(signal.SIGTERM, signal.SIG_DFL); "
                       "os.execv(sys.executable, [sys.executable, '-m', 'shmcache', *sys.argv[1:]])")


def _shmcache(*args: str) -> list[str]:
    return [sys.executable, "-c", _AS_FROM_A_TERMINAL, *args]



def _filled(name: str):
    """A 40 MiB cache of 20,000 entries (a writer): a snapshot of it at 1 MiB/s takes seconds."""
    w = shmcache.create(name, memory="40MiB")
    w.set_many([i.to_bytes(32, "big") for i in range(20_000)], [b"v" * 100] * 20_000)
    return w


def _until(cond, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while True:
        got = cond()
        if got:
            return got
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)


def _stop(p: subprocess.Popen, sig: int) -> tuple[int, str]:
    p.send_signal(sig)
    try:
        _, err = p.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        p.kill()
        p.communicate()
        raise AssertionError(f"the command did not stop within 60 s of {sig.name}") from None
    return p.returncode, err


def _restoring(name: str) -> bool:
    if not shmcache.exists(name):
        return False
    try:
        with shmcache.attach(name) as r:
            return r.control.word(C.H_RESTORE_STATE) == C.RESTORE_RUNNING
    except shmcache.ShmcacheError:
        return False


@pytest.mark.parametrize("sig", SIGNALS, ids=lambda s: s.name)
def test_a_restore_stopped_midway_removes_its_cache(cache_names, tmp_path, sig):
    """Stopped while it re-inserts 1.5M entries into a table of another size: the cache it
    made (there, named, half filled) is removed."""
    src, dst = cache_names("src"), cache_names("dst")
    n = 1_500_000
    keys = np.random.default_rng(5).integers(0, 256, (n, 32), np.uint8)
    with shmcache.create(src, memory="512MiB") as w:
        w.set_many(keys, (np.arange(n + 1, dtype=np.int64) * 60, np.zeros(n * 60, np.uint8)))
        path = S.write(w, tmp_path / "big.snap").path
    shmcache.destroy(src)
    p = subprocess.Popen(_shmcache("restore", str(path), dst, "--memory", "384MiB"), cwd=REPO,
                         stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        _until(lambda: _restoring(dst) or p.poll() is not None, 120, "the restore to be under way")
        assert p.poll() is None, "the restore finished before it could be stopped midway"
        code, err = _stop(p, sig)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert code == 128 + sig and err.strip().splitlines()[-1] == f"shmcache: stopped by {sig.name}", (code, err)
    assert "Traceback" not in err, err
    assert not shmcache.exists(dst), "the half-restored cache was left in /dev/shm"


@pytest.mark.parametrize("sig", SIGNALS, ids=lambda s: s.name)
def test_a_snapshot_stopped_midway_removes_its_temporary_file(cache_names, tmp_path, sig):
    """A paced snapshot (1 MiB/s) stopped while it writes: its PATH.<hex>.tmp is removed and
    the previous snapshot at PATH is untouched."""
    name = cache_names("snap")
    path = tmp_path / "s.snap"
    with _filled(name) as w:
        S.write(w, path)
        before = path.read_bytes()
        p = subprocess.Popen(_shmcache("snapshot", name, str(path), "--rate", "1MiB"),
                             cwd=REPO, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                             text=True)
        try:
            _until(lambda: list(tmp_path.glob("s.snap.*.tmp")) or p.poll() is not None, 120, "its temporary file")
            assert p.poll() is None, "the snapshot finished before it could be stopped midway"
            code, err = _stop(p, sig)
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert code == 128 + sig and err.strip().splitlines()[-1] == f"shmcache: stopped by {sig.name}", (code, err)
    assert list(tmp_path.glob("*.tmp")) == [], "the temporary file was left"
    assert path.read_bytes() == before


def test_a_signal_ignored_at_start_stays_ignored(cache_names, tmp_path):
    """Under nohup (SIGHUP ignored when the command starts) a hangup does not stop it."""
    name = cache_names("nohup")
    path = tmp_path / "s.snap"
    with _filled(name) as w:
        p = subprocess.Popen(["nohup", sys.executable, "-m", "shmcache", "snapshot", name, str(path), "--rate",
                              "8MiB"], cwd=tmp_path, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE, text=True)
        try:
            _until(lambda: list(tmp_path.glob("s.snap.*.tmp")) or p.poll() is not None, 120, "its temporary file")
            os.kill(p.pid, signal.SIGHUP)
            p.communicate(timeout=120)
        finally:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert p.returncode == 0 and path.exists() and list(tmp_path.glob("*.tmp")) == []


# A snapshot whose stop lands inside a finalizer, made certain: the first chunk's copy frees an
# object whose __del__ is where the handler runs (numba's and llvmlite's objects are freed so),
# and the KeyboardInterrupt raised there is printed as "Exception ignored in" and dropped
_STOP_IN_A_FINALIZER = """
import os, signal, sys
from shmcache.snapshots import writing

class Finalizer:
    def __del__(self):
        os.kill(os.getpid(), signal.SIGHUP)
        for _ in range(10000):  # the handler runs in here
            pass

copy_chunk, calls = writing.copy_chunk, []

def first_chunk_frees_a_finalizer(*args):
    calls.append(1)
    if len(calls) == 1:
        Finalizer()
    return copy_chunk(*args)

writing.copy_chunk = first_chunk_frees_a_finalizer
signal.signal(signal.SIGHUP, signal.SIG_DFL)
from shmcache.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_a_stop_dropped_by_a_finalizer_still_stops_the_snapshot(cache_names, tmp_path):
    """The hardest moment to stop a snapshot at: the handler's KeyboardInterrupt is dropped. The
    snapshot still stops at its next step (exit 128 + SIGHUP, one line), removes its temporary
    file and leaves the previous snapshot as it was: it ran to its end, exit 0, and replaced it."""
    name = cache_names("snapfin")
    path = tmp_path / "s.snap"
    with _filled(name) as w:
        S.write(w, path)
        before = path.read_bytes()
        p = subprocess.run([sys.executable, "-c", _STOP_IN_A_FINALIZER, "snapshot", name, str(path)], cwd=REPO,
                           stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300)
    assert "Exception ignored in" in p.stderr, p.stderr  # the trap was met: the interrupt was dropped
    assert p.returncode == 128 + signal.SIGHUP, (p.returncode, p.stderr[-2000:])
    assert p.stderr.strip().splitlines()[-1] == "shmcache: stopped by SIGHUP", p.stderr[-2000:]
    assert list(tmp_path.glob("*.tmp")) == [], "the temporary file was left"
    assert path.read_bytes() == before
