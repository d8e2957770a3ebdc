"""Online resize benchmark (issue 56): what a resize's pause costs per GiB, and what readers
see during it.

    .venv/bin/python -m pytest bench/test_resize.py -q -s -p no:cacheprovider       # smoke: 64 MiB -> 256 MiB
    SHMCACHE_BENCH_RESIZE=full .venv/bin/python -m pytest bench/test_resize.py -q -s -p no:cacheprovider
        # 256 MiB -> 1 GiB and 1 GiB -> 4 GiB, each cache filled to ~75% of its rings (5 GiB of /dev/shm at the peak)

Per resize, in one run: a cache of the first size filled with txmeta-sized entries (32-byte
keys, 61-141 byte values) by a writer; a reader process that follows the name
(shmcache.follow) looks up a sample of the keys all along and counts misses and wrong
values; then the engine's steps of `shmcache resize` as the supervisor takes them
(consumer/supervisor/resizing.py), timed each: the new segment made beside the old one
("make": before the workers are held, not part of the pause), the entries copied
("copy") and the control area ("control"), which with the workers' hold and switch (a
pipe round trip each) is the ingest pause, then the rename over the name. Figures: the
copy per GiB of the old segment and per million entries, memory at the peak (old + new)
and after, the reader's misses and wrong values (expected 0). Nothing asserts on speed;
the reader's counts are asserted.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import uuid

import numpy as np
import pytest

import shmcache
from shmcache.engine import resizing, units
from shmcache.ipc.segment import identity
from shmcache.snapshots.copying import copy_entries

FULL = os.environ.get("SHMCACHE_BENCH_RESIZE") == "full"
SIZES = [("256MiB", "1GiB"), ("1GiB", "4GiB")] if FULL else [("64MiB", "256MiB")]
FILL = 0.75  # of the rings' bytes (some buckets then evict: a random key's bucket is not an average one)
SAMPLE = 50_000
READER = r"""
import json, os, sys, numpy as np, shmcache
name, keys_path, vals_path, stop_path = sys.argv[1:5]
keys, vals = np.load(keys_path), np.load(vals_path, allow_pickle=True)
f = shmcache.follow(name)
out = {"rounds": 0, "misses": 0, "wrong": 0, "sizes": []}
print("started", flush=True)
while not os.path.exists(stop_path):
    r = f.reader()
    if not out["sizes"] or out["sizes"][-1] != r.geometry.size:
        out["sizes"].append(r.geometry.size)
    got = r.get_many(keys)
    out["misses"] += sum(g is None for g in got)
    out["wrong"] += sum(g is not None and g != v for g, v in zip(got, vals))
    out["rounds"] += 1
print(json.dumps(out), flush=True)
"""


def _fill(w, rng) -> tuple[np.ndarray, list[bytes]]:
    """Fill `w` to FILL of its rings with txmeta-sized entries; a sample of (key, value)."""
    n = int(w.geometry.capacity_bytes * FILL) // 144  # a record: 16 B header + 32 B key + ~101 B value, aligned
    keys = rng.integers(0, 256, (n, 32), np.uint8)
    lens = rng.integers(61, 142, n)
    starts = np.zeros(n + 1, np.int64)
    np.cumsum(lens, out=starts[1:])
    data = rng.integers(0, 256, int(starts[-1]), np.uint8)
    for i in range(0, n, 1 << 18):
        j = min(n, i + (1 << 18))
        w.set_many(keys[i:j], (starts[i:j + 1] - starts[i], data[starts[i]:starts[j]]))
    pick = rng.choice(n, min(SAMPLE, n), replace=False)
    got = w.get_many(keys[pick])
    live = [j for j, g in zip(pick.tolist(), got) if g is not None]  # the sample's live keys: the others were evicted
    return keys[live], [data[starts[i]:starts[i + 1]].tobytes() for i in live]


@pytest.mark.parametrize("sizes", SIZES, ids=[f"{a}-{b}" for a, b in SIZES])
def test_resize_pause_and_readers(sizes, tmp_path):
    src, dst = sizes
    name = f"bench-resize-{uuid.uuid4().hex[:8]}"
    rng = np.random.default_rng(56)
    w = shmcache.create(name, memory=src)
    reader = None
    try:
        keys, vals = _fill(w, rng)
        st = w.stats()
        np.save(tmp_path / "keys.npy", keys)
        np.save(tmp_path / "vals.npy", np.array(vals, dtype=object), allow_pickle=True)
        stop = tmp_path / "stop"
        reader = subprocess.Popen([sys.executable, "-c", READER, name, str(tmp_path / "keys.npy"),
                                   str(tmp_path / "vals.npy"), str(stop)], stdout=subprocess.PIPE, text=True)
        assert reader.stdout.readline().strip() == "started"
        old_id = identity(name)
        t0 = time.monotonic()
        new = resizing.create_beside(w, resizing.plan(w, dst))
        t1 = time.monotonic()
        copied = copy_entries(w, new)
        t2 = time.monotonic()
        new.control.copy_from(w.control)
        t3 = time.monotonic()
        peak = w.geometry.size + new.geometry.size
        resizing.swap(new, old_id)
        t4 = time.monotonic()
        old = w.take_over(new)
        time.sleep(1.0)  # the reader's next rounds read the new segment
        old.close()
        stop.write_text("")
        seen = json.loads(reader.communicate(timeout=120)[0].strip().splitlines()[-1])
        assert copied["entries"] == st["entries"] and copied["evictions"] == 0, copied
        assert seen["misses"] == 0 and seen["wrong"] == 0 and seen["sizes"][-1] == w.geometry.size, seen
        gib = st["memory"] / (1 << 30)
        pause = (t3 - t1)
        fig = {"from": src, "to": dst, "entries": st["entries"], "make_s": round(t1 - t0, 3),
               "copy_s": round(t2 - t1, 3), "control_s": round(t3 - t2, 4), "rename_s": round(t4 - t3, 4),
               "pause_s_per_gib": round(pause / gib, 3), "pause_s_per_m_entries": round(pause / st["entries"] * 1e6, 3),
               "peak_bytes": peak, "after_bytes": w.geometry.size, "reader_rounds": seen["rounds"],
               "reader_misses": seen["misses"], "reader_wrong": seen["wrong"]}
        print(f"\nresize {src} -> {dst}: {st['entries']:,} entries; made in {fig['make_s']} s (before the pause), "
              f"copied in {fig['copy_s']} s + control {fig['control_s']} s = {pause / gib:.2f} s per GiB of the old "
              f"segment ({fig['pause_s_per_m_entries']} s per million entries); memory {units.format_bytes(peak)} "
              f"at the peak, {units.format_bytes(w.geometry.size)} after; a following reader: {seen['rounds']} "
              f"rounds of {len(keys):,} lookups, {seen['misses']} misses, {seen['wrong']} wrong", file=sys.stderr)
        print(json.dumps(fig), file=sys.stderr)
    finally:
        if reader is not None and reader.poll() is None:
            reader.kill()
            reader.wait()
        w.close()
        resizing.remove_leftover(name)
        if shmcache.exists(name):
            shmcache.destroy(name, force=True)
