"""`shmcache produce`: the load generator (produce/loadgen.py) with a progress bar."""

from __future__ import annotations

import time

from shmcache.cli.args import key_values
from shmcache.cli.progress import ProgressLine
from shmcache.formats import registry as wire_formats
from shmcache.formats.proto import HASH_FORMS

HELP = "load generator: Teranode-shaped txmeta to a Kafka topic"


def add_arguments(pr) -> None:
    pr.add_argument("--bootstrap", required=True, help="Kafka bootstrap servers, host:port[,host:port]")
    pr.add_argument("--topic", required=True)
    pr.add_argument("--count", type=int, default=1_000_000, help="entries to send (default 1,000,000)")
    pr.add_argument("--format", choices=wire_formats.NAMES, default="v1",
                    help="wire format (default v1; kv: a message per entry, keyed by its hash; proto: Teranode's "
                         "protobuf message per entry, keyed by its txHash)")
    pr.add_argument("--proto-hash", choices=HASH_FORMS, default="raw",
                    help="--format proto: txHash as 32 raw bytes, or as hex in chainhash's byte order (default raw)")
    pr.add_argument("--rate", type=float, default=0.0, help="entries/s (default 0: as fast as it can)")
    pr.add_argument("--batch-size", type=int, default=1024, help="entries per batch, at most (default 1024)")
    pr.add_argument("--linger", type=float, default=0.01,
                    help="seconds a partial batch waits under --rate (default 0.01)")
    pr.add_argument("--delete-share", type=float, default=0.1, help="share of DELETEs of earlier hashes (default 0.1)")
    pr.add_argument("--create-topic", action="store_true", help="create the topic (replication 1) if missing")
    pr.add_argument("--partitions", type=int, default=8, help="partitions of a topic it creates (default 8)")
    pr.add_argument("--ground-truth", metavar="PATH", help="write every entry sent to this Parquet file")
    pr.add_argument("--seed", type=int, help="random seed (default: fresh)")
    pr.add_argument("--broker-wait", type=float, default=15.0, metavar="SECONDS",
                    help="how long to wait for the broker's first answer (default 15)")
    pr.add_argument("--set", action="append", metavar="KEY=VALUE", help="a librdkafka producer setting, repeatable")


def _progress(console, topic: str, total: int) -> ProgressLine:
    from rich.progress import BarColumn, TextColumn, TimeElapsedColumn

    return ProgressLine(console, (TextColumn(f"producing to {topic}"), BarColumn(),
                                  TextColumn("{task.completed:,}/{task.total:,} entries, {task.fields[rate]:,.0f}/s, "
                                             "{task.fields[acked]:,}/{task.fields[messages]:,} messages acknowledged"),
                                  TimeElapsedColumn()), total, rate=0.0, acked=0, messages=0)


def run(a) -> int:
    """`shmcache produce`: progress while sending, then a summary line."""
    from rich.console import Console

    from shmcache.produce.loadgen import LoadConfig, LoadStats, produce

    settings = key_values(a.set, "shmcache produce: --set", "a librdkafka setting")
    cfg = LoadConfig(bootstrap=a.bootstrap, topic=a.topic, count=a.count, format=a.format,
                     proto_hash=a.proto_hash, rate=a.rate,
                     batch_size=a.batch_size, linger=a.linger, delete_share=a.delete_share, seed=a.seed,
                     create_topic=a.create_topic, partitions=a.partitions, ground_truth=a.ground_truth,
                     settings=settings, broker_wait=a.broker_wait)
    console = Console(stderr=True)
    with _progress(console, a.topic, cfg.count) as line:
        def progress(st: LoadStats) -> None:
            rate = st.entries / max(time.monotonic() - st.started, 1e-9)
            line.update(lambda: f"producing to {a.topic}: {st.entries:,}/{st.total:,} entries, {rate:,.0f}/s, "
                                f"{st.delivered:,}/{st.messages:,} messages acknowledged",
                        completed=st.entries, rate=rate, acked=st.delivered, messages=st.messages)
        st = produce(cfg, progress)
    mb = st.bytes / 1e6
    shape = f"proto ({cfg.proto_hash} txHash)" if cfg.format == "proto" else cfg.format
    print(f"sent {st.entries:,} entries ({st.adds:,} ADD, {st.deletes:,} DELETE) in {st.messages:,} {shape} "
          f"messages to {cfg.topic!r} ({st.partitions} partitions) in {st.seconds:.1f} s: "
          f"{st.entries / max(st.seconds, 1e-9):,.0f} entries/s, {mb:,.1f} MB; every message acknowledged")
    if st.ground_truth:
        print(f"ground truth: {st.ground_truth} ({st.entries:,} rows; the last row per tx_hash wins)")
    return 0
