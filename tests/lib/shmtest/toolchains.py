"""The other languages' toolchains as the tests run them: `go` in go/ (CGO off unless asked,
the Python reader beside it for the tests that start a writer), and Maven in jvm/ on the JDK
scripts/setup builds with (22+), its output in a build directory of the caller's, never
jvm/target (scripts/setup's jar, which Spark's tests and the conformance suite load)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from shmtest import REPO

GO_DIR = REPO / "go"
JVM_DIR = REPO / "jvm"
GO = shutil.which("go")
MVN, JAVA = shutil.which("mvn"), shutil.which("java")


def go(*args: str, cgo: bool = False, timeout: float = 300, env: dict | None = None, cwd: Path = GO_DIR) -> str:
    """`go ARGS` in go/ (or cwd); its stdout, or an assertion naming its output."""
    env = {**os.environ, "CGO_ENABLED": "1" if cgo else "0", "SHMCACHE_PYTHON": sys.executable, **(env or {})}
    p = subprocess.run([GO, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert p.returncode == 0, f"go {' '.join(args)} failed:\n{p.stdout}\n{p.stderr}"
    return p.stdout


def find_jdk(feature: str, javac: bool = False) -> str | None:
    """The JAVA_HOME of an installed JDK of that feature release ("25", "22+"), None if none."""
    p = subprocess.run([str(JVM_DIR / "find-jdk"), *(["--javac"] if javac else []), feature], capture_output=True,
                       text=True)
    return p.stdout.strip() or None


BUILD_JDK = find_jdk("22+", javac=True) if MVN else None  # Maven's, for the jar's JDK 22+ classes
JDK17, JDK25 = (find_jdk("17"), find_jdk("25")) if JAVA else (None, None)


def mvn(build: Path, *args: str, timeout: float = 1200) -> subprocess.CompletedProcess:
    """`mvn -q -B -o ARGS` in jvm/ on the build JDK, online once if offline lacks something (a fresh ~/.m2).
    Its output goes to `build` (the pom's shmcache.build.dir), never jvm/target."""
    env = {**os.environ, **({"JAVA_HOME": BUILD_JDK} if BUILD_JDK else {})}
    run = lambda *flags: subprocess.run([MVN, "-q", "-B", *flags, f"-Dshmcache.build.dir={build}", *args],
                                        cwd=JVM_DIR, capture_output=True, text=True, timeout=timeout, env=env)
    p = run("-o")
    if p.returncode != 0 and "offline" in p.stdout + p.stderr:
        p = run()
    return p
