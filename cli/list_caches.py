"""`shmcache list`: the caches under /dev/shm."""

from __future__ import annotations

import shmcache

HELP = "list the caches under /dev/shm"


def add_arguments(ls) -> None:
    pass


def run(a) -> int:
    for name in shmcache.list_caches():
        print(name)
    return 0
