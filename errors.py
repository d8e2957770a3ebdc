"""Every error shmcache raises on purpose, one place.

Each subclasses the builtin a caller would already catch (FileNotFoundError,
ValueError, ...), so `except FileNotFoundError` keeps working, and each message
names the cache and what was wrong. Anomalies on the data path (torn reads
retried, malformed Kafka messages, evictions) are counters, never exceptions.
"""

from __future__ import annotations

__all__ = [
    "ShmcacheError",
    "CacheNotFoundError",
    "CacheExistsError",
    "NotACacheError",
    "LayoutVersionError",
    "CacheNotReadyError",
    "CachePermissionError",
    "CacheOwnerError",
    "UnsafeModeError",
    "GeometryMismatchError",
    "KeySizeError",
    "ValueTooLargeError",
    "MemoryTooSmallError",
    "CacheSpaceError",
    "ReadOnlyError",
    "TooManyWritersError",
    "ClosedError",
    "CorruptCacheError",
    "CacheInUseError",
    "BrokerUnavailableError",
    "KafkaRequestError",
    "SnapshotError",
    "SnapshotCorruptError",
    "SnapshotMismatchError",
    "SnapshotCancelled",
]


class ShmcacheError(Exception):
    """Base class of the errors below. Each names its `kind`: the word the readers' command
    contract gives it (golden/contract.json's kinds, docs/reader-contract.md), the same word
    for the same case in the Python, Go and Java readers. A subclass that names none is a
    TypeError where it is defined, never an error that falls back to a word unseen."""

    kind = "error"

    def __init_subclass__(cls, **kw):
        super().__init_subclass__(**kw)
        if "kind" not in cls.__dict__:
            raise TypeError(f"{cls.__qualname__} names no kind (the readers' contract's word for it)")


class CacheNotFoundError(ShmcacheError, FileNotFoundError):
    """No segment of that name under /dev/shm."""

    kind = "not-found"


class CacheExistsError(ShmcacheError, FileExistsError):
    """create() of a name that exists, without exist_ok=True."""

    kind = "error"


class NotACacheError(ShmcacheError, ValueError):
    """The segment exists but is not a shmcache segment (wrong magic or size)."""

    kind = "not-a-cache"


class LayoutVersionError(ShmcacheError, ValueError):
    """The segment was made by a shmcache of another layout version."""

    kind = "unknown-version"


class CacheNotReadyError(ShmcacheError, TimeoutError):
    """The segment is still being initialised by its creator, or not caught up in time."""

    kind = "not-ready"


class CachePermissionError(ShmcacheError, PermissionError):
    """The segment's mode does not let this user open it."""

    kind = "permission"


class CacheOwnerError(CachePermissionError):
    """The cache's file belongs to another user than the one its reader was told to expect
    (attach(name, owner=...)): anyone may create a name in /dev/shm before its supervisor
    does, and serve any values (and a fake readiness) from it."""

    kind = "wrong-owner"


class UnsafeModeError(CachePermissionError):
    """The cache's file may be written by its group or by others (mode & 0o022): no shmcache
    creator makes such a file, so it was widened by hand or planted, and its content is
    anyone's. Every reader refuses it, whether or not it was told the owner."""

    kind = "unsafe-mode"


class GeometryMismatchError(ShmcacheError, ValueError):
    """create(exist_ok=True) found a segment with another key size or value limit."""

    kind = "bad-argument"


class KeySizeError(ShmcacheError, ValueError):
    """A key whose length is not the cache's key size."""

    kind = "bad-argument"


class ValueTooLargeError(ShmcacheError, ValueError):
    """A value longer than the cache's max_value."""

    kind = "bad-argument"


class MemoryTooSmallError(ShmcacheError, ValueError):
    """memory= cannot hold one largest record per bucket."""

    kind = "bad-argument"


class CacheSpaceError(ShmcacheError, MemoryError):
    """memory= is more than /dev/shm has room for."""

    kind = "error"


class ReadOnlyError(ShmcacheError, PermissionError):
    """A write through a read-only (attach()) handle."""

    kind = "permission"


class TooManyWritersError(ShmcacheError, RuntimeError):
    """Every writer slot of the segment is held by a live process."""

    kind = "error"


class ClosedError(ShmcacheError, ValueError):
    """Use of a handle after close()."""

    kind = "bad-argument"


class CorruptCacheError(NotACacheError):
    """The segment's header or geometry contradicts itself or the file (a damaged or
    hostile segment): the message names the field, what it holds and what it should be."""

    kind = "corrupt"


class CacheInUseError(ShmcacheError, RuntimeError):
    """destroy() of a cache a live supervisor or writer still uses (force=True overrides)."""

    kind = "error"


class BrokerUnavailableError(ShmcacheError, ConnectionError):
    """The Kafka broker did not answer within the wait the caller allowed."""

    kind = "error"


class KafkaRequestError(ShmcacheError, RuntimeError):
    """The broker answered and refused, or a message was not delivered: the message names
    the topic and the broker's or librdkafka's words."""

    kind = "error"


class SnapshotError(ShmcacheError, ValueError):
    """A snapshot file that cannot be used (snapshots/); the message names the file."""

    kind = "bad-argument"


class SnapshotCorruptError(SnapshotError):
    """A snapshot file that is truncated, fails a checksum or is not a snapshot."""

    kind = "bad-argument"


class SnapshotMismatchError(SnapshotError):
    """A valid snapshot of another topic, wire format or key size than the one asked for."""

    kind = "bad-argument"


class SnapshotCancelled(SnapshotError):
    """A snapshot abandoned mid-write because its caller asked it to give up (the `cancel`
    event of snapshots.write: a supervisor's stop); its temporary file is removed
    and the destination is untouched. Not a failure of the snapshot or of the disk."""

    kind = "bad-argument"


def error_kind(e: BaseException) -> str:
    """The word the readers' command contract gives this error (docs/reader-contract.md):
    an error of shmcache's own names its kind; of the others, the system's refusal to let
    this user open a file is `permission`, an argument a library refused `bad-argument`,
    and anything else the system refused `error`."""
    if isinstance(e, ShmcacheError):
        return e.kind
    if isinstance(e, PermissionError):
        return "permission"
    if isinstance(e, ValueError):
        return "bad-argument"
    return "error"
