"""The Prometheus endpoint (consumer/supervisor/metrics.py, `shmcache run --metrics-port`).

- scraped during a real run (broker, supervisor, workers, a reader), its figures
  are the very ones `stats()` and `status()` read from the segment;
- it listens on 127.0.0.1 only, says where in the segment, and is gone after SIGTERM;
- a port already taken stops the supervisor at once with an error naming it;
- the collector alone, on a plain cache: the same figures, nothing for a cache
  that is gone, and the new segment when one is re-created under the name.
"""

import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import numpy as np
import psutil
import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

import shmcache
from shmcache.produce import loadgen
from shmcache.dev.local_kafka import free_ports
from shmcache.consumer.supervisor.metrics import CacheCollector

from shmtest.supervisors import REPO, harness  # noqa: F401
from shmtest.waits import poll_until

PARTITIONS = 4


def scrape(port: int) -> dict:
    """{(sample name, ((label, value), ...)): value} from the endpoint."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    out = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out[(s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k != "cache")))] = s.value
    return out


def test_scrape_during_a_run_agrees_with_stats_and_status(harness, kafka_topic, tmp_path):
    topic = kafka_topic(PARTITIONS)
    name = harness.cache_name("metrics")
    port = free_ports(1)[0]
    sup = harness.supervisor(name, topic, harness.group("metrics"), config={"metrics_port": port})
    r = harness.attach(name, sup=sup)
    poll_until(lambda: r.status()["metrics_port"] == port, 30, "the metrics port in the segment")
    listening = [c.laddr for c in psutil.Process(sup.pid).net_connections("tcp") if c.status == psutil.CONN_LISTEN]
    assert (("127.0.0.1", port) in [tuple(a) for a in listening]), listening  # loopback only

    scraped_mid_run = []

    def progress(st):
        if not scraped_mid_run and st.entries >= st.total // 2:
            scraped_mid_run.append((st.entries, scrape(port)))

    path = str(tmp_path / "truth.parquet")
    sent = loadgen.produce(loadgen.LoadConfig(bootstrap=harness.bootstrap, topic=topic, count=30_000, batch_size=512,
                                              seed=2, ground_truth=path), progress)
    mid_entries, mid = scraped_mid_run[0]
    mid_applied = mid[("shmcache_applied_entries_total", (("action", "add"),))] + \
        mid[("shmcache_applied_entries_total", (("action", "delete"),))]
    assert 0 <= mid_applied <= mid_entries

    ends = sent.end_offsets

    def settled():  # everything applied and committed: the figures stop moving
        st = r.status()
        return all(p["applied"] == p["committed"] == ends.get(p["partition"], 0) for p in st["assigned"]) \
            and len(st["assigned"]) == PARTITIONS
    poll_until(settled, 60, lambda: f"applied and committed to reach {ends}: {r.status()['assigned']}")

    # a reader looks up present and absent hashes: its counters reach the endpoint through the companion
    keys = loadgen.hashes_of(loadgen.final_state(path)["tx_hash"])[:3000]
    absent = np.random.default_rng(0).integers(0, 256, (500, 32), np.uint8)
    with shmcache.attach(name) as reader:
        found = int(reader.get_many_packed(keys).found.sum()) + int(reader.get_many_packed(absent).found.sum())

    m = scrape(port)
    s, st = r.stats(), r.status()
    ws = st["workers"]

    def one(metric, **labels):
        return m[(metric, tuple(sorted((k, str(v)) for k, v in labels.items())))]

    assert one("shmcache_applied_entries_total", action="add") == sum(w["adds"] for w in ws) == sent.adds
    assert one("shmcache_applied_entries_total", action="delete") == sum(w["deletes"] for w in ws) == sent.deletes
    assert one("shmcache_applied_messages_total") == sum(w["messages"] for w in ws) == sent.messages
    assert one("shmcache_malformed_messages_total") == 0
    assert one("shmcache_unknown_action_entries_total") == 0
    for p in st["assigned"]:
        part = p["partition"]
        assert one("shmcache_partition_lag_messages", partition=part) == p["lag"] == 0
        assert one("shmcache_partition_behind_seconds", partition=part) == p["behind_s"] == 0  # no lag
        assert one("shmcache_partition_caught_up", partition=part) == 1
        assert one("shmcache_partition_applied_offset", partition=part) == p["applied"] == ends[part]
        assert one("shmcache_partition_committed_offset", partition=part) == p["committed"] == ends[part]
    assert one("shmcache_ready") == 1
    assert one("shmcache_commits_total") == st["commits"] >= 1
    assert one("shmcache_commit_failures_total") == st["commit_failures"] == 0
    assert one("shmcache_rebalances_total") == st["rebalances"] >= 1
    assert one("shmcache_partitions_lost_total") == 0
    assert one("shmcache_lookup_failing_seconds") == 0  # every look-up answered
    for w in ws:
        assert one("shmcache_worker_up", worker=w["worker"]) == 1
        assert one("shmcache_worker_restarts_total", worker=w["worker"]) == w["starts"] - 1 == 0
    assert one("shmcache_table_entries") == s["entries"] == sent.adds - sent.deletes
    assert one("shmcache_table_bytes") == s["bytes_used"] > 0
    assert one("shmcache_table_capacity_bytes") == s["capacity_bytes"]
    assert one("shmcache_segment_bytes") == s["memory"]
    assert one("shmcache_evictions_total") == s["evictions"] == 0
    assert one("shmcache_lock_takeovers_total") == s["lock_takeovers"] == 0
    assert one("shmcache_reader_hits_total") == s["reader_hits"] == found
    assert one("shmcache_reader_misses_total") == s["reader_misses"] == 3500 - found
    assert one("shmcache_readers") == s["readers"]
    assert abs(one("shmcache_supervisor_start_time_seconds") - st["supervisor_started_s"]) < 1e-3
    assert ("process_cpu_seconds_total", ()) in m  # the supervisor process' own metrics

    # `top` renders the same run without a terminal: plain text, the same figures
    p = subprocess.run([sys.executable, "-m", "shmcache", "top", name, "--once", "--interval", "0.2"], cwd=REPO,
                       capture_output=True, text=True, timeout=60, env={**os.environ, "CI": "true"})
    assert p.returncode == 0, p.stderr
    assert "\x1b[" not in p.stdout
    assert f"supervisor pid {sup.pid}" in p.stdout and "ready" in p.stdout
    assert f"{s['entries']:,}" in p.stdout and f"{sent.adds:,}" in p.stdout

    assert sup.terminate() == 0
    assert r.status()["metrics_port"] is None
    with pytest.raises(urllib.error.URLError):
        scrape(port)


def test_a_taken_metrics_port_stops_the_supervisor_naming_it(harness, kafka_topic):
    topic = kafka_topic(1)
    name = harness.cache_name("port")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        sup = harness.supervisor(name, topic, harness.group("port"), config={"metrics_port": port})
        code = sup.wait(60)
    assert code == 2, sup.log_text()[-2000:]
    assert f"metrics endpoint 127.0.0.1:{port}" in sup.log_text()


def test_collector_reads_a_plain_cache_and_follows_it_across_re_creation():
    name = f"t-metrics-{os.getpid()}-{time.monotonic_ns() % 10**9}"
    registry = CollectorRegistry(auto_describe=False)
    collector = CacheCollector(name)
    registry.register(collector)
    try:
        assert generate_latest(registry) == b""  # no cache, no samples
        keys = np.random.default_rng(1).integers(0, 256, (2000, 32), np.uint8)
        with shmcache.create(name, memory="64MiB") as w:
            w.set_many(keys, [b"v" * 70] * len(keys))
            w.delete_many(keys[:500])
            with shmcache.attach(name) as r:
                r.get_many_packed(keys)
                s = r.stats()
            text = generate_latest(registry).decode()
            got = {smp.name: smp.value for fam in text_string_to_metric_families(text) for smp in fam.samples}
            assert got["shmcache_table_entries"] == s["entries"] == 1500
            assert got["shmcache_table_bytes"] == s["bytes_used"]
            assert got["shmcache_reader_hits_total"] == s["reader_hits"] == 1500
            assert got["shmcache_reader_misses_total"] == s["reader_misses"] == 500
            assert got["shmcache_evictions_total"] == 0 and got["shmcache_ready"] == 0
            assert 'cache="%s"' % name in text
        shmcache.destroy(name)
        assert generate_latest(registry) == b""  # gone: nothing, and the old mapping let go
        with shmcache.create(name, memory="64MiB"):
            text = generate_latest(registry).decode()
        got = {smp.name: smp.value for fam in text_string_to_metric_families(text) for smp in fam.samples}
        assert got["shmcache_table_entries"] == 0 and got["shmcache_reader_hits_total"] == 0
    finally:
        collector.close()
        try:
            shmcache.destroy(name)
        except FileNotFoundError:
            pass


def test_metrics_port_is_validated():
    from shmcache.consumer.config import RunConfig

    with pytest.raises(ValueError, match="metrics_port"):
        RunConfig(name="x", bootstrap="b", topic="t", metrics_port=70000)


def test_docs_list_every_metric_the_collector_yields():
    """docs/metrics.md is the metrics' reference (consumer/supervisor/metrics.py points there): each
    sample a cache yields (a cache with no supervisor: all but the supervisor's own) is in it."""
    name = f"t-metrics-doc-{os.getpid()}-{time.monotonic_ns() % 10**9}"
    registry = CollectorRegistry(auto_describe=False)
    collector = CacheCollector(name)
    registry.register(collector)
    w = shmcache.create(name, memory="64MiB")
    try:
        text = generate_latest(registry).decode()
        samples = {smp.name for fam in text_string_to_metric_families(text) for smp in fam.samples}
        assert len(samples) > 20
        doc = (REPO / "docs" / "metrics.md").read_text()
        assert sorted(s for s in samples if f"`{s}`" not in doc) == []
    finally:
        collector.close()
        w.close()
        shmcache.destroy(name)
