"""numba's on-disk cache of shmcache's kernels, stamped with the whole package's sources.

numba's `cache=True` keeps a function's machine code keyed by a hash of the one
file the function is written in. The kernels inline helpers from other modules
(atomics, prefetch, xxh64, layout's constants), so an edit there left stale code in
the cache. Here every `cache=True` function of this package gets, instead of its
own file's hash, one stamp: a digest of every source file of the package (the
root's modules and every subpackage, found by walking the tree, not listed by
hand). Any change to any of them makes every cached kernel stale, and numba then
compiles it again and overwrites its cache entry; nothing is deleted.

Where the cache lives is numba's choice, unchanged: NUMBA_CACHE_DIR if set, else
`__pycache__` beside the module when writable, else the user's cache directory
(~/.cache/numba): a read-only site-packages install works. numba also keys every
entry by its own version, the Python version and the CPU, so a cache copied to
another machine is not used there.

`install()` only puts the locators in numba's list (no file is read or written);
the stamp is computed when the first `cache=True` function of the package is
decorated. Compiling happens on first use, or ahead of it with `shmcache warm`
(engine/warm.py), which scripts/setup and the supervisor run.
"""

from __future__ import annotations

import functools
import hashlib
import os

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the package's root directory


@functools.lru_cache(maxsize=1)
def package_stamp() -> str:
    """sha256 over the relative path and bytes of every .py file of the package: the
    root directory's own files and every subdirectory holding an __init__.py (so
    tests/, bench/ and a .venv inside the repo are not part of it)."""
    digest = hashlib.sha256()
    for path in sorted(_sources(_ROOT)):
        with open(path, "rb") as f:
            data = f.read()
        digest.update(os.path.relpath(path, _ROOT).encode() + b"\0" + len(data).to_bytes(8, "little") + data)
    return digest.hexdigest()


def _sources(top: str):
    for entry in os.scandir(top):
        if entry.is_file() and entry.name.endswith(".py"):
            yield entry.path
        elif entry.is_dir(follow_symlinks=False) and os.path.isfile(os.path.join(entry.path, "__init__.py")):
            yield from _sources(entry.path)


def _in_package(py_file: str) -> bool:
    return os.path.abspath(py_file).startswith(_ROOT + os.sep)


def _stamped(base):
    class Locator(base):
        def get_source_stamp(self):
            return package_stamp()

        @classmethod
        def from_function(cls, py_func, py_file):
            if not _in_package(py_file):
                return None  # other code that uses numba keeps numba's own stamps
            return super().from_function(py_func, py_file)

    Locator.__name__ = Locator.__qualname__ = "ShmcachePackage" + base.__name__.lstrip("_")
    return Locator


@functools.lru_cache(maxsize=1)
def install() -> bool:
    """Put the package-stamped locators first in numba's list; False (numba's defaults
    stay) if this numba does not have the locators by the names known here."""
    from numba.core import caching

    impl = getattr(caching, "CacheImpl", None) or getattr(caching, "_CacheImpl", None)
    names = [("UserProvidedCacheLocator", "_UserProvidedCacheLocator"), ("InTreeCacheLocator", "_InTreeCacheLocator"),
             ("UserWideCacheLocator", "_UserWideCacheLocator")]
    bases = [getattr(caching, a, None) or getattr(caching, b, None) for a, b in names]
    if impl is None or not isinstance(getattr(impl, "_locator_classes", None), list) or None in bases:
        return False
    impl._locator_classes[:0] = [_stamped(b) for b in bases]
    return True
