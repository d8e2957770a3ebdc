"""The `shmcache` command: create, inspect and remove caches; run the demo."""

from __future__ import annotations

import argparse
import json
import sys

from rich.console import Console
from rich.table import Table

import shmcache
from shmcache.engine.layout import format_bytes


def _hex(text: str, what: str) -> bytes:
    try:
        return bytes.fromhex(text)
    except ValueError:
        raise SystemExit(f"shmcache: {what} {text!r} is not hex") from None


def cmd_create(a) -> int:
    with shmcache.create(a.name, memory=a.memory, key_size=a.key_size, max_value=a.max_value,
                         mode=int(a.mode, 8), exist_ok=a.exist_ok) as w:
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
    shmcache.destroy(a.name)
    return 0


def cmd_list(a) -> int:
    for name in shmcache.list_caches():
        print(name)
    return 0


def cmd_run(a) -> int:
    from shmcache.consumer.config import RunConfig
    from shmcache.consumer.supervisor import run

    flags = {k: getattr(a, k) for k in ("name", "bootstrap", "topic", "group", "memory", "workers", "format",
                                        "commit_interval", "assignment", "max_rate")}
    kafka = {}
    for item in a.set or []:
        k, sep, v = item.partition("=")
        if not sep:
            raise SystemExit(f"shmcache: --set {item!r}: expected KEY=VALUE (a librdkafka setting)")
        kafka[k] = v
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
                  + ("[green]ready[/]" if st["ready"] else "[yellow]not ready[/]"))
    t = Table()
    for col in ("partition", "worker", "pid", "applied", "high watermark", "lag", "committed", "caught up"):
        t.add_column(col, justify="right")
    for p in st["assigned"]:
        t.add_row(str(p["partition"]), str(p["worker"]), str(p["worker_pid"]), f"{p['applied']:,}",
                  f"{p['high_watermark']:,}", "-" if p["lag"] is None else f"{p['lag']:,}", f"{p['committed']:,}",
                  "yes" if p["caught_up"] else "no")
    console.print(t)
    return 0


def cmd_demo(a) -> int:
    from shmcache import demo

    return demo.run(entries=a.entries, readers=a.readers, memory=a.memory, name=a.name, keep=a.keep)


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="shmcache", description="A cache in POSIX shared memory, kept filled from Kafka.")
    sub = p.add_subparsers(dest="command", required=True)
    c = sub.add_parser("create", help="create a cache")
    c.add_argument("name")
    c.add_argument("--memory", default="256MiB", help="fixed size, e.g. 256MiB, 4GiB (default 256MiB)")
    c.add_argument("--key-size", type=int, default=32)
    c.add_argument("--max-value", type=int, default=4096)
    c.add_argument("--mode", default="600", help="octal file mode (default 600; 640 for a reader group)")
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
    x.set_defaults(fn=cmd_destroy)
    ls = sub.add_parser("list", help="list the caches under /dev/shm")
    ls.set_defaults(fn=cmd_list)
    rn = sub.add_parser("run", help="run the supervisor daemon: keep a cache filled from a Kafka topic")
    rn.add_argument("--config", help="a TOML file with these settings (flags override it)")
    rn.add_argument("--name", help="the cache name")
    rn.add_argument("--bootstrap", help="Kafka bootstrap servers, host:port[,host:port]")
    rn.add_argument("--topic")
    rn.add_argument("--group", help="consumer group (default: unique to this machine and cache)")
    rn.add_argument("--memory", help="cache size if it must be created (default 1GiB)")
    rn.add_argument("--workers", type=int, help="worker processes (default 2)")
    rn.add_argument("--format", choices=("v1", "v2", "kv"), help="wire format (default v1)")
    rn.add_argument("--commit-interval", type=float, help="seconds between commits (default 1)")
    rn.add_argument("--assignment", choices=("cooperative-sticky", "range", "roundrobin"),
                    help="partition.assignment.strategy (default cooperative-sticky)")
    rn.add_argument("--max-rate", type=int, help="entries/s per worker while catching up (default 0: unlimited)")
    rn.add_argument("--set", action="append", metavar="KEY=VALUE", help="a librdkafka setting, repeatable")
    rn.set_defaults(fn=cmd_run)
    su = sub.add_parser("status", help="per-partition progress and readiness of a cache")
    su.add_argument("name")
    su.add_argument("--json", action="store_true")
    su.set_defaults(fn=cmd_status)
    dm = sub.add_parser("demo", help="create a cache, fill it from one process, read it from others")
    dm.add_argument("--entries", type=int, default=1_000_000)
    dm.add_argument("--readers", type=int, default=2)
    dm.add_argument("--memory", default="512MiB")
    dm.add_argument("--name")
    dm.add_argument("--keep", action="store_true", help="leave the cache in /dev/shm afterwards")
    dm.set_defaults(fn=cmd_demo)
    return p


def main(argv: list[str] | None = None) -> int:
    a = parser().parse_args(argv)
    try:
        return a.fn(a)
    except (shmcache.ShmcacheError, ValueError, OSError) as e:
        print(f"shmcache: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
