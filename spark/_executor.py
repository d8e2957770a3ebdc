"""What runs inside an executor's Python worker: one read-only handle per cache.

Spark reuses a Python worker process for many tasks (`spark.python.worker.reuse`,
on by default), so a cache is attached once per worker process and kept in
`_READERS` for every later batch. A handle is only ever attached (engine/table.py attach):
PROT_READ, never written, never unlinked, never registered with multiprocessing's
resource tracker, so nothing an executor does (or its exit) can remove a cache.

A cache that was destroyed and created again under the same name is a new file
(another inode): each batch stats `/dev/shm/<name>` (one syscall) and re-attaches
when the inode changed (engine/reattach.py), so a worker never keeps reading a dead table. A cache that
is gone raises CacheNotFoundError naming the cache and this host: on a cluster,
every machine that runs executors needs its own `shmcache run`.
"""

from __future__ import annotations

from shmcache.engine.reattach import Followed
from shmcache.engine.reader import Reader
from shmcache.errors import CacheNotFoundError
from shmcache.ipc.machine import describe
from shmcache.ipc.segment import path_of

_READERS: dict[str, Followed] = {}  # name -> the handle on what is at the name (engine/reattach.py)


def reader(name: str, who: str, owner: int | str | None = None) -> Reader:
    """This process's read-only handle on cache `name`, attached on first use; with `owner`,
    only if that user owns its file (CacheOwnerError otherwise), at every re-attach too."""
    held = _READERS.get(name)
    if held is not None and held.owner != owner:  # asked with another owner: attached (and checked) anew
        _drop(name)
        held = None
    if held is None:
        held = _READERS[name] = Followed(name, owner)
    try:
        r = held.reader()
    except FileNotFoundError:  # CacheNotFoundError: destroyed between the stat and the open
        r = None
    if r is None:
        _drop(name)
        raise _missing(name, who) from None
    if held.attached_now:
        _prune(keep=name)
    return r


def _missing(name: str, who: str) -> CacheNotFoundError:
    return CacheNotFoundError(
        f"{who}: cache {name!r} not found on host {describe()} ({path_of(name)}); "
        "every machine that runs executors needs its own `shmcache run --name "
        f"{name} ...` (see docs/spark.md)")


def _drop(name: str) -> None:
    held = _READERS.pop(name, None)
    if held is not None:
        held.close()  # unmaps; never destroys


def _prune(keep: str) -> None:
    """Unmap handles on caches that no longer exist (or were re-created), so a long-lived
    worker does not keep the memory of destroyed tables mapped."""
    for name in list(_READERS):
        if name != keep and _READERS[name].moved():
            _drop(name)


def attached() -> list[str]:
    """Names this process holds a handle on (for tests and logs)."""
    return sorted(_READERS)
