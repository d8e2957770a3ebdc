"""The JVM reader's two paths (issue 47), each on the JDK that takes it, in one run: the
batch lookup's ns a key on one thread without Spark (jvm/src/test/java/io/shmcache/BatchBench.java:
a row at a time, getBatch and getPacked of 256, thread CPU time a key, medians of its rounds),
a process a configuration, the three alternated process after process, run after run:

- `unsafe 17`: JDK 17, the base classes (sun.misc.Unsafe loads at the mapped address);
- `unsafe 25`: JDK 25 told to take the same Unsafe path (-Dshmcache.memory=unsafe, for this
  comparison only; Unsafe's memory access allowed, so that it prints no warning);
- `segment 25`: JDK 25 as it runs for a user: the jar's META-INF/versions/22 classes (a
  MemorySegment read with ValueLayout accesses), Unsafe's memory access denied.

Then the Spark lookup on local[2] (tests/lib/shmtest/bench/jvm_paths_spark.py: the batched JVM lookup,
engine="jvm", and the Python lookup, each an action over 10 N keys, rounds interleaved),
with Spark's JVM on JDK 17 and on JDK 25 (JAVA_HOME), a session a process, alternated, each
printing the path its executors take (io.shmcache.Segment.access()).

    SHMCACHE_JVM_PATHS_N=500000 SHMCACHE_JVM_PATHS_RUNS=3 .venv/bin/python -m pytest bench/test_jvm_paths.py -p no:cacheprovider -s
    CI=true .venv/bin/python -m pytest bench/test_jvm_paths.py -p no:cacheprovider     # smoke: N = 20,000, 1 run

N entries (txmeta values, made by the Python writer) looked up once each in a scattered
order (the Spark part: 10 N keys); N: SHMCACHE_JVM_PATHS_N, else SHMCACHE_BENCH_N
(scripts/test's smoke size), else 20,000 under CI=true, else 500,000. Runs:
SHMCACHE_JVM_PATHS_RUNS (default 3; 1 at the smoke size). Asserted: each process took the
path its configuration names, and every way of every process read every key's value, the
bytes the writer wrote (the Spark part: found and summed by both engines); never speed. Skipped where the jar or a JDK 25 (jvm/find-jdk 25) is not there.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import statistics
import subprocess
import sys
import uuid
from pathlib import Path

import numpy as np
import pytest

from shmtest.bench import peers as P
from shmtest.toolchains import JDK17, JDK25
import shmcache
from shmcache.formats import txmeta

REPO = Path(__file__).resolve().parents[1]
JVM = REPO / "jvm"
CI = os.environ.get("CI", "").lower() in ("true", "1")
N = next((int(os.environ[v].replace("_", "")) for v in ("SHMCACHE_JVM_PATHS_N", "SHMCACHE_BENCH_N")
          if os.environ.get(v)), 20_000 if CI else 500_000)
SMOKE = N <= 100_000
RUNS = int(os.environ.get("SHMCACHE_JVM_PATHS_RUNS", "1" if SMOKE else "3"))
ROUNDS = 1 if SMOKE else 5  # BatchBench's rounds a process (after one of warm-up)
WAYS = ("row at a time", "chunk 256", "packed 256")
SPARK_REPEAT = 10


def _jar() -> Path | None:
    """$SHMCACHE_JVM_JAR (another build: its test classes beside it, in ../test-classes), else jvm/target's."""
    if os.environ.get("SHMCACHE_JVM_JAR"):
        return Path(os.environ["SHMCACHE_JVM_JAR"])
    jars = sorted(p for p in (JVM / "target").glob("shmcache-jvm-*.jar"))
    return jars[-1] if jars else None


JAR = _jar()
TEST_CLASSES = None if JAR is None else JAR.parent / "test-classes"
pytestmark = [pytest.mark.skipif(JAR is None or not (TEST_CLASSES / "io" / "shmcache" / "BatchBench.class").exists(),
                                 reason="the shmcache JVM jar and its test classes are not built (scripts/setup)"),
              pytest.mark.skipif(JDK17 is None or JDK25 is None, reason="a JDK 17 and a JDK 25 are needed "
                                 "(jvm/find-jdk 17, jvm/find-jdk 25)"),
              pytest.mark.timeout(1800 + N // 100)]

# name: (JAVA_HOME, JVM options, the access Segment.access() must report)
CONFIGS = {
    "unsafe 17": (JDK17, [], "unsafe open-nonblock"),
    "unsafe 25": (JDK25, ["-Dshmcache.memory=unsafe", "--sun-misc-unsafe-memory-access=allow",
                          "--enable-native-access=ALL-UNNAMED"], "unsafe open-nonblock"),
    "segment 25": (JDK25, ["--sun-misc-unsafe-memory-access=deny", "--enable-native-access=ALL-UNNAMED"],
                   "memory-segment open-nonblock"),
}


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    """N txmeta values at sha256(i), and the keys in a scattered order in a file (BatchBench's input)."""
    name = f"bench-jvm-paths-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    keys = np.frombuffer(b"".join(hashlib.sha256(str(i).encode()).digest() for i in range(N)), np.uint8).reshape(N, 32)
    offsets, data = txmeta.encode(txmeta.generate(N, np.random.default_rng(47)))
    order = (np.arange(N, dtype=np.int64) * 7919) % N
    path = tmp_path_factory.mktemp("jvm-paths") / "keys.bin"
    path.write_bytes(keys[order].tobytes())
    w = shmcache.create(name, memory=2 * P.memory_for(N))
    try:
        w.set_many(keys, (offsets, data))
        with shmcache.attach(name) as r:  # every key is there: nothing was evicted
            assert r.get_many_packed(keys[order]).found.all()
        spark_keys = path.parent / "spark-keys.npy"  # the Spark part's: 10 N keys, all hits, scattered
        np.save(spark_keys, keys[(np.arange(SPARK_REPEAT * N, dtype=np.int64) * 7919) % N])
        yield name, path, spark_keys, int(np.diff(offsets).sum())
    finally:
        w.close()
        shmcache.destroy(name, force=True)


def _batch_bench(config: str, name: str, keys_file: Path) -> dict:
    """One process of BatchBench: its access line and each way's CPU ns a key."""
    home, opts, access = CONFIGS[config]
    cp = f"{TEST_CLASSES}:{JAR}"
    p = subprocess.run([f"{home}/bin/java", *opts, "-cp", cp, "io.shmcache.BatchBench", name, str(keys_file),
                        str(ROUNDS), "256,-256"], capture_output=True, text=True, timeout=1800)
    assert p.returncode == 0, f"{config}: BatchBench failed:\n{p.stdout}\n{p.stderr}"
    m = re.search(r"^java (\S+), access (.+), bytes (\d+)$", p.stdout, re.M)
    assert m and m.group(2) == access, f"{config}: {p.stdout}"
    if config == "segment 25":  # as a user runs it: nothing printed but the results
        assert p.stderr == "", f"{config} printed on stderr: {p.stderr}"
    cpu = {}
    for way in WAYS:
        w = re.search(rf"^\s+{way}\s.*\| CPU\s+(\d+) ns/key$", p.stdout, re.M)
        assert w, f"{config}: no line for {way}:\n{p.stdout}"
        cpu[way] = int(w.group(1))
    return {"java": m.group(1), "bytes": int(m.group(3)), "cpu": cpu}


RESULTS: dict[str, list[dict]] = {}


def test_the_batch_lookup_on_each_path(cache):
    name, keys_file, _, value_bytes = cache
    for run in range(RUNS):  # the three alternated, process after process, the order rotating
        configs = list(CONFIGS)
        for config in configs[run % 3:] + configs[:run % 3]:
            r = _batch_bench(config, name, keys_file)
            assert r["bytes"] == value_bytes, f"{config} read {r['bytes']} value bytes, not {value_bytes}"
            RESULTS.setdefault(config, []).append(r)
    print(f"\nThe JVM reader's paths: {N:,} entries, {N:,} scattered hits, 1 thread, {RUNS} runs of each "
          f"configuration alternated, {ROUNDS} rounds a run; thread CPU ns a key (median of a run's rounds), "
          f"load average {os.getloadavg()[0]:.1f}")
    for way in WAYS:
        cells = []
        for config in CONFIGS:
            xs = [r["cpu"][way] for r in RESULTS[config]]
            cells.append(f"{config} {min(xs)}-{max(xs)}")
        ratios = [u["cpu"][way] / s["cpu"][way] for u, s in zip(RESULTS["unsafe 25"], RESULTS["segment 25"])]
        print(f"  {way:14s} " + " | ".join(cells) + "  | segment / unsafe on 25 (speed), run by run: "
              + ", ".join(f"{x:.2f}x" for x in ratios))
    print("  " + "; ".join(f"{c}: java {RESULTS[c][0]['java']}" for c in CONFIGS))


def test_the_spark_lookup_on_jdk_17_and_25(cache):
    pytest.importorskip("pyspark")
    name, _, spark_keys, value_bytes = cache
    want = {"17": "unsafe open-nonblock", "25": "memory-segment open-nonblock"}
    got: dict[str, list[dict]] = {}
    for run in range(RUNS):  # a session a process, the two JDKs alternated
        for feature in ("17", "25") if run % 2 == 0 else ("25", "17"):
            env = {**os.environ, "JAVA_HOME": JDK17 if feature == "17" else JDK25}
            p = subprocess.run([sys.executable, "-P", "-m", "shmtest.bench.jvm_paths_spark", name, str(spark_keys),
                                str(ROUNDS if not SMOKE else 1)], capture_output=True, text=True, env=env,
                               timeout=1800, cwd=REPO)
            assert p.returncode == 0, f"the Spark lookup on JDK {feature} failed:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
            r = json.loads(p.stdout.strip().splitlines()[-1])
            assert r["java"].split(".")[0] == feature and r["access"] == want[feature], r
            for way, (n, b) in r["counts"].items():
                assert (n, b) == (r["rows"], SPARK_REPEAT * value_bytes), (feature, way, n, b)
            got.setdefault(feature, []).append(r)
    rows = got["17"][0]["rows"]
    print(f"\nThe Spark lookup on local[2], {rows:,} keys (all hits) against {N:,} entries, a session a process, "
          f"{RUNS} of each JDK alternated, medians of a session's rounds, M rows/s; load average {os.getloadavg()[0]:.1f}")
    for feature in ("17", "25"):
        for way in ("jvm", "python"):
            meds = [statistics.median(r["rates"][way]) / 1e6 for r in got[feature]]
            print(f"  JDK {feature} ({got[feature][0]['access']}), engine={way:6s}: "
                  + ", ".join(f"{m:.2f}" for m in meds))
    for way in ("jvm", "python"):
        ratios = [statistics.median(b["rates"][way]) / statistics.median(a["rates"][way])
                  for a, b in zip(got["17"], got["25"])]
        print(f"  engine={way}: JDK 25 / JDK 17, run by run: " + ", ".join(f"{x:.2f}x" for x in ratios))
