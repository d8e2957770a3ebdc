"""`shmcache stats NAME [--json]`: a cache's figures."""

from __future__ import annotations

import json

from rich.console import Console
from rich.table import Table

from shmcache.cli.args import attach, cache_arguments
from shmcache.engine.units import format_bytes

HELP = "print a cache's figures"


def add_arguments(s) -> None:
    cache_arguments(s, json=True)


def run(a) -> int:
    with attach(a) as r:
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
