"""`shmcache get NAME KEY`: print the value of a key (hex), exit 1 if absent."""

from __future__ import annotations

import sys

import shmcache
from shmcache.cli.args import hex_arg, owner_option

HELP = "print the value of a key (hex), exit 1 if absent"


def add_arguments(g) -> None:
    g.add_argument("name")
    g.add_argument("key", help="the key in hex")
    owner_option(g)


def run(a) -> int:
    with shmcache.attach(a.name, owner=a.owner) as r:
        v = r.get(hex_arg(a.key, "key"))
    if v is None:
        print("(not found)", file=sys.stderr)
        return 1
    print(v.hex())
    return 0
