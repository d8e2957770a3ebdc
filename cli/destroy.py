"""`shmcache destroy NAME [--force]`: remove a cache."""

from __future__ import annotations

import shmcache

HELP = "remove a cache (mapped readers keep their mapping until they close)"


def add_arguments(x) -> None:
    x.add_argument("name")
    x.add_argument("--force", action="store_true",
                   help="remove it even if it is not a shmcache segment, or a live supervisor or writer uses it")


def run(a) -> int:
    shmcache.destroy(a.name, force=a.force)
    return 0
