"""The warm-up: every numba kernel a worker, a reader and the load generator use, run once
so numba compiles it into its on-disk cache (ipc/jitcache.py says where that lives and how
it stays fresh); whether this install's kernels are compiled (`is_warm`, the marker a
finished warm-up leaves beside numba's cache); and the warm-up as a child process of a
supervisor (`start`, `finish`, and the removal of the private caches a killed one left).
`shmcache warm` and a supervisor's child run it as `python -m shmcache.consumer.warm`.

Compiling costs seconds per kernel signature and numba compiles on a signature's first
call: without a warm-up, every worker process of a freshly installed supervisor would
pay it at once, after "ready". `shmcache warm` runs it at install time (scripts/setup), and the
supervisor runs it once before it starts workers unless the install is warm already.

The kernels are reached through the public calls on a small private cache, so they
compile for exactly the argument types the real calls give (a read-only mapping types
differently from a writable one, a list of keys from an array), with no list of
signatures kept by hand; the lock takeover, which no healthy call reaches, through
engine/writer.py's warm_takeover (the real takeover path, on a bucket of the private cache
locked by an owner word no process has). What each kernel cost is reported: loaded from
the cache ("hits") or compiled now ("misses").
"""

from __future__ import annotations

import os
import secrets
import signal
import subprocess
import sys
import time

from shmcache.errors import CacheNotFoundError

PREFIX = "shmcache-warm-"  # + pid + "-" + random: the warm-up's private cache


def package_stamp() -> str:
    """sha256 over every source file of the package (as ipc/jitcache.py walks them), and
    the Python and numba versions: what a warm-up warmed the kernel cache for. Any edit to
    the package, or an upgrade, gives another stamp."""
    import numba

    from shmcache.ipc import jitcache

    return jitcache.files_stamp(jitcache.package_sources(), f"{sys.version}\0{numba.__version__}\0".encode())


MARKER = "shmcache-warmed-"  # + the package stamp: a file beside the apply kernel's cache entries


def _apply_cache():
    from shmcache.engine.writer import apply_kernel_cache

    return apply_kernel_cache()


def _marker_dir() -> str | None:
    return getattr(_apply_cache(), "_cache_path", None)


def is_warm() -> bool:
    """True if a warm-up finished for exactly these sources, Python and numba, and the apply
    kernel's cache index is still there: a supervisor then starts its workers at once
    (each loads the kernels; none compiles) instead of waiting for a warm-up that would
    only load them too. A cache removed by hand takes the marker with it (same directory)."""
    cache = _apply_cache()
    d = getattr(cache, "_cache_path", None)
    index = getattr(getattr(cache, "_cache_file", None), "_index_path", None)
    return bool(d and index) and os.path.exists(index) and os.path.exists(os.path.join(d, MARKER + package_stamp()))


def mark() -> None:
    """Leave the marker is_warm() looks for (and remove the markers of other versions); a
    cache directory this process cannot write keeps no marker: supervisors warm up first."""
    d = _marker_dir()
    if not d:
        return
    stamp = MARKER + package_stamp()
    try:
        for old in os.listdir(d):
            if old.startswith(MARKER) and old != stamp:
                os.unlink(os.path.join(d, old))
        with open(os.path.join(d, stamp), "w") as f:
            f.write("shmcache warm finished for these sources; see shmcache/consumer/warm.py\n")
    except OSError:
        pass


def _private_caches() -> list[str]:
    """Names in /dev/shm that a warm-up's private cache goes by, whatever is there: a
    file damaged since, without its magic, is one shmcache.list_caches would skip."""
    from shmcache.ipc.segment import SHM_DIR

    try:
        return sorted(e.name for e in os.scandir(SHM_DIR) if e.name.startswith(PREFIX))
    except OSError:
        return []


def remove_leftovers(pid: int) -> list[str]:
    """Remove the private caches a killed warm-up of process `pid` left; returns their names."""
    from shmcache.engine import table

    gone = []
    for name in _private_caches():
        if name.startswith(f"{PREFIX}{pid}-"):
            table.destroy(name, force=True)
            gone.append(name)
    return gone


def remove_orphans() -> list[str]:
    """Remove the private caches of warm-ups whose process is gone: one SIGKILLed (say, with
    its supervisor's whole process tree) had no chance to. A live pid's cache is kept."""
    import psutil

    gone = []
    for pid in sorted({name[len(PREFIX):].split("-", 1)[0] for name in _private_caches()}):
        if pid.isdigit() and not psutil.pid_exists(int(pid)):
            gone += remove_leftovers(int(pid))
    return gone


def start() -> subprocess.Popen:
    """`python -m shmcache.consumer.warm` in a child process, for a supervisor to overlap with its wait
    for the broker: a child cleans its private cache up even if the supervisor is killed
    (and one killed with it is cleaned up by the next start)."""
    remove_orphans()
    return subprocess.Popen([sys.executable, "-m", "shmcache.consumer.warm"], stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def finish(proc: subprocess.Popen, beat, stopping) -> str:
    """Wait for a started warm-up (calling beat() every 0.1 s) and return its last line;
    if stopping() turns true meanwhile, stop it (by pid) and return ""."""
    while proc.poll() is None:
        if stopping():
            # killed, not asked: a child inside a compile would finish it first. Its private
            # cache is then removed here, by the name it was given (PREFIX + its pid).
            proc.kill()
            proc.wait()
            proc.stdout.close()
            remove_leftovers(proc.pid)
            return ""
        beat()
        try:
            proc.wait(0.1)
        except subprocess.TimeoutExpired:
            pass
    out = proc.stdout.read().strip()
    proc.stdout.close()
    last = out.splitlines()[-1] if out else ""
    return last if proc.returncode == 0 else f"shmcache warm failed (exit {proc.returncode}): {last}"


# -- the warm-up itself ----------------------------------------------------------------------


def warm() -> dict:
    """Run every kernel once; returns {"seconds", "compiled", "loaded"} (signatures)."""
    t0 = time.perf_counter()
    import numpy as np  # here: a supervisor imports this module for is_warm() before it pays for numpy

    from shmcache.consumer.worker.loop import apply_batch
    from shmcache.engine import table, writer
    from shmcache.formats import partitioners, txmeta, wire, wire_batch

    before = _cache_counts()
    rng = np.random.default_rng(0)
    n = 64
    keys = rng.integers(0, 256, (n, wire.KEY_SIZE), np.uint8)
    values = [bytes(rng.integers(0, 256, 61 + i, np.uint8)) for i in range(n)]
    actions = np.zeros(n, np.uint8)
    actions[-4:] = 1  # a few DELETEs
    name = f"{PREFIX}{os.getpid()}-{secrets.token_hex(4)}"
    w = None
    try:  # from before create: an error just after it returned still removes the cache
        w = table.create(name, memory="8MiB", max_value=256)  # types, not sizes, pick the signatures
        with table.attach(name) as r:
            key_list = [bytes(k) for k in keys]
            offsets = np.zeros(n + 1, np.int64)
            np.cumsum([len(v) for v in values], out=offsets[1:])
            w.set_many(keys, (offsets, np.frombuffer(b"".join(values), np.uint8)))
            w.set_many(key_list, values)
            for msg in (wire.encode_v1(keys, actions, values), wire.encode_v2(keys, actions, values)):
                apply_batch(w, wire.decode(msg))  # as a worker applies them (v2: with its verified hashes)
                apply_batch(w, wire_batch.decode_many([msg, msg], wire_batch.Scratch()))  # a consume() batch at once
            apply_batch(w, wire.decode_kv(key_list, values))
            w.delete_many(keys[:2])
            w.delete_many(key_list[2:4])
            writer.warm_takeover(w)  # a dead writer's bucket lock taken over: the repair kernel
            for handle in (r, w):  # a reader maps read-only, a writer read-write: two signatures
                handle.get_many_packed(keys)
                handle.get_many_packed(key_list)
                handle.contains_many(keys)
            partitioners.murmur2_partitions(keys, 8)
            meta = txmeta.generate(n, rng)
            offs, data = txmeta.encode(meta)
            txmeta.decode(offs, data)
    finally:
        if w is not None:
            w.close()
        try:
            table.destroy(name)
        except CacheNotFoundError:
            pass  # create was interrupted, and took its name back
    after = _cache_counts()
    return {"seconds": time.perf_counter() - t0, "compiled": after[1] - before[1], "loaded": after[0] - before[0]}


def _cache_counts() -> tuple[int, int]:
    """(signatures loaded from numba's cache, signatures compiled) over the package's cached kernels."""
    from numba.core.registry import CPUDispatcher

    hits = misses = 0
    for mod_name, mod in list(sys.modules.items()):
        if not mod_name.startswith("shmcache") or mod is None:
            continue
        for obj in list(vars(mod).values()):
            if isinstance(obj, CPUDispatcher) and obj.__module__ == mod_name and obj._cache is not None:
                hits += sum(obj.stats.cache_hits.values())
                misses += sum(obj.stats.cache_misses.values())
    return hits, misses


def _stopped(signum, frame) -> None:
    """SIGTERM: remove the private cache and exit at once (128 + signum). Not an exception
    unwinding through warm()'s finally: raised inside numba's compiler (a finalizer, the
    cache writer's pickling) it can be swallowed ("Exception ignored in") or replaced by
    another error, and the stop lost or its exit code changed. Leaving mid-compile damages
    nothing: numba writes each cache file whole (a temporary file, then a rename), the
    index after the data it names."""
    try:
        remove_leftovers(os.getpid())
    finally:
        os._exit(128 + signum)


def main() -> int:
    """A warm-up, as `shmcache warm` and a supervisor's child (start()) run it: a stop (SIGTERM)
    removes the private cache and exits 143."""
    signal.signal(signal.SIGTERM, _stopped)
    s = warm()
    mark()
    print(f"shmcache warm: {s['compiled']} kernel signatures compiled, {s['loaded']} loaded from numba's cache, "
          f"{s['seconds']:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
