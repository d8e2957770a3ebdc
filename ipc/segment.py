"""POSIX shared-memory segments as files under /dev/shm, mapped with mmap(2).

Not multiprocessing.shared_memory: on Python 3.11 attaching registers the segment
with the resource tracker, which unlinks it when the attaching process exits. Here
nothing is ever registered; a segment lives until destroy() unlinks it.

`close()` unmaps, never destroys; `unlink()` removes the name (processes that
still map it keep their mapping until they close).

Huge pages: every mapping is 2 MiB-aligned and the creator asks for 2 MiB pages
(ipc/mapping.py says why and how); `Segment.huge` says whether it got them.

/dev/shm is writable by every user, so anything can sit at a cache's name: a FIFO
(whose plain open blocks until a writer comes), a directory, a symlink to a file
elsewhere, a device. Every open of a name there goes through `open_regular`: it
never follows a symlink, never blocks, and keeps only a regular file; anything else
is refused with NotACacheError saying what is there.

A creator builds the segment as an unnamed file (O_TMPFILE in /dev/shm): sized, on
2 MiB pages, its header written. Only then does `Segment.finish_create` give it its
name, with link(2), which fails if anything is at the name by then. So a name never
holds a half-made cache: an attacher either finds none or a whole one, and a creator
killed at any moment (SIGKILL, a full /dev/shm) leaves nothing at the name, and its
memory goes back with its last mapping.
"""

from __future__ import annotations

import errno
import os
import re
import stat

from shmcache.errors import (
    CacheExistsError,
    CacheNotFoundError,
    CacheOwnerError,
    CachePermissionError,
    CacheSpaceError,
    NotACacheError,
)
from shmcache.ipc import mapping, sigbus
from shmcache.ipc.mapping import HUGE_PAGE

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


_KINDS = ((stat.S_ISDIR, "a directory"), (stat.S_ISLNK, "a symbolic link"), (stat.S_ISFIFO, "a FIFO"),
          (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"))
# open(2) errors that say the name is there but is no file to map (with O_NOFOLLOW, a
# symlink is ELOOP; a directory opened for writing EISDIR; a FIFO with no reader, ENXIO)
_NOT_A_FILE = (errno.ELOOP, errno.EISDIR, errno.ENXIO, errno.ENODEV, errno.ENOTDIR, errno.EOPNOTSUPP)


def kind_of(mode: int) -> str:
    """'a FIFO', 'a directory', ... for an st_mode; 'a regular file' for one."""
    for test, what in _KINDS:
        if test(mode):
            return what
    return "a regular file" if stat.S_ISREG(mode) else "not a regular file"


def _not_a_file(name: str, path: str, what: str, st: os.stat_result | None) -> NotACacheError:
    kind = kind_of(st.st_mode) if st is not None else "not a regular file"
    return NotACacheError(f"cache {name!r}: {path}{what} is {kind}, not a shmcache segment "
                          "(a cache is a regular file)")


def user_text(uid: int) -> str:
    """'uid 998 (shmcache)', or 'uid 4242' for a uid with no name on this machine."""
    import pwd

    try:
        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except KeyError:
        return f"uid {uid}"


# The mode bits that let a file's group or others write it: a reader never reads such a
# cache (docs/segment-format.md, section 4), at attach or at a following handle's look.
UNSAFE_MODE_BITS = 0o022
# The largest uid an owner may name: 2^32 - 2 ((uid_t) -1 is no user's; golden/contract.json)
LARGEST_UID = 4294967294


def owner_uid(owner, name: str) -> int | None:
    """A reader's `owner=` (a user name, or a uid) as a uid; None for None. ValueError naming
    the cache for a user this machine does not have."""
    import pwd

    if owner is None:
        return None
    if isinstance(owner, int) and not isinstance(owner, bool) and 0 <= owner <= LARGEST_UID:
        return owner
    if isinstance(owner, str) and owner:
        try:
            return pwd.getpwnam(owner).pw_uid
        except (KeyError, ValueError):  # ValueError: a NUL in it
            if re.fullmatch(r"[0-9]{1,10}", owner) and int(owner) <= LARGEST_UID:
                return int(owner)
    raise ValueError(f"cache {name!r}: owner={owner!r}: no such user on this machine (a user name, or a uid from "
                     f"0 to {LARGEST_UID})")


def open_regular(name: str, path: str, flags: int, *, what: str = "") -> int:
    """open(2) `path`, a name under /dev/shm, as it is safe to in a directory every user
    may write: never following a symlink, never blocking (a FIFO), and keeping only a
    regular file. CacheNotFoundError if nothing is there, NotACacheError naming what is
    there if it is not a regular file; other errors (PermissionError) are left to the
    caller to word. `what` is added after the path in messages (" (its readers' companion)")."""
    try:
        fd = os.open(path, flags | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise CacheNotFoundError(f"cache {name!r} does not exist (no {path}{what})") from None
    except OSError as e:
        if e.errno not in _NOT_A_FILE:
            raise
        try:
            st = os.lstat(path)
        except OSError:
            st = None
        raise _not_a_file(name, path, what, st) from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _not_a_file(name, path, what, st)
    except BaseException:
        os.close(fd)
        raise
    return fd


def wholly_allocated(st: os.stat_result) -> bool:
    """Every byte of the file has its memory (a creator reserves the whole file before it
    names it). Only such a file is populated at mapping: on tmpfs, populating a hole
    allocates it, so a sparse file planted at a name would take its whole declared size
    of memory at the first attach; a file with holes costs only the pages that are read."""
    return st.st_blocks * 512 >= st.st_size


def identity(name: str) -> tuple[int, int] | None:
    """(st_dev, st_ino) of what is at the name now, without following a symlink; None if
    nothing is. A holder of a mapping compares it with the one it mapped: another value
    means the cache was destroyed, re-created or replaced under it."""
    return _identity_at(path_of(name))


def look(name: str) -> tuple[int, int, bool] | None:
    """What a handle that follows the name sees of it at each look (docs/segment-format.md,
    "Following a name"): identity() and whether the file's mode now lets its group or others
    write it (a chmod of the very file mapped is a change too); None if nothing is there."""
    try:
        st = os.lstat(path_of(name))
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino, bool(st.st_mode & UNSAFE_MODE_BITS)


def _identity_at(path: str) -> tuple[int, int] | None:
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    return st.st_dev, st.st_ino


def shm_free_bytes() -> int | None:
    """Bytes /dev/shm can still take (what its tmpfs size limit leaves); None if it has no limit."""
    st = os.statvfs(SHM_DIR)
    return st.f_bavail * st.f_frsize if st.f_blocks else None


class Segment:
    """One mapping of a segment: read-write (writers) or PROT_READ (readers).

    `path` maps another file of the cache's than /dev/shm/NAME (its readers' companion,
    named `what` in messages); `shared=True` says others write it by design (a reader
    group counts in the companion), so a read-write open does not insist on a file only
    its own user may write. Either way the file is opened with open_regular.
    `create_size` makes a new file instead, unnamed until `finish_create`.

    `check(fd, size)`, for a file opened (not created), runs before it is mapped and
    raises if the file is not what the caller maps: its header read with pread(2). A
    mapping is populated at once (MAP_POPULATE), and on tmpfs populating a hole
    allocates it: a stranger's sparse file of any size at the name would fill /dev/shm
    before its first page could be looked at; and a file with holes is never populated
    (wholly_allocated)."""

    mm: memoryview | None = None  # class defaults: close() may run on a half-built object
    fd: int = -1  # the file mapped, open until close(): owner locks are held and tested on it (ipc/liveness.py)
    addr: int = 0
    huge: bool = False  # backed by 2 MiB pages (see the module docstring)
    _guard: int = -1  # the mapping's token in ipc/sigbus.py
    _named: bool = False  # the file has its name: opened by name, or a creator's after finish_create

    def __init__(self, name: str, *, create_size: int = 0, writable: bool, mode: int = 0o600,
                 path: str | None = None, what: str = "", shared: bool = False, check=None,
                 owner: int | None = None):
        self.name = check_name(name)
        self.path = path if path is not None else path_of(name)
        self.what = what
        self.shared = shared
        self.writable = writable
        self.created = False
        try:
            if create_size:
                self._create(create_size, mode)
            else:
                self._open()
            st = os.fstat(self.fd)
            if owner is not None and st.st_uid != owner:  # before a byte of it is read
                raise CacheOwnerError(f"cache {self.name!r}: {self.path}{self.what} belongs to {user_text(st.st_uid)}, "
                                      f"not to {user_text(owner)} as its reader was told (owner=): refusing to read "
                                      "it (any user may create a name in /dev/shm before its supervisor does)")
            self.size = st.st_size
            self.ident = (st.st_dev, st.st_ino)  # ipc.segment.identity() of the file mapped
            if check is not None and not self.created:
                check(self.fd, self.size)
            if self.size:
                try:
                    self.mm, self.addr, self._guard = mapping.map_aligned(
                        self.fd, self.size, writable, populate=not self.created and wholly_allocated(st))
                except OSError as e:
                    raise OSError(e.errno, f"cache {self.name!r}: cannot map {self.path}{self.what} "
                                           f"({self.size:,} bytes): {os.strerror(e.errno)}") from None
                if self.created:
                    self._back()
        except BaseException:
            self.close()  # a creator's unnamed file goes with its fd and mapping
            raise
        self._named = not self.created

    def finish_create(self) -> None:
        """The creator's last step, once the header (the magic last) is written: give the
        unnamed file its name. CacheExistsError if something took the name meanwhile (the
        new segment then goes with its last mapping; nothing at the name is touched).
        Only once, and only before close(): a segment whose fd is gone can never be named."""
        if self._named or self.fd < 0:
            raise ValueError(f"cache {self.name!r}: {self.path}{self.what} cannot be named: it was not created by "
                             "this handle, or it was named or closed already")
        try:
            dirfd = os.open(os.path.dirname(self.path), os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
            try:  # linkat(AT_SYMLINK_FOLLOW) of /proc/self/fd/N: links the file the fd holds, never replaces
                os.link(f"/proc/self/fd/{self.fd}", os.path.basename(self.path), dst_dir_fd=dirfd,
                        follow_symlinks=True)
            finally:
                os.close(dirfd)
        except FileExistsError:
            raise CacheExistsError(f"cache {self.name!r}: something was made at {self.path}{self.what} while this "
                                   "cache was being created; nothing was created") from None
        except PermissionError as e:
            raise CachePermissionError(f"cache {self.name!r}: cannot create {self.path}{self.what}: "
                                       f"{e.strerror}") from None
        self._named = True

    def unname(self) -> None:
        """A creator that named its segment but could not hand it over (interrupted, say,
        by a signal turned into an exception) takes the name back, while it still holds
        this segment's file and nothing else; its memory then goes with the mapping."""
        try:
            if _identity_at(self.path) == self.ident:
                os.unlink(self.path)
        except OSError:
            pass

    def _close_fd(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def _create(self, size: int, mode: int) -> None:
        if os.path.lexists(self.path):  # refused before any memory is taken; link(2) decides at the end
            raise CacheExistsError(f"cache {self.name!r} already exists ({self.path}{self.what})")
        try:
            self.fd = os.open(os.path.dirname(self.path), os.O_TMPFILE | os.O_RDWR | os.O_CLOEXEC, mode)
        except PermissionError as e:
            raise CachePermissionError(f"cache {self.name!r}: cannot create {self.path}{self.what}: "
                                       f"{e.strerror}") from None
        except OSError as e:
            if e.errno not in (errno.EOPNOTSUPP, errno.EISDIR, errno.EINVAL):
                raise
            raise OSError(e.errno, f"cache {self.name!r}: {os.path.dirname(self.path)} cannot hold an unnamed file "
                                   f"(O_TMPFILE: {e.strerror}), which shmcache builds a cache in: tmpfs on Linux "
                                   "3.11+ can") from None
        self.created = True
        os.fchmod(self.fd, mode)  # the umask must not narrow or widen what was asked
        try:
            os.ftruncate(self.fd, size)
            # One 4 KiB page at the start of each whole 2 MiB range, and no other yet: see _back.
            for off in range(0, size // HUGE_PAGE * HUGE_PAGE, HUGE_PAGE):
                os.pwrite(self.fd, b"\0", off)
        except OSError as e:
            raise self._space_error(e, size) from None

    def _space_error(self, e: OSError, size: int) -> OSError:
        if e.errno in (errno.ENOSPC, errno.ENOMEM, errno.EFBIG):
            return CacheSpaceError(
                f"cache {self.name!r}: {SHM_DIR} has no room for {size:,} bytes ({e.strerror}; "
                f"{shm_free_bytes() or 0:,} bytes free now)")
        return e

    def _back(self) -> None:
        """The creator's memory: 2 MiB pages where the kernel allows, every page reserved,
        the page tables filled. MADV_COLLAPSE of ranges that hold one seeded 4 KiB page
        each (_create) allocates each 2 MiB page at once and zero-fills it: no 4 KiB pages
        to allocate, zero, copy and free, as collapsing a file posix_fallocate had filled
        would. Then
        posix_fallocate reserves what the collapse left (a tail under 2 MiB, or all of it
        where refused): memory never grows after creation, and a full /dev/shm fails here
        with a clear error instead of SIGBUS on a later write. Last, MADV_POPULATE_WRITE
        fills the page tables as MAP_POPULATE does for attachers (Linux 5.14+; before,
        pages are mapped at first touch)."""
        self._collapse()
        try:
            os.posix_fallocate(self.fd, 0, self.size)
        except OSError as e:
            raise self._space_error(e, self.size) from None
        mapping.populate_write(self.addr, self.size)

    def _collapse(self) -> None:
        self.huge = mapping.collapse(self.addr, self.size)

    def _open(self) -> None:
        flags = os.O_RDWR if self.writable else os.O_RDONLY
        try:
            self.fd = open_regular(self.name, self.path, flags, what=self.what)
        except PermissionError:
            how = "read-write" if self.writable else "read-only"
            raise CachePermissionError(
                f"cache {self.name!r}: permission denied opening {self.path}{self.what} {how} "
                f"(mode {self._mode_str()}); ask its owner for a wider mode= or a reader group"
            ) from None
        if self.writable and not self.shared:
            # A writer trusts the memory it works in: a segment someone else may write
            # (a file planted at the name, or made wider by hand) is not one to write to.
            st = os.fstat(self.fd)
            if st.st_mode & 0o022 or st.st_uid != os.geteuid():
                raise CachePermissionError(
                    f"cache {self.name!r}: {self.path} has mode {st.st_mode & 0o777:04o}, owner uid {st.st_uid}: "
                    f"a writer only writes a segment that its own user (uid {os.geteuid()}) owns and no one "
                    "else may write (no group or other write bit); destroy and re-create it")

    def _mode_str(self) -> str:
        try:
            st = os.stat(self.path)
            return f"{st.st_mode & 0o777:04o}, owner uid {st.st_uid}"
        except OSError:
            return "unknown"

    @property
    def lost(self) -> bool:
        """The file was cut short under the mapping (by whoever may write it): the mapping
        now holds zero pages in place of the file (ipc/sigbus.py), and its content is gone."""
        return self.mm is not None and sigbus.lost(self._guard)

    def close(self) -> None:
        """Drop this reference to the mapping: it is unmapped now, or, while numpy views
        of it are still alive somewhere, when the last of them goes. The file is closed, and
        with it go the owner locks this handle held (a creator that fails or closes before
        finish_create: its file never gets a name)."""
        self.mm = None
        self._close_fd()


def unlink(name: str, path: str | None = None) -> None:
    """Remove the name (whatever file is there: the checks are the caller's; never a directory);
    `path`: another file of the cache's than /dev/shm/NAME."""
    path = path if path is not None else path_of(name)
    try:
        os.unlink(path)
    except FileNotFoundError:
        raise CacheNotFoundError(f"cache {name!r} does not exist (no {path})") from None
    except PermissionError:
        raise CachePermissionError(f"cache {name!r}: permission denied removing {path}") from None
    except IsADirectoryError:
        raise NotACacheError(f"cache {name!r}: {path} is a directory, not a shmcache segment; "
                             "shmcache does not remove directories") from None
