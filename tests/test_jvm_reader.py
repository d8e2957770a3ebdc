"""The Java reader (jvm/, issues 40 and 45) in the suite: its JUnit tests run by Maven Surefire
(the golden segments and their expectations, damaged headers refused by field, the format's
constants against docs/segment-format.md's tables, the stuck bound per call, a file cut short
under a tight loop of lookups, a readers' companion cut short, a FIFO at the name, a name
followed through what is put there, the owner and mode rule, readiness against the golden
control areas and a live Python writer, the command line of docs/reader-contract.md, the
txmeta decoder of shmcache_txmeta); and the runnable jar as `scripts/setup` builds it, run
with `java -jar` on a cache the Python writer made. Offline once scripts/setup has resolved
the build (the first run resolves from Maven Central into ~/.m2). Skipped, saying so, where
java or mvn is not installed."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest

import shmcache

JVM_DIR = Path(__file__).resolve().parents[1] / "jvm"
MVN, JAVA = shutil.which("mvn"), shutil.which("java")
pytestmark = pytest.mark.skipif(MVN is None or JAVA is None,
                                reason="java or mvn is not installed: the Java reader (jvm/) is not built or tested")


def mvn(*goals: str, timeout: float = 900) -> subprocess.CompletedProcess:
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
    reports = {r.name for r in (JVM_DIR / "target" / "surefire-reports").glob("TEST-*.xml")}
    assert reports >= {f"TEST-io.shmcache.{t}.xml" for t in (
        "GoldenTest", "FaultTest", "OwnerTest", "spark.TxMetaTest", "LayoutTest", "StuckTest", "CutShortTest",
        "CompanionTest", "OpenTest", "FollowTest", "ModeTest", "StatusTest", "CliTest")}
    assert not list(JVM_DIR.glob("hs_err_pid*.log")), "a JVM died in the tests"


def _version() -> str:
    return re.search(r"<artifactId>shmcache-jvm</artifactId>\s*<version>([^<]+)</version>",
                     (JVM_DIR / "pom.xml").read_text()).group(1)


def test_the_runnable_jar_reads_a_python_writers_cache_with_java_dash_jar():
    p = subprocess.run([MVN, "-q", "-B", "-o", "package", "-DskipTests"], cwd=JVM_DIR, capture_output=True, text=True,
                       timeout=900)  # what scripts/setup runs
    assert p.returncode == 0, f"mvn package failed in jvm/:\n{p.stdout}\n{p.stderr}"
    jar = JVM_DIR / "target" / f"shmcache-jvm-{_version()}.jar"
    with zipfile.ZipFile(jar) as z:
        manifest = z.read("META-INF/MANIFEST.MF").decode().replace("\r\n", "\n")
        classes = z.namelist()
    assert "Main-Class: io.shmcache.cli.Main" in manifest
    # lz4-java and Jackson are Spark's: named by the manifest (copied to target/lib/), never a second copy inside
    assert not [c for c in classes if c.startswith(("net/jpountz/", "com/fasterxml/"))]
    class_path = re.search(r"Class-Path: ((?:.*\n )*.*)", manifest).group(1).replace("\n ", "").split()
    assert all((jar.parent / entry).is_file() for entry in class_path), class_path
    name = f"jvm-jar-{os.getpid()}"
    keys = [b"k" * 32, b"j" * 32, b"x" * 32]
    with shmcache.create(name, memory="4MiB", max_value=64) as w:
        try:
            w.set_many(keys[:2], [b"value one", b""])
            java = lambda *args: subprocess.run([JAVA, "-jar", str(jar), *args], capture_output=True, text=True,
                                                timeout=120)
            got = java("get", name, *(k.hex() for k in keys))
            assert (got.returncode, got.stdout) == (1, f"{b'value one'.hex()}\n\n-\n"), got
            st = java("status", name)
            assert st.returncode == 0 and json.loads(st.stdout)["reason"] == "no-supervisor", st
            bad = java("get", name, "zz")
            assert (bad.returncode, bad.stdout) == (2, "") and bad.stderr.startswith("shmcache-jvm: bad-argument: "), bad
        finally:
            shmcache.destroy(name)
