"""`shmcache spark datagen|publish|lookup|audit`: the PySpark jobs (spark/) as commands.

pyspark is imported only when a Spark command runs. Each command builds a
session with `session()` (local[2] unless --master or $SHMCACHE_SPARK_MASTER says
otherwise) and stops it at the end if it started it; a summary table goes to
stdout, or one JSON object with --json.
"""

from __future__ import annotations

import argparse
import json
import sys
from contextlib import contextmanager

from shmcache.cli.args import key_values
from shmcache.formats import registry as wire_formats

HELP = "Spark jobs: example data, publish to Kafka, lookup, audit"


def add_arguments(sk) -> None:
    # Spark options shared by every job
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
    j.add_argument("--format", choices=wire_formats.SPARK, default="v1")
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


def run(a) -> int:
    # pyspark is imported only when a Spark command runs
    return {"datagen": _datagen, "publish": _publish, "lookup": _lookup, "audit": _audit}[a.job](a)


@contextmanager
def _spark(a, app: str, kafka: bool = False):
    from pyspark.sql import SparkSession

    from shmcache.spark import session

    conf = key_values(a.conf, "shmcache spark: --conf", "a Spark setting")
    started = SparkSession.getActiveSession() is None
    spark = session(app, master=a.master, kafka=kafka, conf=conf)
    try:
        yield spark
    finally:
        if started:
            spark.stop()


def _print(a, title: str, d: dict) -> None:
    if a.json:
        print(json.dumps(d))
        return
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    t = Table(title=Text(title), show_header=False)  # paths and names are the user's: Text, never markup
    for k, v in d.items():
        t.add_row(k, f"{v:,}" if isinstance(v, int) and not isinstance(v, bool) else
                  f"{v:.2f}" if isinstance(v, float) else Text(str(v)))
    Console().print(t)


def _datagen(a) -> int:
    from shmcache.spark import datagen

    r = datagen.write(a.out, a.rows, seed=a.seed, rows_per_file=a.rows_per_file, delete_share=a.delete_share,
                      deletes_path=a.deletes_out, overwrite=a.overwrite)
    _print(a, f"datagen -> {a.out}", r.to_dict())
    return 0


def _publish(a) -> int:
    from shmcache.spark import publish

    kafka = key_values(a.set, "shmcache spark publish: --set", "a Kafka producer setting")
    with _spark(a, "shmcache-publish", kafka=True) as spark:
        r = publish.publish(spark, a.input, a.bootstrap, a.topic, format=a.format, key_col=a.key_col,
                            delete_col=a.delete_col, deletes=a.deletes, partitions=a.partitions,
                            max_entries=a.max_entries, kafka_options=kafka)
    d = r.to_dict()
    if r.seconds > 0:
        d["entries_per_s"] = int((r.adds + r.deletes) / r.seconds)
    _print(a, f"publish {a.input} -> {a.topic}", d)
    return 0


def _lookup(a) -> int:
    from shmcache.spark import lookup

    with _spark(a, "shmcache-lookup") as spark:
        df = lookup(spark.read.parquet(a.input), key_col=a.key_col, cache=a.cache, decode=a.decode)
        df.write.mode("overwrite" if a.overwrite else "errorifexists").parquet(a.out)
        counts = {bool(r.found): r["count"] for r in spark.read.parquet(a.out).groupBy("found").count().collect()}
        n = sum(counts.values())
        _print(a, f"lookup {a.input} in cache {a.cache} -> {a.out}",
               {"rows": n, "found": counts.get(True, 0), "not_found": counts.get(False, 0), "out": a.out})
    return 0


def _audit(a) -> int:
    from shmcache.spark import audit

    with _spark(a, "shmcache-audit") as spark:
        r = audit.audit(spark, a.input, a.cache, key_col=a.key_col, delete_col=a.delete_col, deletes=a.deletes,
                        samples=a.samples)
    failed = (a.fail_on_mismatch and not r.ok) or (a.fail_on_miss and r.counts["miss"] > 0)
    if a.json:
        print(json.dumps({**r.to_dict(), "failed": failed}))
    else:
        _print_audit(r)
    if failed:
        print(f"shmcache spark audit: cache {a.cache!r} differs from {a.input}: "
              + ", ".join(f"{r.counts[s]:,} {s}" for s in ("mismatch", "stale", "miss") if r.counts[s]),
              file=sys.stderr)
    return 1 if failed else 0


def _print_audit(r) -> None:
    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    from shmcache.spark.audit import STATUSES

    con = Console()
    t = Table(title=Text(f"audit {r.source} against cache {r.cache!r} ({r.seconds:.1f} s)"))
    t.add_column("status")
    t.add_column("rows", justify="right")
    t.add_column("share", justify="right")
    for s in STATUSES:
        t.add_row(s, f"{r.counts[s]:,}", f"{r.counts[s] / max(r.total, 1):.2%}")
    con.print(t)
    for s, rows in r.samples.items():
        if s in ("hit", "absent"):
            continue
        st = Table(title=f"{s}: {len(rows)} of {r.counts[s]:,}")
        for c in ("tx_hash", "expected", "got"):
            st.add_column(c)
        for row in rows:
            st.add_row(row["tx_hash"], _short(row["expected"]), _short(row["got"]))
        con.print(st)
    con.print("[green]ok[/]" if r.ok else "[red]MISMATCHES[/]")


def _short(h: str | None) -> str:
    return "-" if h is None else (h[:24] + f"... ({len(h) // 2} B)" if len(h) > 24 else h)
