"""The readiness bound: how far behind its topic a ready cache may be, per partition, in
messages (lag) and in seconds (behind_s: since the last message applied was produced); the
words every reader judges it in, and the contract's grammar for it (golden/contract.json:
a count, a number of seconds), for the command line and the daemon's /ready alike.

Readiness is a latch (a partition caught up once stays caught up while its worker is up):
right for "the cache holds the whole topic", silent on "and is no more than N behind".
A bound asks the second question of a ready status.
"""

from __future__ import annotations

import re

# golden/contract.json's arguments "count" and "seconds"
COUNT = re.compile(r"[0-9]{1,18}")
SECONDS = re.compile(r"[0-9]{1,9}(\.[0-9]{1,9})?")
COUNT_RULE = "1-18 digits"
SECONDS_RULE = "digits, optionally a point and more digits, under 10^9"


def count(text: str, what: str) -> int:
    """A count (1-18 ASCII digits); ValueError naming `what` otherwise."""
    if not COUNT.fullmatch(text):
        raise ValueError(f"{what} {text!r} is not a count ({COUNT_RULE})")
    return int(text)


def seconds(text: str, what: str) -> float:
    """A number of seconds (1-9 ASCII digits, optionally a point and 1-9 more); ValueError
    naming `what` otherwise."""
    if not SECONDS.fullmatch(text):
        raise ValueError(f"{what} {text!r} is not a number of seconds ({SECONDS_RULE})")
    return float(text)


def beyond(st: dict, max_lag: int | None = None, max_behind: float | None = None) -> str:
    """Which partitions assigned here are further behind the topic than a bound, in words ("" when
    none is, or no bound is given): more than max_lag messages (a lag not known is more), or more
    than max_behind seconds (behind_s; 0 without lag, and one not known is more). The same words
    in every reader (docs/segment-format.md section 14); it judges a ready status, as why() says
    why one is not ready."""
    said = []
    if max_lag is not None:
        over = [f"{p['partition']} (lag {'unknown' if p['lag'] is None else p['lag']})"
                for p in st["assigned"] if p["lag"] is None or p["lag"] > max_lag]
        if over:
            said.append(f"partitions more than {max_lag} messages behind: " + ", ".join(over[:20]))
    if max_behind is not None:
        over = [f"{p['partition']} ({'unknown' if p['behind_s'] is None else format(p['behind_s'], '.0f') + ' s'})"
                for p in st["assigned"] if p["behind_s"] is None or p["behind_s"] > max_behind]
        if over:
            said.append(f"partitions more than {max_behind:.1f} s behind: " + ", ".join(over[:20]))
    return "; ".join(said)
