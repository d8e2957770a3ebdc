"""POSIX shared-memory segments as files under /dev/shm, mapped with mmap.

Not multiprocessing.shared_memory: on Python 3.11 attaching registers the segment
with the resource tracker, which unlinks it when the attaching process exits. Here
nothing is ever registered; a segment lives until destroy() unlinks it.

`close()` unmaps, never destroys; `unlink()` removes the name (processes that
still map it keep their mapping until they close).
"""

from __future__ import annotations

import errno
import mmap
import os
import re

from shmcache.errors import (
    CacheExistsError,
    CacheNotFoundError,
    CachePermissionError,
)

SHM_DIR = "/dev/shm"
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}")


def check_name(name: str) -> str:
    """A cache name is one file name under /dev/shm: letters, digits, '.', '_', '-'."""
    if not isinstance(name, str) or not _NAME.fullmatch(name):
        raise ValueError(
            f"cache name {name!r} is not valid: use 1-200 letters, digits, '.', '_' or '-', "
            "starting with a letter or digit"
        )
    return name


def path_of(name: str) -> str:
    return os.path.join(SHM_DIR, check_name(name))


class Segment:
    """One mapping of a segment: read-write (writers) or PROT_READ (readers)."""

    mm: mmap.mmap | None = None  # class defaults: close() may run on a half-built object
    fd: int = -1

    def __init__(self, name: str, *, create_size: int = 0, writable: bool, mode: int = 0o600):
        self.name = check_name(name)
        self.path = path_of(name)
        self.writable = writable
        self.created = False
        try:
            if create_size:
                self._create(create_size, mode)
            else:
                self._open()
            self.size = os.fstat(self.fd).st_size
            if self.size:
                prot = mmap.PROT_READ | (mmap.PROT_WRITE if writable else 0)
                # MAP_POPULATE: fault every page table entry in now, not one 4 KiB page at a
                # time during the first lookups or writes (~0.2 s per GiB, once per process).
                flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
                self.mm = mmap.mmap(self.fd, self.size, flags=flags, prot=prot)
        except BaseException:
            self.close()
            if self.created:
                self.unlink()
            raise
        finally:
            if self.fd >= 0:
                os.close(self.fd)  # the mapping keeps the memory; the fd is not needed
                self.fd = -1

    def _create(self, size: int, mode: int) -> None:
        try:
            self.fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_EXCL, mode)
        except FileExistsError:
            raise CacheExistsError(f"cache {self.name!r} already exists ({self.path})") from None
        except PermissionError as e:
            raise CachePermissionError(f"cache {self.name!r}: cannot create {self.path}: {e.strerror}") from None
        self.created = True
        os.fchmod(self.fd, mode)  # the umask must not narrow or widen what was asked
        try:
            # Reserve every page now: memory never grows after creation, and a full
            # /dev/shm fails here with a clear error instead of SIGBUS on a later write.
            os.posix_fallocate(self.fd, 0, size)
        except OSError as e:
            if e.errno in (errno.ENOSPC, errno.ENOMEM):
                raise MemoryError(
                    f"cache {self.name!r}: /dev/shm has no room for {size} bytes ({e.strerror})"
                ) from None
            raise

    def _open(self) -> None:
        flags = os.O_RDWR if self.writable else os.O_RDONLY
        try:
            self.fd = os.open(self.path, flags | os.O_NOFOLLOW)
        except FileNotFoundError:
            raise CacheNotFoundError(f"cache {self.name!r} does not exist (no {self.path})") from None
        except PermissionError:
            how = "read-write" if self.writable else "read-only"
            raise CachePermissionError(
                f"cache {self.name!r}: permission denied opening {self.path} {how} "
                f"(mode {self._mode_str()}); ask its owner for a wider mode= or a reader group"
            ) from None

    def _mode_str(self) -> str:
        try:
            st = os.stat(self.path)
            return f"{st.st_mode & 0o777:04o}, owner uid {st.st_uid}"
        except OSError:
            return "unknown"

    def close(self) -> None:
        """Unmap now, or, while numpy views of the mapping are still alive somewhere,
        drop this reference so the mapping goes when the last view does."""
        if self.mm is not None:
            try:
                self.mm.close()
            except BufferError:
                pass
            self.mm = None

    def unlink(self) -> None:
        unlink(self.name)


def unlink(name: str) -> None:
    try:
        os.unlink(path_of(name))
    except FileNotFoundError:
        raise CacheNotFoundError(f"cache {name!r} does not exist (no {path_of(name)})") from None
    except PermissionError:
        raise CachePermissionError(f"cache {name!r}: permission denied removing {path_of(name)}") from None
