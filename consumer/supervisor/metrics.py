"""Prometheus metrics of one cache, read from shared memory at scrape time.

`shmcache run --metrics-port N` serves them on http://127.0.0.1:N/metrics; the
metrics, their types and labels are listed in docs/metrics.md. Every figure is read
from the counters the processes already keep in the segment (the workers' rows, the
partition rows, the supervisor's header words, the bucket meta) and the readers'
companion segment, when Prometheus scrapes: nothing is counted twice and nothing is
kept in this process. Every sample carries a `cache` label, so one Prometheus can
scrape several caches' supervisors.

Not guaranteed: a scrape is a snapshot taken without locks, so one partition's
row may be a moment older than another's. The worker and supervisor counters
restart from zero when a supervisor starts (Prometheus' rate() treats that as a
counter reset); the table and reader counters live as long as the segment.
"""

from __future__ import annotations

import logging
import threading

from shmcache.engine.reattach import Followed
from shmcache.errors import CacheNotReadyError, ShmcacheError

log = logging.getLogger("shmcache.metrics")

PREFIX = "shmcache_"


class CacheCollector:
    """A prometheus-client collector for one cache: `collect()` reads the segment.

    It attaches read-only on the first scrape (and again if the cache was destroyed
    and re-created); a cache that does not exist, or (with `owner`, as a supervisor's
    endpoint has: its own user) belongs to another user, yields no samples."""

    def __init__(self, name: str, owner: int | str | None = None):
        self.name = name
        self._followed = Followed(name, owner)
        self._lock = threading.Lock()  # the HTTP server may run scrapes in parallel threads
        self._why = ""  # why the last attach failed, for /ready

    def _attach(self):
        try:
            r = self._followed.reader()
            self._why = "" if r is not None else f"cache {self.name!r} does not exist"
            return r
        except (OSError, ShmcacheError) as e:
            log.debug("metrics: cache %r not attachable: %s", self.name, e)
            self._why = str(e)
            return None

    def collect(self):
        from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily

        with self._lock:
            r = self._attach()
            if r is None:
                return
            s = r.stats()
            st = r.status()
            rs = r.control.resize()
        c = [self.name]

        def counter(name, doc, value, labels=(), rows=None):
            m = CounterMetricFamily(PREFIX + name, doc, labels=["cache", *labels])
            for lv, v in (rows if rows is not None else [((), value)]):
                m.add_metric([*c, *map(str, lv)], v)
            return m

        def gauge(name, doc, value, labels=(), rows=None):
            m = GaugeMetricFamily(PREFIX + name, doc, labels=["cache", *labels])
            for lv, v in (rows if rows is not None else [((), value)]):
                m.add_metric([*c, *map(str, lv)], v)
            return m

        ws = st["workers"]
        parts = st["assigned"]
        yield counter("applied_entries", "Entries applied to the table, by action.", None, ["action"],
                      [(("add",), sum(w["adds"] for w in ws)), (("delete",), sum(w["deletes"] for w in ws))])
        yield counter("applied_messages", "Kafka messages applied.", sum(w["messages"] for w in ws))
        yield counter("malformed_messages", "Messages with damage (the entries before it were applied).",
                      sum(w["malformed"] for w in ws))
        yield counter("unknown_action_entries", "Entries skipped for an unknown action.",
                      sum(w["unknown_actions"] for w in ws))
        yield gauge("partition_lag_messages", "High watermark of the partition's last fetch minus the applied offset.",
                    None, ["partition"],
                    [((p["partition"],), p["lag"]) for p in parts if p["lag"] is not None])
        yield gauge("partition_behind_seconds", "Seconds since the last message the partition applied was produced, "
                    "while it lags (0 without lag); absent when not known.", None, ["partition"],
                    [((p["partition"],), p["behind_s"]) for p in parts if p["behind_s"] is not None])
        yield gauge("partition_caught_up", "1 once the partition applied up to its high watermark at assignment.",
                    None, ["partition"], [((p["partition"],), int(p["caught_up"])) for p in parts])
        yield gauge("partition_applied_offset", "Next offset to apply: every message before it is in the table.",
                    None, ["partition"], [((p["partition"],), p["applied"]) for p in parts])
        yield gauge("partition_committed_offset", "Last offset committed to Kafka (-1: none yet).", None,
                    ["partition"], [((p["partition"],), p["committed"]) for p in parts])
        yield gauge("ready", "1 when every partition of the topic is assigned to this cache by a live supervisor "
                    "that reaches the broker, "
                    "and caught up, with no retention gap (or gaps accepted: run --accept-gaps).", int(st["ready"]))
        yield gauge("partitions_unassigned", "Partitions of the topic not assigned to this cache.",
                    len(st["unassigned"]))
        others = (st["group_members"] - 1) if st["group_members"] else len(st["group_others"])
        yield gauge("group_other_members", "Other members of this cache's consumer group (each holds partitions "
                    "this cache then lacks): should be 0.", max(0, others))
        yield counter("commits_deferred", "Periodic commits held back while the group rebalanced (retried after).",
                      st["commits_deferred"])
        if st["broker"] is not None:
            yield gauge("broker_up", "1 when the Kafka broker answers the supervisor, 0 while it waits for it.",
                        int(st["broker"] == "up"))
            yield gauge("broker_waiting_seconds", "Seconds the supervisor has been waiting for the broker (0: up).",
                        st["broker_waiting_s"] or 0.0)
        yield counter("commits", "Offset commits Kafka accepted.", st["commits"])
        yield counter("commit_failures", "Offset commits Kafka refused or that timed out.", st["commit_failures"])
        yield gauge("commit_pending_seconds", "Seconds the supervisor's offset commit has waited for Kafka's "
                    "answer (0: none waits).", st["commit_pending_s"] or 0.0)
        yield gauge("lookup_failing_seconds", "Seconds assigned partitions have waited for a look-up of where they "
                    "start that fails while the broker answers (0: none waits).", st["lookup_failing_s"] or 0.0)
        yield counter("rebalances", "Completed consumer-group rebalances.", st["rebalances"])
        yield counter("partitions_lost", "Partitions lost without a revoke.", st["partitions_lost"])
        yield gauge("worker_up", "1 while the worker process is alive.", None, ["worker"],
                    [((w["worker"],), int(w["alive"])) for w in ws])
        yield counter("worker_restarts", "Times a dead worker was started again.", None, ["worker"],
                      [((w["worker"],), max(0, w["starts"] - 1)) for w in ws])
        yield counter("worker_stale_kills", "Workers killed (and restarted) for a heartbeat older than "
                      "worker_heartbeat_timeout: hung or stopped.", st["stale_worker_kills"])
        yield counter("worker_start_timeout_kills", "Workers killed (and restarted) for not coming up within "
                      "worker_start_timeout: hung or stopped before they claimed their row.", st["start_timeout_kills"])
        yield gauge("table_entries", "Live entries in the table.", s["entries"])
        yield gauge("table_bytes", "Ring bytes held by live records.", s["bytes_used"])
        yield gauge("table_capacity_bytes", "Ring bytes in all buckets.", s["capacity_bytes"])
        yield gauge("segment_bytes", "Size of the shared-memory segment.", s["memory"])
        yield counter("evictions", "Live records overwritten to make room.", s["evictions"])
        yield counter("resizes", "Online resizes done (shmcache resize, or growing up to run --memory-max).",
                      rs["resizes"])
        if rs["memory_max"]:
            yield gauge("segment_max_bytes", "The size up to which the supervisor grows the cache by itself "
                        "(run --memory-max).", rs["memory_max"])
        if rs["last_resize"] is not None:
            yield gauge("last_resize_pause_seconds", "How long the workers applied nothing during the last online "
                        "resize.", rs["last_resize"]["pause_s"])
        yield counter("lock_takeovers", "Bucket locks taken over from a dead writer.", s["lock_takeovers"])
        yield counter("corruptions", "Damaged bucket states met in the segment: by writers (each bucket then "
                      "rebuilt) and by readers (each a miss).", s["corruptions"])
        yield counter("reader_hits", "Lookups that found their key, summed over reader processes.", s["reader_hits"])
        yield counter("reader_misses", "Lookups that did not, summed over reader processes.", s["reader_misses"])
        yield gauge("readers", "Reader processes attached now (that have looked up at least once).", s["readers"])
        from shmcache.consumer.supervisor import snapshot_policy

        yield from snapshot_policy.metric_families(st, gauge, counter)
        if st["supervisor_started_s"]:
            yield gauge("supervisor_start_time_seconds", "Unix time the current supervisor started.",
                        st["supervisor_started_s"])

    def readiness(self, max_lag: int | None = None, max_behind: float | None = None) -> tuple[bool, str]:
        """(True, why) when wait_ready (with the bound, if given) would return now, else (False,
        why): for GET /ready."""
        with self._lock:
            r = self._attach()
            if r is None:
                return False, self._why
            try:
                r.wait_ready(timeout=0, max_lag=max_lag, max_behind=max_behind)
            except CacheNotReadyError as e:
                return False, str(e)
        return True, f"cache {self.name!r} ready"

    def close(self) -> None:
        with self._lock:
            self._followed.close()


class MetricsServer:
    """The HTTP endpoint: /metrics with this cache's collector and the process' own metrics,
    and /ready (consumer/supervisor/http_endpoint.py)."""

    def __init__(self, name: str, port: int, host: str = "127.0.0.1", owner: int | str | None = None):
        from prometheus_client import CollectorRegistry, ProcessCollector

        from shmcache.consumer.supervisor import http_endpoint

        self.collector = CacheCollector(name, owner)
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(self.collector)
        ProcessCollector(registry=self.registry)  # process_cpu_seconds_total etc. of the supervisor
        try:
            self._server, self._thread = http_endpoint.start(self.collector, self.registry, host, port)
        except OSError as e:
            self.collector.close()
            raise OSError(e.errno, f"metrics endpoint {host}:{port}: {e.strerror}") from None
        self.host = host
        self.port = self._server.server_port

    def close(self) -> None:
        """Stop serving and let go of the segment; safe to call twice."""
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._thread.join(5)
            self._server = None
            self.collector.close()

    _server = None
