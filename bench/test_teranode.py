"""The case for Teranode's services in figures (issue 46, section 6): one warm copy of the
txmeta cache per machine, shared by every Go service and outliving their restarts, against
a private in-process cache in each (VictoriaMetrics/fastcache, what Teranode's txmetacache
forks), on the same SHMCACHE_BENCH_N Teranode-shaped entries (formats/txmeta.generate: 1-3
parents, a block height on half). The Go side is go/bench/teranodebench (over go/txmeta).

    .venv/bin/python -m pytest bench/test_teranode.py -p no:cacheprovider -s             # 1,000,000 entries
    SHMCACHE_BENCH_N=20000 .venv/bin/python -m pytest bench/test_teranode.py -p no:cacheprovider -s   # smoke

- memory: four Go processes attached to one cache, each having looked every entry up,
  against four processes that each fill a private fastcache with the entries; the sum of
  their PSS (/proc/PID/smaps_rollup) for each, with all four alive;
- warm start: a Go service's start to serving its first batch on an existing cache that a
  supervisor keeps ready (spawn, attach, WaitReady, a batch of 1,024 decorated), against
  filling a cache from the topic: `shmcache run` on a fresh cache, spawn to ready, and the
  topic read once by a consumer that does nothing with it (bench/test_consume.py's null
  consumer), which bounds from below any private fill from the topic;
- the loop: GetMetaCachedBatch of 1,024 hashes (lookup and decode) on 1 and 2
  goroutines, against fastcache's HasGet of each hash with the same decode,
  SHMCACHE_BENCH_ROUNDS rounds of SHMCACHE_TERANODE_LOOP_MS each (1000 ms; 100 below 200,000
  entries), the order alternating: M hashes/s of wall time and of the process's CPU time
  (which leaves out what a busy host's other jobs take), their ratios round by round, and
  the allocations per batch (the Go runtime's count over the timed run).

Asserted: every process found and decoded every entry; never the times or sizes (printed,
with the load average).
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
import uuid

import numpy as np
import psutil
import pytest

from shmtest.bench import peers as P
from shmtest.bench.node import GO, Procs, build_program, mib as _mib, pss as _pss, stop_tree as _stop_tree, supervisor, remove
import shmcache
from shmcache.formats import txmeta

N = P.bench_n()
ROUNDS = P.bench_rounds()
LOOP_MS = int(os.environ.get("SHMCACHE_TERANODE_LOOP_MS", "1000" if N >= 200_000 else "100"))
PROCS = 4
FIGURES: dict[str, dict] = {}


@pytest.fixture(scope="module")
def program(tmp_path_factory) -> str:
    if GO is None:
        pytest.skip("go is not installed: go/bench/teranodebench is not built")
    yield build_program(tmp_path_factory.mktemp("teranodebench"))
    if FIGURES:
        print(f"\nteranode (N={N:,}, load average {os.getloadavg()[0]:.1f}):", file=sys.stderr)
        for k, v in FIGURES.items():
            print(f"  {k:32s} " + ", ".join(f"{a} {b}" for a, b in v.items()), file=sys.stderr)


@pytest.fixture(scope="module")
def entries(tmp_path_factory):
    """N entries in files for the Go side (keys.bin, offsets.bin, values.bin) and in a cache
    this process fills and closes (no writer maps it while figures are taken); destroyed at
    the end."""
    d = tmp_path_factory.mktemp("teranode-entries")
    rng = np.random.default_rng(46)
    keys = rng.integers(0, 256, (N, 32), np.uint8)
    meta = txmeta.generate(N, rng)
    off, data = txmeta.encode(meta)
    keys.tofile(d / "keys.bin")
    off.tofile(d / "offsets.bin")
    data.tofile(d / "values.bin")
    name = f"bench-{os.getpid()}-teranode"
    w = shmcache.create(name, memory=N * 256 + (32 << 20), max_value=256)  # room for the fullest bucket
    try:
        for i in range(0, N, 100_000):
            j = min(N, i + 100_000)
            w.set_many(keys[i:j], (off[i:j + 1] - off[i], data[off[i]:off[j]]))
        st = w.stats()
        assert st["evictions"] == 0 and st["entries"] == N, st
        w.close()
        yield {"name": name, "dir": d, "expect": N, "data_bytes": int(off[-1])}
    finally:
        w.close()
        shmcache.destroy(name, force=True)


@pytest.fixture
def procs():
    ps = Procs()
    yield ps
    ps.stop()


def test_memory(program, entries, procs):
    d = entries["dir"]
    runs = {"shmcache": [program, "attach", entries["name"], str(d / "keys.bin")],
            "fastcache": [program, "fastcache", str(d / "keys.bin"), str(d / "offsets.bin"), str(d / "values.bin")]}
    fig = {}
    for kind, argv in runs.items():
        pss = []
        for _ in range(PROCS):  # one after the other: each fills or looks up alone
            p, line = procs.start(argv)
            assert line[0] == "ready" and int(line[1]) == entries["expect"], line
        for p in procs.procs:
            pss.append(_pss(p.pid))
        procs.stop()
        total = sum(x["Pss"] for x in pss)
        fig[kind] = total
        extra = f" (shared segment's share {_mib(sum(x.get('Pss_Shmem', 0) for x in pss))})" if kind == "shmcache" else ""
        FIGURES[f"memory, {PROCS} x {kind}"] = {"sum of PSS": _mib(total) + extra,
                                                 "each": ", ".join(_mib(x["Pss"]) for x in pss)}
    seg = os.stat(f"/dev/shm/{entries['name']}")
    FIGURES["memory, the data"] = {"values": _mib(entries["data_bytes"]), "keys": _mib(N * 32),
                                   "segment": f"{_mib(seg.st_size)} ({_mib(seg.st_blocks * 512)} allocated)"}
    FIGURES["memory, ratio"] = {"fastcache / shmcache": f"{fig['fastcache'] / fig['shmcache']:.2f}x"}


def test_loop(program, entries):
    d = entries["dir"]
    out = subprocess.run([program, "loop", entries["name"], str(d / "keys.bin"), str(d / "offsets.bin"),
                          str(d / "values.bin"), str(ROUNDS), str(LOOP_MS)],
                         capture_output=True, text=True, timeout=600 + 4 * ROUNDS * LOOP_MS / 1000)
    assert out.returncode == 0, out.stderr
    import json

    runs = [json.loads(line) for line in out.stdout.splitlines()]
    assert len(runs) == ROUNDS * 2 * 2
    for r in runs:  # every key is there: every lookup a hit
        assert r["batches"] > 0 and r["hits"] == r["batches"] * P.BATCH, r
    for g in (1, 2):
        of = {impl: [r for r in runs if r["goroutines"] == g and r["impl"] == impl] for impl in ("shmcache", "fastcache")}
        fig = {impl: f"{statistics.median(r['hashes_per_s'] for r in rs) / 1e6:.2f} M hashes/s, "
                     f"{statistics.median(r['hashes_per_cpu_s'] for r in rs) / 1e6:.2f} M a CPU second "
                     f"({max(r['allocs_per_batch'] for r in rs):.2f} allocs/batch)" for impl, rs in of.items()}
        for what, key in (("", "hashes_per_s"), (", a CPU second", "hashes_per_cpu_s")):
            ratios = [a[key] / b[key] for a, b in zip(of["shmcache"], of["fastcache"])]
            fig[f"shmcache / fastcache{what}"] = (f"{statistics.median(ratios):.2f}x "
                                                  f"(rounds {min(ratios):.2f}-{max(ratios):.2f})")
        FIGURES[f"loop, {g} goroutine{'s' if g > 1 else ''}"] = fig


def test_warm_start(program, kafka_broker, kafka_admin, tmp_path):
    from shmtest.bench import consume_runs as C
    from shmtest.bench.consume_topics import Topic
    from shmcache.kafka import topics
    from shmcache.produce import loadgen

    name = f"bench-teranode-{uuid.uuid4().hex[:12]}"
    topics.create_topic(kafka_broker.bootstrap, name, C.PARTITIONS)
    caches: list[str] = []
    try:
        truth = str(tmp_path / "truth.parquet")
        sent = loadgen.produce(loadgen.LoadConfig(bootstrap=kafka_broker.bootstrap, topic=name, count=N, format="v1",
                                                  delete_share=0.0, seed=46, ground_truth=truth))
        state = loadgen.final_state(truth).slice(0, P.BATCH)
        keys = loadgen.hashes_of(state["tx_hash"])
        keys.tofile(tmp_path / "keys.bin")
        topic = Topic(name=name, fmt="v1", n=N, messages=sent.messages, high=dict(sent.end_offsets),
                      sample_keys=np.zeros((0, 32), np.uint8), sample_offsets=np.zeros(1, np.int64),
                      sample_data=np.zeros(0, np.uint8))

        null = C.run_plain(topic, kafka_broker)  # the topic read once, nothing done with it
        fill = C.run_shmcache(topic, kafka_broker, 2, tmp_path, "teranode-fill")  # a fresh cache to ready

        cache = f"bench-{os.getpid()}-teranode-warm"
        caches.append(cache)
        sup, r, ready_s = supervisor(cache, name, kafka_broker.bootstrap, tmp_path / "sup.log", max(256 << 20, N * 320))
        try:
            tree = [_pss(p.pid) for p in [psutil.Process(sup.pid), *psutil.Process(sup.pid).children(recursive=True)]]
            sup_pss = {k: sum(x.get(k, 0) for x in tree) for k in ("Pss", "Pss_Shmem")}
            starts = []
            for _ in range(max(5, ROUNDS)):
                t0 = time.perf_counter()
                p = subprocess.run([program, "serve", cache, str(tmp_path / "keys.bin")], capture_output=True,
                                   text=True, timeout=120)
                starts.append(time.perf_counter() - t0)
                assert p.returncode == 0, p.stderr
                line = p.stdout.split()
                assert line[0] == "serving" and int(line[1]) == len(keys), line
        finally:
            r.close()
            _stop_tree(sup)
        warm = statistics.median(starts)
        fill_s = fill["startup_s"] + fill["catch_up_s"]
        null_s = null["startup_s"] + null["catch_up_s"]
        FIGURES["warm start, Go service"] = {"spawn to serving, median": f"{warm * 1e3:.1f} ms",
                                             "runs": ", ".join(f"{s * 1e3:.1f}" for s in starts)}
        FIGURES["warm start, fill from the topic"] = {
            "shmcache run, spawn to ready": f"{fill_s:.2f} s ({fill_s / warm:.0f}x)",
            "null consumer, the topic read once": f"{null_s:.2f} s ({null_s / warm:.0f}x)",
            "topic": f"{N:,} entries, {sent.bytes / 2**20:.0f} MiB"}
        FIGURES["supervisor (2 workers)"] = {
            "sum of PSS": f"{_mib(sup_pss['Pss'])} (its segment's share {_mib(sup_pss['Pss_Shmem'])})",
            "spawn to ready": f"{ready_s:.2f} s"}
    finally:
        remove(kafka_admin, [name], caches)
