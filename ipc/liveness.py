"""Owner words: who holds a lock or a slot, and whether that process still lives.

An owner word is `pid << 32 | stamp`, where stamp is the low 32 bits of the
process's start time in 1/100 s. The stamp is what makes a reused pid harmless:
a new process with the same pid has another start time. A zombie (killed, not yet
reaped by its parent) still "exists" for kill(pid, 0); its status says dead.
"""

from __future__ import annotations

import os

import psutil

_STAMP_MASK = 0xFFFFFFFF


def _stamp(proc: psutil.Process) -> int:
    return (round(proc.create_time() * 100) & _STAMP_MASK) or 1  # never 0: 0 means "free"


def owner_word(pid: int | None = None) -> int:
    """The owner word of `pid` (default: this process)."""
    proc = psutil.Process(os.getpid() if pid is None else pid)
    return (proc.pid << 32) | _stamp(proc)


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
