"""Argument helpers for the command line: the bottom of the command-line layer.

The standard library and the contract's grammar (engine/control/bound.py), so any command
module may import it; nothing below the command line needs it (the commands' bodies live in
this package).
"""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn

from shmcache.engine.control import bound


def usage_error(message: str) -> NoReturn:
    """A user's mistake at the command line: one line on stderr, exit 2, no traceback."""
    print(message, file=sys.stderr)
    raise SystemExit(2)


# The commands every reader gives in the same words (docs/reader-contract.md): their errors
# are one line `shmcache: KIND: message`, KIND from shmcache.errors.error_kind.
CONTRACT = ("get", "watch", "stats", "status", "wait-ready")


class ArgParser(argparse.ArgumentParser):
    """argparse, with its errors on one line (exit 2) instead of a usage block, as a
    bad-argument (docs/reader-contract.md): an unknown command or option, a missing or
    extra argument, no command at all."""

    def error(self, message: str) -> NoReturn:
        command = self.prog.removeprefix("shmcache").strip()  # "get" of "shmcache get"; "" for the command itself
        contract_error(f"{command + ': ' if command else ''}{message} (see {self.prog} --help)")


def contract_error(message: str) -> NoReturn:
    """A bad argument: `shmcache: bad-argument: message`, one line, exit 2."""
    usage_error(f"shmcache: bad-argument: {one_line(message)}")


def one_line(message: str) -> str:
    """A message as one line of an error (docs/reader-contract.md): a line break in it, as
    from a name or an argument given with one, written as its escape."""
    return message.replace("\r", "\\r").replace("\n", "\\n")


def seconds_arg(text: str, what: str) -> float:
    """A number of seconds as the contract has it (watch's SECONDS, wait-ready's --timeout and
    --max-behind): 1-9 ASCII digits, optionally a point and 1-9 more; no sign, exponent,
    underscore, space or infinity. A bad-argument otherwise."""
    try:
        return bound.seconds(text, what)
    except ValueError as e:
        contract_error(str(e))


def count_arg(text: str, what: str) -> int:
    """A count as the contract has it (wait-ready's --max-lag): 1-18 ASCII digits (under
    10^18); no sign, point, exponent, underscore or space. A bad-argument otherwise."""
    try:
        return bound.count(text, what)
    except ValueError as e:
        contract_error(str(e))


def hex_arg(text: str, what: str) -> bytes:
    try:
        return bytes.fromhex(text)
    except ValueError:
        usage_error(f"shmcache: {what} {text!r} is not hex")


def mode_arg(text: str) -> int:
    """--mode: octal digits, as chmod takes them."""
    try:
        return int(text, 8)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an octal file mode (e.g. 600, 640)") from None


def key_values(items: list[str] | None, flag: str, what: str) -> dict[str, str]:
    """Repeated `--set KEY=VALUE` style options as a dict; a usage error (exit 2) naming the flag otherwise."""
    out = {}
    for item in items or []:
        k, sep, v = item.partition("=")
        if not sep:
            usage_error(f"{flag} {item!r}: expected KEY=VALUE ({what})")
        out[k] = v
    return out


def cache_arguments(p, *, json: bool = False) -> None:
    """A command that reads a cache: its NAME, --owner, and --json if it can print one object."""
    p.add_argument("name", help="the cache's name")
    if json:
        p.add_argument("--json", action="store_true", help="print one JSON object")
    owner_option(p)


def attach(a):
    """The cache a reading command names, checked to be --owner's (shmcache.attach)."""
    import shmcache  # here, not above: a line is judged before the engine is imported

    return shmcache.attach(a.name, owner=a.owner)


def owner_option(p) -> None:
    """--owner USER: a reader's check of whose the cache is (attach(owner=))."""
    p.add_argument("--owner", metavar="USER", help="read the cache only if this user (a name or uid) owns it, "
                                                   "e.g. the supervisor's: refuse one another user made at the name")
