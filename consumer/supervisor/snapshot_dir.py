"""The supervisor's snapshot directory (`shmcache run --snapshot-dir DIR`): its files, their
order, and the checks that make it safe to restore from (consumer/supervisor/snapshot_policy.py
takes and restores the snapshots).

Files: DIR/NAME-<number, 20 digits>.snap, the number the wall clock in ns or one past
the largest there (next_path), so the order of the numbers is the order the snapshots
were made in, a clock set back or not: it is what "newest" means for the restore and
for retention. Only regular files of this user's are read (scan; the restore opens
them with O_NOFOLLOW and O_NONBLOCK): a FIFO, a link or another user's file is logged
by name and passed over. A NAME-*.snap.<16 hex digits>.tmp is a snapshot being written
(or one a killed writer left) and is never read; the next start of a supervisor with
this DIR and NAME removes what a killed one left (a writer holds a lock on its file
until the rename: one being written is left). DIR is made at `shmcache run`'s start if
it does not exist; one that is not a directory, cannot be made, or that another user
may write to stops the start (check_dir). A snapshot that cannot be written (the
directory gone, read-only, full) is logged and counted, and the supervisor carries on.

The directory is opened once, at the start (check_dir), its checks made on what was
opened, and from then on reached through that descriptor (dir_path): a symbolic link at
DIR (or on its way) re-pointed later, say by another user who owns it in a folder anyone
may write, changes nothing.
"""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

from shmcache import snapshots
from shmcache.ipc.segment import kind_of

SUFFIX = ".snap"


def scan(directory, name: str) -> tuple[list[Path], list[tuple[Path, str]]]:
    """This cache's finished snapshots in `directory` (never a .tmp), created last first,
    and the names of that form refused, each with why: anything but a regular file of this
    user's (a FIFO would hang the read, a symbolic link or another user's file is not this
    supervisor's). lstat only: nothing is opened here (the restore opens with O_NOFOLLOW and
    O_NONBLOCK and checks again). Their order is the number in their names, which
    next_path makes larger than any before it, whatever the wall clock says."""
    d = Path(directory)
    if not d.is_dir():
        return [], []
    found, refused = [], []
    for p in d.glob(f"{name}-*{SUFFIX}"):
        if not _number(p, name):
            continue
        try:
            st = os.lstat(p)
        except OSError:  # gone since it was listed
            continue
        if not stat.S_ISREG(st.st_mode):
            refused.append((p, f"it is {kind_of(st.st_mode)}"))
        elif st.st_uid != os.geteuid():
            refused.append((p, f"it belongs to uid {st.st_uid}, not to this user (uid {os.geteuid()})"))
        else:
            found.append(p)
    return sorted(found, key=lambda p: _number(p, name), reverse=True), sorted(refused)


def files(directory, name: str) -> list[Path]:
    """This cache's finished snapshots in `directory` that may be read, created last first (scan)."""
    return scan(directory, name)[0]


def _number(p: Path, name: str) -> int:
    digits = p.name[len(name) + 1:-len(SUFFIX)]
    return int(digits) if digits.isdigit() and digits.isascii() else 0


def path_for(directory, name: str, number: int) -> Path:
    return Path(directory) / f"{name}-{number:020d}{SUFFIX}"


def next_path(directory, name: str) -> Path:
    """Where the next snapshot goes: numbered by the wall clock in ns, or one past the largest
    number there if that is larger (a clock set back), so that the last one created sorts
    first and retention removes the oldest, never the newest."""
    there = [_number(p, name) for p in Path(directory).glob(f"{name}-*{SUFFIX}")]
    return path_for(directory, name, max([time.time_ns(), *(n + 1 for n in there)]))


def unfinished(directory, name: str) -> list[Path]:
    """The temporary files of this cache's snapshots in `directory` (being written, or left
    by a writer that was killed): those whose finished name (snapshots.final_name) files() would list."""
    d = Path(directory)
    if not d.is_dir():
        return []
    out = []
    for p in d.glob(f"{name}-*{SUFFIX}*.tmp"):
        final = snapshots.final_name(p.name)
        if final and final.endswith(SUFFIX) and final[len(name) + 1:-len(SUFFIX)].isdigit():
            out.append(p)
    return sorted(out)


def check_dir(directory) -> int | None:
    """At a supervisor's start: `directory` (the snapshot dir) is a directory, made if it
    does not exist, that no other user may write to (one who could would plant the
    snapshot the next start restores); ValueError naming it otherwise (a file there, a
    parent that cannot be written, group or other write permission, another owner than
    this user or root), before anything starts.

    Returns a descriptor of the very directory it checked (None without a directory): the
    checks are made on what was opened (fstat), and the supervisor then reaches the
    directory only through that descriptor (dir_path), never by its name again. A symbolic
    link at `directory` (or on its way) that someone re-points after the start changes
    nothing: snapshots still go to, and come from, the directory that was checked."""
    if not directory:
        return None
    try:
        Path(directory).mkdir(parents=True, exist_ok=True)
        fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except (FileExistsError, NotADirectoryError) as e:
        try:
            what = f"is {kind_of(os.stat(directory).st_mode)}"
        except OSError:  # a file on its way: it cannot be made
            raise ValueError(f"snapshot_dir {directory}: is not a directory and cannot be made: "
                             f"{e.strerror or e}") from None
        raise ValueError(f"snapshot_dir {directory}: exists and is not a directory ({what})") from None
    except OSError as e:
        raise ValueError(f"snapshot_dir {directory}: is not a directory and cannot be made: {e.strerror or e}") from e
    st = os.fstat(fd)
    if st.st_mode & (stat.S_IWGRP | stat.S_IWOTH) or st.st_uid not in (os.geteuid(), 0):
        os.close(fd)
        raise ValueError(f"snapshot_dir {directory}: mode {stat.S_IMODE(st.st_mode):o}, owner uid {st.st_uid}: "
                         "other users may write to it, and so plant the snapshot a start restores; give a "
                         f"directory of this user's (uid {os.geteuid()}) that only it may write (chmod go-w)")
    return fd


def dir_path(fd: int) -> str:
    """The directory behind descriptor `fd` as a path this process resolves to it alone
    (the kernel's link to the open file): what check_dir checked, whatever the name it
    was given names now."""
    return f"/proc/self/fd/{fd}"
