"""`shmcache wait-ready [--timeout S] [--max-lag N] [--max-behind S] NAME`: wait until the cache
holds its whole topic and, with a bound, no partition is more than N messages or S seconds
behind it; print its status (JSON) and exit 0, or exit 1 naming why not once the timeout has
passed.

One of the commands every reader gives in the same words (docs/reader-contract.md). The
handle follows the name: while nothing is at it (the cache being destroyed and created
again) the wait goes on; any other error ends it (exit 2)."""

from __future__ import annotations

import json
import math
import sys
import time

from shmcache.cli.args import cache_arguments, count_arg, seconds_arg
from shmcache.errors import CacheNotFoundError

HELP = ("wait until the cache holds its whole topic, within --max-lag/--max-behind if given (exit 0), or say why "
        "not at --timeout (exit 1)")
POLL_S = 0.05


def add_arguments(w) -> None:
    cache_arguments(w)
    w.add_argument("--timeout", metavar="S", help="give up after S seconds (default: wait for as long as it takes)")
    w.add_argument("--max-lag", metavar="N", help="and no partition more than N messages behind its topic")
    w.add_argument("--max-behind", metavar="S",
                   help="and no partition more than S seconds behind: since the last message it applied was produced")


def run(a) -> int:
    timeout = math.inf if a.timeout is None else seconds_arg(a.timeout, "--timeout")
    max_lag = None if a.max_lag is None else count_arg(a.max_lag, "--max-lag")
    max_behind = None if a.max_behind is None else seconds_arg(a.max_behind, "--max-behind")
    # the engine's, once the line is taken: a line refused costs none of it
    from shmcache.engine.control.bound import beyond
    from shmcache.engine.control.status import why
    from shmcache.engine.reattach import follow
    from shmcache.ipc.segment import path_of

    deadline = time.monotonic() + timeout
    followed = follow(a.name, owner=a.owner)  # a bad name or owner: bad-argument, exit 2
    try:
        while True:
            r = followed.reader()
            st = None
            if r is not None:
                try:
                    st = r.status()
                except CacheNotFoundError:
                    st = None
            over = beyond(st, max_lag, max_behind) if st is not None and st["ready"] else ""
            if st is not None and st["ready"] and not over:
                print(json.dumps(st))
                return 0
            if time.monotonic() >= deadline:
                said = (over or why(st)) if st is not None else f"it does not exist (no {path_of(a.name)})"
                print(f"shmcache: not-ready: cache {a.name!r} not ready after {timeout:.1f} s: {said}",
                      file=sys.stderr)
                return 1
            time.sleep(POLL_S)
    finally:
        followed.close()
