"""numba's on-disk cache of shmcache's kernels, stamped with the sources they depend on.

numba's `cache=True` keeps a function's machine code keyed by a hash of the one
file the function is written in. The kernels inline helpers and constants from other
modules (atomics, prefetch, xxh64, layout's constants), so an edit there left stale
code in the cache. Here every `cache=True` function of this package gets, instead of
its own file's hash, a stamp over the file it is written in and every module of the
package that file imports, transitively (found by reading the files' import
statements with `ast`, not listed by hand). Any change to one of them makes the
kernels that depend on it stale, and numba then compiles them again and overwrites
their cache entries; nothing is deleted. An edit elsewhere (spark/, the command
line) recompiles nothing.

Where the cache lives is numba's choice: NUMBA_CACHE_DIR if set, else `__pycache__`
beside the module when writable, else the user's cache directory (~/.cache/numba): a
read-only site-packages install works. Where none of those can be written (a reader
running as a user with no home, in a container whose image is read-only), numba has no
place and refuses to compile a `cache=True` function at all; so last comes a directory of
this user's own in the system's temp directory (`shmcache-numba-UID`, mode 0700, used only
if this user owns it and no one else may write it: compiled code is run from it). numba also keys every
entry by its own version, the Python version and the CPU, so a cache copied to
another machine is not used there.

`install()` only puts the locators in numba's list (no file is read or written);
a stamp is computed when a `cache=True` function of the package is decorated. It
must run before the first of them is: a kernel decorated earlier keeps numba's own
stamp, and a process that then loads it overwrites the cache entry that processes
with this stamp keep, which compile it again, and so on. It lives in ipc/, the
lowest layer, so that every module with kernels can call it first, whichever of
them a process imports first (ipc/atomics.py, engine/xxh64.py and engine/_pyobjects.py
do; the rest import one of those before their kernels; tests/ipc/test_jitcache.py imports
each alone). Nothing else calls it: importing the package, or its constants, imports no
numba (the command line parses its arguments without it).
Compiling happens on first use, or ahead of it with `shmcache warm` (consumer/warm.py),
which scripts/setup and the supervisor run.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import os
import stat
import tempfile

_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # the package's root directory


_PACKAGE = "shmcache"  # the import name of the directory _ROOT


@functools.lru_cache(maxsize=None)
def source_stamp(py_file: str) -> str:
    """sha256 over the relative path and bytes of `py_file` and of every package module it
    imports, transitively."""
    return files_stamp(_closure(os.path.abspath(py_file)))


def files_stamp(paths, salt: bytes = b"") -> str:
    """sha256 over `salt` and the relative path and bytes of each file, in path order
    (a kernel's stamp here; the whole package's in consumer/warm.py's marker)."""
    digest = hashlib.sha256(salt)
    for path in sorted(paths):
        with open(path, "rb") as f:
            data = f.read()
        digest.update(os.path.relpath(path, _ROOT).encode() + b"\0" + len(data).to_bytes(8, "little") + data)
    return digest.hexdigest()


def package_sources() -> list[str]:
    """Every source file of the package (see _sources)."""
    return list(_sources(_ROOT))


def _closure(path: str) -> set[str]:
    seen: set[str] = set()
    todo = [path]
    while todo:
        p = todo.pop()
        if p not in seen:
            seen.add(p)
            todo.extend(_imports(p))
    return seen


@functools.lru_cache(maxsize=None)
def _imports(path: str) -> tuple[str, ...]:
    """The package's source files that `path` imports anything from (any statement, at any
    depth: a function's own imports count too)."""
    with open(path, "rb") as f:
        tree = ast.parse(f.read(), path)
    here = os.path.relpath(os.path.dirname(path), _ROOT).split(os.sep)
    here = [] if here == ["."] else here
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for a in node.names:
                found.append(_module_file(a.name.split(".")))
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = here[:len(here) - node.level + 1] if node.level > 1 else here
                parts = [_PACKAGE, *base, *(node.module.split(".") if node.module else [])]
            else:
                parts = (node.module or "").split(".")
            for a in node.names:  # `from P import n`: n's own file if n is a module, else P's
                found.append(_module_file(parts + [a.name]) or _module_file(parts))
    return tuple(sorted({f for f in found if f}))


def _module_file(parts: list[str]) -> str | None:
    """The file of module `a.b.c` inside this package, or None (outside it, or no module)."""
    if not parts or parts[0] != _PACKAGE:
        return None
    base = os.path.join(_ROOT, *parts[1:])
    for candidate in (base + ".py", os.path.join(base, "__init__.py")):
        if os.path.isfile(candidate):
            return candidate
    return None


def _sources(top: str):
    """Every .py file of the package: the root's own and every subpackage's (tests/, bench/
    and a .venv inside the repo hold no __init__.py and are not part of it)."""
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
            return source_stamp(self._py_file)

        @classmethod
        def from_function(cls, py_func, py_file):
            if not _in_package(py_file):
                return None  # other code that uses numba keeps numba's own stamps
            return super().from_function(py_func, py_file)

    Locator.__name__ = Locator.__qualname__ = "ShmcachePackage" + base.__name__.lstrip("_")
    return Locator


def private_dir() -> str:
    """This user's own directory of compiled kernels in the system's temp directory."""
    return os.path.join(tempfile.gettempdir(), f"shmcache-numba-{os.geteuid()}")


def _private(base):
    """numba's user-wide locator (`base`), placed in private_dir() instead of ~/.cache."""

    class Locator(base):
        def __init__(self, py_func, py_file):
            super().__init__(py_func, py_file)
            self._cache_path = os.path.join(private_dir(), self.get_suitable_cache_subpath(py_file))

        def ensure_cache_path(self):
            top = private_dir()
            try:
                os.mkdir(top, 0o700)
            except FileExistsError:
                pass
            st = os.lstat(top)
            if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.geteuid() or st.st_mode & 0o077:
                raise OSError(f"{top} is not a directory of this user's alone: no kernel is cached there")
            super().ensure_cache_path()

    Locator.__name__ = Locator.__qualname__ = "Private" + base.__name__.lstrip("_")
    return Locator


@functools.lru_cache(maxsize=1)  # once a process: the locators go in once
def install() -> bool:
    """Put the package-stamped locators first in numba's list; False (numba's defaults
    stay) if this numba does not have the locators by the names known here. Every module
    with a `cache=True` kernel calls it (or imports one that does) before its kernels are
    decorated."""
    from numba.core import caching

    impl = getattr(caching, "CacheImpl", None) or getattr(caching, "_CacheImpl", None)
    names = [("UserProvidedCacheLocator", "_UserProvidedCacheLocator"), ("InTreeCacheLocator", "_InTreeCacheLocator"),
             ("UserWideCacheLocator", "_UserWideCacheLocator")]
    bases = [getattr(caching, a, None) or getattr(caching, b, None) for a, b in names]
    if impl is None or not isinstance(getattr(impl, "_locator_classes", None), list) or None in bases:
        return False
    impl._locator_classes[:0] = [_stamped(b) for b in bases] + [_stamped(_private(bases[-1]))]
    return True
