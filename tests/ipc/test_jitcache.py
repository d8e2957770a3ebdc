"""numba's on-disk kernel cache (ipc/jitcache.py, consumer/warm.py): compiled once, kept
correct after a source change anywhere in the package, nothing deleted at import.

The first two tests run a copy of the package's sources from a temporary directory
(as a site-packages install would be), in child processes."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap

import pytest

import shmcache
from shmcache.ipc import jitcache

ROOT = os.path.dirname(os.path.abspath(shmcache.__file__))


def _copy_package(dest) -> str:
    """The package's .py files (as jitcache walks them) under dest/shmcache; returns that dir."""
    pkg = os.path.join(dest, "shmcache")
    for path in jitcache._sources(ROOT):
        rel = os.path.relpath(path, ROOT)
        os.makedirs(os.path.dirname(os.path.join(pkg, rel)), exist_ok=True)
        shutil.copyfile(path, os.path.join(pkg, rel))
    return pkg


def _run(code: str, env: dict, timeout: float = 600) -> str:
    r = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True,
                       timeout=timeout)
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout


def _env(pythonpath: str, **extra) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NUMBA_")}
    env.update(PYTHONPATH=pythonpath, **extra)
    return env


def test_import_deletes_no_cache_file(tmp_path):
    """Importing the engine reads and writes nothing of numba's cache: the old import hook
    deleted every .nbi/.nbc beside the kernels when its stamp file was missing or stale."""
    pkg = _copy_package(tmp_path)
    planted = [os.path.join(pkg, "engine", "__pycache__", "x.nbi"), os.path.join(pkg, "ipc", "__pycache__", "y.nbc")]
    for p in planted:
        os.makedirs(os.path.dirname(p), exist_ok=True)
        with open(p, "wb") as f:
            f.write(b"kept")
    _run("import shmcache.engine.table", _env(str(tmp_path)))
    assert [open(p, "rb").read() for p in planted] == [b"kept", b"kept"]


@pytest.mark.slow  # a build: every kernel of a copy of the package compiled
def test_change_in_an_inlined_module_recompiles(tmp_path, cache_name):
    """A kernel inlines another module's constants: after that module changes, a process
    runs the new code, not the cached machine code. Here layout.py swaps the words of the
    eviction and takeover counters of a bucket's row; the apply kernel (in _kernels.py,
    unchanged) must count evictions where stats() now reads them. NUMBA_CACHE_DIR points
    outside the package, where a read-only site-packages install keeps its cache (the old
    import hook only cleaned __pycache__ beside the sources, so this ran stale code)."""
    pkg = _copy_package(tmp_path / "src")
    env = _env(str(tmp_path / "src"), NUMBA_CACHE_DIR=str(tmp_path / "numba-cache"))
    code = f"""
        import json, numpy as np, shmcache
        w = shmcache.create({cache_name!r}, memory="4MiB", max_value=64)
        keys = np.random.default_rng(1).integers(0, 256, (60000, 32), np.uint8)
        vals = (np.arange(60001, dtype=np.int64) * 8, np.zeros(480000, np.uint8))
        w.set_many(keys, vals)
        s = w.stats()
        w.close()
        shmcache.destroy({cache_name!r})
        print(json.dumps([s["evictions"], s["lock_takeovers"]]))
    """
    layout = os.path.join(pkg, "engine", "layout.py")
    ev, takeovers = json.loads(_run(code, env))
    assert ev > 0 and takeovers == 0
    with open(layout) as f:
        text = f.read()
    assert "M_EVICTIONS = 6" in text and "M_TAKEOVERS = 7" in text
    with open(layout, "w") as f:
        f.write(text.replace("M_EVICTIONS = 6", "M_EVICTIONS = 7").replace("M_TAKEOVERS = 7", "M_TAKEOVERS = 6", 1))
    ev, takeovers = json.loads(_run(code, env))
    assert ev > 0 and takeovers == 0, "the apply kernel ran from a stale cache (old counter words)"


def test_after_warm_nothing_compiles(tmp_path):
    """After `shmcache warm`, a new process writing, reading with an array and a list of
    keys, and decoding the wire formats compiles no kernel: each is loaded from the cache."""
    from shmcache.consumer import warm

    warm.warm()  # this install's cache (scripts/setup warmed it; compiles only if sources changed since)
    out = _run("""
        import json
        from shmcache.consumer import warm
        print(json.dumps(warm.warm()))
    """, dict(os.environ))
    got = json.loads(out.strip().splitlines()[-1])
    assert got["compiled"] == 0 and got["loaded"] > 0, got


def test_a_kernels_stamp_covers_what_it_imports_and_nothing_else(tmp_path):
    """The stamp of a kernel's file changes with any module it imports, transitively
    (layout.py, inlined by the apply kernel through its imports), and not with the rest of
    the package (spark/, the command line): an edit there recompiles nothing."""
    pkg = _copy_package(tmp_path)
    code = """
        import os, shmcache
        from shmcache.ipc import jitcache
        root = os.path.dirname(shmcache.__file__)
        print(jitcache.source_stamp(os.path.join(root, "engine", "_lookup.py")))
    """
    env = _env(str(tmp_path))
    first = _run(code, env)

    def edit(rel):
        with open(os.path.join(pkg, rel), "a") as f:
            f.write("\n# edited\n")
    for rel in (os.path.join("spark", "audit.py"), os.path.join("cli", "status.py"), "consumer/warm.py"):
        edit(rel)
    assert _run(code, env) == first
    edit(os.path.join("engine", "layout.py"))  # imported by _kernels.py, which _lookup.py imports
    second = _run(code, env)
    assert second != first
    edit(os.path.join("ipc", "atomics.py"))  # two imports away
    assert _run(code, env) != second


def _kernel_modules() -> list[str]:
    """Every module of the package that decorates a kernel for numba's cache."""
    mods = []
    for path in jitcache._sources(ROOT):
        with open(path) as f:
            if "cache=True" in f.read() and not path.endswith("jitcache.py"):
                rel = os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
                mods.append("shmcache." + rel.removesuffix(".__init__"))
    return sorted(mods)


def test_every_kernel_is_stamped_whichever_module_a_process_imports_first():
    """A kernel decorated before the stamped locators are installed keeps numba's own
    stamp; a process that loads it then overwrites the cache entry the other processes
    keep, and they compile it again (`shmcache warm` imported ipc/ first and made the
    next process compile the atomics). Each kernel module, imported alone in a new
    process, must leave every cached kernel of the package in it with the package's stamp."""
    mods = _kernel_modules()
    assert {"shmcache.ipc.atomics", "shmcache.engine._kernels", "shmcache.formats.txmeta"} <= set(mods), mods
    for mod in mods:
        out = _run(f"""
            import importlib, json, sys
            from numba.core.registry import CPUDispatcher
            importlib.import_module({mod!r})
            found = {{}}
            for name, m in list(sys.modules.items()):
                if not name.startswith("shmcache"):
                    continue
                for attr, f in vars(m).items():
                    impl = getattr(getattr(f, "_cache", None), "_impl", None)
                    if isinstance(f, CPUDispatcher) and impl is not None:
                        found[name + "." + attr] = type(impl.locator).__name__
            print(json.dumps(found))
        """, dict(os.environ))
        found = json.loads(out.strip().splitlines()[-1])
        assert found, f"{mod}: no cached kernel found"
        wrong = {k: v for k, v in found.items() if not v.startswith("ShmcachePackage")}
        assert not wrong, f"imported first, {mod} left kernels with numba's own stamp: {wrong}"


def _private_locator(tmp_path, monkeypatch):
    """The last locator, with the system's temp directory at tmp_path."""
    from numba.core import caching

    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr("tempfile.tempdir", None)  # gettempdir() reads TMPDIR again
    locator = jitcache._private(caching.UserWideCacheLocator)
    return locator, tmp_path / f"shmcache-numba-{os.geteuid()}"


def test_with_nowhere_else_to_write_kernels_go_to_a_private_temp_directory(tmp_path, monkeypatch):
    """A reader's user with no writable home (nobody, in a read-only image): numba has no
    place of its own and would refuse every cached kernel; the last locator is a directory
    of this user's own, 0700, in the temp directory."""
    from shmcache.engine import _repair

    locator, top = _private_locator(tmp_path, monkeypatch)
    loc = locator.from_function(_repair._rebuild.py_func, _repair.__file__)
    assert loc is not None and loc.get_cache_path().startswith(str(top) + os.sep)
    st = os.stat(top)
    assert st.st_uid == os.geteuid() and st.st_mode & 0o777 == 0o700


@pytest.mark.parametrize("wrong", ["another user's", "others may write it", "a symlink"])
def test_a_private_directory_not_of_this_users_alone_is_not_used(tmp_path, monkeypatch, wrong):
    """Compiled code is run from there: a directory someone else made at its name first is
    never used (the kernels are then compiled, not cached)."""
    from shmcache.engine import _repair

    if wrong == "another user's" and os.geteuid() != 0:
        pytest.skip("making another user's directory needs root")
    locator, top = _private_locator(tmp_path, monkeypatch)
    if wrong == "a symlink":
        (tmp_path / "elsewhere").mkdir(mode=0o700)
        top.symlink_to(tmp_path / "elsewhere")
    else:
        top.mkdir(mode=0o700)
        if wrong == "another user's":
            os.chown(top, 65534, 65534)
        else:
            top.chmod(0o777)
    assert locator.from_function(_repair._rebuild.py_func, _repair.__file__) is None
