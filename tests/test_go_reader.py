"""The Go reader (go/, issue 41) in the suite: gofmt, go vet, a CGO_ENABLED=0 build, its
tests (the golden segments, byte flips, a truncated file, a real Python writer under Go
readers, a re-created cache), and the writer test again under the race detector.
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


def _go(*args: str, cgo: bool = False, timeout: float = 300) -> str:
    env = {**os.environ, "CGO_ENABLED": "1" if cgo else "0", "SHMCACHE_PYTHON": sys.executable}
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


@pytest.mark.skipif(shutil.which("gcc") is None and shutil.which("cc") is None,
                    reason="no C compiler: go test -race needs cgo")
def test_python_writer_under_go_readers_with_the_race_detector():
    _go("test", "-count=1", "-race", "-run", "PythonWriter|Reattach", ".", cgo=True)
