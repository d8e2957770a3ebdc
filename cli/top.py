"""`shmcache top NAME`: a live view of a cache (cli/top_view.py renders it)."""

from __future__ import annotations

from shmcache.cli.args import owner_option

HELP = "a live view of a cache: throughput, lag, memory, readers, workers"


def add_arguments(tp) -> None:
    tp.add_argument("name")
    tp.add_argument("--interval", type=float, default=1.0, help="seconds between refreshes (default 1)")
    tp.add_argument("--once", action="store_true", help="print one snapshot and exit (rates over one interval)")
    owner_option(tp)
    tp.add_argument("--count", type=int, default=0, help="exit after this many refreshes (default 0: until Ctrl-C)")


def run(a) -> int:
    from shmcache.cli import top_view

    return top_view.command(a)
