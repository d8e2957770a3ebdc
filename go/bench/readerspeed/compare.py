"""GetMany against the Python reader's get_many_packed on the same cache, in one run, the
readers' rounds taken in turn (issue 46, section 6): on a host other jobs keep busy, only
ratios within a run count, and a round's CPU-time rate leaves out what they take of the
core. With --before REV, GetMany of the reader as it was at git revision REV takes its
turn too: the figures before and after a change, in the same run.

    .venv/bin/python go/bench/readerspeed/compare.py [--n 1000000] [--rounds 9] [--batches 3000] [--misses] [--before REV]

It fills a cache of N Teranode-shaped entries (testdata/bench.py's fill), builds
readerspeed (this checkout's reader; and REV's, from `git archive REV go`), then each
round runs every Go build once (a process each, BATCHES batches of 1024 keys) and times
get_many_packed over the same keys in this process, in an order that turns each round.
It prints every round and the medians of the ratios; then destroys the cache and removes
what it built."""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

import shmcache

HERE = Path(__file__).resolve().parent
BENCH = HERE.parent
REPO = BENCH.parents[1]
BATCH = 1024


def load_fill():
    spec = importlib.util.spec_from_file_location("go_bench_fill", BENCH / "testdata" / "bench.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.fill


def go(*args: str, cwd: Path) -> None:
    subprocess.run(["go", *args], cwd=cwd, check=True, env={**os.environ, "CGO_ENABLED": "0"}, timeout=600)


def build_now(out: Path) -> None:
    go("build", "-o", str(out), "./readerspeed", cwd=BENCH)


def build_at(rev: str, tmp: Path, out: Path) -> None:
    """readerspeed against the reader of revision rev: its go/ from git, a module of
    readerspeed's main.go with a replace to it."""
    src = tmp / "rev"
    src.mkdir()
    archive = subprocess.run(["git", "-C", str(REPO), "archive", rev, "go"], check=True, capture_output=True)
    subprocess.run(["tar", "-x", "-C", str(src)], input=archive.stdout, check=True)
    mod = tmp / "harness"
    mod.mkdir()
    shutil.copy(HERE / "main.go", mod / "main.go")
    (mod / "go.mod").write_text("module readerspeedrev\n\ngo 1.23\n\nrequire github.com/shmcache/shmcache/go v0.0.0\n\n"
                                f"replace github.com/shmcache/shmcache/go => {src / 'go'}\n")
    shutil.copy(src / "go" / "go.sum", mod / "go.sum")
    go("mod", "tidy", cwd=mod)
    go("build", "-o", str(out), ".", cwd=mod)


def python_round(name: str, keys: np.ndarray, batches: int) -> tuple[float, float]:
    """get_many_packed over batches of keys: keys/s of wall time and of this thread's CPU time."""
    with shmcache.attach(name) as r:
        r.get_many_packed(keys[:BATCH])
        n, pos = len(keys), 0
        t0, c0 = time.perf_counter_ns(), time.thread_time_ns()
        for _ in range(batches):
            if pos + BATCH > n:
                pos = 0
            r.get_many_packed(keys[pos:pos + BATCH])
            pos += BATCH
        wall, cpu = time.perf_counter_ns() - t0, time.thread_time_ns() - c0
    return batches * BATCH / wall * 1e9, batches * BATCH / cpu * 1e9


def go_round(exe: Path, name: str, keys: Path, batches: int) -> tuple[float, float]:
    p = subprocess.run([str(exe), name, str(keys), str(batches)], check=True, capture_output=True, text=True,
                       timeout=600)
    wall, cpu, _ = p.stdout.split()
    return float(wall), float(cpu)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=1_000_000, help="entries in the cache")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--batches", type=int, default=3000, help="batches of 1024 keys a reader's round")
    ap.add_argument("--misses", action="store_true", help="look up absent keys (default: present ones)")
    ap.add_argument("--before", metavar="REV", help="also GetMany of the reader at git revision REV")
    a = ap.parse_args()
    name = f"go-readerspeed-{os.getpid()}"
    tmp = Path(tempfile.mkdtemp(prefix="shmcache-readerspeed-"))
    try:
        load_fill()(name, a.n, str(tmp))
        keys_file = tmp / ("misses.bin" if a.misses else "keys.bin")
        keys = np.fromfile(keys_file, np.uint8).reshape(-1, 32)
        readers = {"go": tmp / "readerspeed"}
        build_now(readers["go"])
        if a.before:
            readers["go@" + a.before] = tmp / "readerspeed-before"
            build_at(a.before, tmp, readers["go@" + a.before])
        names = [*readers, "python"]
        rows: list[dict[str, tuple[float, float]]] = []
        for r in range(a.rounds):
            row = {}
            for k in names[r % len(names):] + names[:r % len(names)]:  # each round starts with the next reader
                row[k] = (python_round(name, keys, a.batches) if k == "python"
                          else go_round(readers[k], name, keys_file, a.batches))
            rows.append(row)
            print(f"round {r + 1}: " + ", ".join(f"{k} {w / 1e6:.2f} ({c / 1e6:.2f})" for k, (w, c) in row.items()),
                  flush=True)
        print(f"\n{'misses' if a.misses else 'hits'}, N={a.n:,}, {a.rounds} rounds of {a.batches} batches, "
              f"load average {os.getloadavg()[0]:.1f}; M keys/s of wall time (of CPU time), median:")
        for k in names:
            print(f"  {k:24s} {statistics.median(row[k][0] for row in rows) / 1e6:6.2f} "
                  f"({statistics.median(row[k][1] for row in rows) / 1e6:.2f})")
        pairs = [(g, "python") for g in readers] + ([("go", "go@" + a.before)] if a.before else [])
        for x, y in pairs:
            wall = [row[x][0] / row[y][0] for row in rows]
            cpu = [row[x][1] / row[y][1] for row in rows]
            print(f"  {x} / {y}: {statistics.median(wall):.2f}x (rounds {min(wall):.2f}-{max(wall):.2f}); "
                  f"CPU time {statistics.median(cpu):.2f}x (rounds {min(cpu):.2f}-{max(cpu):.2f})")
    finally:
        shmcache.destroy(name, force=True)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
