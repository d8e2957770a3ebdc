"""The restart only a shared cache survives (issue 55): a service's hit rate over the first
minutes after it restarts, with its own private cache refilled from the topic, against the
machine's shared cache, which the restart does not touch.

    .venv/bin/python -m pytest bench/test_restart_hits.py -p no:cacheprovider -s        # retention 60 s

Teranode's txmeta topic keeps 60 s (retention.ms=60000; the broker applies retention every
5 s, scripts/kafka). Transactions are produced at a steady RATE a second, each with 1-3
parents, OLD_SHARE of them older than the retention (as a block's parents mostly are) and
the rest from the last retention period but at least 2 s old (an old one is older than
OLD_AGE_S: past the retention, its segment's roll and the broker's next look). HISTORY
older transactions come first, with times of the last two hours, on a topic that keeps
everything until `shmcache run` has applied them (ready); then the topic keeps
RETENTION_S, and once retention has deleted the whole history (every partition's log start
offset past the history's end: waited for, not timed), the service
restarts: its private cache starts empty and is refilled by a consumer from the oldest
offset the topic still has, as a private cache filled from the topic must be (a set of the
keys read: a fastcache large enough to evict nothing holds just those), while the shared
cache is looked up as it stands. Then, every tick, the parents of the transactions produced
in that tick are looked up both ways: the hit rate per window of the measured period.

Sizes: SHMCACHE_BENCH_N below 200,000 (the suite's smoke size) runs with a 10 s retention
for 15 s; else 60 s for 180 s. Asserted: the shared cache holds every parent once the
daemon applied what was produced (a lookup before that counts as a miss in the figure);
the private one misses every parent of the history retention deleted before its restart.
Never a time or a rate.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import uuid

import numpy as np

from shmtest.bench import peers as P
from shmtest.bench.node import remove, stop_tree, supervisor
from shmtest.waits import wait_applied

FULL = P.bench_n() >= 200_000
RETENTION_S = 60 if FULL else 10
MEASURE_S = 180 if FULL else 15
WINDOW_S = 10 if FULL else 3
RATE = 2_000  # transactions a second
HISTORY = 1_000_000 if FULL else 20_000  # transactions older than the topic keeps, the cache holds
TICK_S = 0.25
OLD_SHARE = 0.8  # of the parents: older than the retention
# An old parent is older than this: past the retention, the newest segment it could be in
# (segment.ms is a sixth of the retention) and the broker's next look (5 s), so gone
OLD_AGE_S = RETENTION_S * 1.5 + 5
RECENT_MIN_S = 2.0  # a recent parent is at least this old: applied by then
PARTITIONS = 4


class Producer:
    """Transactions at RATE a second, a v1 message of them a tick, each tx's parents drawn
    from earlier ones by the mix above. Keeps every tx's key and production time."""

    def __init__(self, bootstrap: str, topic: str):
        from confluent_kafka import Producer as KafkaProducer

        self.p = KafkaProducer({"bootstrap.servers": bootstrap, "linger.ms": 5})
        self.topic = topic
        self.rng = np.random.default_rng(55)
        self.keys = np.zeros((0, 32), np.uint8)
        self.times = np.zeros(0)
        self.tick = 0

    def _parents(self, now: float, n: int) -> np.ndarray:
        """The indices of n parents, by the mix of old and recent."""
        old = np.flatnonzero(self.times < now - OLD_AGE_S)
        recent = np.flatnonzero((self.times >= now - RETENTION_S) & (self.times < now - RECENT_MIN_S))
        pick_old = self.rng.random(n) < OLD_SHARE
        if len(old) == 0:
            pick_old[:] = False
        if len(recent) == 0:
            pick_old[:] = len(old) > 0
        idx = np.where(pick_old, old[self.rng.integers(0, max(1, len(old)), n)] if len(old) else 0,
                       recent[self.rng.integers(0, max(1, len(recent)), n)] if len(recent) else 0)
        return idx

    def history(self, n: int) -> None:
        """n transactions produced with times of the last two hours, all older than
        OLD_AGE_S: what the topic held once and retention deleted (its records carry those
        times, so the first look after their segments roll deletes them)."""
        from shmcache.formats import txmeta, wire

        now = time.time()
        times = np.sort(self.rng.uniform(now - 7200, now - OLD_AGE_S - 1, n))
        keys = self.rng.integers(0, 256, (n, 32), np.uint8)
        for i in range(0, n, 5_000):
            j = min(n, i + 5_000)
            self.p.produce(self.topic, wire.encode_v1(keys[i:j], np.zeros(j - i, np.uint8),
                                                      txmeta.encode(txmeta.generate(j - i, self.rng))),
                           partition=(i // 5_000) % PARTITIONS, timestamp=int(times[j - 1] * 1000))
            self.p.poll(0)
        self.p.flush(60)
        self.keys, self.times = keys, times

    def step(self) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
        """One tick's transactions, produced: their parents' keys, times and indices (None
        before any transaction is old enough to be a parent)."""
        from shmcache.formats import txmeta, wire

        now = time.time()
        n = int(RATE * TICK_S)
        have = len(self.keys) > 0 and self.times[0] < now - RECENT_MIN_S
        meta = txmeta.generate(n, self.rng)
        lookups = None
        if have:
            idx = self._parents(now, len(meta.parents))
            meta.parents[:] = self.keys[idx]
            lookups = (self.keys[idx], self.times[idx], idx)
        keys = self.rng.integers(0, 256, (n, 32), np.uint8)
        self.p.produce(self.topic, wire.encode_v1(keys, np.zeros(n, np.uint8), txmeta.encode(meta)),
                       partition=self.tick % PARTITIONS)
        self.p.poll(0)
        self.keys = np.concatenate([self.keys, keys])
        self.times = np.concatenate([self.times, np.full(n, now)])
        self.tick += 1
        return lookups

    def close(self) -> None:
        self.p.flush(30)
        self.p = None


class PrivateCache:
    """A restarted service's own cache: empty, then every key a consumer reads from the
    oldest offset the topic still has."""

    def __init__(self, bootstrap: str, topic: str):
        from confluent_kafka import OFFSET_BEGINNING, Consumer, TopicPartition

        self.keys: set[bytes] = set()
        self.c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"private-{uuid.uuid4().hex[:8]}",
                           "enable.auto.commit": False})
        self.c.assign([TopicPartition(topic, p, OFFSET_BEGINNING) for p in range(PARTITIONS)])
        self.stop = threading.Event()
        self.t = threading.Thread(target=self._fill, daemon=True)
        self.t.start()

    def _fill(self) -> None:
        from shmcache.formats import wire

        while not self.stop.is_set():
            for m in self.c.consume(500, 0.1):
                if m.error() is None and m.value():
                    self.keys.update(bytes(k) for k in wire.decode(m.value(), max_value=4096).keys)

    def hits(self, keys: np.ndarray) -> np.ndarray:
        return np.fromiter((bytes(k) in self.keys for k in keys), bool, len(keys))

    def close(self) -> None:
        self.stop.set()
        self.t.join(10)
        self.c.close()


def _retain(admin, topic: str, ms: int) -> None:
    """The topic keeps `ms` from now on (retention.ms, as Teranode's txmeta topic does)."""
    from confluent_kafka.admin import AlterConfigOpType, ConfigEntry, ConfigResource

    res = ConfigResource(ConfigResource.Type.TOPIC, topic, incremental_configs=[
        ConfigEntry("retention.ms", str(ms), incremental_operation=AlterConfigOpType.SET)])
    for fut in admin.incremental_alter_configs([res]).values():
        fut.result(timeout=30)


def _offsets(bootstrap: str, topic: str) -> tuple[list[int], list[int]]:
    """Each partition's log start offset and end offset."""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": "offsets"})
    try:
        marks = [c.get_watermark_offsets(TopicPartition(topic, p), timeout=10) for p in range(PARTITIONS)]
        return [lo for lo, _ in marks], [hi for _, hi in marks]
    finally:
        c.close()


def test_restart_hit_rate(kafka_broker, kafka_admin, tmp_path):
    from shmcache.engine import sizing
    from shmcache.kafka import topics

    topic = f"bench-restart-{uuid.uuid4().hex[:12]}"
    cache = f"bench-{os.getpid()}-restart"
    # kept for good until the daemon has applied the history: retention set after (_retain)
    topics.create_topic(kafka_broker.bootstrap, topic, PARTITIONS, config={
        "retention.ms": "-1", "segment.ms": str(RETENTION_S * 1000 // 6)})
    prod = Producer(kafka_broker.bootstrap, topic)
    sup = r = private = None
    windows: list[tuple[int, ...]] = []  # lookups, private hits, shared hits, old, private hits of gone
    try:
        prod.history(HISTORY)
        ends = _offsets(kafka_broker.bootstrap, topic)[1]
        memory = sizing.memory_for(int(HISTORY + RATE * (2 * OLD_AGE_S + MEASURE_S)), 141).memory
        sup, r, _ = supervisor(cache, topic, kafka_broker.bootstrap, tmp_path / "sup.log", memory)  # has it all
        _retain(kafka_admin, topic, RETENTION_S * 1000)
        # live records roll the history's segments; retention then deletes them: waited for
        deadline = time.monotonic() + 300
        while True:
            lows = _offsets(kafka_broker.bootstrap, topic)[0]
            if all(lo >= end for lo, end in zip(lows, ends)):
                break
            assert time.monotonic() < deadline, f"retention left the history: log starts {lows}, history ends {ends}"
            prod.step()
            time.sleep(TICK_S)
        private = PrivateCache(kafka_broker.bootstrap, topic)  # the service restarts
        t0 = time.time()
        window = [0] * 5
        while time.time() - t0 < MEASURE_S:
            got = prod.step()
            if got is not None:
                keys, times, idx = got
                now = time.time()
                shared = r.get_many_packed(keys).found
                if not shared.all():  # not applied yet on a busy host: once applied, every one is there
                    prod.p.flush(30)
                    wait_applied(r, _offsets(kafka_broker.bootstrap, topic)[1], 120)
                    missed = keys[~shared]
                    assert r.get_many_packed(missed).found.all(), "the shared cache lost parents it had applied"
                priv = private.hits(keys)
                gone = idx < HISTORY  # the history: deleted by retention before the restart (waited for)
                window = [a + b for a, b in zip(window, (len(keys), int(priv.sum()), int(shared.sum()),
                                                         int((times < now - OLD_AGE_S).sum()),
                                                         int((priv & gone).sum())))]
            if time.time() - t0 >= (len(windows) + 1) * WINDOW_S:
                windows.append(tuple(window))
                window = [0] * 5
            time.sleep(TICK_S)
    finally:
        prod.close()
        if private is not None:
            private.close()
        if r is not None:
            r.close()
        if sup is not None:
            stop_tree(sup)
        remove(kafka_admin, [topic], [cache])
    lines = [f"restart hit rate (retention {RETENTION_S} s, {HISTORY:,} older transactions, {RATE:,} tx/s, "
             f"{OLD_SHARE:.0%} of the parents older than the retention; load average {os.getloadavg()[0]:.1f}): "
             "after the restart"]
    for i, (n, priv, shared, old, _) in enumerate(windows):
        lines.append(f"  {i * WINDOW_S:4d}-{(i + 1) * WINDOW_S:<4d}s  private {100 * priv / n:5.1f} %   "
                     f"shared {100 * shared / n:5.1f} %   ({n:,} lookups, {100 * old / n:.0f} % old)")
    print("\n" + "\n".join(lines), file=sys.stderr)
    total = [sum(w[i] for w in windows) for i in range(5)]
    assert total[0] > 0 and total[3] > 0
    assert total[4] == 0, f"the private cache found {total[4]} parents the topic had deleted before it restarted"
