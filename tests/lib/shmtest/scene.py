"""What the conformance scenarios put at a cache's name (tests/conformance/scenarios.toml):
caches, another user's files, FIFOs, random bytes, sparse files, and the changes made
under a live reader. Every change to the name is one rename (or one unlink), so a reader
never sees a state between two steps. Everything made is removed by `clear()`."""

from __future__ import annotations

import gzip
import hashlib
import json
import mmap
import os
import pwd
import re
import shutil
import struct
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import xxhash

import shmcache
from shmcache.engine import layout as L
from shmcache.engine import reader_stats
from shmcache.ipc import liveness

from shmtest import REPO
SHM = Path("/dev/shm")
GOLDEN = REPO / "golden"
NOBODY = pwd.getpwnam("nobody").pw_uid
_AT_FDCWD, _RENAME_EXCHANGE = -100, 2


def key(short: str) -> bytes:
    """Key "k": 32 bytes of "k"."""
    return (short.encode() * 32)[:32]


def value(short: str) -> bytes:
    return short.encode()


class Scene:
    """One cache name and what is made at it (and beside it, in /dev/shm)."""

    def __init__(self, tag: str, name: str | None = None):
        self.name = name or f"conf-{tag}-{os.getpid()}-{uuid.uuid4().hex[:6]}"
        self.made: list[Path] = []  # temporary names beside it
        self.holders: list[subprocess.Popen] = []
        self._locks_fd = -1  # the file description holding the installed file's owner locks
        self._beating: threading.Event | None = None  # set: keep_ages's thread stops

    @property
    def path(self) -> Path:
        return SHM / self.name

    def _temp(self) -> str:
        t = f"{self.name}-tmp-{uuid.uuid4().hex[:6]}"
        self.made.append(SHM / t)
        self.made.append(Path(reader_stats.path_of(t)))
        return t

    # -- setups -----------------------------------------------------------------------------

    def setup(self, actions: list[str], entries: dict[str, str] | None = None) -> None:
        for action in actions:
            verb, _, arg = action.partition(" ")
            if verb == "cache":
                self._cache(self.name, entries or {"k": "v1"})
            elif verb == "chown":
                os.chown(self.path, pwd.getpwnam(arg).pw_uid, -1, follow_symlinks=False)
            elif verb == "chmod":
                os.chmod(self.path, int(arg, 8))
            elif verb == "random":
                self._random(self.path)
            elif verb == "fifo":
                os.mkfifo(self.path, 0o600)
            elif verb == "directory":
                os.mkdir(self.path, 0o700)
            elif verb == "symlink":
                t = self._temp()
                self._cache(t, entries or {"k": "v1"})
                os.symlink(SHM / t, self.path)
            elif verb == "sparse":
                self._sparse(int(arg))
            elif verb.startswith("control_"):
                raise AssertionError("a control golden is installed with install_control")
            elif verb != "nothing":
                raise AssertionError(f"unknown setup action {action!r}")

    @staticmethod
    def _cache(name: str, entries: dict[str, str]) -> None:
        with shmcache.create(name, memory="34MiB") as w:
            for k, v in entries.items():
                w.set(key(k), value(v))

    @staticmethod
    def _random(path: Path) -> None:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.write(fd, os.urandom(1 << 20))
        finally:
            os.close(fd)

    def _sparse(self, size: int) -> None:
        """A file of about `size` bytes (a real cache's size for that memory, up to the 2^46
        slots a bucket may have) whose first page is a whole cache's header and whose every
        other byte is a hole: what a stranger could plant at a name."""
        t = self._temp()
        with shmcache.create(t, memory="34MiB"):  # made to read back one real header
            pass
        with open(SHM / t, "rb") as f:
            header = bytearray(f.read(L.PAGE))
        shmcache.destroy(t)
        key_size = struct.unpack_from("<q", header, L.H_KEY_SIZE * L.WORD)[0]
        max_value = struct.unpack_from("<q", header, L.H_MAX_VALUE * L.WORD)[0]
        geo = L.Geometry.plan(size, key_size, max_value)  # that header, for `size`
        for word, v in ((L.H_SLOTS, geo.slots), (L.H_RING, geo.ring), (L.H_SIZE, geo.size)):
            struct.pack_into("<q", header, word * L.WORD, v)
        fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        try:
            os.ftruncate(fd, geo.size)
            os.pwrite(fd, header, 0)
        finally:
            os.close(fd)

    def allocated(self) -> int:
        """Bytes of memory the file at the name holds."""
        return os.stat(self.path).st_blocks * 512

    def install(self, data: bytes | bytearray, path: Path | None = None) -> None:
        """A segment image at the name (or at path), mode 0600, whole when it appears there: written
        under a temporary name and renamed, as shmcache's create does (a wait-ready that attached
        while a write at the name was half done read a cache cut short, `corrupt`)."""
        at = path or self.path
        assert not os.path.lexists(at), f"{at} is taken"
        t = SHM / self._temp()
        with os.fdopen(os.open(t, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600), "wb") as f:
            f.write(data)  # every byte (os.write may write part)
        os.rename(t, at)

    def txmeta_goldens(self, which: str) -> list[tuple[bytes, dict]]:
        """A cache at the name holding golden txmeta values (`which`: all, valid or malformed),
        case i at key sha256("conformance txmeta i"): each key with its case (name, value, expect)."""
        cases = [(i, c) for i, c in enumerate(txmeta_cases())
                 if which == "all" or (c["expect"] == {"valid": False}) == (which == "malformed")]
        keys = [hashlib.sha256(b"conformance txmeta %d" % i).digest() for i, _ in cases]
        values = [bytes.fromhex(c["value"]) for _, c in cases]
        with shmcache.create(self.name, memory="128MiB", max_value=max(map(len, values))) as w:
            w.set_many(keys, values)
            assert w.stats()["entries"] == len(keys), "a golden txmeta value was evicted"
        return [(k, c) for k, (_, c) in zip(keys, cases)]

    # -- changes under live readers ------------------------------------------------------------

    def step(self, action: str) -> None:
        verb, _, arg = action.partition(" ")
        if verb == "truncate":
            os.truncate(self.path, int(arg))
        elif verb == "chmod":
            os.chmod(self.path, int(arg, 8))
        elif verb == "truncate-companion":
            os.truncate(reader_stats.path_of(self.name), int(arg))
        elif verb == "set":
            with shmcache.open(self.name) as w:
                w.set(key("k"), value(arg))
        elif verb == "replace-random":
            t = self._temp()
            self._random(SHM / t)
            os.rename(SHM / t, self.path)
        elif verb in ("replace-cache", "replace-other"):
            t = self._temp()
            self._cache(t, {"k": arg})
            if verb == "replace-other":
                os.chown(SHM / t, NOBODY, -1)
            # the cache's companion first (a reader joins the companion of the cache it maps)
            comp = Path(reader_stats.path_of(t))
            if comp.exists():
                os.rename(comp, reader_stats.path_of(self.name))
            os.rename(SHM / t, self.path)
        elif verb == "remove":
            self._remove(self.path)
        elif verb == "resize":
            self._resize(arg)
        else:
            raise AssertionError(f"unknown step {action!r}")

    def _resize(self, memory: str) -> None:
        """The cache at the name given another size as `shmcache resize` gives it (the engine's
        steps of consumer/supervisor/resizing.py, with no supervisor: nobody writes meanwhile):
        a new segment beside it, every entry and the control area copied, renamed over the name."""
        from shmcache.engine import resizing
        from shmcache.ipc.segment import identity
        from shmcache.snapshots.copying import copy_entries

        with shmcache.open(self.name) as w:
            was = identity(self.name)
            new = resizing.create_beside(w, resizing.plan(w, memory))
            try:
                assert copy_entries(w, new)["evictions"] == 0
                new.control.copy_from(w.control)
                resizing.swap(new, was)
            finally:
                new.close()
                resizing.remove_leftover(self.name)

    # -- churn: the name changing again and again ------------------------------------------------

    def exchange_loop(self, seconds: float, kind: str = "fifo-exchange") -> subprocess.Popen:
        """A process that swaps the file at the name with another (renameat2 RENAME_EXCHANGE,
        one system call: the name always holds one of the two) as fast as it can for
        `seconds`, and leaves the name as it found it. A reader's look at the name and its
        open are then split by a swap now and then, the hardest case of each `kind`:
          fifo-exchange   the cache and a FIFO
          other-exchange  the cache and another valid cache (k = "v2") that user nobody owns,
                          of mode 0644
          mode-exchange   the cache and another valid cache (k = "v2") of mode 0666
          planted         at a name without a cache: nobody's FIFO and nobody's file of
                          random bytes, both removed at the end (the name holds nothing)"""
        t = self._temp()
        if kind in ("fifo-exchange", "planted"):
            os.mkfifo(SHM / t, 0o600)
        elif kind in ("other-exchange", "mode-exchange"):
            self._cache(t, {"k": "v2"})
        else:
            raise AssertionError(f"unknown churn {kind!r}")
        if kind == "planted":
            self._random(self.path)
            os.chown(self.path, NOBODY, -1)
        if kind in ("planted", "other-exchange"):
            os.chown(SHM / t, NOBODY, -1)
        if kind == "other-exchange":
            os.chmod(SHM / t, 0o644)  # readable by the readers: only the owner check stands in the way
        if kind == "mode-exchange":
            os.chmod(SHM / t, 0o666)
        code = (
            "import ctypes, os, sys, time\n"
            "libc = ctypes.CDLL(None, use_errno=True)\n"
            "a, b, end = sys.argv[1].encode(), sys.argv[2].encode(), time.monotonic() + float(sys.argv[3])\n"
            "n = 0\n"
            "while time.monotonic() < end:\n"
            f"    if libc.renameat2({_AT_FDCWD}, a, {_AT_FDCWD}, b, {_RENAME_EXCHANGE}) != 0:\n"
            "        sys.exit('renameat2: errno %d' % ctypes.get_errno())\n"
            "    n += 1\n"
            "if n % 2:\n"
            f"    libc.renameat2({_AT_FDCWD}, a, {_AT_FDCWD}, b, {_RENAME_EXCHANGE})\n"
            "if sys.argv[4] == 'remove':\n"
            "    os.unlink(a)\n"
            "    os.unlink(b)\n"
            "print(n)\n")
        p = subprocess.Popen([sys.executable, "-c", code, str(self.path), str(SHM / t), str(seconds),
                              "remove" if kind == "planted" else "keep"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        self.holders.append(p)
        return p

    # -- buckets held mid-write ------------------------------------------------------------------

    def keys_in_distinct_buckets(self, n: int) -> list[bytes]:
        """n keys, each in a bucket of its own as long as there are buckets left (NBUCKETS),
        then any."""
        keys, buckets, i = [], set(), 0
        while len(keys) < n:
            if len(buckets) == L.NBUCKETS:
                keys.append(struct.pack("<Q", i) * 4)
                i += 1
                continue
            k = struct.pack("<Q", i) * 4
            b = xxhash.xxh64_intdigest(k) & (L.NBUCKETS - 1)
            if b not in buckets:
                buckets.add(b)
                keys.append(k)
            i += 1
        return keys

    def hold_every_bucket(self) -> subprocess.Popen:
        """A live process holding every bucket of the cache mid-write (tests/lib/shmtest/procs.py),
        killed when the scene is cleared."""
        from shmtest.procs import hold_every_bucket

        p = hold_every_bucket(str(self.path))
        self.holders.append(p)
        return p

    # -- golden control areas ------------------------------------------------------------------------

    def install_control(self, case: dict, owners: dict[str, int]) -> None:
        """A golden control area at the name, its live words filled and their owner locks held
        (by this process, on a file description of its own, until the scene is cleared or
        another file is installed)."""
        from shmtest import golden_control as G

        self.install(G.image(case, owners, time.monotonic_ns()))
        self.hold_locks(case["locked"])

    def keep_ages(self, case: dict) -> None:
        """Keep the installed control golden's time words (its `ages`: heartbeats, a stall's
        start) that many seconds before now, as live owners keep their heartbeats: a thread
        stores them every 0.5 s until the scene is cleared. For a
        scenario that must read "ready" however long a loaded machine takes to run it (a
        heartbeat goes stale after 10 s)."""
        ages = {int(off): seconds for off, seconds in case.get("ages", {}).items()}
        stop = self._beating = threading.Event()
        fd = os.open(self.path, os.O_RDWR | os.O_CLOEXEC)
        mm = mmap.mmap(fd, 0)
        os.close(fd)

        def beat() -> None:
            while not stop.wait(0.5):
                now = time.monotonic_ns()
                for off, seconds in ages.items():  # aligned words: one 8-byte copy each
                    struct.pack_into("<q", mm, off, now - int(seconds * 1e9))
            mm.close()

        threading.Thread(target=beat, daemon=True).start()

    def hold_locks(self, offsets) -> None:
        """Hold the owner locks (docs/segment-format.md, section 13) of the words at these file
        offsets of the cache installed now, as their owners would; the ones held before go."""
        self.drop_locks()
        self._locks_fd = os.open(self.path, os.O_RDWR | os.O_CLOEXEC)
        for off in offsets:
            assert liveness.lock_word(self._locks_fd, int(off) // L.WORD), f"word at {off} is locked already"

    def drop_locks(self) -> None:
        if self._locks_fd >= 0:
            os.close(self._locks_fd)
            self._locks_fd = -1

    # -- cleanup ---------------------------------------------------------------------------------

    @staticmethod
    def _remove(path: Path) -> None:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        elif os.path.lexists(path):
            os.unlink(path)

    def clear(self) -> None:
        if self._beating is not None:
            self._beating.set()
        self.drop_locks()
        for p in self.holders:
            if p.poll() is None:
                p.kill()
            p.wait()
        if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9._-]{0,199}", self.name):
            return  # a scenario's invalid name ("../x"): nothing was made at it, and nothing is removed
        for p in [self.path, Path(reader_stats.path_of(self.name)), *self.made]:
            self._remove(p)


def control_cases() -> dict:
    return json.loads((GOLDEN / "control" / "expect.json").read_text())["cases"]


def txmeta_cases() -> list[dict]:
    return json.loads((GOLDEN / "txmeta" / "cases.json").read_text())["cases"]


def golden_cases() -> dict:
    return json.loads((GOLDEN / "expect.json").read_text())["cases"]


def golden_image(case: dict) -> bytearray:
    return bytearray(gzip.decompress((GOLDEN / case["file"]).read_bytes()))


def live_owner(pid: int) -> int:
    return liveness.owner_word(pid)
