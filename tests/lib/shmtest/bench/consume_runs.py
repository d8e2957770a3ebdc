"""The consume benchmark's runs (bench/test_consume.py, and the benchmarks that time a start
or a restore over its topics: bench/test_startup.py, bench/test_snapshot.py,
bench/test_teranode.py): `shmcache run` over a pre-filled topic until caught up, a
consumer that does nothing, and one that writes into Redis; each gives its entries/s, its
startup and the cores it kept busy."""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import numpy as np
import psutil
import pytest

import shmcache
from shmcache.formats import registry, wire
from shmtest.bench import consume_profile as CP
from shmtest.bench import peers as P
from shmtest.bench.consume_topics import Topic, produce_topic  # noqa: F401 - produce_topic: the runs' topics

PARTITIONS = 8
POLL_S = 0.02  # status poll interval
CONSUME_BATCH = 500  # peers' consume(num_messages=...)
REDIS_PIPELINE = 8  # messages per Redis pipeline
CI = os.environ.get("CI", "").lower() in ("true", "1")


def consume_n() -> int:
    """SHMCACHE_CONSUME_N, else SHMCACHE_BENCH_N, else 5,000,000 (100,000 under CI=true)."""
    for var in ("SHMCACHE_CONSUME_N", "SHMCACHE_BENCH_N"):
        v = os.environ.get(var)
        if v:
            return int(v.replace("_", ""))
    return 100_000 if CI else 5_000_000


N = consume_n()


def run_timeout() -> float:
    return 120.0 + N / 20_000


FULL_SHARE = 4  # a full-cache run's cache holds about 1/FULL_SHARE of the topic's records


def _rate(n: int, t_before: float, t_first: float, e_first: int, t_done: float) -> float:
    """Entries applied after the first observed one over the time they took; if the
    first observation already saw most of them (a tiny smoke N), all n over the time
    since the last moment nothing was applied."""
    if e_first <= n // 2 and t_done > t_first:
        return (n - e_first) / (t_done - t_first)
    return n / max(t_done - t_before, 1e-9)


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def run_shmcache(topic: Topic, broker, workers: int, log_dir: Path, tag: str, full: bool = False) -> dict:
    """`shmcache run` on a fresh segment and group until caught up; check the table;
    SIGTERM (exit 0); destroy the segment. Every process it started is gone after.
    Also: the CPU each process used while catching up, and the workers' profiles.

    full: the segment is created first, holding about 1/FULL_SHARE of the topic's
    records (values up to 256 B, so that even the smoke size fills it), and `run` attaches
    to it: after the first quarter of the topic, nearly every add evicts the bucket's
    oldest record, the steady state of a cache that lives for longer than its memory."""
    bootstrap = broker.bootstrap
    name = f"bench-{os.getpid()}-consume-{tag}"
    memory = f"{max(256, math.ceil(topic.n * 200 * 1.5 / 2**20))}MiB"
    if full:
        memory = f"{max(4, math.ceil(topic.n * P.MEAN_RECORD / FULL_SHARE / 2**20))}MiB"
        shmcache.create(name, memory=memory, max_value=256).close()
    argv = [sys.executable, "-m", "shmcache", "run", "--name", name, "--bootstrap", bootstrap,
            "--topic", topic.name, "--group", f"bench-consume-{uuid.uuid4().hex[:12]}",
            "--workers", str(workers), "--memory", memory, "--format", topic.fmt]
    for setting in filter(None, os.environ.get("SHMCACHE_CONSUME_SET", "").split(",")):  # librdkafka, to try
        argv += ["--set", setting]
    log_path = log_dir / f"{name}.log"
    seen: dict[int, psutil.Process] = {}

    def remember() -> None:
        try:
            for k in psutil.Process(proc.pid).children(recursive=True):
                seen.setdefault(k.pid, k)
        except psutil.Error:
            pass

    def alive_or_fail(what: str) -> None:
        if proc.poll() is not None:
            pytest.fail(f"shmcache run exited with {proc.returncode} {what}; log {log_path}:\n{_tail(log_path)}")

    r = None
    with open(log_path, "wb") as logf:
        t0 = time.perf_counter()
        proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=logf, stderr=subprocess.STDOUT)
        seen[proc.pid] = psutil.Process(proc.pid)
        try:
            deadline = t0 + run_timeout()
            while r is None:  # the supervisor creates the segment
                try:
                    r = shmcache.attach(name)
                except (OSError, shmcache.ShmcacheError):
                    alive_or_fail("before creating the cache")
                    assert time.perf_counter() < deadline, "the cache was never created"
                    time.sleep(POLL_S)
            t_cache = time.perf_counter()  # the supervisor created the cache (it writes the magic last)
            t_before = t0
            t_first = e_first = None
            while True:
                st = r.status()
                now = time.perf_counter()
                adds = sum(w["adds"] for w in st["workers"])
                if t_first is None:
                    if adds > 0:
                        t_first, e_first = now, adds
                        remember()
                        roles = {"workers": [q for pid, q in seen.items() if pid != proc.pid],
                                 "supervisor": [seen[proc.pid]], "broker": [psutil.Process(broker.pid)]}
                        cpu0 = CP.cpu_snapshot(roles)
                    else:
                        t_before = now
                parts = st["assigned"]
                if st["ready"] and len(parts) == PARTITIONS and all(p["caught_up"] for p in parts):
                    t_done = now
                    cpu1 = CP.cpu_snapshot(roles)
                    break
                alive_or_fail("before catching up")
                assert now < deadline, f"not caught up after {run_timeout():.0f} s: {parts}"
                time.sleep(POLL_S)
            assert t_first is not None, "caught up without applying anything"
            remember()
            # -- correctness: offsets, counters, the table itself
            for p in parts:
                assert p["applied"] == topic.high[p["partition"]], p
            assert sum(w["malformed"] for w in st["workers"]) == 0
            assert sum(w["adds"] for w in st["workers"]) >= topic.n  # ADD is at-least-once
            stats = r.stats()
            if full:
                _check_full(r, topic, stats, sum(w["adds"] for w in st["workers"]))
            else:
                assert stats["entries"] == topic.n, stats
                assert stats["evictions"] == 0, stats
                got = r.get_many_packed(topic.sample_keys)
                assert got.found.all(), f"{int((~got.found).sum())} of {len(got)} sampled keys missing"
                assert np.array_equal(got.offsets, topic.sample_offsets) and np.array_equal(got.data, topic.sample_data)
            # -- a clean stop
            t_stop = time.perf_counter()
            proc.send_signal(signal.SIGTERM)
            try:
                rc = proc.wait(60)
            except subprocess.TimeoutExpired:
                rc = None
            stop_s = time.perf_counter() - t_stop
            assert rc == 0, f"shmcache run exited with {rc} on SIGTERM; log:\n{_tail(log_path)}"
            logf.flush()
            profile = CP.parse_profiles(log_path.read_text(errors="replace"))
        finally:
            for p in [seen[proc.pid], *[q for pid, q in seen.items() if pid != proc.pid]]:
                try:
                    if p.is_running():  # psutil checks the pid was not reused
                        p.kill()
                except psutil.Error:
                    pass
            psutil.wait_procs(list(seen.values()), timeout=10)
            if proc.poll() is None:
                proc.wait(10)
            if r is not None:
                r.close()
            try:
                shmcache.destroy(name)
            except FileNotFoundError:
                pass
    return {"entries_per_s": _rate(topic.n, t_before, t_first, e_first, t_done),
            "catch_up_s": t_done - t_first, "startup_s": t_first - t0, "cache_s": t_cache - t0, "stop_s": stop_s,
            "first_seen": e_first, "workers": workers, "profile": profile,
            "cores": CP.cores(cpu0, cpu1, t_done - t_first)}


def _check_full(r, topic: Topic, stats: dict, adds: int) -> None:
    """A full cache after the whole topic: it evicted, holds fewer entries than the topic,
    and every sampled key it still holds has its value (the ones evicted are misses)."""
    assert stats["evictions"] > 0 and 0 < stats["entries"] < topic.n, stats
    # every key is new: each one is held or was evicted (an add applied twice, at-least-once,
    # may be evicted twice)
    assert topic.n <= stats["evictions"] + stats["entries"] <= adds, (stats, adds)
    got = r.get_many_packed(topic.sample_keys).to_list()
    held = [i for i, v in enumerate(got) if v is not None]
    assert held, "not one sampled key is held: the keys applied last should be"
    for i in held:
        assert got[i] == topic.sample_values[i], f"sampled key {i}: a wrong value"


class RedisTarget:
    """A redis-server (tests/lib/shmtest/bench/peers.py) and a client; the consumer writes through it."""

    def __init__(self):
        self.server = P.RedisServer()
        self.client = self.server.connect()

    def write(self, msgs) -> None:
        """Decode each message and queue its entries in order: MSET per run of ADDs,
        DEL per run of DELETEs; one round trip per REDIS_PIPELINE messages."""
        pipe = self.client.pipeline(transaction=False)
        queued = 0
        for m in msgs:
            value = m.value()
            b = wire.decode(value)
            assert b.error is None, b
            n = len(b)
            kb = b.keys.tobytes()
            keys = [kb[i * wire.KEY_SIZE:(i + 1) * wire.KEY_SIZE] for i in range(n)]
            acts = b.actions
            if n and not acts.any():  # all ADD: the common case
                vals = [value[s:s + ln] for s, ln in zip(b.value_starts.tolist(), b.value_lens.tolist())]
                pipe.mset(dict(zip(keys, vals)))
            else:
                cuts = [0, *(np.flatnonzero(np.diff(acts)) + 1).tolist(), n]
                for s, e in zip(cuts[:-1], cuts[1:]):
                    if s == e:
                        continue
                    if acts[s] == wire.DELETE:
                        pipe.delete(*keys[s:e])
                    else:
                        pipe.mset({keys[i]: b.value(i) for i in range(s, e)})
            queued += 1
            if queued == REDIS_PIPELINE:
                pipe.execute()
                queued = 0
        if queued:
            pipe.execute()

    def check(self, topic: Topic) -> None:
        assert self.client.dbsize() == topic.n
        for s in range(0, len(topic.sample_list), 1000):
            assert self.client.mget(topic.sample_list[s:s + 1000]) == topic.sample_values[s:s + 1000]

    def close(self) -> None:
        try:
            self.client.close()
        finally:
            self.server.stop()


def run_plain(topic: Topic, broker, target: RedisTarget | None = None, settings: dict | None = None) -> dict:
    """A plain confluent-kafka consumer over all partitions from the beginning until
    every one reaches its high watermark; entries counted from the count headers (v1), or
    one a message (a topic of a message per entry: proto)."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

    if target is not None:
        target.client.flushall()
    per_entry = not registry.get(topic.fmt).batched
    assert target is None or not per_entry, "the Redis peer decodes v1"
    bootstrap = broker.bootstrap
    roles = {"bench process": [psutil.Process()], "broker": [psutil.Process(broker.pid)]}
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"bench-consume-plain-{uuid.uuid4().hex[:12]}",
                  "enable.auto.commit": False, "enable.auto.offset.store": False,
                  "enable.partition.eof": False, "auto.offset.reset": "earliest", **(settings or {})})
    try:
        t0 = time.perf_counter()
        c.assign([TopicPartition(topic.name, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
        nxt = dict.fromkeys(range(PARTITIONS), 0)
        left = topic.messages  # messages still to come: ask for at most these (no waiting at the tail)
        entries, t_before, t_first, e_first = 0, t0, None, 0
        deadline = t0 + run_timeout()
        while left:
            t_call = time.perf_counter()
            # consume() returns when it has num_messages or at the timeout: the first call
            # asks for 1 (the moment data arrives), the last for what is left (no idle wait)
            msgs = c.consume(num_messages=1 if t_first is None else min(CONSUME_BATCH, left), timeout=1.0)
            for m in msgs:
                if m.error() is not None:
                    raise AssertionError(f"consume error: {m.error()}")
                p, off = m.partition(), m.offset()
                assert off == nxt[p], (p, off, nxt[p])  # in order, nothing skipped
                nxt[p] = off + 1
                if target is None:
                    entries += 1 if per_entry else int.from_bytes(m.value()[:4], "little")
            if target is not None and msgs:
                target.write(msgs)
                entries += sum(int.from_bytes(m.value()[:4], "little") for m in msgs)
            left -= len(msgs)
            if msgs and t_first is None:
                t_first, e_first, t_before = time.perf_counter(), entries, t_call
                cpu0 = CP.cpu_snapshot(roles)
            assert time.perf_counter() < deadline, f"not caught up after {run_timeout():.0f} s: {nxt}"
        t_done = time.perf_counter()
        cpu1 = CP.cpu_snapshot(roles)
    finally:
        c.close()
    assert nxt == topic.high
    assert entries == topic.n
    if target is not None:
        target.check(topic)
    return {"entries_per_s": _rate(topic.n, t_before, t_first, e_first, t_done),
            "catch_up_s": t_done - t_first, "startup_s": t_first - t0, "first_seen": e_first,
            "cores": CP.cores(cpu0, cpu1, t_done - t_first)}
