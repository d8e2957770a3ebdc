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
    """Base class of the errors below."""


class CacheNotFoundError(ShmcacheError, FileNotFoundError):
    """No segment of that name under /dev/shm."""


class CacheExistsError(ShmcacheError, FileExistsError):
    """create() of a name that exists, without exist_ok=True."""


class NotACacheError(ShmcacheError, ValueError):
    """The segment exists but is not a shmcache segment (wrong magic or size)."""


class LayoutVersionError(ShmcacheError, ValueError):
    """The segment was made by a shmcache of another layout version."""


class CacheNotReadyError(ShmcacheError, TimeoutError):
    """The segment is still being initialised by its creator, or not caught up in time."""


class CachePermissionError(ShmcacheError, PermissionError):
    """The segment's mode does not let this user open it."""


class CacheOwnerError(CachePermissionError):
    """The cache's file belongs to another user than the one its reader was told to expect
    (attach(name, owner=...)): anyone may create a name in /dev/shm before its supervisor
    does, and serve any values (and a fake readiness) from it."""


class UnsafeModeError(CachePermissionError):
    """The cache's file may be written by its group or by others (mode & 0o022): no shmcache
    creator makes such a file, so it was widened by hand or planted, and its content is
    anyone's. Every reader refuses it, whether or not it was told the owner."""


class GeometryMismatchError(ShmcacheError, ValueError):
    """create(exist_ok=True) found a segment with another key size or value limit."""


class KeySizeError(ShmcacheError, ValueError):
    """A key whose length is not the cache's key size."""


class ValueTooLargeError(ShmcacheError, ValueError):
    """A value longer than the cache's max_value."""


class MemoryTooSmallError(ShmcacheError, ValueError):
    """memory= cannot hold one largest record per bucket."""


class CacheSpaceError(ShmcacheError, MemoryError):
    """memory= is more than /dev/shm has room for."""


class ReadOnlyError(ShmcacheError, PermissionError):
    """A write through a read-only (attach()) handle."""


class TooManyWritersError(ShmcacheError, RuntimeError):
    """Every writer slot of the segment is held by a live process."""


class ClosedError(ShmcacheError, ValueError):
    """Use of a handle after close()."""


class CorruptCacheError(NotACacheError):
    """The segment's header or geometry contradicts itself or the file (a damaged or
    hostile segment): the message names the field, what it holds and what it should be."""


class CacheInUseError(ShmcacheError, RuntimeError):
    """destroy() of a cache a live supervisor or writer still uses (force=True overrides)."""


class BrokerUnavailableError(ShmcacheError, ConnectionError):
    """The Kafka broker did not answer within the wait the caller allowed."""


class KafkaRequestError(ShmcacheError, RuntimeError):
    """The broker answered and refused, or a message was not delivered: the message names
    the topic and the broker's or librdkafka's words."""


class SnapshotError(ShmcacheError, ValueError):
    """A snapshot file that cannot be used (snapshots/); the message names the file."""


class SnapshotCorruptError(SnapshotError):
    """A snapshot file that is truncated, fails a checksum or is not a snapshot."""


class SnapshotMismatchError(SnapshotError):
    """A valid snapshot of another topic, wire format or key size than the one asked for."""


class SnapshotCancelled(SnapshotError):
    """A snapshot abandoned mid-write because its caller asked it to give up (the `cancel`
    event of snapshots.write: a supervisor's stop); its temporary file is removed
    and the destination is untouched. Not a failure of the snapshot or of the disk."""


def error_kind(e: BaseException) -> str:
    """The word the readers' command contract gives this error (docs/reader-contract.md):
    the same word for the same case in the Python, Go and Java readers."""
    for cls, kind in _KINDS:
        if isinstance(e, cls):
            return kind
    return "error"


_KINDS = (  # most specific first
    (CacheNotFoundError, "not-found"),
    (CorruptCacheError, "corrupt"),
    (LayoutVersionError, "unknown-version"),
    (NotACacheError, "not-a-cache"),
    (CacheOwnerError, "wrong-owner"),
    (UnsafeModeError, "unsafe-mode"),
    (PermissionError, "permission"),
    (CacheNotReadyError, "not-ready"),
    (ValueError, "bad-argument"),
)
