"""Where worker processes come from: a fork server (multiprocessing's "forkserver" start
method) that imports the workers' modules and, on a warm install, loads numba and the
decode kernels once (consumer/_worker_preload.py), and then forks each worker, first or
restarted, with all of that in place: a worker is fetching ~0.1 s after its start
instead of after a second of imports of its own, and N workers do not pay it N times
on a machine with few cores.

The supervisor starts it first thing (`shmcache run` before it even imports numpy), so
it imports while the supervisor opens the cache and reaches the broker. It names itself
shmcache-fork and dies with the supervisor (a dead supervisor's workers are orphans at
once, and exit); consumer/worker_handle.py forks from it and watches what it forked.

This module imports nothing heavy: cli/__init__.py calls prestart() before anything else.
"""

from __future__ import annotations

import multiprocessing as mp

PRELOAD = "shmcache.consumer._worker_preload"


def context():
    """The multiprocessing context the workers are started with."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload([PRELOAD])
    return ctx


def prestart() -> None:
    """Start the fork server now, without waiting for it (a no-op once it runs)."""
    from multiprocessing import forkserver

    context()
    forkserver.ensure_running()
