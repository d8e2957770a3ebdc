"""`shmcache size --entries N --value-bytes B`: the --memory a cache needs (engine/sizing.py)."""

from __future__ import annotations

import json

from shmcache.engine import sizing
from shmcache.engine.layout import DEFAULT_KEY_SIZE, DEFAULT_MAX_VALUE

HELP = "say how much --memory a cache needs for N entries"


def add_arguments(c) -> None:
    c.add_argument("--entries", type=int, required=True, help="live entries the cache must hold")
    c.add_argument("--value-bytes", type=int, required=True, help="a value's mean size in bytes")
    c.add_argument("--key-size", type=int, default=DEFAULT_KEY_SIZE)
    c.add_argument("--max-value", type=int, default=DEFAULT_MAX_VALUE)
    c.add_argument("--headroom", type=float, default=sizing.DEFAULT_HEADROOM,
                   help=f"fraction of each ring kept for records an update or a DELETE left dead "
                        f"(default {sizing.DEFAULT_HEADROOM})")
    c.add_argument("--json", action="store_true", help="one line of JSON")


def run(a) -> int:
    plan = sizing.memory_for(a.entries, a.value_bytes, key_size=a.key_size, max_value=a.max_value,
                             headroom=a.headroom)
    print(json.dumps(plan.as_dict()) if a.json else plan.summary())
    return 0
