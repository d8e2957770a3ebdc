"""The conformance scenarios across namespaces (issue 52): the daemon in a pod of its own,
readers in others.

On Kubernetes the daemon is a DaemonSet pod and each service a pod of its own: they share
the node's /dev/shm (a hostPath), each in its own PID namespace, often as its own user.
Here, one machine: `shmcache run` is pid 1 of a PID and mount namespace of its own
(shmtest/pods.py), on the real broker; every reader (Python, Go, Java on JDK 17 and 25) runs its
commands (docs/reader-contract.md) as pid 1 of another, as user nobody in the cache's
reader group. Before owner locks (docs/segment-format.md, section 13), no reader outside
the daemon's namespace ever saw it ready: each looked its pid up in its own /proc.

Held here, on one live topology:
- every reader says ready, `wait-ready` returns 0, and `get` serves what the topic holds;
- a companion row held by a live reader of another pod (pid 1 there, and pid 1 in the
  claimant's pod too) is never taken, though it is the first row a claim looks at and
  every other row holds a dead reader's word; and a dead one is taken;
- a second supervisor started in another pod is refused, naming pid 1 of another PID
  namespace;
- the daemon's pod killed: every reader says `no-supervisor` at once, and `wait-ready`
  exits 1;
- the cache then destroyed and made again by the next daemon pod: a `wait-ready` of every
  reader, started before, returns 0 for the new cache, and a watch (Python, Go) follows the
  name: not-found, then the key's value again, with nothing but a miss between.
Needs root (namespaces, another uid)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psutil
import pytest

from shmtest import readers as R
import shmcache
from shmtest.pods import NOBODY, NOGROUP, available, pod
from shmtest.supervisors import harness  # noqa: F401  (fixture)
from shmtest.topic_model import produce_entries
from shmtest.waits import poll_until, wait_gone
from shmcache.engine import layout as L
from shmcache.engine import reader_stats

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(available() is not None, reason=str(available()))

KEYS = 6  # keys each reader gets


@pytest.fixture(scope="module")
def readers() -> list[R.Reader]:
    found = []
    for make in (R.python_reader, R.go_reader, R.java_reader, R.java25_reader):
        r = make()
        if isinstance(r, R.Reader):
            found.append(r)
    assert [r.name for r in found][:2] == ["python", "go"], "the Python and Go readers are built here"
    return found


def _as_nobody(argv: list[str]) -> list[str]:
    """argv as pid 1 of a pod of its own, as nobody. The pods here share this machine's /tmp,
    where JVMs of one user and one pid (1, in every pod) would keep their perf data in one
    file (/tmp/hsperfdata_nobody/1), and the second to start warn about it on stdout; a pod
    of a cluster has a /tmp of its own. So the JVMs here keep none."""
    if Path(argv[0]).name == "java":
        argv = [argv[0], "-XX:-UsePerfData", *argv[1:]]
    return pod(argv, uid=NOBODY, gid=NOGROUP)


def _in_pod(reader: R.Reader, *args: str, timeout: float = 240) -> subprocess.CompletedProcess:
    """One command of the contract, run by `reader` as pid 1 of a pod of its own, as nobody."""
    argv = _as_nobody([*reader.argv, *args])
    p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, cwd=REPO, env={**os.environ, "CI": "true"})
    assert not (reader.jvm and R.JVM_WARNING.search(p.stderr)), p.stderr[-1000:]
    return p


def _status(reader: R.Reader, name: str) -> dict:
    p = _in_pod(reader, "status", "--json", name)
    try:
        return json.loads(p.stdout)
    except ValueError:
        raise AssertionError(f"{reader}: status --json: exit {p.returncode}: {p.stdout[:300]!r} ... {p.stdout[-300:]!r} {p.stderr[-500:]!r}")


def test_a_daemon_in_its_own_pod_serves_readers_in_others(harness, kafka_topic, readers):  # noqa: F811
    topic = kafka_topic(2)
    sent = produce_entries(harness.bootstrap, topic, {0: 40, 1: 40}, np.random.default_rng(52))
    name = harness.cache_name("pods")
    sup = harness.supervisor(name, topic, harness.group("pods"), memory="40MiB",
                             args=("--mode", "640", "--reader-group", str(NOGROUP)), wrap=pod)
    host = harness.attach(name, sup=sup)  # this test's own reader: the machine's PID namespace, another still
    assert host.wait_ready(timeout=120)["ready"]
    inner = sup.inner()
    assert host.status()["supervisor_pid"] == 1, "the supervisor is pid 1 of its pod"
    keys = list(sent)[:KEYS]
    hexkeys = [k.hex() for k in keys]

    # -- ready, wait-ready and get, from every reader in a pod of its own --------------------------
    for r in readers:
        st = _status(r, name)
        assert (st["ready"], st["supervisor_alive"], st["reason"], st["supervisor_pid"]) == (True, True, "ready", 1), \
            f"{r}: {st}"
        p = _in_pod(r, "wait-ready", "--timeout", "60", name)
        assert p.returncode == 0 and json.loads(p.stdout)["ready"], f"{r}: wait-ready: {p.returncode} {p.stderr}"
        p = _in_pod(r, "get", name, *hexkeys)
        assert p.returncode == 0 and p.stdout.split() == [sent[k].hex() for k in keys], f"{r}: get: {p}"

    # -- the companion: a live reader's row in another pod is never taken; a dead one's is ---------
    comp = reader_stats.path_of(name)
    go = next(r for r in readers if r.name == "go")
    with open(comp, "r+b") as f:  # no reader runs now: every row free, so the watch takes row 0, the first looked at
        for i in range(reader_stats.MAX_READERS):
            f.seek(L.PAGE + i * L.ROW_WORDS * L.WORD)
            f.write(bytes(8))
    before = _rows(comp)[:, reader_stats.R_OWNER].copy()
    watch = subprocess.Popen(_as_nobody([*go.argv, "watch", name, hexkeys[0], "600"]),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
    try:
        # the watch's row: a free one it claimed at its first lookup (earlier readers' rows are free
        # again, or hold their dead words)
        live_row, = poll_until(lambda: next(((i,) for i, w in enumerate(_rows(comp)[:, reader_stats.R_OWNER])
                                             if w and not before[i]), None), 60, "the watch's companion row")
        assert live_row == 0
        held = {live_row: int(_rows(comp)[live_row, reader_stats.R_OWNER])}
        dead = _dead_word()
        with open(comp, "r+b") as f:  # every other row: a dead reader's, counters kept
            for i in range(reader_stats.MAX_READERS):
                if i != live_row:
                    f.seek(L.PAGE + i * L.ROW_WORDS * L.WORD)
                    f.write(int(dead).to_bytes(8, "little", signed=True))
        p = _in_pod(readers[0], "get", name, hexkeys[1])  # Python: its claim must pick a dead row
        assert p.returncode == 0, p.stderr
        after = _rows(comp)[:, reader_stats.R_OWNER]
        assert after[live_row] == held[live_row], "a live reader's row in another pod was taken"
        # the Python reader took one dead row (and cleared it at its exit): no longer the dead word
        assert sum(1 for i, w in enumerate(after) if i != live_row and w != dead) == 1, "no dead row was reclaimed"
    finally:
        watch.kill()
        watch.wait(30)

    # -- a second supervisor, in a pod of its own: refused ---------------------------------------------------
    second = subprocess.run(pod([sys.executable, "-m", "shmcache", "run", "--name", name, "--bootstrap",
                                 harness.bootstrap, "--topic", topic, "--memory", "40MiB"]),
                            capture_output=True, text=True, timeout=120, cwd=REPO)
    assert second.returncode != 0 and "already has a live supervisor, pid 1 of another PID namespace" in second.stderr, \
        second.stderr[-2000:]

    # -- the daemon's pod killed: no reader calls it ready -------------------------------------------------
    procs = [inner, *inner.children(recursive=True)]
    inner.kill()  # pid 1 of its namespace: the kernel kills every other process there
    wait_gone(procs, "the daemon's pod")
    for r in readers:
        st = _status(r, name)
        assert (st["ready"], st["supervisor_alive"], st["reason"]) == (False, False, "no-supervisor"), f"{r}: {st}"
        p = _in_pod(r, "wait-ready", "--timeout", "0.5", name)
        assert p.returncode == 1 and "no live supervisor" in p.stderr, f"{r}: wait-ready: {p.returncode} {p.stderr}"

    # -- the cache destroyed, and made again by the next daemon pod: each reader's wait-ready, started
    #    before, returns 0 for the new cache; a watch in a pod of its own follows the name ---------------
    hit = f"hit {sent[keys[2]].hex()}"
    watches = [R.Running(r, "watch", name, hexkeys[2], "600", wrap=_as_nobody) for r in readers[:2]]
    waits = []
    try:
        for w in watches:
            _line(w, hit)
        waits = [R.Running(r, "wait-ready", "--timeout", "240", name, wrap=_as_nobody) for r in readers]
        poll_until(lambda: all(_maps_cache(w.proc.pid, name) for w in [*watches, *waits]), 120,
                   "every reader in its pod to map the cache")
        host.close()
        shmcache.destroy(name)
        for w in watches:
            _line(w, "error not-found: ")
        harness.supervisor(name, topic, harness.group("pods-again"), memory="40MiB",
                           args=("--mode", "640", "--reader-group", str(NOGROUP)), wrap=pod)
        for w in watches:  # the new cache is empty until its daemon applied the key: a miss, never another value
            _line(w, hit, passing=" miss")
        for w in waits:
            assert w.proc.wait(300) == 0, f"{w.reader}: wait-ready after the re-create: {w.stderr()[-1000:]}"
            got = w.next_line(30)
            assert got is not None and json.loads(got[1])["ready"] is True, f"{w.reader}: {got!r}"
    finally:
        for w in [*watches, *waits]:
            w.stop()


def _line(w: R.Running, want: str, timeout: float = 240, passing: str | None = None) -> None:
    """w's next line holds `want` (a watch prints each change of outcome once), after any
    number of lines that end with `passing`."""
    while True:
        got = w.next_line(timeout)
        if not (got is not None and passing is not None and got[1].endswith(passing)):
            break
    assert got is not None and want in got[1], f"{w.reader}: {got!r}, wanted {want!r}; stderr {w.stderr()[-1000:]!r}"


def _maps_cache(pid: int, name: str) -> bool:
    """The process pid, or a descendant (the pod's pid 1 under unshare), maps /dev/shm/name."""
    try:
        procs = [psutil.Process(pid), *psutil.Process(pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return False
    for p in procs:
        try:
            if any(m.path.removesuffix(" (deleted)") == f"/dev/shm/{name}" for m in p.memory_maps(grouped=False)):
                return True
        except psutil.Error:
            pass
    return False


def _rows(path: str) -> np.ndarray:
    data = Path(path).read_bytes()
    return np.frombuffer(data, np.int64, reader_stats.MAX_READERS * L.ROW_WORDS, L.PAGE).reshape(-1, L.ROW_WORDS)


def _dead_word() -> int:
    """The owner word of a process that has exited (and been reaped)."""
    from shmcache.ipc import liveness

    p = subprocess.Popen(["sleep", "600"])
    word = liveness.owner_word(p.pid)
    p.kill()
    p.wait()
    return word
