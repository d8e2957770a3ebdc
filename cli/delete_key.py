"""`shmcache delete NAME KEY`: delete a key (hex)."""

from __future__ import annotations

import shmcache
from shmcache.cli.args import hex_arg

HELP = "delete a key (hex)"


def add_arguments(d) -> None:
    d.add_argument("name")
    d.add_argument("key")


def run(a) -> int:
    with shmcache.open(a.name) as w:
        w.delete(hex_arg(a.key, "key"))
    return 0
