"""The Python side of go/txmeta's tests: creates cache NAME and sets, for every case i of
the golden txmeta values (CASES, golden/txmeta/cases.json), key sha256(b"txmeta go test
%d" % i) to the case's value; prints "ready", then waits for the end of stdin, destroys
the cache and exits."""

import hashlib
import json
import sys

import shmcache


def main() -> None:
    name, path = sys.argv[1], sys.argv[2]
    cases = json.loads(open(path).read())["cases"]
    keys = [hashlib.sha256(b"txmeta go test %d" % i).digest() for i in range(len(cases))]
    values = [bytes.fromhex(c["value"]) for c in cases]
    w = shmcache.create(name, memory="64MiB", max_value=max(len(v) for v in values))
    try:
        w.set_many(keys, values)
        st = w.stats()
        assert st["evictions"] == 0 and st["entries"] == len(cases), st
        print("ready", flush=True)
        sys.stdin.read()
    finally:
        w.close()
        shmcache.destroy(name, force=True)


main()
