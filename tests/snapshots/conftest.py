"""tests/snapshots: a snapshot is taken of a table that the engine tests' child processes
write (tests/engine/_procs.py), so their fixture serves here too: child processes that
are all stopped and reaped after."""

import importlib.util
import sys
from pathlib import Path

ENGINE_TESTS = Path(__file__).resolve().parent.parent / "engine"
if str(ENGINE_TESTS) not in sys.path:
    sys.path.insert(0, str(ENGINE_TESTS))  # `from _procs import ...`, as tests/engine does


def _engine_fixtures():
    name = "_shmcache_engine_test_fixtures"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, ENGINE_TESTS / "conftest.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
    return sys.modules[name]


procs = _engine_fixtures().procs
