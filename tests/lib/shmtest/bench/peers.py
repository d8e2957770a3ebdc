"""Helpers for bench/test_table.py: the dataset, the peers (shmcache, dict, LMDB,
Redis) and the reader/writer child processes (the results and the summary table are
tests/lib/shmtest/bench/summary.py's).

Run as a script it is one of those child processes:
    python -m shmtest.bench.peers reader|writer CACHE_NAME N SEED
speaking one JSON line per command on stdout (see _child_main).
"""

from __future__ import annotations

import json
import os
import select
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field

import numpy as np

BATCH = 1024
SEED = 20240611
KEY_SIZE = 32
VALUE_MIN, VALUE_MAX = 61, 141  # inclusive, Teranode txmeta sizes


def bench_n() -> int:
    """SHMCACHE_BENCH_N, else 20,000 under CI=true, else 1,000,000."""
    v = os.environ.get("SHMCACHE_BENCH_N")
    if v:
        return int(v.replace("_", ""))
    return 20_000 if os.environ.get("CI", "").lower() in ("true", "1") else 1_000_000


def bench_rounds() -> int:
    return int(os.environ.get("SHMCACHE_BENCH_ROUNDS", "5"))


# -- dataset ------------------------------------------------------------------------------------


@dataclass
class Dataset:
    """N random 32-byte keys with random 61-141-byte values, stored in index order and
    queried in the order of a random permutation, in batches of BATCH.

    Every peer gets the same batches: shmcache as (n, 32) uint8 arrays and
    (offsets, data) values; dict, LMDB and Redis as lists of bytes."""

    n: int
    keys: np.ndarray  # (n, 32) uint8, insertion (fill) order
    offsets: np.ndarray  # (n + 1,) int64 into data, insertion order
    data: np.ndarray  # uint8
    perm: np.ndarray  # query order
    hit_batches: list[np.ndarray] = field(default_factory=list)  # keys[perm] in batches
    miss_batches: list[np.ndarray] = field(default_factory=list)  # absent keys
    value_batches: list[tuple[np.ndarray, np.ndarray]] = field(default_factory=list)  # (offsets, data) for hit_batches
    # as bytes (only in the parent)
    hit_lists: list[list[bytes]] = field(default_factory=list)
    miss_lists: list[list[bytes]] = field(default_factory=list)
    value_lists: list[list[bytes]] = field(default_factory=list)
    fill_key_lists: list[list[bytes]] = field(default_factory=list)  # insertion order
    fill_value_lists: list[list[bytes]] = field(default_factory=list)


def make_dataset(n: int, seed: int = SEED, with_bytes: bool = True) -> Dataset:
    rng = np.random.default_rng(seed)
    keys = rng.integers(0, 256, (n, KEY_SIZE), np.uint8)
    lens = rng.integers(VALUE_MIN, VALUE_MAX + 1, n).astype(np.int64)
    offsets = np.zeros(n + 1, np.int64)
    np.cumsum(lens, out=offsets[1:])
    data = rng.integers(0, 256, int(offsets[-1]), np.uint8)
    perm = rng.permutation(n)
    miss = rng.integers(0, 256, (n, KEY_SIZE), np.uint8)
    ds = Dataset(n, keys, offsets, data, perm)
    for s in range(0, n, BATCH):
        idx = perm[s : s + BATCH]
        ds.hit_batches.append(np.ascontiguousarray(keys[idx]))
        ds.miss_batches.append(np.ascontiguousarray(miss[s : s + BATCH]))
        blens = lens[idx]
        boffs = np.zeros(len(idx) + 1, np.int64)
        np.cumsum(blens, out=boffs[1:])
        gather = np.repeat(offsets[idx] - boffs[:-1], blens) + np.arange(boffs[-1])
        ds.value_batches.append((boffs, data[gather]))
    if with_bytes:
        kb, mb, vb, o = keys.tobytes(), miss.tobytes(), data.tobytes(), offsets.tolist()
        key_list = [kb[i * KEY_SIZE : (i + 1) * KEY_SIZE] for i in range(n)]
        value_list = [vb[o[i] : o[i + 1]] for i in range(n)]
        for s in range(0, n, BATCH):
            idx = perm[s : s + BATCH].tolist()
            ds.hit_lists.append([key_list[i] for i in idx])
            ds.value_lists.append([value_list[i] for i in idx])
            ds.miss_lists.append([mb[i * KEY_SIZE : (i + 1) * KEY_SIZE] for i in range(s, min(s + BATCH, n))])
            ds.fill_key_lists.append(key_list[s : s + BATCH])
            ds.fill_value_lists.append(value_list[s : s + BATCH])
    return ds


def import_source(src: str, module: str, folder: str):
    """Import Python source as module `module` from a file in tempdir/folder: kernels of
    another version (bench/test_checks_cost.py) or edited copies (test_lookup_bounds.py).
    A file, not exec: numba's cache lives beside it and its loader imports it by name."""
    import importlib
    from pathlib import Path

    d = Path(tempfile.gettempdir()) / folder
    d.mkdir(exist_ok=True)
    path = d / f"{module}.py"
    if not path.exists() or path.read_text() != src:
        path.write_text(src)
    if str(d) not in sys.path:
        sys.path.insert(0, str(d))
    return importlib.import_module(module)


def fill(w, ds: Dataset) -> None:
    """Set every key of the dataset into the cache (a Writer), in insertion order and batches."""
    for s in range(0, ds.n, BATCH):
        e = min(s + BATCH, ds.n)
        w.set_many(ds.keys[s:e], (ds.offsets[s:e + 1] - ds.offsets[s], ds.data[ds.offsets[s]:ds.offsets[e]]))


def cache_memory(n: int) -> int:
    """Segment size: ~3 full rounds of records fit in the rings, so re-setting every
    key never evicts a live one (a record is ~160 B at these sizes)."""
    return max(64 << 20, n * 512)


MEAN_RECORD = 16 + KEY_SIZE + (VALUE_MIN + VALUE_MAX) // 2 + 15 & ~15  # layout.record_size of a mean value


def memory_for(n: int, max_value: int = 4096) -> int:
    """The smallest segment (by the layout's own plan) whose index and rings hold n records
    of the mean size: "a cache sized for n entries" (bench/test_churn.py, test_scale.py)."""
    import shmcache
    from shmcache.engine import layout as L

    lo, hi = 1 << 20, 1 << 40
    while lo < hi:
        mid = (lo + hi) // 2
        try:
            geo = L.Geometry.plan(mid, KEY_SIZE, max_value)
            ok = min(L.NBUCKETS * geo.max_live, geo.capacity_bytes // MEAN_RECORD) >= n
        except shmcache.MemoryTooSmallError:
            ok = False
        lo, hi = (lo, mid) if ok else (mid + 1, hi)
    return lo


# -- peers --------------------------------------------------------------------------------------
# Each peer has get_pass(which, count) with which in {"hit", "miss"}: look every key up
# in batches; with count=False (the timed pass) results are dropped batch by batch, with
# count=True (the check pass, untimed) it returns how many were found. set_pass()
# re-sets every key (same value) in batches, in query order. check(k) compares the
# values of the first k batches with the dataset.


class ShmPeer:
    def __init__(self, ds: Dataset, name: str):
        import shmcache

        self.ds, self.name = ds, name
        self.writer = shmcache.create(name, memory=cache_memory(ds.n))
        try:
            self.reader = shmcache.attach(name)
        except BaseException:
            self.writer.close()
            shmcache.destroy(name)
            raise

    def fill(self) -> None:
        ds = self.ds
        for s in range(0, ds.n, BATCH):
            e = min(s + BATCH, ds.n)
            self.writer.set_many(ds.keys[s:e], (ds.offsets[s : e + 1] - ds.offsets[s], ds.data[ds.offsets[s] : ds.offsets[e]]))

    def get_pass(self, which: str, count: bool = False) -> int:
        get, found = self.reader.get_many_packed, 0
        for b in self.ds.hit_batches if which == "hit" else self.ds.miss_batches:
            p = get(b)
            if count:
                found += int(np.count_nonzero(p.found))
        return found

    def get_list_pass(self, which: str, count: bool = False) -> int:
        get, found = self.reader.get_many, 0
        for b in self.ds.hit_batches if which == "hit" else self.ds.miss_batches:
            out = get(b)
            if count:
                found += sum(v is not None for v in out)
        return found

    def get_keylist_pass(self, which: str, count: bool = False) -> int:
        """get_many_packed with the keys as a list of bytes (what most callers hold)."""
        get, found = self.reader.get_many_packed, 0
        for b in self.ds.hit_lists if which == "hit" else self.ds.miss_lists:
            p = get(b)
            if count:
                found += int(np.count_nonzero(p.found))
        return found

    def set_pass(self) -> None:
        set_many = self.writer.set_many
        for k, v in zip(self.ds.hit_batches, self.ds.value_batches):
            set_many(k, v)

    def set_keylist_pass(self) -> None:
        """set_many with keys and values as lists of bytes."""
        set_many = self.writer.set_many
        for k, v in zip(self.ds.hit_lists, self.ds.value_lists):
            set_many(k, v)

    def set_list_pass(self) -> None:
        set_many = self.writer.set_many
        for k, v in zip(self.ds.hit_batches, self.ds.value_lists):
            set_many(k, v)

    def check(self, nbatches: int) -> None:
        for b, (offs, data) in list(zip(self.ds.hit_batches, self.ds.value_batches))[:nbatches]:
            p = self.reader.get_many_packed(b)
            assert p.found.all() and np.array_equal(p.offsets, offs) and np.array_equal(p.data, data)

    def close(self) -> None:
        import shmcache

        for h in (self.reader, self.writer):
            h.close()
        shmcache.destroy(self.name)


class DictPeer:
    def __init__(self, ds: Dataset):
        self.ds, self.d = ds, {}

    def fill(self) -> None:
        for kb, vb in zip(self.ds.fill_key_lists, self.ds.fill_value_lists):
            self.d.update(zip(kb, vb))

    def get_pass(self, which: str, count: bool = False) -> int:
        get, found = self.d.get, 0
        for b in self.ds.hit_lists if which == "hit" else self.ds.miss_lists:
            out = [get(k) for k in b]
            if count:
                found += sum(v is not None for v in out)
        return found

    def set_pass(self) -> None:
        update = self.d.update
        for kb, vb in zip(self.ds.hit_lists, self.ds.value_lists):
            update(zip(kb, vb))

    def check(self, nbatches: int) -> None:
        for kb, vb in list(zip(self.ds.hit_lists, self.ds.value_lists))[:nbatches]:
            assert [self.d.get(k) for k in kb] == vb

    def close(self) -> None:
        self.d.clear()


class LmdbPeer:
    """One read txn per batch with txn.get per key (as fast as or faster than
    Cursor.getmulti, 5-20 % in trials; buffers=True was 2x slower), one write txn per
    batch with Cursor.putmulti (as fast as txn.put per key, within noise)."""

    def __init__(self, ds: Dataset):
        import lmdb

        self.ds = ds
        self.dir = tempfile.mkdtemp(prefix=f"bench-lmdb-{os.getpid()}-", dir="/dev/shm")
        try:
            self.env = lmdb.open(self.dir, map_size=max(256 << 20, ds.n * 1024), writemap=True, sync=False,
                                 metasync=False, map_async=True, readahead=False, max_dbs=0)
        except BaseException:
            shutil.rmtree(self.dir, ignore_errors=True)
            raise

    def _put(self, key_lists, value_lists) -> None:
        begin = self.env.begin
        for kb, vb in zip(key_lists, value_lists):
            with begin(write=True) as txn:
                txn.cursor().putmulti(zip(kb, vb))

    def fill(self) -> None:
        self._put(self.ds.fill_key_lists, self.ds.fill_value_lists)

    def get_pass(self, which: str, count: bool = False) -> int:
        begin, found = self.env.begin, 0
        for b in self.ds.hit_lists if which == "hit" else self.ds.miss_lists:
            with begin() as txn:
                get = txn.get
                out = [get(k) for k in b]
            if count:
                found += sum(v is not None for v in out)
        return found

    def set_pass(self) -> None:
        self._put(self.ds.hit_lists, self.ds.value_lists)

    def check(self, nbatches: int) -> None:
        for kb, vb in list(zip(self.ds.hit_lists, self.ds.value_lists))[:nbatches]:
            with self.env.begin() as txn:
                assert [txn.get(k) for k in kb] == vb

    def close(self) -> None:
        try:
            self.env.close()
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)


class RedisServer:
    """A throw-away redis-server on 127.0.0.1 (no persistence), stopped by pid."""

    def __init__(self):
        exe = shutil.which("redis-server")
        if exe is None:
            raise FileNotFoundError("redis-server is not installed (not on PATH)")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            self.port = s.getsockname()[1]
        self.dir = tempfile.mkdtemp(prefix=f"bench-redis-{os.getpid()}-")
        self.proc = subprocess.Popen(
            [exe, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", self.dir, "--logfile", "", "--loglevel", "warning"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )
        self.pid = self.proc.pid

    def connect(self):
        """A redis-py client once the server answers; the server is stopped if it never does."""
        import redis

        try:
            client = redis.Redis(host="127.0.0.1", port=self.port)
            deadline = time.monotonic() + 10
            while True:
                try:
                    client.ping()
                    return client
                except redis.ConnectionError:
                    if time.monotonic() > deadline or self.proc.poll() is not None:
                        raise
                    time.sleep(0.02)
        except BaseException:
            self.stop()
            raise

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.pid, 15)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                os.kill(self.pid, 9)
                self.proc.wait()
        shutil.rmtree(self.dir, ignore_errors=True)


class RedisPeer:
    """redis-py, one MGET / MSET of a whole batch per call (no pipelining beyond that)."""

    def __init__(self, ds: Dataset):
        self.ds = ds
        self.server = RedisServer()
        self.client = self.server.connect()

    def fill(self) -> None:
        for kb, vb in zip(self.ds.fill_key_lists, self.ds.fill_value_lists):
            self.client.mset(dict(zip(kb, vb)))

    def get_pass(self, which: str, count: bool = False) -> int:
        mget, found = self.client.mget, 0
        for b in self.ds.hit_lists if which == "hit" else self.ds.miss_lists:
            out = mget(b)
            if count:
                found += sum(v is not None for v in out)
        return found

    def set_pass(self) -> None:
        mset = self.client.mset
        for kb, vb in zip(self.ds.hit_lists, self.ds.value_lists):
            mset(dict(zip(kb, vb)))

    def check(self, nbatches: int) -> None:
        for kb, vb in list(zip(self.ds.hit_lists, self.ds.value_lists))[:nbatches]:
            assert self.client.mget(kb) == vb

    def close(self) -> None:
        try:
            self.client.close()
        finally:
            self.server.stop()


# -- child processes ------------------------------------------------------------------------------


class Child:
    """A reader or writer process (this file run as a script), driven by lines on stdin."""

    def __init__(self, role: str, cache: str, n: int, seed: int = SEED):
        self.proc = subprocess.Popen([sys.executable, "-P", "-m", "shmtest.bench.peers", role, cache, str(n), str(seed)],
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)
        self.role = role

    def send(self, cmd: str) -> None:
        self.proc.stdin.write(cmd + "\n")
        self.proc.stdin.flush()

    def recv(self) -> dict:
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"{self.role} process {self.proc.pid} exited (rc={self.proc.wait()})")
        return json.loads(line)

    def stop(self) -> None:
        if self.proc.poll() is None:
            try:
                self.send("quit")
                self.proc.wait(10)
            except (OSError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        for f in (self.proc.stdin, self.proc.stdout):
            try:
                f.close()
            except OSError:
                pass


def _child_main(role: str, cache: str, n: int, seed: int) -> None:
    """reader: on "go", one get_many_packed pass over all keys -> {"t0", "t1", "found"};
               on "check", a pass comparing every value -> {"ok", "read_retries"}.
    writer: on "go", set_many over all keys again and again until the next line
            arrives -> {"sets", "seconds"}.
    Both print {"ready": true} once attached and warmed up, and stop on "quit" or EOF."""
    import shmcache

    ds = make_dataset(n, seed, with_bytes=False)
    out = sys.stdout
    if role == "reader":
        r = shmcache.attach(cache)
        for b in ds.hit_batches[:4]:
            r.get_many_packed(b)  # warm up (numba dispatch, caches)
        print(json.dumps({"ready": True}), file=out, flush=True)
        for line in sys.stdin:
            cmd = line.strip()
            if cmd == "go":
                found, get = 0, r.get_many_packed
                c0, t0 = time.process_time(), time.perf_counter()
                for b in ds.hit_batches:
                    found += int(np.count_nonzero(get(b).found))
                t1, c1 = time.perf_counter(), time.process_time()
                print(json.dumps({"t0": t0, "t1": t1, "cpu": c1 - c0, "found": found}), file=out, flush=True)
            elif cmd == "check":
                ok = True
                for b, (offs, data) in zip(ds.hit_batches, ds.value_batches):
                    p = r.get_many_packed(b)
                    ok = ok and bool(p.found.all()) and np.array_equal(p.offsets, offs) and np.array_equal(p.data, data)
                print(json.dumps({"ok": ok, "read_retries": r.stats()["read_retries"]}), file=out, flush=True)
            else:
                break
        r.close()
    elif role == "writer":
        w = shmcache.open(cache)
        w.set_many(ds.hit_batches[0], ds.value_batches[0])  # warm up
        print(json.dumps({"ready": True}), file=out, flush=True)
        stdin = sys.stdin
        for line in stdin:
            if line.strip() != "go":
                break
            sets, t0, running = 0, time.perf_counter(), True
            while running:
                for k, v in zip(ds.hit_batches, ds.value_batches):
                    w.set_many(k, v)
                    sets += len(k)
                    if select.select([stdin], [], [], 0)[0]:
                        running = False
                        break
            print(json.dumps({"sets": sets, "seconds": time.perf_counter() - t0}), file=out, flush=True)
        w.close()
    else:
        raise SystemExit(f"unknown role {role!r}")


if __name__ == "__main__":
    _child_main(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
