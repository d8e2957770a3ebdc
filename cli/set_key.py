"""`shmcache set NAME KEY VALUE`: set a key (hex) to a value (hex)."""

from __future__ import annotations

import shmcache
from shmcache.cli.args import hex_arg

HELP = "set a key (hex) to a value (hex)"


def add_arguments(st) -> None:
    st.add_argument("name")
    st.add_argument("key")
    st.add_argument("value")


def run(a) -> int:
    with shmcache.open(a.name) as w:
        w.set(hex_arg(a.key, "key"), hex_arg(a.value, "value"))
    return 0
