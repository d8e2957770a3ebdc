"""Who among the owner words of one segment (or companion) is alive, in any PID namespace.

docs/segment-format.md, section 13. An owner word names a process by pid and start
stamp (ipc/liveness.py), and a pid means something only in its own PID namespace. In a
file whose owners hold owner locks (a segment with H_OWNER_LOCKS set, a companion of
version 3), the word's owner is alive while some open file description holds a write
lock on the word's 8 bytes: the kernel drops it when its holder dies, and every process
that opens the file sees it, whichever namespace either runs in. In an older file, the
pid rule: the pid looked up in this process's /proc.
"""

from __future__ import annotations

import os

import numpy as np

from shmcache.engine import layout as L
from shmcache.ipc import liveness
from shmcache.ipc.atomics import cas_word, load_word

_mine: tuple[int, int] = (0, 0)  # (pid, owner word) of this process: the word is read once per process


def my_word() -> int:
    """This process's owner word (read once per process: a fork has its own)."""
    global _mine
    pid = os.getpid()
    if _mine[0] != pid:
        _mine = (pid, liveness.owner_word())
    return _mine[1]


class Owners:
    """The owner words of the file `fd` holds open: judged by owner lock when `locks`,
    else by pid. `fd` is the handle's own (ipc/segment.py keeps it open until close)."""

    __slots__ = ("fd", "locks")

    def __init__(self, fd: int, locks: bool):
        self.fd = fd
        self.locks = locks

    def alive(self, word: int, index: int) -> bool:
        """The process `word`, published at word `index` of the file, runs. This process's
        own word is alive (its lock may be held on this very fd, which a test cannot see)."""
        word = int(word)
        if word == 0:
            return False
        if not self.locks:
            return liveness.is_alive(word)
        return word == my_word() or liveness.locked_word(self.fd, index)

    def writer_alive(self, word: int, writers: np.ndarray) -> bool:
        """A bucket lock's owner `word` is alive: a writer row (the 1-d W_* table) holds it
        and is alive. A writer takes its row before it takes any bucket's lock."""
        word = int(word)
        if word == 0 or not self.locks or word == my_word():
            return self.alive(word, -1)  # no row to find: the lock's index is not looked at
        first = writer_row_word(0)
        for r in np.flatnonzero(writers[L.W_OWNER::L.ROW_WORDS] == word).tolist():
            if self.alive(word, first + r * L.ROW_WORDS):
                return True
        return False

    def claim(self, words: np.ndarray, at: int, index: int, me: int) -> bool:
        """Publish `me` at words[at], which is word `index` of the file, if no live owner holds
        it: its owner lock first (with locks), then a compare-and-swap from what is there.
        False if a live process holds it."""
        if self.locks:
            if not liveness.lock_word(self.fd, index):
                return False
            cur = int(load_word(words, at))
            if cur == me or cas_word(words, at, cur, me) == cur:
                return True
            liveness.unlock_word(self.fd, index)  # another claimant's CAS came first (it holds no lock: old code)
            return False
        cur = int(load_word(words, at))
        if cur and cur != me and liveness.is_alive(cur):
            return False
        return cur == me or cas_word(words, at, cur, me) == cur

    def release(self, words: np.ndarray, at: int, index: int, me: int) -> None:
        """`me` holds words[at] no more: the word is cleared (if still `me`), then its lock
        dropped (index -1: the lock is left to go with the file, closed next)."""
        cas_word(words, at, me, 0)
        if self.locks and index >= 0:
            liveness.unlock_word(self.fd, index)

    def claim_row(self, words: np.ndarray, nrows: int, first: int, me: int) -> int:
        """Claim one of `nrows` rows of `ROW_WORDS` words (the 1-d array `words`, whose word 0
        is word `first` of the file), each holding its owner word in its word 0: a free row
        (0) first, else one whose owner died (its counters stay, so totals never drop).
        Returns the row, or -1 if live owners hold all."""
        if not self.locks:
            return liveness.claim_row(words, nrows, L.ROW_WORDS, me)
        for want_free in (True, False):
            for row in range(nrows):
                at = row * L.ROW_WORDS
                if (int(load_word(words, at)) == 0) == want_free and self.claim(words, at, first + at, me):
                    return row
        return -1


def pid_text(word: int) -> str:
    """The pid of a live owner word, for a message: "pid N", or, when this process's /proc
    has no such process (the owner runs in another PID namespace: a container of its own),
    "pid N of another PID namespace"."""
    pid = liveness.word_pid(word)
    return f"pid {pid}" if liveness.is_alive(word) else f"pid {pid} of another PID namespace"


def writer_row_word(row: int) -> int:
    """The file word index of writer row `row`'s W_OWNER."""
    return L.Geometry.writers_off // L.WORD + row * L.ROW_WORDS + L.W_OWNER


def worker_row_word(row: int) -> int:
    """The file word index of worker row `row`'s owner word (K_OWNER, word 0 of the row)."""
    return L.Geometry.workers_off // L.WORD + row * L.ROW_WORDS


def for_segment(fd: int, header: np.ndarray) -> Owners:
    """The judge of a cache's segment: owner locks if its creator said its owners hold them."""
    return Owners(fd, int(header[L.H_OWNER_LOCKS]) == 1)

