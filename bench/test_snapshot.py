"""Snapshot benchmark (issue "warm restart"): how long a snapshot of a live cache, a
restore (same geometry: a straight copy; another memory size: every entry re-inserted)
and a replay of the topic with `shmcache run` take to give the same table, and what a
snapshot costs a reader beside it.

    SHMCACHE_BENCH_N=1000000 .venv/bin/python -m pytest bench/test_snapshot.py -q -s -p no:cacheprovider
    SHMCACHE_BENCH_N=10000000 ...     # on demand: ~5 GiB of /dev/shm at the peak, minutes
    .venv/bin/python -m pytest bench/test_snapshot.py -q -s -p no:cacheprovider       # smoke, N = 20,000

(SHMCACHE_SNAPSHOT_N=1000000,10000000 runs several sizes in one go.)

Per N (in one run): the topic (8 partitions, v1 messages of 1024 ADDs, as
bench/test_consume.py makes it) is replayed by `shmcache run --snapshot-dir` from a
fresh segment until ready ("replay": process start to ready); the live cache is
snapshotted by `snapshots.write` ("snapshot"); the supervisor is stopped; the
snapshot is restored into a new cache of the same geometry ("restore copy") and of
1.25x the memory ("restore re-insert"). Each table is checked against the sampled
keys and the entry count. The restored cache then gets a `shmcache run` on the same
topic and a new group: "ready after restore" is process start to ready (it fetches
nothing: the snapshot's offsets are the topic's end).

Reader (test_reader_beside_a_snapshot): a table of N entries of the same data; a
child process looks up keys spread over all of it in batches of 1024 all along
while this process alternates windows without and with a snapshot, for a snapshot
as `shmcache run` takes it (SCHED_IDLE, snapshot_rate) and as `shmcache snapshot`
does by default (unlimited); see _reader_cost. Figures go to stderr (a line
and a JSON object per N); nothing asserts on speed.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import numpy as np
import pytest

import shmcache
from shmtest.bench import consume_topics as CT  # the consume benchmark's data
from shmtest.bench import consume_runs as TC  # the consume benchmark's runs and topic maker
from shmtest.bench.node import stop_tree
from shmcache.kafka import topics
from shmcache.consumer.config import RunConfig
from shmcache.engine import units
from shmcache import snapshots as S

WINDOWS = int(os.environ.get("SHMCACHE_BENCH_WINDOWS", "6"))  # pairs of windows (without, with a snapshot) per way
READER = r"""
import signal, sys, time, numpy as np, shmcache
name, keys_path, out_path = sys.argv[1:4]
keys = np.load(keys_path)
r = shmcache.attach(name)
r.get_many_packed(keys[:1024])
stop = []
signal.signal(signal.SIGUSR1, lambda *_: stop.append(1))
at = np.zeros(1 << 22)  # the time each batch ended (monotonic: the same clock as the parent's)
cpu = np.zeros(1 << 22)  # this thread's CPU time then
n = 0
print("go", flush=True)
while not stop and n < len(at):
    for i in range(0, len(keys), 1024):
        r.get_many_packed(keys[i:i + 1024])
        at[n] = time.monotonic()
        cpu[n] = time.thread_time()
        n += 1
np.save(out_path, np.stack([at[:n], cpu[:n]]))
"""


def _rate_in(at: np.ndarray, t0: float, t1: float) -> float:
    """Batches of 1024 lookups per second the reader finished between t0 and t1."""
    return 1024 * (np.searchsorted(at, t1) - np.searchsorted(at, t0)) / (t1 - t0)


def _cpu_per_batch(at: np.ndarray, cpu: np.ndarray, t0: float, t1: float) -> float:
    """The reader's CPU seconds per batch of 1024 lookups finished between t0 and t1:
    what the snapshot costs it in memory stalls and shared caches, which the scheduling
    of a loaded machine (that moves its rate) does not touch."""
    i, j = np.searchsorted(at, t0), np.searchsorted(at, t1)
    return (cpu[j - 1] - cpu[i]) / max(1, j - 1 - i)


def _reader_cost(name: str, keys_path: Path, out_dir: Path, how: str, rate: int) -> dict:
    """A reader process looks up sampled keys in batches of 1024 all along, while this
    process alternates WINDOWS times: a window with no snapshot, then one snapshot
    written (as long as it takes), the next window as long as that. `how`: "periodic"
    = as `shmcache run` does (a thread at SCHED_IDLE, `rate` bytes/s); "on demand" = as
    `shmcache snapshot` does by default (this thread, unlimited). The reader's rate in
    each window comes from the times its batches ended; the cost is the median over the
    pairs of 1 - rate beside the snapshot / rate without (a pair's windows are next to
    each other, so a load that comes and goes on the machine touches both alike)."""
    out = out_dir / f"reader-{how.replace(' ', '-')}.npy"
    p = subprocess.Popen([sys.executable, "-c", READER, name, str(keys_path), str(out)], stdin=subprocess.DEVNULL,
                         stdout=subprocess.PIPE, text=True)
    windows = []

    def snapshots():
        if how == "periodic":
            S.lower_priority()
        with shmcache.attach(name) as r:
            span = 0.5
            for i in range(WINDOWS):
                t0 = time.monotonic()
                time.sleep(span)  # a bench: the reader alone for as long as the last snapshot took
                t1 = time.monotonic()
                S.write(r, out_dir / f"beside-{i}.snap", rate=rate)
                t2 = time.monotonic()
                os.unlink(out_dir / f"beside-{i}.snap")
                windows.append((t0, t1, t2))
                span = t2 - t1

    try:
        assert p.stdout.readline().strip() == "go"
        t = threading.Thread(target=snapshots)
        t.start()
        t.join()
        p.send_signal(signal.SIGUSR1)
        assert p.wait(60) == 0
        at = np.load(out)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait(10)
    at, cpu = at
    idle = [_rate_in(at, a, b) for a, b, _ in windows]
    beside = [_rate_in(at, b, c) for _, b, c in windows]
    costs = [1 - y / x for x, y in zip(idle, beside)]
    cpu_costs = [_cpu_per_batch(at, cpu, b, c) / _cpu_per_batch(at, cpu, a, b) - 1 for a, b, c in windows]
    return {"idle_per_s": float(np.median(idle)), "beside_per_s": float(np.median(beside)),
            "cost": float(np.median(costs)), "costs": [round(float(c), 3) for c in costs],
            "cpu_cost": float(np.median(cpu_costs)), "cpu_costs": [round(float(c), 3) for c in cpu_costs],
            "cost_of_means": float(1 - np.mean(beside) / np.mean(idle)), "load": os.getloadavg()[0],
            "snapshot_s": float(np.median([c - b for _, b, c in windows]))}


PERIODIC_RATE = units.parse_bytes(RunConfig.snapshot_rate)  # what `shmcache run` snapshots at by default


def sizes() -> list[int]:
    v = os.environ.get("SHMCACHE_SNAPSHOT_N") or os.environ.get("SHMCACHE_BENCH_N")
    return [int(x) for x in v.split(",")] if v else [20_000]


def _run(name: str, topic, bootstrap: str, memory: str, log: Path, snaps: Path) -> tuple[subprocess.Popen, float]:
    """`shmcache run` until ready; returns the process (still running) and its time to ready."""
    argv = [sys.executable, "-m", "shmcache", "run", "--name", name, "--bootstrap", bootstrap, "--topic",
            topic.name, "--group", f"bench-snap-{uuid.uuid4().hex[:12]}", "--workers", "2", "--memory", memory,
            "--snapshot-dir", str(snaps), "--snapshot-interval", "86400"]
    t0 = time.perf_counter()
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=open(log, "ab"), stderr=subprocess.STDOUT)
    r = None
    try:
        while True:
            assert proc.poll() is None, f"shmcache run exited with {proc.returncode}: {log.read_text()[-2000:]}"
            assert time.perf_counter() - t0 < 1800, "not ready after 30 min"
            if r is None and shmcache.exists(name):
                try:
                    r = shmcache.attach(name)
                except (OSError, shmcache.ShmcacheError):
                    r = None
            if r is not None and r.status()["ready"]:
                return proc, time.perf_counter() - t0
            time.sleep(0.02)
    except BaseException:
        _stop(proc)
        raise
    finally:
        if r is not None:
            r.close()


def _stop(proc: subprocess.Popen) -> int | None:
    """SIGTERM, wait; SIGKILL the tree if it stays (every process it started is gone after)."""
    return stop_tree(proc, wait=120)


def _check(name: str, topic) -> None:
    with shmcache.attach(name) as r:
        assert r.stats()["entries"] == topic.n
        got = r.get_many_packed(topic.sample_keys)
        assert got.found.all() and np.array_equal(got.data, topic.sample_data)


@pytest.mark.parametrize("n", sizes())
def test_snapshot_restore_replay(n, kafka_broker, kafka_admin, tmp_path):
    name = f"bench-{os.getpid()}-snap"
    tname = f"bench-snap-{uuid.uuid4().hex[:12]}"
    topics.create_topic(kafka_broker.bootstrap, tname, TC.PARTITIONS)  # and waits for its leaders
    snaps = tmp_path / "snaps"
    snaps.mkdir()
    memory = f"{max(256, math.ceil(n * 200 * 1.5 / 2**20))}MiB"
    names = [name, name + "-copy", name + "-re"]
    procs = []
    f = {"n": n, "memory": memory}
    try:
        topic = TC.produce_topic(kafka_broker.bootstrap, tname, "v1", n, TC.PARTITIONS, TC.run_timeout())
        proc, f["replay_s"] = _run(name, topic, kafka_broker.bootstrap, memory, tmp_path / "run.log", snaps)
        procs.append(proc)
        _check(name, topic)
        path = tmp_path / "live.snap"
        with shmcache.attach(name) as r:
            t0 = time.perf_counter()
            info = S.write(r, path)
            f["snapshot_s"] = time.perf_counter() - t0
        f["snapshot_bytes"] = info.bytes
        assert _stop(proc) == 0
        shmcache.destroy(name)
        # one restored cache at a time in /dev/shm (10M entries: 3.5 GiB re-inserted, 2.8 GiB copied)
        for target, mem, key in ((name + "-re", f"{math.ceil(int(memory[:-3]) * 1.25)}MiB", "restore_reinsert_s"),
                                 (name + "-copy", None, "restore_copy_s")):
            t0 = time.perf_counter()
            out = S.restore(path, target, memory=mem)
            f[key] = time.perf_counter() - t0
            assert out["mode"] == ("copy" if mem is None else "re-insert")
            _check(target, topic)
            if mem is not None:
                shmcache.destroy(target)
        proc, f["ready_after_restore_s"] = _run(name + "-copy", topic, kafka_broker.bootstrap, memory,
                                               tmp_path / "run2.log", snaps)
        procs.append(proc)
        assert _stop(proc) == 0
    finally:
        for p in procs:
            if p.poll() is None:
                _stop(p)
        for x in names:
            if shmcache.exists(x):
                shmcache.destroy(x)
        for fut in kafka_admin.delete_topics([tname], operation_timeout=10).values():
            try:
                fut.result(timeout=15)
            except Exception:
                pass
    gb = f["snapshot_bytes"] / 1e9
    f.update(snapshot_gb_per_s=gb / f["snapshot_s"], restore_copy_gb_per_s=gb / f["restore_copy_s"],
             replay_over_restore_copy=f["replay_s"] / f["restore_copy_s"],
             replay_over_restore_reinsert=f["replay_s"] / f["restore_reinsert_s"])
    print(f"\nsnapshot bench N={n:,} ({memory}, snapshot {gb:.2f} GB): replay {f['replay_s']:.2f} s; snapshot "
          f"{f['snapshot_s']:.2f} s ({f['snapshot_gb_per_s']:.2f} GB/s); restore copy {f['restore_copy_s']:.2f} s "
          f"({f['restore_copy_gb_per_s']:.2f} GB/s, {f['replay_over_restore_copy']:.1f}x faster than replay); "
          f"restore re-insert {f['restore_reinsert_s']:.2f} s ({f['replay_over_restore_reinsert']:.1f}x); "
          f"run ready after restore {f['ready_after_restore_s']:.2f} s", file=sys.stderr)
    print(json.dumps(f), file=sys.stderr)


READER_KEYS = 1_000_000  # keys the reader cycles through, spread over the whole table


@pytest.mark.parametrize("n", sizes())
def test_reader_beside_a_snapshot(n, tmp_path):
    """What a snapshot costs a reader of the table beside it (the issue's aim: < 10 % of
    its idle rate for the supervisor's periodic snapshot). The table: N entries of the
    consume benchmark's data (32-byte keys, 61-141-byte values), written with set_many
    (the reader's cost does not depend on how the table was filled, and a topic would
    take minutes at 10M). The reader looks up min(N, 1M) keys spread over the whole
    table in a random order, as a real reader's lookups land, so that it pays the
    memory a lookup costs and not a hot sample that lives in the caches."""
    name = f"bench-{os.getpid()}-snapr"
    memory = f"{max(256, math.ceil(n * 200 * 1.5 / 2**20))}MiB"
    rng = np.random.default_rng(7)
    picks = []
    try:
        with shmcache.create(name, memory=memory) as w:
            for _, keys, offsets, data in CT.chunks(n):
                w.set_many(keys, (offsets, data))
                picks.append(keys[rng.random(len(keys)) < READER_KEYS / n])
            assert w.stats()["entries"] == n
        keys = np.concatenate(picks)
        rng.shuffle(keys)
        keys_path = tmp_path / "keys.npy"
        np.save(keys_path, keys)
        f = {"n": n, "memory": memory, "reader_keys": len(keys),
             "reader_periodic": _reader_cost(name, keys_path, tmp_path, "periodic", PERIODIC_RATE),
             "reader_on_demand": _reader_cost(name, keys_path, tmp_path, "on demand", 0)}
    finally:
        if shmcache.exists(name):
            shmcache.destroy(name)
    rp, ro = f["reader_periodic"], f["reader_on_demand"]
    print(f"\nreader beside a snapshot, N={n:,} ({memory}, {len(keys):,} keys looked up over the table): "
          f"periodic (SCHED_IDLE, {units.format_bytes(PERIODIC_RATE)}/s, {rp['snapshot_s']:.2f} s): "
          f"{rp['idle_per_s']:,.0f}/s -> {rp['beside_per_s']:,.0f}/s ({rp['cost']:.1%} less; CPU per lookup "
          f"{rp['cpu_cost']:+.1%}); on demand (unlimited, {ro['snapshot_s']:.2f} s): {ro['idle_per_s']:,.0f}/s -> "
          f"{ro['beside_per_s']:,.0f}/s ({ro['cost']:.1%} less; CPU per lookup {ro['cpu_cost']:+.1%}); "
          f"load {rp['load']:.1f}", file=sys.stderr)
    print(json.dumps(f), file=sys.stderr)
