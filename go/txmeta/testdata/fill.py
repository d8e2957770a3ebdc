"""The Python side of go/txmeta's tests: creates cache NAME and sets, for every case i of
the golden txmeta values (CASES, golden/txmeta/cases.json), key sha256(b"txmeta go test
%d" % i) to the case's value, and for i < GENERATED, key sha256(b"txmeta go test generated
%d" % i) to a Teranode-shaped value as the load generator makes them (formats/txmeta.generate,
seed 46); prints "ready", then waits for the end of stdin, destroys the cache and exits."""

import hashlib
import json
import sys

import numpy as np

import shmcache
from shmcache.formats import txmeta


def main() -> None:
    name, path, generated = sys.argv[1], sys.argv[2], int(sys.argv[3])
    cases = json.loads(open(path).read())["cases"]
    keys = [hashlib.sha256(b"txmeta go test %d" % i).digest() for i in range(len(cases))]
    values = [bytes.fromhex(c["value"]) for c in cases]
    off, data = txmeta.encode(txmeta.generate(generated, np.random.default_rng(46)))
    keys += [hashlib.sha256(b"txmeta go test generated %d" % i).digest() for i in range(generated)]
    values += [data[off[i]:off[i + 1]].tobytes() for i in range(generated)]
    w = shmcache.create(name, memory="64MiB", max_value=max(len(v) for v in values))
    try:
        w.set_many(keys, values)
        st = w.stats()
        assert st["evictions"] == 0 and st["entries"] == len(keys), st
        print("ready", flush=True)
        sys.stdin.read()
    finally:
        w.close()
        shmcache.destroy(name, force=True)


main()
