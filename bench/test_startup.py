"""Ready in seconds (issue 13, part 1): time from `shmcache run` to the first applied
entry, and from a new reader process's start to its first lookup, with numba's kernel
cache warm (what `scripts/setup` / `shmcache warm` leave) and cold (an empty
NUMBA_CACHE_DIR: nothing compiled yet).

    .venv/bin/python -m pytest bench/test_startup.py -p no:cacheprovider -s                       # warm only
    SHMCACHE_BENCH_COLD=1 .venv/bin/python -m pytest bench/test_startup.py -p no:cacheprovider -s  # and cold

Cold runs compile every kernel (about a minute of CPU), so they run only on demand.
`shmcache run` goes through bench/test_consume.py's run_shmcache (a fresh segment of
256 MiB, 2 workers, a topic of 8 partitions holding 20,000 entries); "startup" is from
spawning the process to the first entry seen applied (status polled every 20 ms). The
reader is a new Python process: import shmcache, attach, get_many_packed of 1024
keys given as a list of bytes. Asserted: the run applies every entry and the lookup
finds every key; never the times (printed, with the load average).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import uuid

import numpy as np
import pytest

from shmtest.bench import peers as P
import shmcache
from shmcache.kafka import topics
from shmtest.bench import consume_runs as C

ENTRIES = 20_000
MODES = ["warm", "cold"] if os.environ.get("SHMCACHE_BENCH_COLD") else ["warm"]
FIGURES: dict[str, dict] = {}


@pytest.fixture(scope="module")
def numba_env(tmp_path_factory):
    """mode -> environment: warm, this install's own cache (warmed here first, which loads
    only, unless sources changed since setup); cold, an empty NUMBA_CACHE_DIR."""
    from shmcache.consumer import warm

    warm.warm()
    envs = {"warm": dict(os.environ)}
    envs["cold"] = {**os.environ, "NUMBA_CACHE_DIR": str(tmp_path_factory.mktemp("numba-cold"))}
    yield envs
    if FIGURES:
        print(f"\nstartup (load average {os.getloadavg()[0]:.1f}):", file=sys.stderr)
        for k, v in FIGURES.items():
            print(f"  {k:34s} " + ", ".join(f"{a} {b:.2f} s" for a, b in v.items()), file=sys.stderr)


@pytest.fixture(scope="module")
def small_topic(kafka_broker, kafka_admin):
    name = f"bench-startup-{uuid.uuid4().hex[:12]}"
    topics.create_topic(kafka_broker.bootstrap, name, C.PARTITIONS)  # and waits for its leaders
    try:
        yield C.produce_topic(kafka_broker.bootstrap, name, "v1", ENTRIES, C.PARTITIONS, C.run_timeout())
    finally:
        for fut in kafka_admin.delete_topics([name], operation_timeout=10).values():
            try:
                fut.result(timeout=15)
            except Exception:
                pass


@pytest.mark.parametrize("mode", MODES)
def test_run_to_first_entry(mode, numba_env, small_topic, kafka_broker, tmp_path, monkeypatch):
    if mode == "cold":  # inherited by the supervisor, its warm-up child and its workers
        monkeypatch.setenv("NUMBA_CACHE_DIR", numba_env["cold"]["NUMBA_CACHE_DIR"])
    r = C.run_shmcache(small_topic, kafka_broker, 2, tmp_path, f"startup-{mode}")
    FIGURES[f"shmcache run ({mode})"] = {"cache created": r["cache_s"], "to first applied entry": r["startup_s"],
                                         "caught up after": r["catch_up_s"]}


@pytest.mark.parametrize("mode", MODES)
def test_attach_to_first_lookup(mode, numba_env, tmp_path):
    name = f"bench-{os.getpid()}-startup-{mode}"
    rng = np.random.default_rng(5)
    keys = rng.integers(0, 256, (P.BATCH, P.KEY_SIZE), np.uint8)
    w = shmcache.create(name, memory="64MiB")
    try:
        w.set_many(keys, [b"v" * 100] * P.BATCH)
        key_file = tmp_path / "keys"
        key_file.write_bytes(keys.tobytes())
        code = textwrap.dedent(f"""
            import time
            t0 = time.perf_counter()
            import json
            import shmcache
            t1 = time.perf_counter()
            r = shmcache.attach({name!r})
            t2 = time.perf_counter()
            data = open({str(key_file)!r}, "rb").read()
            keys = [data[i:i + 32] for i in range(0, len(data), 32)]
            found = int(r.get_many_packed(keys).found.sum())
            t3 = time.perf_counter()
            print(json.dumps({{"import": t1 - t0, "attach": t2 - t1, "first lookup": t3 - t2, "total": t3 - t0,
                               "found": found}}))
        """)
        out = subprocess.run([sys.executable, "-c", code], env=numba_env[mode], capture_output=True, text=True,
                             timeout=1800)
        assert out.returncode == 0, out.stderr[-3000:]
        got = json.loads(out.stdout.strip().splitlines()[-1])
        assert got.pop("found") == P.BATCH
        FIGURES[f"reader start to first lookup ({mode})"] = got
    finally:
        w.close()
        shmcache.destroy(name)
