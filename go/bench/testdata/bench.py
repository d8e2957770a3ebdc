"""The Python side of go/bench: bench_test.go runs it, readerspeed/compare.py imports fill.
It creates cache NAME with N Teranode-shaped entries (32-byte random keys, 61-141 byte
values; numpy seed 41), writes the keys, the values and N absent keys to DIR for the Go
side, prints "ready", then times the Python reader's get_many_packed on request: a line
"hits B" or "misses B" runs B batches of 1024 keys and answers with the nanoseconds they
took. At end of input it destroys the cache."""

import sys
import time

import numpy as np

import shmcache

BATCH = 1024


def fill(name: str, n: int, out: str) -> None:
    """Cache NAME with the N entries, and keys.bin, misses.bin, offsets.bin, values.bin in OUT."""
    rng = np.random.default_rng(41)
    keys = rng.integers(0, 256, (n, 32), np.uint8)
    misses = rng.integers(0, 256, (n, 32), np.uint8)
    lens = rng.integers(61, 142, n).astype(np.int64)
    offsets = np.zeros(n + 1, np.int64)
    np.cumsum(lens, out=offsets[1:])
    data = rng.integers(0, 256, int(offsets[-1]), np.uint8)
    with shmcache.create(name, memory=max(64 << 20, n * 512), max_value=256) as w:
        for i in range(0, n, 100_000):
            j = min(n, i + 100_000)
            w.set_many(keys[i:j], (offsets[i:j + 1] - offsets[i], data[offsets[i]:offsets[j]]))
        assert w.stats()["evictions"] == 0
    keys.tofile(f"{out}/keys.bin")
    misses.tofile(f"{out}/misses.bin")
    offsets.tofile(f"{out}/offsets.bin")
    data.tofile(f"{out}/values.bin")


def main() -> None:
    name, n, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    try:
        fill(name, n, out)
        keys = np.fromfile(f"{out}/keys.bin", np.uint8).reshape(n, 32)
        misses = np.fromfile(f"{out}/misses.bin", np.uint8).reshape(n, 32)
        r = shmcache.attach(name)
        r.get_many_packed(keys[:BATCH])  # kernels loaded
        print("ready", flush=True)
        for line in sys.stdin:
            what, batches = line.split()
            src = keys if what == "hits" else misses
            t0 = time.perf_counter_ns()
            pos = 0
            for _ in range(int(batches)):
                if pos + BATCH > n:
                    pos = 0
                r.get_many_packed(src[pos:pos + BATCH])
                pos += BATCH
            print(time.perf_counter_ns() - t0, flush=True)
        r.close()
    finally:
        shmcache.destroy(name, force=True)


if __name__ == "__main__":
    main()
