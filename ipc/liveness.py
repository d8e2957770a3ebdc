"""Owner words: who holds a lock or a slot, and whether that process still lives.

An owner word is `pid << 32 | stamp`, where stamp is the low 32 bits of the
process's start time in 1/100 s. The stamp is what makes a reused pid harmless:
a new process with the same pid has another start time. A zombie (killed, not yet
reaped by its parent) still "exists" for kill(pid, 0); its status says dead.

A pid means something only in its own PID namespace: in a container (a pod of its
own), pid 1 is someone else's pid 1, or nothing. So the process that publishes its
owner word in a shared file also holds an **owner lock**, an open-file-description
write lock (F_OFD_SETLK) on that word's 8 bytes of the file, for as long as it holds
the word. The kernel drops it when the process dies, however it dies, and every
process that opens the file sees it, in whatever PID namespace (the lock belongs to
the file, which all containers sharing /dev/shm share). `locked_word` tests one
without taking it: alive, with no clock and no pid (docs/segment-format.md, section 13).
"""

from __future__ import annotations

import ctypes
import errno
import fcntl
import os
import signal
import struct
import time

import psutil


_STAMP_MASK = 0xFFFFFFFF
_PR_SET_PDEATHSIG = 1  # linux/prctl.h
_PR_SET_NAME = 15
_libc = ctypes.CDLL(None, use_errno=True)


def _stamp(proc: psutil.Process) -> int:
    return (round(proc.create_time() * 100) & _STAMP_MASK) or 1  # never 0: 0 means "free"


def owner_word(pid: int | None = None) -> int:
    """The owner word of `pid` (default: this process)."""
    proc = psutil.Process(os.getpid() if pid is None else pid)
    return (proc.pid << 32) | _stamp(proc)


def set_process_name(name: str) -> None:
    """This process's name as ps, top and psutil's name() show it (Linux: at most 15 bytes)."""
    try:
        _libc.prctl(_PR_SET_NAME, ctypes.c_char_p(name.encode()[:15]), 0, 0, 0)
    except AttributeError:  # not Linux: the name stays
        pass


def die_with_parent(sig: int = signal.SIGKILL, parent: int | None = None) -> None:
    """Have the kernel send this process `sig` when its parent dies (Linux; elsewhere
    nothing). A parent gone before the request took effect: `sig` now, as the kernel would
    have sent it (and exit, should it be ignored). `parent`: the parent's pid as the
    process learnt it at its start, for one that may have been adopted already."""
    parent = os.getppid() if parent is None else parent
    try:
        _libc.prctl(_PR_SET_PDEATHSIG, int(sig), 0, 0, 0)
    except AttributeError:  # not Linux
        return
    if os.getppid() != parent:
        signal.raise_signal(sig)
        os._exit(0)


class StopRequest:
    """A stop asked by a signal that raises an exception in the main thread, kept so it
    can be raised again. A handler that runs while a finalizer runs (numba's compiler and
    llvmlite free objects in `__del__`; so does any library) has its exception printed
    as "Exception ignored in" and dropped, and the program would go on as if never
    asked; `check()`, called between steps and in every wait, raises it again.
    `make(signum)` builds the exception (SystemExit(143), KeyboardInterrupt, ...)."""

    def __init__(self, make) -> None:
        self.make = make
        self.signum = 0  # the first signal that asked, 0 until one did

    def install(self, *sigs: int) -> dict:
        """Handle `sigs` in this process from now on (a stop asked before is forgotten); returns
        the handlers they had."""
        self.signum = 0
        return {sig: signal.signal(sig, self._handler) for sig in sigs}

    def _handler(self, signum, frame) -> None:
        self.signum = self.signum or signum
        raise self.make(signum)

    def check(self) -> None:
        if self.signum:
            raise self.make(self.signum)


PROBE_WAIT_S = 1.0  # the longest a claimant waits out readers' passing read locks on a word
_FLOCK = struct.Struct("hhqqi4x")  # struct flock on Linux x86-64/arm64: type, whence, start, len, pid
_WORD = 8


def _flock(fd: int, cmd: int, kind: int, index: int) -> int:
    """fcntl(fd, cmd) on word `index`'s 8 bytes; returns the l_type the kernel answers."""
    got = fcntl.fcntl(fd, cmd, _FLOCK.pack(kind, os.SEEK_SET, index * _WORD, _WORD, 0))
    return _FLOCK.unpack(got)[0]


def locked_word(fd: int, index: int) -> bool:
    """Some open file description other than fd's holds a write lock on word `index` of
    the file: its owner lives. Read locks (a JVM reader's test, which can only take one)
    do not count. Needs only read access to the file."""
    return _flock(fd, fcntl.F_OFD_GETLK, fcntl.F_RDLCK, index) != fcntl.F_UNLCK


def lock_word(fd: int, index: int) -> bool:
    """Take the owner lock of word `index` of the file (open for writing) on fd; False if
    another live owner holds it. A read lock met there is a reader's passing test (the
    JVM's), held for microseconds: waited out (PROBE_WAIT_S at most), never taken for an owner."""
    deadline = time.monotonic() + PROBE_WAIT_S
    while True:
        try:
            _flock(fd, fcntl.F_OFD_SETLK, fcntl.F_WRLCK, index)
            return True
        except OSError as e:
            if e.errno not in (errno.EAGAIN, errno.EACCES):
                raise
        if locked_word(fd, index) or time.monotonic() > deadline:
            return False
        time.sleep(0.001)


def unlock_word(fd: int, index: int) -> None:
    """Drop the owner lock of word `index` that fd holds (none held: nothing happens)."""
    _flock(fd, fcntl.F_OFD_SETLK, fcntl.F_UNLCK, index)


def word_pid(word: int) -> int:
    return int(word) >> 32


def is_alive(word: int) -> bool:
    """True if the process named by an owner word is running (not gone, not a zombie, not a reused pid)."""
    pid = word_pid(word)
    if pid <= 0:
        return False
    try:
        proc = psutil.Process(pid)
        if proc.status() == psutil.STATUS_ZOMBIE:
            return False
        return _stamp(proc) == (int(word) & _STAMP_MASK)
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return False
    except psutil.AccessDenied:
        return True  # someone else's live process


def claim_row(words, nrows: int, stride: int, me: int, *, share_own: bool = False) -> int:
    """Claim one of `nrows` rows whose first word (at row * stride in the 1-d int64
    array `words`) holds its owner word: a free row (0) first, else one whose owner
    died (its counters stay, so totals never drop). With share_own, a row this owner
    already holds is returned as is. Returns the row, or -1 if live owners hold all."""
    from shmcache.ipc.atomics import cas_word, load_word  # numba's: here, not for what else imports liveness

    for want_free in (True, False):
        for row in range(nrows):
            idx = row * stride
            cur = int(load_word(words, idx))
            if share_own and cur == me:
                return row
            if (cur == 0) == want_free and (want_free or not is_alive(cur)):
                if cas_word(words, idx, cur, me) == cur:
                    return row
    return -1


def stop_processes(procs: list[psutil.Process], timeout: float) -> None:
    """SIGTERM every live process in `procs`, wait up to `timeout`, SIGKILL the rest (psutil
    checks each pid still names the process it was: a reused pid is never signalled)."""
    live = []
    for p in procs:
        try:
            if p.is_running():
                p.terminate()
                live.append(p)
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(live, timeout=timeout)
    for p in alive:
        try:
            p.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(alive, timeout=5)
