"""`shmcache spark datagen|publish|lookup|audit`: the jobs as commands.

cli.py holds the argument parser (the `spark` block) and calls `run(args)` here,
so pyspark is imported only when a Spark command runs. Each command builds a
session with `session()` (local[2] unless --master or $SHMCACHE_SPARK_MASTER says
otherwise) and stops it at the end if it started it; a summary table goes to
stdout, or one JSON object with --json.
"""

from __future__ import annotations

import json
import sys
from contextlib import contextmanager

from shmcache.cli import key_values


def run(a) -> int:
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

    t = Table(title=title, show_header=False)
    for k, v in d.items():
        t.add_row(k, f"{v:,}" if isinstance(v, int) and not isinstance(v, bool) else
                  f"{v:.2f}" if isinstance(v, float) else str(v))
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

    from shmcache.spark.audit import STATUSES

    con = Console()
    t = Table(title=f"audit {r.source} against cache {r.cache!r} ({r.seconds:.1f} s)")
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
