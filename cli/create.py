"""`shmcache create NAME`: create a cache."""

from __future__ import annotations

import shmcache
from shmcache.cli.args import mode_arg
from shmcache.engine.layout import DEFAULT_MAX_VALUE
from shmcache.engine.units import format_bytes

HELP = "create a cache"


def add_arguments(c) -> None:
    c.add_argument("name")
    c.add_argument("--memory", default="256MiB", help="fixed size, e.g. 256MiB, 4GiB (default 256MiB)")
    c.add_argument("--key-size", type=int, default=32)
    c.add_argument("--max-value", type=int, default=DEFAULT_MAX_VALUE)
    c.add_argument("--mode", type=mode_arg, default=0o600,
                   help="octal file mode (default 600; 640 for a reader group); no one but the owner may write")
    c.add_argument("--exist-ok", action="store_true")


def run(a) -> int:
    with shmcache.create(a.name, memory=a.memory, key_size=a.key_size, max_value=a.max_value,
                         mode=a.mode, exist_ok=a.exist_ok) as w:
        g = w.geometry
        print(f"{a.name}: {format_bytes(g.size)}, key {g.key_size} B, values up to {g.max_value} B, "
              f"{g.slots} slots and {g.ring} ring bytes per bucket")
    return 0
