"""A bucket lock held by a live process that stopped (SIGSTOP) while writing: the worker
that needs that bucket waits for it, and is not taken for hung. Against the real broker,
a real `shmcache run`, real workers and a real writer process of the application's.

The writer (`shmcache.open`, set_many in a loop) is stopped until it is caught holding a
lock, the hardest case: its bucket's seqlock is odd and its owner alive. A message whose
keys include some of that bucket goes to partition 0. Its worker applies up to the first
of them and waits: it must go on beating, so the supervisor does not kill it as stale
(for over three times the bound here), and say in one warning which process holds the
lock. Before, it stopped beating and was killed, and its successor waited for the same
lock and was killed in turn, each time only said to be "stale". It sleeps between looks
at the lock rather than spin on a core. Meanwhile the cache is not ready, and says
which bucket's lock the partition's worker waits for. Once the writer is killed, the worker takes the
dead writer's lock over, applies the rest, and the cache is ready with every entry.
"""

import os
import subprocess
import sys
import time

import numpy as np
import psutil
import xxhash

from shmtest.supervisors import harness  # noqa: F401
from shmtest.topic_model import Model, check_table, produce_and_wait
from shmtest.waits import poll_until

from shmcache.formats import wire
from shmcache.engine import layout as L
from shmcache.ipc import liveness

PARTITIONS = 2
STALE_S = 4.0  # worker_heartbeat_timeout here

# The application's writer rewrites 2000 keys in a loop, all outside the buckets given in
# argv[2]: the buckets of the entries produced before it starts. A bucket's ring is FIFO,
# and its rewrites (hundreds a second per bucket) evict the older records of any bucket
# it shares, as the cache may; in CI they once took 10 of the 48 produced entries.
WRITER = f"""\
import sys
import numpy as np
import xxhash
import shmcache

w = shmcache.open(sys.argv[1])
avoid = {{int(b) for b in sys.argv[2].split(",")}}
rng = np.random.default_rng(7)
rows = []
while len(rows) < 2000:
    k = b"\\xee" * 4 + rng.bytes(28)
    if xxhash.xxh64_intdigest(k) & {L.NBUCKETS - 1} not in avoid:
        rows.append(k)
keys = np.frombuffer(b"".join(rows), np.uint8).reshape(2000, 32).copy()
values = (np.arange(2001, dtype=np.int64) * 8, np.zeros(2000 * 8, np.uint8))
print("ready", flush=True)
while True:
    w.set_many(keys, values)
"""


def _caught_holding_a_lock(proc: psutil.Process, meta: np.ndarray) -> int:
    """Stop the writer until it is stopped holding a bucket lock; that bucket."""
    locks = meta.reshape(L.NBUCKETS, L.ROW_WORDS)[:, L.M_LOCK]
    for _ in range(10_000):
        proc.suspend()
        poll_until(lambda: proc.status() == psutil.STATUS_STOPPED, 10, "the writer to stop")
        held = [int(b) for b in np.flatnonzero(locks) if liveness.word_pid(int(locks[b])) == proc.pid]
        if held:
            return held[0]
        proc.resume()
    raise AssertionError("the writer was never stopped holding a lock")


def _bucket_of(key: bytes) -> int:
    """The bucket the table files `key` under (its xxh64, seed 0)."""
    return xxhash.xxh64_intdigest(key) & (L.NBUCKETS - 1)


def _keys_in(bucket: int, n: int, rng) -> list[bytes]:
    """n random 32-byte keys the table files under `bucket`."""
    out = []
    while len(out) < n:
        k = rng.bytes(32)
        if _bucket_of(k) == bucket:
            out.append(k)
    return out


def _send(bootstrap: str, topic: str, partition: int, entries: dict[bytes, bytes]) -> None:
    from confluent_kafka import Producer

    prod = Producer({"bootstrap.servers": bootstrap})
    keys = list(entries)
    prod.produce(topic, wire.encode_v1(keys, [wire.ADD] * len(keys), [entries[k] for k in keys]),
                 partition=partition)
    assert prod.flush(30) == 0


def test_a_worker_waiting_for_a_stopped_writers_lock_is_not_killed(harness, kafka_topic):
    topic = kafka_topic(PARTITIONS)
    model = Model("v1", PARTITIONS, seed=71)
    produce_and_wait(harness, topic, model, PARTITIONS, rate=1000, max_batches=2 * PARTITIONS)
    name = harness.cache_name("lockheld")
    sup = harness.supervisor(name, topic, harness.group("lockheld"), workers=2,
                             config={"worker_heartbeat_timeout": STALE_S})
    r = harness.attach(name, sup=sup)
    r.wait_ready(timeout=120)
    i = next(p["worker"] for p in r.status()["assigned"] if p["partition"] == 0)

    produced = ",".join(str(_bucket_of(k)) for k in model.snapshot())
    writer = subprocess.Popen([sys.executable, "-c", WRITER, name, produced], stdout=subprocess.PIPE, text=True)
    try:
        assert writer.stdout.readline().strip() == "ready"
        wproc = psutil.Process(writer.pid)
        bucket = _caught_holding_a_lock(wproc, r.segment_arrays().meta)

        rng = np.random.default_rng(72)
        keys = [rng.bytes(32) for _ in range(50)] + _keys_in(bucket, 3, rng) + [rng.bytes(32) for _ in range(50)]
        sent = {k: rng.bytes(int(rng.integers(61, 142))) for k in keys}
        _send(harness.bootstrap, topic, 0, sent)

        said = f"bucket {bucket}'s lock has been held for"
        poll_until(lambda: said in sup.log_text(), 60,
                   lambda: f"worker {i} to say it waits for bucket {bucket}; log:\n{sup.log_text()[-3000:]}")
        line = next(x for x in sup.log_text().splitlines() if said in x)
        assert f"worker {i}: " in line and f"by pid {writer.pid} (" in line and "stopped" in line, line
        waiting = psutil.Process(r.status()["workers"][i]["pid"])
        cpu0, seen = sum(waiting.cpu_times()[:2]), time.monotonic()
        while time.monotonic() - seen < 3 * STALE_S:  # the property: alive and waiting, for 3x the bound
            st = r.status()
            assert st["stale_worker_kills"] == 0 and [w["starts"] for w in st["workers"]] == [1, 1], (
                st["workers"], sup.log_text()[-3000:])
            assert not st["ready"] and not st["workers"][i]["stale"], st
            assert [p["worker_down"] for p in st["assigned"] if p["partition"] == 0] == [
                f"waiting for bucket {bucket}'s lock, held by another live process"], st["assigned"]
            time.sleep(0.2)
        cpu = sum(waiting.cpu_times()[:2]) - cpu0
        assert cpu < 0.25 * (time.monotonic() - seen), f"the waiting worker used {cpu:.1f} s of CPU"  # no spinning
        assert wproc.status() == psutil.STATUS_STOPPED  # still holding it
        shown = subprocess.run([sys.executable, "-m", "shmcache", "status", name], capture_output=True, text=True,
                               timeout=60, env={**os.environ, "COLUMNS": "250"})  # its lines unwrapped
        assert f"waiting for bucket {bucket}'s lock" in " ".join(shown.stdout.split()), shown.stdout + shown.stderr
    finally:
        writer.kill()
        writer.wait()
        writer.stdout.close()
    r.wait_ready(timeout=120)
    log = sup.log_text()
    assert f"took over bucket {bucket} from dead writer pid {writer.pid}" in log, log[-3000:]
    assert "was stale" not in log and r.status()["stale_worker_kills"] == 0, log[-3000:]
    check_table(r, {**model.snapshot(), **sent})
    assert sup.terminate() == 0, sup.log_text()[-3000:]
