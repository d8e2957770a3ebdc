"""A supervisor's restore at start keeps the snapshot's size unless one is given, and a
restore that evicts says so (issue 39 item 3). It restored at --memory, whose default
(1 GiB) is not the snapshot's: a 64 MiB cache of 297,117 entries restored at 40 MiB
re-inserted 228,038 and evicted 69,079 without a warning, and the partitions resumed
after the offsets those entries came from, so they were never fetched again. Real
`shmcache run` processes with no broker (the restore comes before the broker's wait)."""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path

import numpy as np

import shmcache
from shmcache.consumer.supervisor import snapshot_dir as snapdir
from shmcache import snapshots as S

from shmtest.waits import poll_until, stop_popen

REPO = Path(__file__).resolve().parents[3]
ENTRIES = 250_000  # 64-byte values: what a 64 MiB cache holds without evicting, a 40 MiB one not



def _restored(name: str):
    if not shmcache.exists(name):
        return None
    try:
        with shmcache.attach(name) as r:
            st = r.status()
            return (st, r.stats()) if st["restore"]["state"] == "restored" else None
    except shmcache.ShmcacheError:
        return None


def _said(log: Path, line: str) -> bool:
    """The supervisor logs its restore after the segment says "restored": a reader may see it first."""
    return line in log.read_text()


def _run(name: str, snaps: Path, log: Path, *memory: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "shmcache", "run", "--name", name, "--bootstrap", "127.0.0.1:1",
                             "--topic", "t", "--snapshot-dir", str(snaps), *memory], cwd=REPO,
                            stdin=subprocess.DEVNULL, stdout=open(log, "wb"), stderr=subprocess.STDOUT)



def test_the_start_restores_at_the_snapshots_size_unless_told_and_says_what_a_smaller_one_evicted(tmp_path):
    name = f"t-rsize-{uuid.uuid4().hex[:8]}"
    snaps = tmp_path / "snaps"
    snaps.mkdir(mode=0o700)
    keys = np.random.default_rng(9).integers(0, 256, (ENTRIES, 32), np.uint8)
    procs = []
    try:
        with shmcache.create(name, memory="64MiB") as w:
            w.control.set_topic("t", 1)
            w.set_many(keys, (np.arange(ENTRIES + 1, dtype=np.int64) * 64, np.ones(ENTRIES * 64, np.uint8)))
            assert w.stats()["entries"] == ENTRIES and w.stats()["evictions"] == 0, w.stats()
            size = w.geometry.size
            S.write(w, snapdir.path_for(snaps, name, 1))
        shmcache.destroy(name)
        # no --memory: the snapshot's own geometry, a straight copy, nothing evicted
        p = _run(name, snaps, tmp_path / "own.log")
        procs.append(p)
        st, stats = poll_until(lambda: p.poll() is None and _said(tmp_path / "own.log", " entries from ")
                               and _restored(name), 120,
                               lambda: f"the restore: {(tmp_path / 'own.log').read_text()[-2000:]}")
        assert stats["memory"] == size and stats["entries"] == ENTRIES, stats
        assert st["restore"]["entries"] == ENTRIES and st["restore"]["evictions"] == 0
        assert "(copy," in (tmp_path / "own.log").read_text()
        stop_popen(p)
        if shmcache.exists(name):  # a run that never joined the group removes what it made
            shmcache.destroy(name)

        # --memory 40MiB given: re-inserted into the smaller table; what it evicted is said
        p = _run(name, snaps, tmp_path / "small.log", "--memory", "40MiB")
        procs.append(p)
        st, stats = poll_until(lambda: p.poll() is None and _said(tmp_path / "small.log", "the restore evicted")
                               and _restored(name), 120,
                               lambda: f"the restore: {(tmp_path / 'small.log').read_text()[-2000:]}")
        evicted = st["restore"]["evictions"]
        assert stats["memory"] < size and evicted > 0 and stats["entries"] + evicted == ENTRIES, (st["restore"], stats)
        log = (tmp_path / "small.log").read_text()
        assert f"WARNING shmcache.snapshots[{p.pid}]: cache {name!r}: the restore evicted {evicted} of the " \
               f"snapshot's {ENTRIES} entries" in log, log[-3000:]
        out = subprocess.run([sys.executable, "-m", "shmcache", "status", name], cwd=REPO, capture_output=True,
                             text=True, timeout=60)
        assert f"{evicted:,} evicted" in out.stdout.replace("\n", " "), out.stdout
    finally:
        for p in procs:
            stop_popen(p)
        if shmcache.exists(name):
            shmcache.destroy(name, force=True)
