"""Keep numba's on-disk cache of the kernels consistent with their sources.

numba's `cache=True` invalidates a cached function only when its own file
changes; kernels that inline helpers from other modules (atomics, prefetch,
xxh64) kept stale machine code after those modules were edited. At import, a
digest of every module the kernels are built from is compared with a stamp
beside the cache; on a mismatch the cache files are removed, so the kernels
compile once from the current sources.
"""

from __future__ import annotations

import glob
import hashlib
import os

_HERE = os.path.dirname(os.path.abspath(__file__))
_SOURCES = [
    os.path.join(_HERE, f) for f in ("_kernels.py", "_lookup.py", "_xxh64.py", "_prefetch.py", "_memcpy.py", "layout.py")
] + [os.path.join(_HERE, "..", "ipc", "atomics.py")]


def ensure_fresh() -> None:
    digest = hashlib.sha256()
    for path in _SOURCES:
        try:
            with open(path, "rb") as f:
                digest.update(f.read())
        except OSError:
            return  # not laid out as in the repo: leave numba's own checks to it
    want = digest.hexdigest()
    cache_dirs = [os.path.join(_HERE, "__pycache__"), os.path.join(_HERE, "..", "ipc", "__pycache__")]
    stamp = os.path.join(cache_dirs[0], "kernels.sha256")
    try:
        with open(stamp) as f:
            if f.read() == want:
                return
    except OSError:
        pass
    try:
        for d in cache_dirs:
            for p in glob.glob(os.path.join(d, "*.nbi")) + glob.glob(os.path.join(d, "*.nbc")):
                os.unlink(p)
        os.makedirs(cache_dirs[0], exist_ok=True)
        with open(stamp + ".tmp", "w") as f:
            f.write(want)
        os.replace(stamp + ".tmp", stamp)
    except OSError:
        pass  # a read-only install: numba falls back to its user cache directory
