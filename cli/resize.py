"""`shmcache resize NAME --memory SIZE`: give a cache a live supervisor serves another size,
without a restart, a lost message or a miss (engine/resizing.py, consumer/supervisor/resizing.py).

The command asks in the cache's header and waits for the supervisor's answer: the new
segment at the name (exit 0, one line: the sizes, the entries copied, how long the
workers paused), or its refusal (exit 2, one line saying why: no room beside the cache,
a size whose rings cannot hold the live entries, a worker not up, no live supervisor).
"""

from __future__ import annotations

import json
import time

from shmcache.cli.args import seconds_arg
from shmcache.engine import units

HELP = "give a cache its live supervisor serves another size, online"
POLL_S = 0.05


def add_arguments(p) -> None:
    p.add_argument("name", help="the cache")
    p.add_argument("--memory", required=True, metavar="SIZE",
                   help="the new size, e.g. 4GiB: larger, or smaller if its rings still hold every live entry")
    p.add_argument("--timeout", default="600", metavar="S",
                   help="give up (exit 2) if the supervisor has not taken the ask within S seconds (default 600); "
                        "a resize it has begun is waited for")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def run(a) -> int:
    import shmcache
    from shmcache.engine import resizing
    from shmcache.errors import ShmcacheError
    from shmcache.ipc.segment import identity

    nbytes = units.parse_bytes(a.memory, what="--memory")
    timeout = seconds_arg(a.timeout, "--timeout")
    with shmcache.attach(a.name) as r:
        before = r.geometry.size
        geo = resizing.plan(r, nbytes)  # MemoryTooSmallError: one line, exit 2
        if not r.control.supervisor_alive():
            raise ShmcacheError(f"cache {a.name!r}: no live supervisor serves it (`shmcache run` resizes the cache it "
                                "serves; a cache nobody fills is made again at the size wanted)")
        if geo.size == before:
            return _say(a, {"name": a.name, "resized": False, "size": before},
                        f"{a.name} is {units.format_bytes(before)} already")
        resizing.check_room(a.name, geo)  # the supervisor checks again, as it makes the segment
    ask = resizing.Ask(a.name)
    try:
        refusals = ask.refusals()
        other = ask.ask(nbytes)
        if other:
            raise ShmcacheError(f"cache {a.name!r}: a resize to {units.format_bytes(abs(other))} is asked for already")
        t0 = time.monotonic()
        while identity(a.name) == ask.identity:  # until the name holds the resized segment
            state = ask.state()
            if state == 0 and ask.refusals() != refusals:
                with shmcache.attach(a.name) as r:
                    why = r.control.resize()["resize_refused"]
                raise ShmcacheError(f"cache {a.name!r}: resize to {units.format_bytes(geo.size)} refused: {why}")
            if not ask.supervisor_alive() and identity(a.name) == ask.identity:
                if state > 0 and ask.withdraw(nbytes):
                    raise ShmcacheError(f"cache {a.name!r}: its supervisor stopped before it took the resize")
                if state < 0:
                    raise ShmcacheError(f"cache {a.name!r}: its supervisor stopped during the resize; the cache at "
                                        "the name is the old one, whole (the next start removes the new one's half)")
            if state > 0 and time.monotonic() - t0 > timeout and ask.withdraw(nbytes):
                raise ShmcacheError(f"cache {a.name!r}: its supervisor did not take the resize within {timeout:g} s; "
                                    "the ask is withdrawn")
            time.sleep(POLL_S)
    finally:
        ask.close()
    with shmcache.attach(a.name) as r:
        last = r.control.resize()["last_resize"]
        size = r.geometry.size
    if size != geo.size or last is None or last["to"] != size:
        raise ShmcacheError(f"cache {a.name!r}: the segment at the name changed, but not to the size asked for "
                            f"({units.format_bytes(size)}): destroyed and made again meanwhile?")
    return _say(a, {"name": a.name, "resized": True, "from": before, "size": size, **last},
                f"resized {a.name} from {units.format_bytes(before)} to {units.format_bytes(size)}: "
                f"{last['entries']:,} entries copied in {last['copy_s']:.2f} s, the workers paused {last['pause_s']:.2f} s")


def _say(a, out: dict, line: str) -> int:
    print(json.dumps(out) if a.json else line)
    return 0
