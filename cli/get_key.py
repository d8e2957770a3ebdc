"""`shmcache get [--decode txmeta] NAME HEXKEY...`: print each key's value (hex), `-` for a
miss; exit 1 if any missed. With `--decode txmeta`, each value found is printed as the JSON
object of its txmeta decode (formats/txmeta.record), `{"valid": false}` if it is not one.

One of the commands every reader gives in the same words (docs/reader-contract.md)."""

from __future__ import annotations

import json

from shmcache.cli.args import attach, cache_arguments, contract_error

HELP = "print each key's value (hex, `-` for a miss), exit 1 if any is absent"


def add_arguments(g) -> None:
    cache_arguments(g)
    g.add_argument("keys", nargs="+", metavar="HEXKEY", help="the keys in hex")
    g.add_argument("--decode", choices=["txmeta"],
                   help="print each value found as its decode, one JSON object a line ({\"valid\": false} if malformed)")


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
    lines = decoded(values) if a.decode else ["-" if v is None else v.hex() for v in values]
    print("\n".join(lines))
    return 0 if all(v is not None for v in values) else 1


def decoded(values: list[bytes | None]) -> list[str]:
    """A line a value: its txmeta decode as one JSON object, `-` for a miss."""
    import numpy as np

    from shmcache.formats import txmeta  # here: numba's import is paid only by --decode

    found = [v for v in values if v is not None]
    meta = txmeta.decode(np.cumsum([0] + [len(v) for v in found]), np.frombuffer(b"".join(found), np.uint8))
    objects = iter(txmeta.record(meta, i) for i in range(len(found)))
    return ["-" if v is None else json.dumps(next(objects)) for v in values]
