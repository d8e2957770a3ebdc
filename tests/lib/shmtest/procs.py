"""Child processes for the multi-process engine tests, and what the tests share with them.

Run as a script, `python -m shmtest.procs ROLE NAME ARGS...`, a child imports shmcache from
the venv, prepares its keys and values, prints one JSON line `{"ready": ...}` and then
follows line commands on stdin ("go", "write V", "read V", "quit"), answering with
one JSON line each. Imported by the tests, it gives the value scheme, the verifier,
a white-box table checker and `Proc`, a handle on one child with timeouts.

Value scheme (every hit can be checked against its key alone):

    [8 B blake2b(key)[:8]][u32 version][u32 body_len ^ (seed >> 32)][body]

seed = mix64(hdr ^ version * C); body_len (from seed, and 1.5-2.5 KB when the version has
the BIG bit) and every body byte derive from seed, so a value of another key, a value
made of two versions, a truncated or stretched value all fail `verify`.
"""

from __future__ import annotations

import hashlib
import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
NBUCKETS = 8192
HEAD = 16  # value header bytes

_C1 = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser, on uint64 arrays (wrapping)."""
    x = x.astype(np.uint64, copy=True)
    with np.errstate(over="ignore"):
        x ^= x >> np.uint64(30)
        x *= _M1
        x ^= x >> np.uint64(27)
        x *= _M2
        x ^= x >> np.uint64(31)
    return x


def key_pool(seed: int, n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(keys (n, 32) uint8, hdr (n,) uint64 = blake2b(key)[:8], bucket (n,) int64 by xxhash)."""
    import xxhash

    keys = np.random.default_rng(seed).integers(0, 256, (n, 32), dtype=np.uint8)
    raw = keys.tobytes()
    kb = [raw[i * 32:(i + 1) * 32] for i in range(n)]
    hdr = np.frombuffer(b"".join(hashlib.blake2b(k, digest_size=8).digest() for k in kb), np.uint64)
    bucket = np.fromiter((xxhash.xxh64_intdigest(k) % NBUCKETS for k in kb), np.int64, n)
    return keys, hdr.copy(), bucket


def probe_keys(seed: int) -> tuple[np.ndarray, np.ndarray]:
    """One key in every bucket, in bucket order: (keys (8192, 32) uint8, hdr (8192,) uint64)."""
    import xxhash

    rng = np.random.default_rng(seed + 10_000)
    chosen: dict[int, bytes] = {}
    while len(chosen) < NBUCKETS:
        raw = rng.integers(0, 256, (16384, 32), dtype=np.uint8).tobytes()
        for i in range(16384):
            k = raw[i * 32:(i + 1) * 32]
            chosen.setdefault(xxhash.xxh64_intdigest(k) % NBUCKETS, k)
    kb = [chosen[b] for b in range(NBUCKETS)]
    hdr = np.frombuffer(b"".join(hashlib.blake2b(k, digest_size=8).digest() for k in kb), np.uint64)
    return np.frombuffer(b"".join(kb), np.uint8).reshape(NBUCKETS, 32).copy(), hdr.copy()


def hot_keys(seed: int, buckets: int = 8, per_bucket: int = 8) -> tuple[np.ndarray, np.ndarray]:
    """per_bucket keys in each of buckets 0 .. buckets-1: (keys, hdr), where writers and readers collide."""
    import xxhash

    rng = np.random.default_rng(seed + 20_000)
    chosen: dict[int, list[bytes]] = {b: [] for b in range(buckets)}
    while any(len(v) < per_bucket for v in chosen.values()):
        raw = rng.integers(0, 256, (16384, 32), dtype=np.uint8).tobytes()
        for i in range(16384):
            k = raw[i * 32:(i + 1) * 32]
            b = xxhash.xxh64_intdigest(k) % NBUCKETS
            if b < buckets and len(chosen[b]) < per_bucket:
                chosen[b].append(k)
    kb = [k for b in range(buckets) for k in chosen[b]]
    hdr = np.frombuffer(b"".join(hashlib.blake2b(k, digest_size=8).digest() for k in kb), np.uint64)
    return np.frombuffer(b"".join(kb), np.uint8).reshape(len(kb), 32).copy(), hdr.copy()


def universe(seed: int, nkeys: int) -> tuple[np.ndarray, np.ndarray]:
    """The pool followed by the hot keys: (keys, hdr)."""
    keys, hdr, _ = key_pool(seed, nkeys)
    hk, hh = hot_keys(seed)
    return np.concatenate([keys, hk]), np.concatenate([hdr, hh])


def pick(rng, nkeys: int, nhot: int, batch: int) -> np.ndarray:
    """A batch of universe indices: half from the pool, half hot keys."""
    hot = batch // 2
    return np.concatenate([rng.integers(0, nkeys, batch - hot), nkeys + rng.integers(0, nhot, hot)])


BIG = 1 << 23  # a version with this bit set has a big body (writers set it for hot keys)


def _body_lens(seed: np.ndarray, ver: np.ndarray) -> np.ndarray:
    small = (seed % np.uint64(200)).astype(np.int64)
    big = 1000 + (seed % np.uint64(2500)).astype(np.int64)  # 1 in 64 values is big: ring padding
    lens = np.where(((seed >> np.uint64(40)) & np.uint64(63)) == 0, big, small)
    # BIG versions: 1.5-2.5 KB, so a bucket's ring holds two and every set evicts a live record
    return np.where(ver & np.uint64(BIG), 1500 + (seed % np.uint64(1000)).astype(np.int64), lens)


def make_values(hdr: np.ndarray, ver) -> tuple[np.ndarray, np.ndarray]:
    """(offsets, data) of the values of keys with these headers at these versions (u32)."""
    n = len(hdr)
    ver = np.broadcast_to(np.asarray(ver, np.uint64), (n,)) & np.uint64(0xFFFFFFFF)
    with np.errstate(over="ignore"):
        seed = mix64(hdr ^ (ver * _C1))
    blen = _body_lens(seed, ver)
    total = HEAD + blen
    offsets = np.zeros(n + 1, np.int64)
    np.cumsum(total, out=offsets[1:])
    data = np.empty(int(offsets[-1]), np.uint8)
    head = np.empty((n, 4), np.uint32)
    head[:, 0:2] = hdr.view(np.uint32).reshape(n, 2)
    head[:, 2] = ver.astype(np.uint32)
    head[:, 3] = blen.astype(np.uint32) ^ (seed >> np.uint64(32)).astype(np.uint32)
    starts = offsets[:-1]
    data[(starts[:, None] + np.arange(HEAD)).reshape(-1)] = head.view(np.uint8).reshape(-1)
    nb = int(blen.sum())
    if nb:
        bstart = np.repeat(starts + HEAD, blen)
        j = np.arange(nb, dtype=np.int64) - np.repeat(np.cumsum(blen) - blen, blen)
        with np.errstate(over="ignore"):
            body = (np.repeat(seed, blen) + j.astype(np.uint64) * _C1) >> np.uint64(56)
        data[bstart + j] = body.astype(np.uint8)
    return offsets, data


def verify(packed, hdr: np.ndarray) -> tuple[int, np.ndarray, str]:
    """Check every hit of a lookup of keys with these headers.

    Returns (number of bad values, versions of the hits (-1 where missing or bad), first problem)."""
    found = np.asarray(packed.found, bool)
    offs = np.asarray(packed.offsets, np.int64)
    data = np.asarray(packed.data, np.uint8)
    vers = np.full(len(found), -1, np.int64)
    hits = np.flatnonzero(found)
    if not len(hits):
        return 0, vers, ""
    starts = offs[hits]
    lens = offs[hits + 1] - starts
    bad = lens < HEAD
    ok = np.flatnonzero(~bad)
    problem = ""
    if bad.any():
        i = int(hits[np.flatnonzero(bad)[0]])
        problem = f"key #{i}: value of {int(lens[np.flatnonzero(bad)[0]])} bytes, shorter than its header"
    s = starts[ok]
    head = data[(s[:, None] + np.arange(HEAD)).reshape(-1)].reshape(-1, HEAD).copy().view(np.uint32)
    got_hdr = head[:, 0:2].copy().view(np.uint64).reshape(-1)
    got_ver = head[:, 2].astype(np.int64)
    exp_off, exp_data = make_values(hdr[hits[ok]], got_ver.astype(np.uint64))
    exp_lens = np.diff(exp_off)
    good = (got_hdr == hdr[hits[ok]]) & (exp_lens == lens[ok])
    # compare bytes of the values whose length is right
    cand = np.flatnonzero(good)
    if len(cand):
        clen = lens[ok][cand]
        idx_got = np.repeat(s[cand], clen) + (np.arange(int(clen.sum())) - np.repeat(np.cumsum(clen) - clen, clen))
        idx_exp = np.repeat(exp_off[:-1][cand], clen) + (np.arange(int(clen.sum())) - np.repeat(np.cumsum(clen) - clen, clen))
        diff = data[idx_got] != exp_data[idx_exp]
        per = np.add.reduceat(diff.astype(np.int64), np.cumsum(clen) - clen) if len(diff) else np.zeros(len(cand), np.int64)
        good[cand[per > 0]] = False
    nbad = int(bad.sum()) + int((~good).sum())
    vers[hits[ok[good]]] = got_ver[good]
    if nbad and not problem:
        j = int(np.flatnonzero(~good)[0])
        i = int(hits[ok[j]])
        problem = (f"key #{i}: value of {int(lens[ok][j])} bytes (expected {int(exp_lens[j])} for version "
                   f"{int(got_ver[j])}), header {'matches' if got_hdr[j] == hdr[i] else 'does NOT match'} its key, "
                   f"first bytes {data[s[j]:s[j] + 24].tobytes().hex()}")
    return nbad, vers, problem


def check_table(r) -> dict:
    """White-box invariants of a quiescent table (no writer inside a bucket), from a Reader's arrays.

    Every bucket: lock free, version even, index slots that are set == live count, every
    indexed record is LIVE, lies in the bucket's ring, belongs to that bucket, and live
    bytes == the sizes of the indexed records. Returns {"entries": ..., "slots": ...}."""
    from shmcache.engine import layout as L

    g = r.geometry
    meta = r._meta.reshape(L.NBUCKETS, L.ROW_WORDS)
    assert (meta[:, L.M_LOCK] == 0).all(), f"locks held: buckets {np.flatnonzero(meta[:, L.M_LOCK])[:10]}"
    assert (meta[:, L.M_VERSION] & 1 == 0).all(), f"odd versions: {np.flatnonzero(meta[:, L.M_VERSION] & 1)[:10]}"
    idx = r._index.reshape(L.NBUCKETS, g.slots)
    used = idx != 0
    per_bucket = used.sum(1)
    bad = np.flatnonzero(per_bucket != meta[:, L.M_LIVE])
    assert not len(bad), f"bucket {bad[0]}: {per_bucket[bad[0]]} index slots set but live={meta[bad[0], L.M_LIVE]}"
    b, s = np.nonzero(used)
    e = idx[b, s]
    off = (e & L.POS_MASK) - 1
    assert ((off >= 0) & (off % L.RECORD_ALIGN == 0) & (off + L.RECORD_HEADER + g.key_size <= g.ring)).all()
    w = (b * g.ring + off) // 8
    word = r._ring64[w + 1]
    flags = word >> 32
    vlen = word & 0xFFFFFFFF
    assert (flags == L.F_LIVE).all(), f"{int((flags != L.F_LIVE).sum())} indexed records are not LIVE"
    h = r._ring64[w]
    assert ((h & (L.NBUCKETS - 1)) == b).all(), "an indexed record hashes to another bucket"
    assert ((h >> L.TAG_SHIFT) & 0xFFFF == e >> L.POS_BITS).all(), "an index slot's tag differs from its record's hash"
    size = (L.RECORD_HEADER + g.key_size + vlen + L.RECORD_ALIGN - 1) // L.RECORD_ALIGN * L.RECORD_ALIGN
    lb = np.bincount(b, weights=size, minlength=L.NBUCKETS).astype(np.int64)
    bad = np.flatnonzero(lb != meta[:, L.M_LIVE_BYTES])
    assert not len(bad), f"bucket {bad[0]}: indexed records hold {lb[bad[0]]} B but live_bytes={meta[bad[0], L.M_LIVE_BYTES]}"
    span = meta[:, L.M_HEAD] - meta[:, L.M_TAIL]
    assert ((span >= 0) & (span <= g.ring)).all(), "a ring's head and tail are more than a ring apart"
    return {"entries": int(used.sum())}


# -- the parent's handle on a child --------------------------------------------------------


class Proc:
    """One child running this file as a script, with line I/O and timeouts."""

    def __init__(self, role: str, *args, log_dir: str):
        self.role = role
        self.err_path = os.path.join(log_dir, f"{role}-{time.monotonic_ns()}.stderr")
        self._err = open(self.err_path, "w+")
        self.p = subprocess.Popen(
            [sys.executable, "-P", "-m", "shmtest.procs", role, *map(str, args)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._err, text=True, bufsize=1,
        )
        self.pid = self.p.pid
        self._q: queue.Queue = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        for line in self.p.stdout:
            self._q.put(line)
        self._q.put(None)

    def stderr(self) -> str:
        self._err.flush()
        with open(self.err_path) as f:
            return f.read()[-3000:]

    def recv(self, timeout: float) -> dict:
        try:
            line = self._q.get(timeout=timeout)
        except queue.Empty:
            raise TimeoutError(f"{self.role} (pid {self.pid}) gave no answer in {timeout} s; stderr:\n{self.stderr()}") from None
        if line is None:
            self.p.wait(5)
            raise RuntimeError(f"{self.role} (pid {self.pid}) exited with {self.p.returncode}; stderr:\n{self.stderr()}")
        return json.loads(line)

    def send(self, cmd: str) -> None:
        self.p.stdin.write(cmd + "\n")
        self.p.stdin.flush()

    def ask(self, cmd: str, timeout: float) -> dict:
        self.send(cmd)
        return self.recv(timeout)

    def sigkill(self) -> None:
        """SIGKILL and reap (a zombie would still look alive to kill(pid, 0))."""
        if self.p.poll() is None:
            os.kill(self.pid, signal.SIGKILL)
        self.p.wait(10)

    def close(self) -> None:
        if self.p.poll() is None:
            try:
                self.p.kill()
            except ProcessLookupError:
                pass
        try:
            self.p.wait(10)
        finally:
            for f in (self.p.stdin, self._err):
                try:
                    f.close()
                except OSError:
                    pass


# -- child roles --------------------------------------------------------------------------------


_HOLDER = """
import mmap, os, struct, sys
import shmcache
from shmcache.engine import layout as L
from shmcache.ipc import liveness
w = shmcache.open(os.path.basename(sys.argv[1]))
me = liveness.owner_word()
fd = os.open(sys.argv[1], os.O_RDWR)
m = mmap.mmap(fd, 0)
for b in range(L.NBUCKETS):
    row = L.FIXED_BYTES - L.NBUCKETS * L.ROW_WORDS * L.WORD + b * L.ROW_WORDS * L.WORD
    v = struct.unpack_from('<q', m, row + L.M_VERSION * 8)[0]
    struct.pack_into('<q', m, row + L.M_LOCK * 8, me)
    struct.pack_into('<q', m, row + L.M_VERSION * 8, v | 1)
print('held', flush=True)
sys.stdin.read()
"""


def hold_every_bucket(path: str) -> subprocess.Popen:
    """A live process that holds every bucket of the cache at `path` mid-write (its owner word
    in M_LOCK, M_VERSION odd), as a writer stopped inside a write would, until it is killed
    or its stdin closes: a writer, its row and owner lock held (docs/segment-format.md,
    section 13)."""
    p = subprocess.Popen([sys.executable, "-c", _HOLDER, str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         text=True)
    if p.stdout.readline().strip() != "held":
        p.kill()
        p.wait()
        raise AssertionError("the holder did not start")
    return p


def _say(**kw) -> None:
    sys.stdout.write(json.dumps(kw) + "\n")
    sys.stdout.flush()


def _wait_go() -> None:
    line = sys.stdin.readline()
    if line.strip() != "go":
        sys.exit(f"expected 'go', got {line!r}")


def role_writer(name, seed, nkeys, wid, duration, batch):
    """For `duration` s after "go", round and round: `batch` random pool keys at a new version,
    then `batch` hot keys from 16 prepared batches with BIG values (prepared, so the writer is
    mostly in the kernel, evicting live records from under the readers in the hot buckets)."""
    import shmcache

    nkeys, wid, duration, batch = int(nkeys), int(wid), float(duration), int(batch)
    keys, hdr = universe(int(seed), nkeys)
    nhot = len(keys) - nkeys
    rng = np.random.default_rng(1000 + wid)
    hot_plans = []
    for j in range(16):
        idx = nkeys + rng.integers(0, nhot, batch)
        hot_plans.append((keys[idx], make_values(hdr[idx], (wid << 24) | BIG | j)))
    w = shmcache.open(name)
    w.set_many(*hot_plans[0])  # compile before the clock starts
    _say(ready=os.getpid())
    _wait_go()
    sets = batches = 0
    t_end = time.monotonic() + duration
    while time.monotonic() < t_end:
        idx = rng.integers(0, nkeys, batch)
        w.set_many(keys[idx], make_values(hdr[idx], (wid << 24) | (batches % BIG)))
        w.set_many(*hot_plans[batches % 16])
        batches += 1
        sets += 2 * batch
    _say(sets=sets, batches=batches)
    w.close()


def role_reader(name, seed, nkeys, duration, batch):
    """Random batches of the universe, every hit verified, for `duration` s after "go"."""
    import shmcache

    nkeys, duration, batch = int(nkeys), float(duration), int(batch)
    keys, hdr = universe(int(seed), nkeys)
    rng = np.random.default_rng(os.getpid())
    r = shmcache.attach(name)
    verify(r.get_many_packed(keys[:8]), hdr[:8])
    _say(ready=os.getpid())
    _wait_go()
    lookups = hits = hot_hits = bad = 0
    problem = ""
    t_end = time.monotonic() + duration
    while time.monotonic() < t_end:
        idx = pick(rng, nkeys, len(keys) - nkeys, batch)
        p = r.get_many_packed(keys[idx])
        nb, _, prob = verify(p, hdr[idx])
        lookups += batch
        hits += int(p.found.sum())
        hot_hits += int(p.found[idx >= nkeys].sum())
        bad += nb
        problem = problem or prob
    st = r.stats()
    _say(lookups=lookups, hits=hits, hot_hits=hot_hits, bad=bad, problem=problem, read_retries=st["read_retries"])
    r.close()


def role_overlap_writer(name, seed, nkeys, wid, rounds, batch):
    """`rounds` passes over the whole pool in shuffled batches; version = wid << 16 | round.

    Writer 1 goes through each round's shuffle forwards, writer 2 backwards, so writers
    started together meet on the same buckets (lock contention). The last round is paced
    (~0.4 s), so the two last rounds overlap and which writer sets a key last is a race."""
    import shmcache

    nkeys, wid, rounds, batch = int(nkeys), int(wid), int(rounds), int(batch)
    keys, hdr, _ = key_pool(int(seed), nkeys)
    rng = np.random.default_rng(2000)
    w = shmcache.open(name)
    w.set_many(keys[:0], make_values(hdr[:0], 0))
    plans = []
    for rnd in range(rounds):
        perm = rng.permutation(nkeys)
        if wid == 2:
            perm = perm[::-1]
        plans.append([(keys[perm[s:s + batch]], make_values(hdr[perm[s:s + batch]], (wid << 16) | rnd))
                      for s in range(0, nkeys, batch)])
    pause = 0.4 / len(plans[-1])
    _say(ready=os.getpid())
    _wait_go()
    t0 = time.monotonic()
    for plan in plans[:-1]:
        for k, v in plan:
            w.set_many(k, v)
    last_start = time.time()
    for k, v in plans[-1]:
        w.set_many(k, v)
        time.sleep(pause)
    _say(done=time.monotonic() - t0, last_round=[last_start, time.time()])
    w.close()


def role_crash_writer(name, seed, nkeys, ver):
    """Loops set_many over the whole pool in two big batches until killed."""
    import shmcache

    nkeys, ver = int(nkeys), int(ver)
    keys, hdr, _ = key_pool(int(seed), nkeys)
    half = nkeys // 2
    batches = [(keys[:half], make_values(hdr[:half], ver)), (keys[half:], make_values(hdr[half:], ver + 1))]
    w = shmcache.open(name)
    _say(ready=os.getpid(), owner=w._me)
    while True:
        for k, v in batches:
            w.set_many(k, v)


def role_service_writer(name, seed):
    """On "write V": one key in every bucket (probe_keys) at version V; answers with the time it took."""
    import shmcache

    pk, ph = probe_keys(int(seed))
    w = shmcache.open(name)
    _say(ready=os.getpid())
    for line in sys.stdin:
        cmd = line.split()
        if cmd[0] == "quit":
            break
        t0 = time.monotonic()
        w.set_many(pk, make_values(ph, int(cmd[1])))
        _say(elapsed=time.monotonic() - t0)
    w.close()


def role_service_reader(name, seed, nkeys, warm="warm"):
    """On "read V SEL": looks up pool keys SEL ("all", a count of random ones, or a JSON list of
    indices) followed by one key in every bucket (probe_keys), verifies every hit, and checks that
    the probe keys are at version V (V = -1: not checked). Answers with counts and the time the
    lookup took. warm="cold": no lookup before "ready" (the first one also loads the kernels)."""
    import shmcache

    keys, hdr, _ = key_pool(int(seed), int(nkeys))
    pk, ph = probe_keys(int(seed))
    rng = np.random.default_rng(os.getpid())
    r = shmcache.attach(name)
    if warm == "warm":
        verify(r.get_many_packed(pk[:8]), ph[:8])
    _say(ready=os.getpid())
    for line in sys.stdin:
        cmd = line.split()
        if cmd[0] == "quit":
            break
        want, spec = int(cmd[1]), cmd[2]
        if spec == "all":
            sel = np.arange(len(keys))
        elif spec.isdigit():
            sel = rng.choice(len(keys), int(spec), replace=False)
        else:
            sel = np.array(json.loads(spec), np.int64)
        k = np.concatenate([keys[sel], pk])
        h = np.concatenate([hdr[sel], ph])
        t0 = time.monotonic()
        p = r.get_many_packed(k)
        dt = time.monotonic() - t0
        nb, vers, prob = verify(p, h)
        out = dict(elapsed=dt, n=len(k), hits=int(p.found.sum()), bad=nb, problem=prob,
                   read_retries=r.stats()["read_retries"])
        if want >= 0:
            pv = vers[len(sel):]
            out["probe_missing"] = int((pv < 0).sum())
            out["probe_wrong_version"] = int(((pv >= 0) & (pv != want)).sum())
        _say(**out)
    r.close()


ROLES = {
    "writer": role_writer,
    "reader": role_reader,
    "overlap_writer": role_overlap_writer,
    "crash_writer": role_crash_writer,
    "service_writer": role_service_writer,
    "service_reader": role_service_reader,
}

if __name__ == "__main__":
    if sys.argv[1] not in ROLES:  # the corruption tests' roles
        from shmtest.fuzz_child import ROLES as FUZZ_ROLES

        ROLES.update(FUZZ_ROLES)
    ROLES[sys.argv[1]](*sys.argv[2:])
