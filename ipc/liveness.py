"""Owner words: who holds a lock or a slot, and whether that process still lives.

An owner word is `pid << 32 | stamp`, where stamp is the low 32 bits of the
process's start time in 1/100 s. The stamp is what makes a reused pid harmless:
a new process with the same pid has another start time. A zombie (killed, not yet
reaped by its parent) still "exists" for kill(pid, 0); its status says dead.
"""

from __future__ import annotations

import ctypes
import os
import signal

import psutil

from shmcache.ipc.atomics import cas_word, load_word

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
