"""The `shmcache` command: create, inspect and remove caches; run the demo."""

from __future__ import annotations

import argparse
import json
import sys
from typing import NoReturn

from rich.console import Console
from rich.table import Table

import shmcache
from shmcache.engine.layout import format_bytes


def usage_error(message: str) -> NoReturn:
    """A user's mistake at the command line: one line on stderr, exit 2, no traceback."""
    print(message, file=sys.stderr)
    raise SystemExit(2)


class _Parser(argparse.ArgumentParser):
    """argparse, with its errors on one line (exit 2) instead of a usage block."""

    def error(self, message: str) -> NoReturn:
        usage_error(f"{self.prog}: {message} (see {self.prog} --help)")


def _hex(text: str, what: str) -> bytes:
    try:
        return bytes.fromhex(text)
    except ValueError:
        usage_error(f"shmcache: {what} {text!r} is not hex")


def _mode(text: str) -> int:
    """--mode: octal digits, as chmod takes them."""
    try:
        return int(text, 8)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an octal file mode (e.g. 600, 640)") from None


def key_values(items: list[str] | None, flag: str, what: str) -> dict[str, str]:
    """Repeated `--set KEY=VALUE` style options as a dict; a usage error (exit 2) naming the flag otherwise."""
    out = {}
    for item in items or []:
        k, sep, v = item.partition("=")
        if not sep:
            usage_error(f"{flag} {item!r}: expected KEY=VALUE ({what})")
        out[k] = v
    return out


def cmd_create(a) -> int:
    with shmcache.create(a.name, memory=a.memory, key_size=a.key_size, max_value=a.max_value,
                         mode=a.mode, exist_ok=a.exist_ok) as w:
        g = w.geometry
        print(f"{a.name}: {format_bytes(g.size)}, key {g.key_size} B, values up to {g.max_value} B, "
              f"{g.slots} slots and {g.ring} ring bytes per bucket")
    return 0


def cmd_stats(a) -> int:
    with shmcache.attach(a.name) as r:
        s = r.stats()
    for k in ("hits", "misses", "read_retries"):  # this command's own lookups: none
        s.pop(k)
    if a.json:
        print(json.dumps(s))
        return 0
    table = Table(title=f"cache {a.name}", show_header=False)
    for k, v in s.items():
        shown = format_bytes(v) if k in ("bytes_used", "capacity_bytes", "memory") else f"{v:,}" if isinstance(v, int) else str(v)
        table.add_row(k, shown)
    Console().print(table)
    return 0


def cmd_get(a) -> int:
    with shmcache.attach(a.name) as r:
        v = r.get(_hex(a.key, "key"))
    if v is None:
        print("(not found)", file=sys.stderr)
        return 1
    print(v.hex())
    return 0


def cmd_set(a) -> int:
    with shmcache.open(a.name) as w:
        w.set(_hex(a.key, "key"), _hex(a.value, "value"))
    return 0


def cmd_delete(a) -> int:
    with shmcache.open(a.name) as w:
        w.delete(_hex(a.key, "key"))
    return 0


def cmd_destroy(a) -> int:
    shmcache.destroy(a.name, force=a.force)
    return 0


def cmd_list(a) -> int:
    for name in shmcache.list_caches():
        print(name)
    return 0


def cmd_run(a) -> int:
    from shmcache.consumer.config import RunConfig
    from shmcache.consumer.supervisor import run

    flags = {k: getattr(a, k) for k in ("name", "bootstrap", "topic", "group", "instance_id", "memory", "workers",
                                        "format", "commit_interval", "assignment", "max_rate", "metrics_port",
                                        "metrics_host", "broker_wait", "machine")}
    kafka = key_values(a.set, "shmcache: --set", "a librdkafka setting")
    if a.config:
        cfg = RunConfig.from_toml(a.config, **flags)
        cfg.kafka.update(kafka)
        cfg.validate()
    else:
        missing = [f"--{k}" for k in ("name", "bootstrap", "topic") if not flags[k]]
        if missing:
            raise SystemExit(f"shmcache run: give {', '.join(missing)} (or --config FILE)")
        cfg = RunConfig(**{k: v for k, v in flags.items() if v is not None}, kafka=kafka)
    return run(cfg)


def cmd_status(a) -> int:
    with shmcache.attach(a.name) as r:
        st = r.status()
    if a.json:
        print(json.dumps(st))
        return 0
    console = Console()
    sup = f"pid {st['supervisor_pid']}" + ("" if st["supervisor_alive"] else " (not running)") if st["supervisor_pid"] else "none"
    console.print(f"cache [bold]{a.name}[/]: topic {st['topic']!r}, {st['partitions']} partitions, supervisor {sup}, "
                  + ("[green]ready[/]" if st["ready"] else "[yellow]not ready[/]")
                  + (f", [red]waiting for the broker[/] ({st['broker_waiting_s']:.0f} s)"
                     if st.get("broker") == "waiting for the broker" else ""))
    t = Table()
    for col in ("partition", "worker", "pid", "applied", "high watermark", "lag", "committed", "caught up"):
        t.add_column(col, justify="right")
    for p in st["assigned"]:
        t.add_row(str(p["partition"]), str(p["worker"]), str(p["worker_pid"]), f"{p['applied']:,}",
                  f"{p['high_watermark']:,}", "-" if p["lag"] is None else f"{p['lag']:,}", f"{p['committed']:,}",
                  "yes" if p["caught_up"] else "no")
    console.print(t)
    for line in group_lines(st):
        console.print(f"[bold red]{line}[/]")
    if st["workers"]:
        t = Table()
        for col in ("worker", "pid", "state", "restarts", "heartbeat", "ADD", "DELETE", "messages", "malformed"):
            t.add_column(col, justify="right")
        for w in st["workers"]:
            t.add_row(str(w["worker"]), str(w["pid"] or "-"), w["state"], str(max(0, w["starts"] - 1)),
                      "-" if w["heartbeat_age_s"] is None else f"{w['heartbeat_age_s']:.1f} s ago",
                      f"{w['adds']:,}", f"{w['deletes']:,}", f"{w['messages']:,}", f"{w['malformed']:,}")
        console.print(t)
    return 0


def group_lines(st: dict) -> list[str]:
    """What status and top say when the cache does not hold the whole topic."""
    out = []
    if st.get("shared_group"):
        n = st["group_members"]
        out.append(f"consumer group shared with {n - 1 if n else 'another'} other member(s): this cache holds only "
                   "the partitions assigned to it (not ready); give each cache a group of its own")
        for o in st["group_others"]:
            inst = f", instance {o['instance_id']}" if o["instance_id"] else ""
            out.append(f"  {o['client_id']} on {o['host']}{inst}: partitions {o['partitions']}")
    if st["supervisor_alive"] and st["unassigned"] and not st["assigning"]:
        out.append(f"partitions not assigned to this cache: {st['unassigned'][:32]}"
                   + (f" (+{len(st['unassigned']) - 32})" if len(st["unassigned"]) > 32 else ""))
    if st.get("damaged"):
        out.append("damaged control words: " + "; ".join(st["damaged"]))
    return out


def cmd_demo(a) -> int:
    if a.cluster:
        from shmcache.spark import cluster_demo

        return cluster_demo.command(a)
    from shmcache import demo

    a.entries = a.entries or 2_000_000
    return demo.command(a)


def cmd_produce(a) -> int:
    from shmcache.consumer import loadgen

    return loadgen.command(a)


def cmd_top(a) -> int:
    from shmcache import top

    return top.command(a)


def cmd_spark(a) -> int:
    from shmcache.spark import _cli  # pyspark is imported only when a Spark command runs

    return _cli.run(a)


def parser() -> argparse.ArgumentParser:
    p = _Parser(prog="shmcache", description="A cache in POSIX shared memory, kept filled from Kafka.")
    sub = p.add_subparsers(dest="command", required=True)
    c = sub.add_parser("create", help="create a cache")
    c.add_argument("name")
    c.add_argument("--memory", default="256MiB", help="fixed size, e.g. 256MiB, 4GiB (default 256MiB)")
    c.add_argument("--key-size", type=int, default=32)
    c.add_argument("--max-value", type=int, default=4096)
    c.add_argument("--mode", type=_mode, default=0o600,
                   help="octal file mode (default 600; 640 for a reader group); no one but the owner may write")
    c.add_argument("--exist-ok", action="store_true")
    c.set_defaults(fn=cmd_create)
    s = sub.add_parser("stats", help="print a cache's figures")
    s.add_argument("name")
    s.add_argument("--json", action="store_true")
    s.set_defaults(fn=cmd_stats)
    g = sub.add_parser("get", help="print the value of a key (hex), exit 1 if absent")
    g.add_argument("name")
    g.add_argument("key", help="the key in hex")
    g.set_defaults(fn=cmd_get)
    st = sub.add_parser("set", help="set a key (hex) to a value (hex)")
    st.add_argument("name")
    st.add_argument("key")
    st.add_argument("value")
    st.set_defaults(fn=cmd_set)
    d = sub.add_parser("delete", help="delete a key (hex)")
    d.add_argument("name")
    d.add_argument("key")
    d.set_defaults(fn=cmd_delete)
    x = sub.add_parser("destroy", help="remove a cache (mapped readers keep their mapping until they close)")
    x.add_argument("name")
    x.add_argument("--force", action="store_true",
                   help="remove it even if it is not a shmcache segment, or a live supervisor or writer uses it")
    x.set_defaults(fn=cmd_destroy)
    ls = sub.add_parser("list", help="list the caches under /dev/shm")
    ls.set_defaults(fn=cmd_list)
    rn = sub.add_parser("run", help="run the supervisor daemon: keep a cache filled from a Kafka topic")
    rn.add_argument("--config", help="a TOML file with these settings (flags override it)")
    rn.add_argument("--name", help="the cache name")
    rn.add_argument("--bootstrap", help="Kafka bootstrap servers, host:port[,host:port]")
    rn.add_argument("--topic")
    rn.add_argument("--group", help="consumer group (default: unique to this machine and cache)")
    rn.add_argument("--instance-id", help="Kafka static membership id (group.instance.id; default: unique to "
                                          "this machine and cache; 'none' = dynamic membership)")
    rn.add_argument("--machine", help="this machine's name in the default group and instance id "
                                      "(default $SHMCACHE_MACHINE, else the host name)")
    rn.add_argument("--memory", help="cache size if it must be created (default 1GiB)")
    rn.add_argument("--workers", type=int, help="worker processes (default 2)")
    rn.add_argument("--format", choices=("v1", "v2", "kv"), help="wire format (default v1)")
    rn.add_argument("--commit-interval", type=float, help="seconds between commits (default 1)")
    rn.add_argument("--assignment", choices=("cooperative-sticky", "range", "roundrobin"),
                    help="partition.assignment.strategy (default cooperative-sticky)")
    rn.add_argument("--max-rate", type=int, help="entries/s per worker while catching up (default 0: unlimited)")
    rn.add_argument("--set", action="append", metavar="KEY=VALUE", help="a librdkafka setting, repeatable")
    rn.add_argument("--metrics-port", type=int, help="serve Prometheus metrics on this port (default 0: none)")
    rn.add_argument("--metrics-host", help="address of the metrics endpoint (default 127.0.0.1)")
    rn.add_argument("--broker-wait", type=float, metavar="SECONDS",
                    help="exit if the Kafka broker does not answer for this long (default 0: wait for it)")
    rn.set_defaults(fn=cmd_run)
    su = sub.add_parser("status", help="per-partition progress and readiness of a cache")
    su.add_argument("name")
    su.add_argument("--json", action="store_true")
    su.set_defaults(fn=cmd_status)
    dm = sub.add_parser("demo", help="the main job end to end: Kafka broker, supervisor, load generator, reader")
    dm.add_argument("--entries", type=int, help="entries to produce (default 2,000,000; 20,000 with --cluster)")
    dm.add_argument("--workers", type=int, default=2, help="worker processes (default 2)")
    dm.add_argument("--partitions", type=int, default=8, help="partitions of the demo topic (default 8)")
    dm.add_argument("--format", choices=("v1", "v2"), default="v1", help="wire format (default v1)")
    dm.add_argument("--bootstrap", help="use this Kafka broker instead of starting the project's local one")
    dm.add_argument("--memory", default="auto", help="cache size (default: enough that nothing is evicted)")
    dm.add_argument("--sample", type=int, default=100_000, help="sent keys the reader checks (default 100,000)")
    dm.add_argument("--delete-share", type=float, default=0.1, help="share of DELETEs (default 0.1)")
    dm.add_argument("--seed", type=int, help="random seed of the generated entries")
    dm.add_argument("--name", help="cache name (default: demo-<random>)")
    dm.add_argument("--keep", action="store_true", help="leave the cache in /dev/shm afterwards")
    dm.add_argument("--cluster", action="store_true", help="on a Spark cluster of 2 machines on this host, each "
                    "with its own /dev/shm and replica (root; spark/cluster_demo.py)")
    dm.add_argument("--cluster-dir", help="with --cluster: keep the run directory here (logs, lookup output)")
    dm.add_argument("--json", action="store_true", help="with --cluster: a JSON report on the last line")
    dm.set_defaults(fn=cmd_demo)
    pr = sub.add_parser("produce", help="load generator: Teranode-shaped txmeta to a Kafka topic")
    pr.add_argument("--bootstrap", required=True, help="Kafka bootstrap servers, host:port[,host:port]")
    pr.add_argument("--topic", required=True)
    pr.add_argument("--count", type=int, default=1_000_000, help="entries to send (default 1,000,000)")
    pr.add_argument("--format", choices=("v1", "v2", "kv"), default="v1",
                    help="wire format (default v1; kv: a message per entry, keyed by its hash)")
    pr.add_argument("--rate", type=float, default=0.0, help="entries/s (default 0: as fast as it can)")
    pr.add_argument("--batch-size", type=int, default=1024, help="entries per batch, at most (default 1024)")
    pr.add_argument("--linger", type=float, default=0.01,
                    help="seconds a partial batch waits under --rate (default 0.01)")
    pr.add_argument("--delete-share", type=float, default=0.1, help="share of DELETEs of earlier hashes (default 0.1)")
    pr.add_argument("--create-topic", action="store_true", help="create the topic (replication 1) if missing")
    pr.add_argument("--partitions", type=int, default=8, help="partitions of a topic it creates (default 8)")
    pr.add_argument("--ground-truth", metavar="PATH", help="write every entry sent to this Parquet file")
    pr.add_argument("--seed", type=int, help="random seed (default: fresh)")
    pr.add_argument("--set", action="append", metavar="KEY=VALUE", help="a librdkafka producer setting, repeatable")
    pr.set_defaults(fn=cmd_produce)
    tp = sub.add_parser("top", help="a live view of a cache: throughput, lag, memory, readers, workers")
    tp.add_argument("name")
    tp.add_argument("--interval", type=float, default=1.0, help="seconds between refreshes (default 1)")
    tp.add_argument("--once", action="store_true", help="print one snapshot and exit (rates over one interval)")
    tp.add_argument("--count", type=int, default=0, help="exit after this many refreshes (default 0: until Ctrl-C)")
    tp.set_defaults(fn=cmd_top)
    # -- spark: the PySpark jobs (spark/_cli.py); Spark options shared by every job
    sk = sub.add_parser("spark", help="Spark jobs: example data, publish to Kafka, lookup, audit")
    spark_common = argparse.ArgumentParser(add_help=False)
    spark_common.add_argument("--master", help="Spark master (default $SHMCACHE_SPARK_MASTER, else local[2])")
    spark_common.add_argument("--conf", action="append", metavar="KEY=VALUE", help="a Spark setting, repeatable")
    spark_common.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    jobs = sk.add_subparsers(dest="job", required=True)
    j = jobs.add_parser("datagen", help="write example Parquet of txmeta rows (no Spark)")
    j.add_argument("out", help="output directory")
    j.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    j.add_argument("--rows", type=int, required=True)
    j.add_argument("--seed", type=int, default=0)
    j.add_argument("--rows-per-file", type=int, default=250_000)
    j.add_argument("--delete-share", type=float, default=0.0, help="share of hashes also deleted (default 0)")
    j.add_argument("--deletes-out", help="write the deleted hashes here, not as rows with deleted=true")
    j.add_argument("--overwrite", action="store_true", help="replace part files already there")
    j = jobs.add_parser("publish", parents=[spark_common], help="Parquet of txmeta rows -> the txmeta topic")
    j.add_argument("input", help="Parquet of txmeta rows (file or directory)")
    j.add_argument("--bootstrap", required=True)
    j.add_argument("--topic", required=True)
    j.add_argument("--format", choices=("v1", "v2"), default="v1")
    j.add_argument("--partitions", type=int, help="the topic's partitions (default: asked of the broker)")
    j.add_argument("--max-entries", type=int, default=1024, help="entries per message (default 1024)")
    j.add_argument("--set", action="append", metavar="KEY=VALUE", help="a Kafka producer setting, repeatable")
    j = jobs.add_parser("lookup", parents=[spark_common], help="look a Parquet file's keys up, write Parquet")
    j.add_argument("input")
    j.add_argument("out")
    j.add_argument("--decode", choices=("txmeta",), help="add the MetaBytes fields as columns")
    j.add_argument("--overwrite", action="store_true")
    j = jobs.add_parser("audit", parents=[spark_common], help="compare a Parquet source of truth with a cache")
    j.add_argument("input", help="Parquet of txmeta rows (the source of truth)")
    j.add_argument("--samples", type=int, default=5, help="examples kept per class (default 5)")
    j.add_argument("--fail-on-mismatch", action="store_true", help="exit 1 on a wrong value or a deleted hash present")
    j.add_argument("--fail-on-miss", action="store_true", help="exit 1 when an expected hash is absent")
    for name, j in jobs.choices.items():
        if name != "datagen":
            j.add_argument("--key-col", default="tx_hash", help="the key column: binary, or hex string")
        if name in ("publish", "audit"):
            j.add_argument("--delete-col", help="a boolean column: true = the row's hash is deleted")
            j.add_argument("--deletes", help="Parquet of hashes to delete (the key column)")
        if name in ("lookup", "audit"):
            j.add_argument("--cache", default="txmeta", help="cache name (default txmeta)")
    sk.set_defaults(fn=cmd_spark)
    return p


def main(argv: list[str] | None = None) -> int:
    a = parser().parse_args(argv)
    try:
        return a.fn(a)
    except (shmcache.ShmcacheError, ValueError, OSError) as e:
        print(f"shmcache: {e}", file=sys.stderr)
        return 2
    except SystemExit as e:
        if isinstance(e.code, str):  # a command's own usage error: its message, and the usage-error code
            print(e.code, file=sys.stderr)
            return 2
        raise


if __name__ == "__main__":
    sys.exit(main())
