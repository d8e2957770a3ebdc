"""Kafka consume benchmark (issues "Kafka into the table" and 13 part 2): how fast
`shmcache run` fills a cache from a pre-filled topic, in each wire format, against a
consumer that does nothing (the broker's and client's limit) and one that writes the
same entries into Redis; and where the workers' time goes.

    SHMCACHE_CONSUME_N=2000000 .venv/bin/python -m pytest bench/test_consume.py -q --benchmark-enable -p no:cacheprovider -s
    CI=true .venv/bin/python -m pytest bench/test_consume.py -p no:cacheprovider     # smoke, N = 100,000

Four topics of 8 partitions hold the same N ADD entries (tests/lib/shmtest/bench/consume_topics.py):
v1 messages of 1024 entries keyed by their first hash (murmur2_random), v2 messages
of up to 1024 entries placed by v2_partition (a partition per bucket range), kv
(a message per entry) and proto (the upstream Teranode topic: a protobuf message per
entry, formats/proto.py). Every run reads a topic from the beginning:

- null: a confluent-kafka Consumer assign()ed to all 8 partitions of the v1 topic,
  consume(500) until every partition reaches its high watermark, counting entries
  from each message's count header (nothing decoded); null proto: the same over the
  proto topic, an entry a message, fetching as the workers do (fetch.queue.backoff.ms
  10 ms: the bound of a topic of a message per entry);
- shmcache: `python -m shmcache run --format F` with 1 or 2 workers as a subprocess on
  a fresh segment and consumer group, status() polled every 20 ms;
- full cache: v1 with 2 workers into a segment created first at 1/4 of the topic's
  records (FULL_SHARE), so that from the first quarter on nearly every add evicts: a
  cache's steady state, where the others only fill;
- redis: the null consumer plus wire.decode (the workers' decoder) and, per message,
  MSET of its ADDs and DEL of its DELETEs, 8 messages per pipeline(transaction=False),
  into a redis-server on 127.0.0.1 (skipped, with the reason, when redis-server is
  missing);
- interleaved: per round, null, v1, v2 and proto with 2 workers back to back (order
  rotating); the per-round ratios' medians are printed as notes.
- proto against v1: `shmcache run --format proto` with 1 and 2 workers over the same
  entries; the ratios to v1, to kv and to the null proto consumer say what bounds it.

entries/s counts from the first entry applied (shmcache: the first status poll in
which the workers' `adds` is > 0; the peers: their first message handled, asked
for with consume(num_messages=1)) to caught up (every partition at its high watermark), over the
entries applied after that first moment; the time before it (process start, group
join, spawning workers, first fetch) is reported as "startup". Over the same window,
the CPU cores each process kept busy (psutil), and from each worker's log line
(consumer/worker/profile.py) its loop's time by phase. Tests assert correctness
(every sampled key read back with its value, the entry count, no eviction, a clean
exit on SIGTERM; a full cache: evictions, and every sampled key it holds with its
value), never speed.

SHMCACHE_CONSUME_N sets N (else SHMCACHE_BENCH_N; default 5,000,000; 100,000 when CI=true);
SHMCACHE_CONSUME_SET="key=value,..." passes librdkafka settings to `shmcache run` (--set), to try them;
SHMCACHE_CONSUME_ROUNDS the runs per consumer with --benchmark-enable (default 3,
median reported; 1 run each otherwise).
"""

from __future__ import annotations

import io
import json
import os
import statistics
import sys
import time
import uuid
from pathlib import Path

import pytest

import shmcache
from shmcache.kafka import topics
from shmtest.bench import consume_profile as CP
from shmtest.bench import summary as S
from shmtest.bench.consume_runs import (N, PARTITIONS, RedisTarget, run_plain, run_shmcache,  # noqa: F401
                                        run_timeout)
from shmtest.bench.consume_topics import BATCH, Topic, produce_topic

# generous: producing N, and the slowest peer (Redis, ~0.3-1 M entries/s) per round
pytestmark = pytest.mark.timeout(600 + N // 2_000)


# -- results and the summary -----------------------------------------------------------------------

RESULTS: dict[str, dict] = {}  # row label -> figures
META: dict = {}
NOTES: list[str] = []
ROWS = [("null", "null consumer, v1 (no decode)"), ("shmcache-1w", "shmcache run v1, 1 worker"),
        ("shmcache-2w", "shmcache run v1, 2 workers"), ("v2-1w", "shmcache run v2, 1 worker"),
        ("v2-2w", "shmcache run v2, 2 workers"), ("kv-2w", "shmcache run kv, 2 workers"),
        ("null-proto", "null consumer, proto (no decode)"), ("proto-1w", "shmcache run proto, 1 worker"),
        ("proto-2w", "shmcache run proto, 2 workers"),
        ("full-2w", "shmcache run v1, 2 workers, full cache"), ("redis", "redis, v1 (decode + MSET)")]
FORMAT_OF = {"null": "v1", "redis": "v1", "shmcache-1w": "v1", "shmcache-2w": "v1", "v2-1w": "v2", "v2-2w": "v2",
             "kv-2w": "kv", "full-2w": "v1", "null-proto": "proto", "proto-1w": "proto", "proto-2w": "proto"}
BEST = "shmcache (best of 1/2 workers)"
RATIOS = [  # label, numerator, denominator, target (issue 13: 2 workers >= 0.8x null, v2 >= v1)
    ("shmcache v1 best / null consumer", BEST, "null", None),
    ("shmcache v1 1 worker / null consumer", "shmcache-1w", "null", None),
    ("shmcache v1 2 workers / null consumer", "shmcache-2w", "null", 0.8),
    ("shmcache v1 best / redis consumer", BEST, "redis", 5.0),
    ("shmcache v1 2 workers / 1 worker", "shmcache-2w", "shmcache-1w", None),
    ("v2 1 worker / v1 1 worker", "v2-1w", "shmcache-1w", 1.0),
    ("v2 2 workers / v1 2 workers", "v2-2w", "shmcache-2w", 1.0),
    ("kv 2 workers / v1 2 workers", "kv-2w", "shmcache-2w", None),
    ("proto 1 worker / v1 1 worker", "proto-1w", "shmcache-1w", None),
    ("proto 2 workers / v1 2 workers", "proto-2w", "shmcache-2w", None),
    ("proto 2 workers / kv 2 workers", "proto-2w", "kv-2w", None),
    ("proto 2 workers / null proto consumer", "proto-2w", "null-proto", None),
    ("v1 2 workers: full cache / filling", "full-2w", "shmcache-2w", None),
    ("v1 2 workers, full cache / null consumer", "full-2w", "null", None),
]


def _rate_of(key: str, which: str = "entries_per_s") -> float | None:
    if key == BEST:
        rates = [RESULTS[k][which] for k in ("shmcache-1w", "shmcache-2w") if k in RESULTS]
        return max(rates) if rates else None
    return RESULTS[key][which] if key in RESULTS else None


def render() -> str:
    if not RESULTS and not META.get("interleaved"):
        return ""
    from rich import box
    from rich.console import Console
    from rich.table import Table

    buf = io.StringIO()
    con = Console(file=buf, width=140, force_terminal=False, color_system=None)
    tops = META.get("topics", {})
    shape = "; ".join(f"{f}: {t['messages']:,} messages, {t['topic_mb']:.0f} MB" for f, t in tops.items())
    title = (f"Kafka -> table: the same N={META['n']:,} entries per format ({shape}), {PARTITIONS} partitions, "
             f"{META.get('mode', '')}, {os.cpu_count()} CPUs\nentries/s from the first applied entry to caught up, "
             "higher is better")
    t = Table(title=title, title_justify="left", box=box.ASCII2)
    for c in ("consumer", "entries/s", "best round", "MB/s", "catch-up s", "startup s", "load avg", "note"):
        t.add_column(c, justify="left" if c in ("consumer", "note") else "right")
    for key, label in ROWS:
        r = RESULTS.get(key)
        if r is None:
            t.add_row(label, "-", "", "", "", "", "", "skipped" if key in META.get("skipped", {}) else "not run")
            continue
        per_entry = tops.get(FORMAT_OF[key], {}).get("bytes_per_entry", 0)
        t.add_row(label, S.fmt_rate(r["entries_per_s"]), S.fmt_rate(r["best_entries_per_s"]),
                  f"{r['entries_per_s'] * per_entry / 1e6:.0f}", f"{r['catch_up_s']:.2f}",
                  f"{r['startup_s']:.2f}", f"{r['load_avg']:.2f}", r.get("note", ""))
    con.print(t)
    t = Table(title="ratios (targets from the issues; never asserted)", title_justify="left", box=box.ASCII2)
    for c in ("ratio", "median rounds", "best rounds", "target", "met (median)"):
        t.add_column(c, justify="left" if c == "ratio" else "right")
    for label, num, den, target in RATIOS:
        want = "" if target is None else f">= {target:g}x"
        a, b = _rate_of(num), _rate_of(den)
        if a is None or b is None:
            t.add_row(label, "n/a", "", want, "")
            continue
        v = a / b
        best = _rate_of(num, "best_entries_per_s") / _rate_of(den, "best_entries_per_s")
        t.add_row(label, f"{v:.2f}x", f"{best:.2f}x", want, "" if target is None else ("yes" if v >= target else "NO"))
    con.print(t)
    _render_profile(con)
    for f, m in tops.items():
        con.print(f"producing the {f} topic: {m['encode_s']:.1f} s to generate and encode, {m['produce_s']:.1f} s to "
                  f"produce ({META['n'] / m['produce_s'] / 1e6:.2f} M entries/s)")
    con.print(f"load average (1 min) at start {META['load_avg_start']:.2f}, at end {os.getloadavg()[0]:.2f} "
              "(other processes skew the figures)")
    for note in NOTES:
        con.print(f"note: {note}")
    return buf.getvalue()


PROFILE_COLUMNS = [  # column, the cores entries it sums (tests/lib/shmtest/bench/consume_profile.py cpu_snapshot roles)
    ("workers py", ("workers main",)), ("workers rdkafka", ("workers threads",)),
    ("supervisor", ("supervisor main", "supervisor threads")), ("broker", ("broker main", "broker threads")),
    ("bench process", ("bench process main", "bench process threads"))]


def _render_profile(con) -> None:
    """Where the time went, for the median run of each consumer (tests/lib/shmtest/bench/consume_profile.py)."""
    from rich import box
    from rich.table import Table

    rows = [(key, RESULTS[key]["mid"]) for key, _ in ROWS if key in RESULTS]
    if not rows:
        return
    t = Table(title="where the time goes (median run): the workers' busy loop by phase (summed over workers), "
              "us per message; CPU cores busy from the first entry to caught up (workers py: their main "
              "threads; rdkafka: librdkafka's threads)", title_justify="left", box=box.ASCII2)
    for c in ("consumer", "fetch", "decode", "apply", "publish", "us/msg", *(c for c, _ in PROFILE_COLUMNS), "total"):
        t.add_column(c, justify="left" if c == "consumer" else "right")
    for key, r in rows:
        prof, cores = r.get("profile"), r.get("cores", {})
        if prof:
            sh = CP.phase_shares(prof)
            busy = sum(prof[p] for p in sh)
            phases = [f"{sh[p]:.0%}" for p in ("fetch", "decode", "apply", "publish")]
            per_msg = f"{busy / max(prof['messages'], 1) * 1e6:.0f}"
        else:
            phases, per_msg = [""] * 4, ""
        cols = [f"{sum(cores[k] for k in ks):.2f}" if all(k in cores for k in ks) else "" for _, ks in PROFILE_COLUMNS]
        t.add_row(key, *phases, per_msg, *cols, f"{sum(cores.values()):.2f}" if cores else "")
    con.print(t)


def save(directory: Path) -> Path | None:
    if not RESULTS or not META.get("enabled"):
        return None
    directory.mkdir(exist_ok=True)
    path = directory / f"consume-{time.strftime('%Y%m%d-%H%M%S')}.json"
    ratios = {}
    for label, num, den, _ in RATIOS:
        a, b = _rate_of(num), _rate_of(den)
        if a is not None and b is not None:
            ratios[label] = a / b
    path.write_text(json.dumps({"meta": {**META, "cpus": os.cpu_count(), "partitions": PARTITIONS, "batch": BATCH},
                                "results": RESULTS, "ratios": ratios, "notes": NOTES}, indent=1, default=str))
    return path


S.SUMMARIES.append(("shmcache Kafka consume benchmark summary", render, save))


# -- the topic -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def topic_of(kafka_broker, kafka_admin):
    """topic_of(fmt) -> the N entries as a topic in wire format fmt (tests/lib/shmtest/bench/consume_topics.py),
    made on first use, the same entries for every format; deleted at the end."""
    META.update(load_avg_start=os.getloadavg()[0], skipped={}, n=N)
    made: dict[str, Topic] = {}
    names: list[str] = []

    def get(fmt: str) -> Topic:
        if fmt not in made:
            name = f"bench-consume-{fmt}-{uuid.uuid4().hex[:12]}"
            names.append(name)
            topics.create_topic(kafka_broker.bootstrap, name, PARTITIONS)  # and waits for its leaders
            made[fmt] = produce_topic(kafka_broker.bootstrap, name, fmt, N, PARTITIONS, run_timeout())
            META.setdefault("topics", {})[fmt] = made[fmt].meta
        return made[fmt]

    try:
        yield get
    finally:
        if names:
            for fut in kafka_admin.delete_topics(names, operation_timeout=10).values():
                try:
                    fut.result(timeout=15)
                except Exception:
                    pass
        # a segment of ours left behind by a failed run (each run destroys its own)
        for cache in shmcache.list_caches():
            if cache.startswith(f"bench-{os.getpid()}-consume"):
                shmcache.destroy(cache)


@pytest.fixture(scope="module")
def log_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("consume")


# -- one run of each consumer ---------------------------------------------------------------------------


# -- the tests ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def redis_target():
    try:
        target = RedisTarget()
    except Exception as e:  # redis-server not installed, redis-py missing, server not starting
        target, reason = None, f"redis peer skipped: {e}"
        print(reason, file=sys.stderr)
        NOTES.append(reason)
        META.setdefault("skipped", {})["redis"] = reason
    if target is None:
        yield reason
        return
    try:
        yield target
    finally:
        target.close()


def measure(benchmark, key: str, one_run) -> None:
    """Run one_run() once (benchmarks disabled) or SHMCACHE_CONSUME_ROUNDS times
    through benchmark.pedantic; record the median and best entries/s of the runs."""
    rounds = consume_rounds(benchmark)
    META.update(enabled=benchmark.enabled,
                mode=f"median of {rounds} runs" if benchmark.enabled else "1 run each (benchmarks disabled)")
    runs: list[dict] = []
    load = os.getloadavg()[0]
    benchmark.pedantic(lambda: runs.append(one_run(len(runs))), rounds=rounds, iterations=1)
    rates = [r["entries_per_s"] for r in runs]
    med = statistics.median(rates)
    mid = min(runs, key=lambda r: abs(r["entries_per_s"] - med))
    RESULTS[key] = {"entries_per_s": med, "best_entries_per_s": max(rates), "catch_up_s": mid["catch_up_s"],
                    "startup_s": statistics.median(r["startup_s"] for r in runs), "load_avg": load,
                    "runs": runs, "mid": mid}
    benchmark.extra_info.update(entries_per_s=med, best_entries_per_s=max(rates), n=N, runs=runs)
    print(f"{key}: {S.fmt_rate(med)} entries/s (runs: {', '.join(S.fmt_rate(x) for x in rates)}), "
          f"startup {RESULTS[key]['startup_s']:.2f} s", file=sys.stderr)


def consume_rounds(benchmark) -> int:
    return int(os.environ.get("SHMCACHE_CONSUME_ROUNDS", "3")) if benchmark.enabled else 1


SHMCACHE_RUNS = {"shmcache-1w": ("v1", 1), "shmcache-2w": ("v1", 2), "v2-1w": ("v2", 1), "v2-2w": ("v2", 2),
                 "kv-2w": ("kv", 2), "full-2w": ("v1", 2), "proto-1w": ("proto", 1), "proto-2w": ("proto", 2)}


def test_null_consumer(benchmark, kafka_broker, topic_of):
    measure(benchmark, "null", lambda i: run_plain(topic_of("v1"), kafka_broker))


# librdkafka postpones a partition's next fetch by fetch.queue.backoff.ms (1 s by default) once its
# local queue holds queued.min.messages (100,000): a topic of a message per entry reaches that
# count, and the workers fetch with 10 ms for it (consumer/config.py consumer_settings), so the
# bound of such a topic is measured with their setting
PER_ENTRY_FETCH = {"fetch.queue.backoff.ms": 10}


def test_null_proto_consumer(benchmark, kafka_broker, topic_of):
    measure(benchmark, "null-proto", lambda i: run_plain(topic_of("proto"), kafka_broker, settings=PER_ENTRY_FETCH))


@pytest.mark.parametrize("key", list(SHMCACHE_RUNS))
def test_shmcache(benchmark, kafka_broker, topic_of, log_dir, key):
    fmt, workers = SHMCACHE_RUNS[key]
    topic = topic_of(fmt)
    measure(benchmark, key, lambda i: run_shmcache(topic, kafka_broker, workers, log_dir, f"{key}-{i}",
                                                   full=key.startswith("full")))
    RESULTS[key]["note"] = f"stop on SIGTERM {statistics.median(r['stop_s'] for r in RESULTS[key]['runs']):.1f} s"


def test_redis_consumer(benchmark, kafka_broker, topic_of, redis_target):
    if isinstance(redis_target, str):
        pytest.skip(redis_target)
    measure(benchmark, "redis", lambda i: run_plain(topic_of("v1"), kafka_broker, redis_target))


def test_ratios_interleaved(benchmark, kafka_broker, topic_of, log_dir):
    """The issue's ratios a second way: each round runs the null consumer, v1, v2 and proto
    with 2 workers back to back (the order rotating), and keeps each round's ratios, so a
    machine whose speed drifts over minutes weighs on both sides of a ratio alike."""
    order = ["null", "shmcache-2w", "v2-2w", "proto-2w"]
    per_round: dict[str, list[float]] = {"v1 2 workers / null": [], "v2 2 workers / v1 2 workers": [],
                                         "proto 2 workers / v1 2 workers": []}
    benchmark.pedantic(lambda: _interleave(benchmark, topic_of, kafka_broker, log_dir, order, per_round),
                       rounds=1, iterations=1)
    META["interleaved"] = per_round
    for label, vals in per_round.items():
        NOTES.append(f"interleaved, {label}: median {statistics.median(vals):.2f}x over {len(vals)} rounds "
                     f"({', '.join(f'{v:.2f}' for v in vals)})")


def _interleave(benchmark, topic_of, kafka_broker, log_dir, order, per_round) -> None:
    for i in range(consume_rounds(benchmark)):
        rates = {}
        for key in order[i % len(order):] + order[:i % len(order)]:
            if key == "null":
                rates[key] = run_plain(topic_of("v1"), kafka_broker)["entries_per_s"]
            else:
                fmt, workers = SHMCACHE_RUNS[key]
                rates[key] = run_shmcache(topic_of(fmt), kafka_broker, workers, log_dir, f"il-{key}-{i}")["entries_per_s"]
        per_round["v1 2 workers / null"].append(rates["shmcache-2w"] / rates["null"])
        per_round["v2 2 workers / v1 2 workers"].append(rates["v2-2w"] / rates["shmcache-2w"])
        per_round["proto 2 workers / v1 2 workers"].append(rates["proto-2w"] / rates["shmcache-2w"])
        print(f"interleaved round {i}: " + ", ".join(f"{k} {S.fmt_rate(v)}" for k, v in rates.items()), file=sys.stderr)
