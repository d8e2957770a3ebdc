"""A worker's main thread without Kafka (issue 13, part 2): what each entry costs it, by step.

    SHMCACHE_BENCH_N=2000000 .venv/bin/python -m pytest bench/test_worker_loop.py -p no:cacheprovider -s

The v1 messages of bench/test_consume.py's topic (the same generator: 1024 entries a
message, random 32-byte keys, 61-141-byte values), handed over as a worker gets them:
`consume()` calls of 256 messages (RunConfig.batch_messages), each message a fresh
`bytes`. Per call, in one process, thread CPU time (so that other processes' load
weighs less than in wall time) of each step:
- copy: a new `bytes` of each message, the copy confluent-kafka makes of every message
  it hands over (what a worker's "fetch" costs it beyond librdkafka's own threads);
- decode: `wire_batch.decode_many` as the worker calls it (each message walked once),
  and beside it, on the same call, the two passes it replaced (a scan of every
  message for its counts, then a gather: tests/lib/shmtest/bench/wire_two_pass.py), the order
  alternating;
- apply: `Writer.apply` of the decoded batch into a fresh segment (a fill: no entry
  evicts), as `worker.apply_batch` calls it.
Messages from SHMCACHE_BENCH_N entries (1,000,000; 20,000 under CI=true: a smoke run),
decoded SHMCACHE_BENCH_ROUNDS times (5), applied once.

Asserted, never timed: both decodes give the same keys, value starts and lengths, and
the table then holds N entries, 10,000 sampled keys among them.
"""

from __future__ import annotations

import statistics
import time
import uuid

import numpy as np

from shmtest.bench import peers as P
from shmtest.bench import wire_two_pass as _before
import shmcache
from shmtest.bench.consume_topics import BATCH, chunks, messages_of
from shmcache.formats import wire, wire_batch, _wire_kernels as _k
from shmcache.consumer.worker.loop import apply_batch

CALL = 256  # messages a consume() call hands over (consumer/config.py RunConfig.batch_messages)


def _two_passes(values: list, scratch: wire_batch.Scratch) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """decode_many as it was up to commit 94080f9, for clean v1 messages: copied back to back
    as today, then every message scanned for its counts and every message gathered (the
    kernels of tests/lib/shmtest/bench/wire_two_pass.py), into new arrays. (keys, value starts, lens)."""
    m = len(values)
    ends = np.cumsum([len(v) for v in values])
    starts = np.empty(m, np.int64)
    starts[:1] = 0
    starts[1:] = ends[:-1]
    buf = scratch.take(int(ends[-1]))
    for v, s, e in zip(values, starts.tolist(), ends.tolist()):
        buf[s:e] = np.frombuffer(v, np.uint8)
    data = buf.view()
    data.flags.writeable = False
    scanned = np.empty((m, _k.M_COLUMNS), np.int64)
    assert _before.scan_many(data, starts, ends, wire.KEY_SIZE, 256, scanned) == 0
    kept = int(scanned[:, _k.M_KEPT].sum())
    keys = np.empty((kept, wire.KEY_SIZE), np.uint8)
    actions, vstarts, lens = np.empty(kept, np.uint8), np.empty(kept, np.int64), np.empty(kept, np.int32)
    _before.gather_many(data, starts, ends, scanned, wire.KEY_SIZE, keys, actions, vstarts, lens, np.empty(0, np.uint64))
    return keys, vstarts, lens


def test_worker_main_thread():
    n = P.bench_n()
    rounds = P.bench_rounds()
    msgs, keys_all = [], []
    for _c0, keys, offsets, data in chunks(n):
        msgs.extend(np.frombuffer(v, np.uint8) for _key, v, _p in messages_of("v1", keys, offsets, data, 8))
        keys_all.append(keys)
    calls = [msgs[s:s + CALL] for s in range(0, len(msgs), CALL)]
    name = f"bench-{uuid.uuid4().hex[:8]}-worker-loop"
    w = shmcache.create(name, memory=max(64 << 20, n * 300), max_value=256)
    ns = dict(copy=0, apply=0)
    rows = []  # per round: ns of decode now, before
    try:
        s_now, s_before = wire_batch.Scratch(), wire_batch.Scratch()
        apply_batch(w, wire_batch.decode_many([bytes(4)], s_now))  # the kernels loaded (as a worker does), not timed
        largest = [m.tobytes() for m in max(calls, key=lambda c: sum(map(len, c)))]
        wire_batch.decode_many(largest, s_now), _two_passes(largest, s_before)  # scratches grown, kernels compiled
        applied = 0
        for r in range(rounds):
            now_s = before_s = 0
            for c, call in enumerate(calls):
                t0 = time.thread_time_ns()
                values = [m.tobytes() for m in call]
                t1 = time.thread_time_ns()
                for way in (("now", "before") if (r + c) % 2 else ("before", "now")):
                    t = time.thread_time_ns()
                    if way == "now":
                        new = wire_batch.decode_many(values, s_now, max_value=256)
                        now_s += time.thread_time_ns() - t
                    else:
                        old = _two_passes(values, s_before)
                        before_s += time.thread_time_ns() - t
                assert np.array_equal(new.keys, old[0]) and np.array_equal(new.value_starts, old[1])
                assert np.array_equal(new.value_lens, old[2])
                ns["copy"] += t1 - t0
                if r == 0:  # every entry applied once: a fill
                    t = time.thread_time_ns()
                    apply_batch(w, new)
                    ns["apply"] += time.thread_time_ns() - t
                    applied += len(new)
            rows.append((now_s, before_s))
        assert applied == n and w.stats()["entries"] == n
        sample = np.concatenate(keys_all)[:: max(1, n // 10_000)]
        assert w.get_many_packed(sample).found.all()
    finally:
        w.close()
        shmcache.destroy(name)
    per = {"copy": ns["copy"] / (n * rounds), "apply": ns["apply"] / n,
           "now": statistics.median(a for a, _ in rows) / n, "before": statistics.median(b for _, b in rows) / n}
    ratios = [a / b for a, b in rows]
    print(f"\nA worker's main thread without Kafka, ns of thread CPU an entry (N = {n:,}: {len(msgs):,} v1 messages "
          f"of {BATCH}, {len(calls)} calls of {CALL}; decode: median of {rounds} rounds; apply once)")
    print(f"  copy of each message into a bytes (confluent-kafka's)  {per['copy']:6.1f}")
    print(f"  decode, two passes (before)                           {per['before']:6.1f}")
    print(f"  decode, one pass (decode_many, now)                   {per['now']:6.1f}   "
          f"now / before: median {statistics.median(ratios):.2f}x (rounds {', '.join(f'{x:.2f}' for x in ratios)})")
    print(f"  apply (Writer.apply, a fill)                          {per['apply']:6.1f}")
    print(f"  copy + decode + apply                                 {per['copy'] + per['now'] + per['apply']:6.1f}"
          f"   the bound: apply, {per['apply'] / (per['copy'] + per['now'] + per['apply']):.0%} of it")
