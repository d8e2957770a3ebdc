"""A warm-up the supervisor stops (it was asked to stop while the kernels compiled)
leaves nothing behind: not the child process, not its private cache."""

from __future__ import annotations

import subprocess
import sys

import shmcache
from shmcache import warm

# A child that holds a warm-up's private cache and never finishes: the hardest moment to
# stop a warm-up at (the real one holds its cache only while it runs the kernels).
HOLDER = f"""
import os, sys, time, shmcache
shmcache.create(f"{warm.PREFIX}{{os.getpid()}}-t", memory="8MiB", max_value=256)
print("made", flush=True)
time.sleep(600)
"""


def test_a_stopped_warm_up_leaves_no_process_and_no_cache():
    proc = subprocess.Popen([sys.executable, "-c", HOLDER], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            text=True)
    name = f"{warm.PREFIX}{proc.pid}-t"
    try:
        assert proc.stdout.readline().strip() == "made"  # the cache exists now
        assert name in list(shmcache.list_caches())
        beats = []
        assert warm.finish(proc, lambda: beats.append(1), lambda: True) == ""
        assert proc.poll() is not None
        assert not [c for c in shmcache.list_caches() if c.startswith(f"{warm.PREFIX}{proc.pid}-")]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if shmcache.exists(name):
            shmcache.destroy(name, force=True)
