"""`shmcache warm`: compile every numba kernel into numba's cache, once per install (consumer/warm.py)."""

from __future__ import annotations

HELP = "compile the numba kernels into numba's cache, once per install (scripts/setup and `run` do it)"


def add_arguments(p) -> None:
    pass


def run(a) -> int:
    from shmcache.consumer import warm

    warm.remove_orphans()  # caches of warm-ups killed outright (a supervisor's start() does the same)
    return warm.main()
