"""What a handle checks of a cache's file when it attaches, and after each call: the
header before anything is mapped (a stranger's file at the name costs one page read),
the geometry against the file's size, and whether the file was cut short under the
mapping (ipc/sigbus.py put zero pages there)."""

from __future__ import annotations

import os

import numpy as np

from shmcache.engine import layout as L
from shmcache.errors import CorruptCacheError, LayoutVersionError, NotACacheError, UnsafeModeError
from shmcache.ipc.segment import Segment, path_of, user_text


def too_small(name: str, path: str, size: int) -> NotACacheError:
    return NotACacheError(f"cache {name!r}: {path} is {size} bytes, not a shmcache segment")


def check_header(name: str, path: str, size: int, h: np.ndarray, magic: int) -> L.Geometry:
    """The geometry of the cache whose header words are h and whose file holds size bytes;
    NotACacheError, LayoutVersionError or CorruptCacheError naming what is wrong. magic
    is h's H_MAGIC word as the caller read it (on a mapping, an acquire load: a creator
    names its segment once the magic is in)."""
    if magic == 0:
        raise NotACacheError(
            f"cache {name!r}: {path} has no shmcache magic (shmcache did not make it, or its header "
            f"was overwritten): not a usable cache; remove it with shmcache destroy --force {name}")
    if magic != L.MAGIC:
        raise NotACacheError(f"cache {name!r}: {path} is not a shmcache segment (bad magic)")
    if h[L.H_VERSION] != L.LAYOUT_VERSION:
        raise LayoutVersionError(
            f"cache {name!r} has layout version {int(h[L.H_VERSION])}; this shmcache reads "
            f"version {L.LAYOUT_VERSION} (destroy and re-create it, or use a matching shmcache)"
        )
    return L.Geometry.from_header(name, h, size)


def raise_if_lost(name: str, seg: Segment) -> None:
    """Reader.raise_if_lost, for the control view too: it holds the segment, not the handle
    (a handle its own view referred back to would wait for the cycle collector to unmap)."""
    if seg.lost:
        raise CorruptCacheError(
            f"cache {name!r}: {seg.path} was cut short while this process mapped it (truncated by a process "
            "that may write it); its content is gone from this handle: attach again, or destroy and re-create "
            "the cache")


def header_check(name: str):
    """Segment's check of a file before it maps it (ipc/segment.py): its mode must let no one
    but its owner write it (UnsafeModeError), and its first page, read with pread(2), must
    be a whole cache's header for a file of its size. A stranger's file at
    the name (a sparse one of any size) is refused having cost one page read, not mapped
    and populated first."""
    path = path_of(name)

    def check(fd: int, size: int) -> None:
        st = os.fstat(fd)
        if st.st_mode & 0o022:
            raise UnsafeModeError(
                f"cache {name!r}: {path} has mode {st.st_mode & 0o777:04o} (owner {user_text(st.st_uid)}): its group or "
                "others may write it, so anyone could have put its content there; no shmcache creator makes such a "
                "file: refusing to read it (destroy and re-create the cache, or chmod it back to 0600 or 0640)")
        page = os.pread(fd, L.PAGE, 0) if size >= L.PAGE else b""
        if len(page) < L.PAGE:  # shrunk since its size was read, too
            raise too_small(name, path, size)
        h = np.frombuffer(page, np.int64)
        check_header(name, path, size, h, int(h[L.H_MAGIC]))
    return check
