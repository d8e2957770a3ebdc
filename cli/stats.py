"""`shmcache stats NAME [--json]`: a cache's figures."""

from __future__ import annotations

import json

from rich.console import Console
from rich.table import Table

import shmcache
from shmcache.cli.args import owner_option
from shmcache.engine.units import format_bytes

HELP = "print a cache's figures"


def add_arguments(s) -> None:
    s.add_argument("name")
    s.add_argument("--json", action="store_true")
    owner_option(s)


def run(a) -> int:
    with shmcache.attach(a.name, owner=a.owner) as r:
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
