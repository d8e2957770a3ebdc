"""shmcache: a node-local cache in POSIX shared memory, kept filled from Kafka.

    import shmcache
    w = shmcache.create("txmeta", memory="256MiB")   # writer
    w.set_many(keys, values)
    r = shmcache.attach("txmeta")                    # read-only, any process
    r.get_many_packed(keys)

See engine/table.py for what is and is not guaranteed.
`shmcache.open` is create's partner for an existing cache; it is not in __all__, so
`from shmcache import *` never shadows the builtin open().
"""

from shmcache.engine.table import Packed, Reader, Writer, attach, create, destroy, exists, list_caches
from shmcache.engine.table import open_writer as open
from shmcache.engine.snapshot import restore, verify as verify_snapshot, write as snapshot
from shmcache.errors import *  # noqa: F403  (the error classes are part of the API)
from shmcache.errors import __all__ as _errors_all

__version__ = "0.1.0"

__all__ = ["create", "attach", "destroy", "exists", "list_caches", "Reader", "Writer", "Packed", "snapshot", "restore",
           "verify_snapshot", *_errors_all]
