"""The warm-up: every numba kernel a worker, a reader and the load generator use, run once
so numba compiles it into its on-disk cache (ipc/jitcache.py says where that lives and
how it stays fresh); `shmcache warm` and a supervisor's child (consumer/warm.py start())
run it as `python -m shmcache.consumer.warmup`.

The kernels are reached through the public calls on a small private cache, so they
compile for exactly the argument types the real calls give (a read-only mapping
types differently from a writable one, a list of keys from an array), with no list
of signatures kept by hand; the lock takeover, which no healthy call reaches, through
engine/writer.py's warm_takeover (the real takeover path, on a bucket of the private
cache locked by an owner word no process has). What each kernel cost is reported: loaded from the
cache ("hits") or compiled now ("misses").
"""

from __future__ import annotations

import os
import secrets
import signal
import sys
import time

import numpy as np

from shmcache.consumer.warm import PREFIX, mark, remove_leftovers
from shmcache.errors import CacheNotFoundError


def warm() -> dict:
    """Run every kernel once; returns {"seconds", "compiled", "loaded"} (signatures)."""
    t0 = time.perf_counter()
    from shmcache.consumer.worker import apply_batch
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
