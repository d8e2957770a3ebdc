"""The Go reader (go/, issues 41 and 45) in the suite: gofmt, go vet, a CGO_ENABLED=0 build,
its tests (the golden segments and golden control areas, byte flips, a truncated file, a
real Python writer under Go readers, readiness against the Python reader's, a followed
name, the owner and mode checks, the shmcache-go commands; the goldens again without
prefetching), the writer and following tests again under the race detector, and a
smoke-size run of its benchmark.
Skipped, saying so, where `go` is not installed."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

GO_DIR = Path(__file__).resolve().parents[1] / "go"
GO = shutil.which("go")
pytestmark = pytest.mark.skipif(GO is None, reason="go is not installed: the Go reader (go/) is not built or tested")


def _go(*args: str, cgo: bool = False, timeout: float = 300, env: dict | None = None) -> str:
    env = {**os.environ, "CGO_ENABLED": "1" if cgo else "0", "SHMCACHE_PYTHON": sys.executable, **(env or {})}
    p = subprocess.run([GO, *args], cwd=GO_DIR, env=env, capture_output=True, text=True, timeout=timeout)
    assert p.returncode == 0, f"go {' '.join(args)} failed:\n{p.stdout}\n{p.stderr}"
    return p.stdout


def test_gofmt_vet_and_a_pure_go_build():
    fmt = subprocess.run([str(Path(GO).with_name("gofmt")), "-l", "."], cwd=GO_DIR, capture_output=True, text=True)
    assert fmt.returncode == 0 and fmt.stdout == "", f"not gofmt'ed: {fmt.stdout}{fmt.stderr}"
    _go("vet", "./...")
    _go("build", "./...")


def test_go_tests():
    _go("test", "-count=1", "./...")


def test_go_tests_without_prefetch():
    """The path of platforms without a prefetch instruction (touching lines), on the goldens."""
    _go("test", "-count=1", "-tags", "shmcache_noprefetch", "-run", "Golden|ByteFlip|Truncated", ".")


def test_go_benchmark_smoke():
    """go/bench_test.go at a smoke size (SHMCACHE_BENCH_N, 20,000 unless set): it runs and
    allocates nothing per batch. Full size: see its docstring."""
    n = os.environ.get("SHMCACHE_BENCH_N", "20000")
    out = _go("test", "-run", "^$", "-bench", ".", "-benchmem", "-benchtime", "20x", "-cpu", "1", ".",
              env={"SHMCACHE_BENCH_N": n})
    rows = [line.split() for line in out.splitlines() if line.startswith("BenchmarkGetMany")]
    assert len(rows) == 2, out
    assert all(r[r.index("allocs/op") - 1] == "0" for r in rows), out


@pytest.mark.skipif(shutil.which("gcc") is None and shutil.which("cc") is None,
                    reason="no C compiler: go test -race needs cgo")
def test_python_writer_under_go_readers_with_the_race_detector():
    _go("test", "-count=1", "-race", "-run", "PythonWriter|Reattach|Follow|CompanionCutShort", ".", cgo=True)
