"""`shmcache get NAME HEXKEY...`: print each key's value (hex), `-` for a miss; exit 1 if any missed.

One of the commands every reader gives in the same words (docs/reader-contract.md)."""

from __future__ import annotations

from shmcache.cli.args import attach, cache_arguments, contract_error

HELP = "print each key's value (hex, `-` for a miss), exit 1 if any is absent"


def add_arguments(g) -> None:
    cache_arguments(g)
    g.add_argument("keys", nargs="+", metavar="HEXKEY", help="the keys in hex")


def hex_keys(texts: list[str]) -> list[bytes]:
    """The keys as bytes; a bad-argument error naming the first that is not hex."""
    keys = []
    for i, text in enumerate(texts):
        try:
            keys.append(bytes.fromhex(text))
        except ValueError:
            contract_error(f"key {i} {text!r} is not hex")
    return keys


def run(a) -> int:
    keys = hex_keys(a.keys)
    with attach(a) as r:
        values = r.get_many(keys)  # one call: one batch
    print("\n".join("-" if v is None else v.hex() for v in values))
    return 0 if all(v is not None for v in values) else 1
