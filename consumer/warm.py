"""Whether this install's numba kernels are compiled (`is_warm`, the marker a finished
warm-up leaves beside numba's cache) and the warm-up as a child process of a supervisor
(`start`, `finish`, and the removal of the private caches a killed one left). The
warm-up itself is consumer/warmup.py, run as `python -m shmcache.consumer.warmup`.

Compiling costs seconds per kernel signature and numba compiles on a signature's first
call: without a warm-up, every worker process of a freshly installed supervisor would
pay it at once, after "ready". `shmcache warm` runs it at install time (scripts/setup), and the
supervisor runs it once before it starts workers unless the install is warm already.
"""

from __future__ import annotations

import os
import subprocess
import sys


PREFIX = "shmcache-warm-"  # + pid + "-" + random: the warm-up's private cache


def package_stamp() -> str:
    """sha256 over every source file of the package (as ipc/jitcache.py walks them), and
    the Python and numba versions: what a warm-up warmed the kernel cache for. Any edit to
    the package, or an upgrade, gives another stamp."""
    import numba

    from shmcache.ipc import jitcache

    return jitcache.files_stamp(jitcache.package_sources(), f"{sys.version}\0{numba.__version__}\0".encode())


MARKER = "shmcache-warmed-"  # + the package stamp: a file beside the apply kernel's cache entries


def _apply_cache():
    from shmcache.engine.writer import apply_kernel_cache

    return apply_kernel_cache()


def _marker_dir() -> str | None:
    return getattr(_apply_cache(), "_cache_path", None)


def is_warm() -> bool:
    """True if a warm-up finished for exactly these sources, Python and numba, and the apply
    kernel's cache index is still there: a supervisor then starts its workers at once
    (each loads the kernels; none compiles) instead of waiting for a warm-up that would
    only load them too. A cache removed by hand takes the marker with it (same directory)."""
    cache = _apply_cache()
    d = getattr(cache, "_cache_path", None)
    index = getattr(getattr(cache, "_cache_file", None), "_index_path", None)
    return bool(d and index) and os.path.exists(index) and os.path.exists(os.path.join(d, MARKER + package_stamp()))


def mark() -> None:
    """Leave the marker is_warm() looks for (and remove the markers of other versions); a
    cache directory this process cannot write keeps no marker: supervisors warm up first."""
    d = _marker_dir()
    if not d:
        return
    stamp = MARKER + package_stamp()
    try:
        for old in os.listdir(d):
            if old.startswith(MARKER) and old != stamp:
                os.unlink(os.path.join(d, old))
        with open(os.path.join(d, stamp), "w") as f:
            f.write("shmcache warm finished for these sources; see shmcache/consumer/warm.py\n")
    except OSError:
        pass


def _private_caches() -> list[str]:
    """Names in /dev/shm that a warm-up's private cache goes by, whatever is there: a
    file damaged since, without its magic, is one shmcache.list_caches would skip."""
    from shmcache.ipc.segment import SHM_DIR

    try:
        return sorted(e.name for e in os.scandir(SHM_DIR) if e.name.startswith(PREFIX))
    except OSError:
        return []


def remove_leftovers(pid: int) -> list[str]:
    """Remove the private caches a killed warm-up of process `pid` left; returns their names."""
    from shmcache.engine import table

    gone = []
    for name in _private_caches():
        if name.startswith(f"{PREFIX}{pid}-"):
            table.destroy(name, force=True)
            gone.append(name)
    return gone


def remove_orphans() -> list[str]:
    """Remove the private caches of warm-ups whose process is gone: one SIGKILLed (say, with
    its supervisor's whole process tree) had no chance to. A live pid's cache is kept."""
    import psutil

    gone = []
    for pid in sorted({name[len(PREFIX):].split("-", 1)[0] for name in _private_caches()}):
        if pid.isdigit() and not psutil.pid_exists(int(pid)):
            gone += remove_leftovers(int(pid))
    return gone


def start() -> subprocess.Popen:
    """`python -m shmcache.consumer.warmup` in a child process, for a supervisor to overlap with its wait
    for the broker: a child cleans its private cache up even if the supervisor is killed
    (and one killed with it is cleaned up by the next start)."""
    remove_orphans()
    return subprocess.Popen([sys.executable, "-m", "shmcache.consumer.warmup"], stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def finish(proc: subprocess.Popen, beat, stopping) -> str:
    """Wait for a started warm-up (calling beat() every 0.1 s) and return its last line;
    if stopping() turns true meanwhile, stop it (by pid) and return ""."""
    while proc.poll() is None:
        if stopping():
            # killed, not asked: a child inside a compile would finish it first. Its private
            # cache is then removed here, by the name it was given (PREFIX + its pid).
            proc.kill()
            proc.wait()
            proc.stdout.close()
            remove_leftovers(proc.pid)
            return ""
        beat()
        try:
            proc.wait(0.1)
        except subprocess.TimeoutExpired:
            pass
    out = proc.stdout.read().strip()
    proc.stdout.close()
    last = out.splitlines()[-1] if out else ""
    return last if proc.returncode == 0 else f"shmcache warm failed (exit {proc.returncode}): {last}"
