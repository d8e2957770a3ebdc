"""The Java reader (jvm/, issue 40) in the suite: its JUnit tests (the golden segments and
their expectations, damaged headers refused by field, a bucket held by a live process
given up after the bound, a file cut short under the mapping, byte flips, a re-created
cache, the readers' companion, a cache another user owns refused when the reader is told its
owner, the txmeta decoder of shmcache_txmeta) run by Maven Surefire. Offline once scripts/setup has
resolved the build (the first run resolves from Maven Central into ~/.m2). Skipped, saying
so, where java or mvn is not installed."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

JVM_DIR = Path(__file__).resolve().parents[1] / "jvm"
MVN, JAVA = shutil.which("mvn"), shutil.which("java")
pytestmark = pytest.mark.skipif(MVN is None or JAVA is None,
                                reason="java or mvn is not installed: the Java reader (jvm/) is not built or tested")


def mvn(*goals: str, timeout: float = 600) -> subprocess.CompletedProcess:
    """`mvn -q -B -o GOALS` in jvm/, online once if offline lacks something (a fresh ~/.m2)."""
    run = lambda *flags: subprocess.run([MVN, "-q", "-B", *flags, *goals], cwd=JVM_DIR, capture_output=True,
                                        text=True, timeout=timeout)
    p = run("-o")
    if p.returncode != 0 and "offline" in p.stdout + p.stderr:
        p = run()
    return p


def test_junit_tests_of_the_java_reader():
    p = mvn("test")
    assert p.returncode == 0, f"mvn test failed in jvm/ (reports in jvm/target/surefire-reports):\n{p.stdout}\n{p.stderr}"
    reports = list((JVM_DIR / "target" / "surefire-reports").glob("TEST-*.xml"))
    assert {r.name for r in reports} >= {"TEST-io.shmcache.GoldenTest.xml", "TEST-io.shmcache.FaultTest.xml",
                                          "TEST-io.shmcache.OwnerTest.xml", "TEST-io.shmcache.spark.TxMetaTest.xml"}
