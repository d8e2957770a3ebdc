"""A real shmcache writer for the Go tests (writer_test.go): creates cache NAME, sets
N keys, prints "ready OWNER_WORD", then overwrites every key round after round (each
value says its key and round, with a length that changes) until stdin closes; then
prints "done ROUNDS READER_HITS" (the readers' hits as the Python reader's stats()
sees them) and destroys the cache."""

import hashlib
import sys
import threading

import shmcache
from shmcache.ipc import liveness


def key_of(i: int) -> bytes:
    return hashlib.sha256(b"go writer test %d" % i).digest()


def value_of(key: bytes, r: int) -> bytes:
    n = 61 + (r * 7 + key[0]) % 81  # 61-141 bytes, Teranode's range
    head = key[:8] + r.to_bytes(8, "little")
    return (head + hashlib.sha256(head).digest() * 5)[:n]


def main() -> None:
    name, n = sys.argv[1], int(sys.argv[2])
    keys = [key_of(i) for i in range(n)]
    w = shmcache.create(name, memory="64MiB", max_value=256)
    try:
        w.set_many(keys, [value_of(k, 0) for k in keys])
        stop = threading.Event()
        threading.Thread(target=lambda: (sys.stdin.read(), stop.set()), daemon=True).start()
        print("ready", liveness.owner_word(), flush=True)
        r = 0
        while not stop.is_set():
            r += 1
            w.set_many(keys, [value_of(k, r) for k in keys])
        print("done", r, w.stats()["reader_hits"], flush=True)
    finally:
        w.close()
        shmcache.destroy(name, force=True)


main()
