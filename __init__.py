"""shmcache: a node-local cache in POSIX shared memory, kept filled from Kafka.

    import shmcache
    w = shmcache.create("txmeta", memory="256MiB")   # writer
    w.set_many(keys, values)
    r = shmcache.attach("txmeta")                    # read-only, any process
    r.get_many_packed(keys)

See engine/table.py for what is and is not guaranteed.
`shmcache.open` is create's partner for an existing cache; it is not in __all__, so
`from shmcache import *` never shadows the builtin open().

The names below come from their modules at first use (PEP 562): `import shmcache`
itself imports no numpy or numba, so `shmcache run` can start its workers' fork server
(consumer/worker/forkserver.py) before it pays for them.
"""

from typing import TYPE_CHECKING

from shmcache.errors import *  # noqa: F403  (the error classes are part of the API)
from shmcache.errors import __all__ as _errors_all

if TYPE_CHECKING:  # never run: what __getattr__ gives, named for type checkers and the API reference (docs/api.md)
    from shmcache.engine.lifecycle import destroy, exists, list_caches  # noqa: F401
    from shmcache.engine.reader import Packed, Reader  # noqa: F401
    from shmcache.engine.reattach import follow  # noqa: F401
    from shmcache.engine.table import attach, create  # noqa: F401
    from shmcache.engine.table import open_writer as open  # noqa: F401
    from shmcache.engine.writer import Writer  # noqa: F401
    from shmcache.formats import txmeta  # noqa: F401
    from shmcache.snapshots import restore  # noqa: F401
    from shmcache.snapshots import verify as verify_snapshot  # noqa: F401
    from shmcache.snapshots import write as snapshot  # noqa: F401

__version__ = "0.1.0"

_LAZY = {  # name -> (module, attribute)
    **{n: ("shmcache.engine.table", n) for n in ("Packed", "Reader", "Writer", "attach", "create", "destroy",
                                                 "exists", "list_caches")},
    "open": ("shmcache.engine.table", "open_writer"),
    "follow": ("shmcache.engine.reattach", "follow"),
    "snapshot": ("shmcache.snapshots", "write"),
    "restore": ("shmcache.snapshots", "restore"),
    "verify_snapshot": ("shmcache.snapshots", "verify"),
    "txmeta": ("shmcache.formats.txmeta", None),  # the module: the txmeta value codec (decode, to_arrow)
}

__all__ = ["create", "attach", "follow", "destroy", "exists", "list_caches", "Reader", "Writer", "Packed", "snapshot", "restore",
           "verify_snapshot", *_errors_all]


def __getattr__(name: str):
    try:
        module, attr = _LAZY[name]
    except KeyError:
        raise AttributeError(f"module 'shmcache' has no attribute {name!r}") from None
    import importlib

    value = importlib.import_module(module)
    value = value if attr is None else getattr(value, attr)
    globals()[name] = value  # once: later lookups never come here
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
