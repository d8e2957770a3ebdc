"""`shmcache watch NAME HEXKEY SECONDS`: look a key up in a loop, as a long-running service
would, and print a line each time the outcome changes.

One of the commands every reader gives in the same words (docs/reader-contract.md). The
handle follows the name (engine/reattach.py): a cache destroyed and created again is mapped
again, and while nothing usable is at the name each turn tries again. Lines:
`ELAPSED hit HEX`, `ELAPSED miss`, `ELAPSED error KIND: message`."""

from __future__ import annotations

import time

from shmcache.cli.args import cache_arguments, one_line, seconds_arg
from shmcache.cli.get_key import hex_keys
from shmcache.errors import ShmcacheError, error_kind

HELP = "look a key up in a loop for SECONDS, printing each change of outcome"
PACE_S = 0.01  # between lookups


def add_arguments(w) -> None:
    cache_arguments(w)
    w.add_argument("key", metavar="HEXKEY", help="the key in hex")
    w.add_argument("seconds", metavar="SECONDS", help="how long to watch")


def outcome(followed, key: bytes) -> tuple[str, str]:
    """(what, detail): ("hit", hex), ("miss", "") or ("error", "KIND: message") of one lookup."""
    try:
        r = followed.reader()
        if r is None:
            from shmcache.ipc.segment import path_of

            return "error", f"not-found: cache {followed.name!r} does not exist (no {path_of(followed.name)})"
        v = r.get(key)
    except (ShmcacheError, ValueError, OSError) as e:
        return "error", f"{error_kind(e)}: {e}"
    return ("miss", "") if v is None else ("hit", v.hex())


def run(a) -> int:
    key = hex_keys([a.key])[0]
    seconds = seconds_arg(a.seconds, "SECONDS")
    from shmcache.engine.reattach import follow  # the engine's, once the line is taken

    followed = follow(a.name, owner=a.owner)  # a bad name or owner: bad-argument, exit 2
    start = time.monotonic()
    last = None
    try:
        while True:  # one lookup at least, however short SECONDS: the first outcome is always told
            what, detail = outcome(followed, key)
            now = time.monotonic() - start  # when the outcome was known: after the lookup, however long it took
            same = (what, detail.split(":")[0] if what == "error" else detail)  # an error's kind, not its words
            if same != last:
                last = same
                print(f"{now:.3f} {what}" + (f" {one_line(detail)}" if detail else ""), flush=True)
            if time.monotonic() - start >= seconds:
                return 0
            time.sleep(PACE_S)
    finally:
        followed.close()
