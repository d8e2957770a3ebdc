"""`shmcache get NAME KEY`: print the value of a key (hex), exit 1 if absent."""

from __future__ import annotations

import sys

from shmcache.cli.args import attach, cache_arguments, hex_arg

HELP = "print the value of a key (hex), exit 1 if absent"


def add_arguments(g) -> None:
    cache_arguments(g)
    g.add_argument("key", help="the key in hex")


def run(a) -> int:
    with attach(a) as r:
        v = r.get(hex_arg(a.key, "key"))
    if v is None:
        print("(not found)", file=sys.stderr)
        return 1
    print(v.hex())
    return 0
