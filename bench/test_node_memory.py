"""A Teranode node's memory counted whole (issue 55): everything one shared cache costs, the
`shmcache run` daemon with all its processes (supervisor, fork server, resource tracker, 2
workers) and its segment, plus N Go services attached to it (N = 1, 2, 4), against N
services each holding a private VictoriaMetrics/fastcache of the same entries, as Teranode's
txmetacache does; the sum of PSS (/proc/PID/smaps_rollup) of every process, and where the
two cross.

    SHMCACHE_BENCH_N=1000000 .venv/bin/python -m pytest bench/test_node_memory.py -p no:cacheprovider -s
    SHMCACHE_BENCH_N=10000000 .venv/bin/python -m pytest bench/test_node_memory.py -p no:cacheprovider -s

The entries are SHMCACHE_BENCH_N Teranode-shaped ones (the load generator's, 61-141 byte
values), sent to the real broker and applied by the daemon; the segment is as big as
`shmcache size` says for them (docs/operators.md, "How much memory"); each fastcache is
filled with the very values the cache holds. A service looks every entry up before it is
measured, and so does each fastcache process; all N of a kind are alive when measured.

Reported: the daemon's PSS (and that of it which is not its share of the segment, the
figure the issue bounds at 120 MiB for 2 workers), the sum for each N both ways, the
cost of one more service both ways, and the N from which the shared cache takes less.
Asserted: every process found every entry; never the sizes (printed).
"""

from __future__ import annotations

import os
import sys
import uuid

import numpy as np
import psutil
import pytest

from shmtest.bench import peers as P
from shmtest.bench.node import GO, Procs, build_program, mib, remove, sum_pss, supervisor, stop_tree, tree_pss
import shmcache

N = P.bench_n()
COUNTS = (1, 2, 4)


@pytest.fixture(scope="module")
def program(tmp_path_factory) -> str:
    if GO is None:
        pytest.skip("go is not installed: go/bench/teranodebench is not built")
    return build_program(tmp_path_factory.mktemp("teranodebench"))


def _entries(cache: str, keys: np.ndarray, d) -> None:
    """The cache's values of `keys`, written for the Go side as teranodebench reads them."""
    lens, data = [], []
    with shmcache.attach(cache) as r:
        for i in range(0, len(keys), 100_000):
            got = r.get_many_packed(keys[i:i + 100_000])
            assert got.found.all()
            lens.append(np.diff(got.offsets))
            data.append(got.data[:got.offsets[-1]])
    offsets = np.concatenate([[0], np.cumsum(np.concatenate(lens))]).astype(np.int64)
    keys.tofile(d / "keys.bin")
    offsets.tofile(d / "offsets.bin")
    np.concatenate(data).tofile(d / "values.bin")


def test_node_memory(program, kafka_broker, kafka_admin, tmp_path):
    from shmcache.engine import sizing
    from shmcache.kafka import topics
    from shmcache.produce import loadgen

    topic = f"bench-node-{uuid.uuid4().hex[:12]}"
    cache = f"bench-{os.getpid()}-node"
    topics.create_topic(kafka_broker.bootstrap, topic, 4)
    procs = Procs()
    sup = r = None
    try:
        truth = str(tmp_path / "truth.parquet")
        loadgen.produce(loadgen.LoadConfig(bootstrap=kafka_broker.bootstrap, topic=topic, count=N, format="v1",
                                           delete_share=0.0, seed=46, ground_truth=truth))
        keys = loadgen.hashes_of(loadgen.final_state(truth)["tx_hash"])
        plan = sizing.memory_for(len(keys), 141)  # the largest value the load generator makes
        sup, r, _ = supervisor(cache, topic, kafka_broker.bootstrap, tmp_path / "sup.log", plan.memory)
        assert r.stats()["entries"] == len(keys)
        r.close()
        r = None
        _entries(cache, keys, tmp_path)
        daemon = tree_pss(sup.pid)
        kids = len(psutil.Process(sup.pid).children(recursive=True))
        shared, private = {}, {}
        attach = [program, "attach", cache, str(tmp_path / "keys.bin")]
        for n in COUNTS:
            while len(procs.procs) < n:
                _, line = procs.start(attach)
                assert line == ["ready", str(len(keys))], line
            shared[n] = {"daemon": tree_pss(sup.pid), "services": sum_pss(p.pid for p in procs.procs)}
        procs.stop()
        fill = [program, "fastcache", *(str(tmp_path / f) for f in ("keys.bin", "offsets.bin", "values.bin"))]
        for n in COUNTS:
            while len(procs.procs) < n:
                _, line = procs.start(fill)
                assert line == ["ready", str(len(keys))], line
            private[n] = sum_pss(p.pid for p in procs.procs)
        procs.stop()
    finally:
        procs.stop()
        if r is not None:
            r.close()
        if sup is not None:
            stop_tree(sup)
        remove(kafka_admin, [topic], [cache])

    total = {n: shared[n]["daemon"]["Pss"] + shared[n]["services"]["Pss"] for n in COUNTS}
    each_shared = (total[4] - total[1]) / 3  # one more service
    each_private = (private[4]["Pss"] - private[1]["Pss"]) / 3
    base = total[1] - each_shared  # the daemon and its segment, with no service
    cross = base / (each_private - each_shared) if each_private > each_shared else float("inf")
    lines = [f"node memory (N={N:,} entries, load average {os.getloadavg()[0]:.1f}), sum of PSS:",
             f"  the daemon alone ({kids} processes under the supervisor): {mib(daemon['Pss'])}, of it "
             f"{mib(daemon['Pss'] - daemon.get('Pss_Shmem', 0))} not the segment "
             f"(anon {mib(daemon.get('Pss_Anon', 0))}, files {mib(daemon.get('Pss_File', 0))}); "
             f"the segment {mib(plan.geometry.size)} (--memory by `shmcache size`)"]
    for n in COUNTS:
        lines.append(f"  {n} service{'s' if n > 1 else ' '}: shared {mib(total[n])} (daemon "
                     f"{mib(shared[n]['daemon']['Pss'])} + services {mib(shared[n]['services']['Pss'])}), "
                     f"private fastcaches {mib(private[n]['Pss'])}: {private[n]['Pss'] / total[n]:.2f}x")
    lines.append(f"  one more service: shared {mib(each_shared)}, private {mib(each_private)}; the shared cache "
                 f"takes less from {cross:.2f} services on" + (" (never)" if cross == float("inf") else ""))
    print("\n" + "\n".join(lines), file=sys.stderr)
