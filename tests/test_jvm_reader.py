"""The Java reader (jvm/, issues 40, 45 and 47) in the suite, on every JDK it serves: its JUnit
tests run by Maven Surefire on the multi-release jar itself, once on JDK 17 (the Unsafe path,
the opener thread) and once on JDK 25 (the MemorySegment path, open(2) with O_NONBLOCK) with
sun.misc.Unsafe's memory access denied (--sun-misc-unsafe-memory-access=deny): the golden
segments and their expectations, damaged headers refused by field, the format's constants
against docs/segment-format.md's tables, the stuck bound per call, a file cut short under a
tight loop of lookups, a readers' companion cut short, a FIFO at the name, a name followed
through what is put there, the owner and mode rule, readiness against the golden control
areas and a live Python writer, the command line of docs/reader-contract.md, the txmeta
decoder of shmcache_txmeta (on JDK 25 with the flags Spark gives its JVMs: Spark's own
classes read through Unsafe). And the runnable jar as `scripts/setup` builds it, run with
`java -jar` on a cache the Python writer made, on each JDK: on JDK 25 it prints nothing but
the contract's lines, with the JDK's default flags and with Unsafe denied.

Maven runs on a JDK 22+ (jvm/find-jdk --javac 22+), as scripts/setup runs it. Offline once
scripts/setup has resolved the build (the first run resolves from Maven Central into ~/.m2).
Skipped, saying so, where java or mvn is not installed; the JDK 25 leg is skipped where no
JDK 25 is (jvm/find-jdk 25)."""

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

from shmtest.toolchains import BUILD_JDK, JAVA, JDK17, JDK25, JVM_DIR, MVN, mvn

pytestmark = pytest.mark.skipif(MVN is None or JAVA is None,
                                reason="java or mvn is not installed: the Java reader (jvm/) is not built or tested")
# the JVM's own warnings (sun.misc.Unsafe's deprecation, a restricted method called), never the reader's log
JVM_WARNING = re.compile(r"^WARNING: (?!shmcache: )|VM warning", re.M)


BASE_TESTS = ("AccessTest", "GoldenTest", "FaultTest", "OwnerTest", "LayoutTest", "StuckTest", "CutShortTest",
              "CompanionTest", "OpenTest", "FollowTest", "ModeTest", "StatusTest", "CliTest", "XXH64Test",
              "BudgetTest", "ContractTest")
SPARK_TESTS = ("spark.TxMetaTest",)


@pytest.fixture(scope="module")
def build(tmp_path_factory) -> Path:
    """This module's Maven build directory (the pom's shmcache.build.dir)."""
    return tmp_path_factory.mktemp("jvm-target")


def _reports(build: Path, leg: str) -> dict[str, str]:
    """A Surefire leg's reports: test class -> the java.specification.version it ran on."""
    out = {}
    for r in (build / "surefire-reports" / leg).glob("TEST-*.xml"):
        m = re.search(r'name="java.specification.version" value="([^"]+)"', r.read_text())
        out[r.name[len("TEST-io.shmcache."):-len(".xml")]] = m.group(1) if m else "?"
    return out


def test_junit_tests_of_the_java_reader_on_jdk_17_and_25(build):
    assert JDK17, "no JDK 17 is installed (jvm/find-jdk 17): the executors' JDK the reader is built for"
    shutil.rmtree(build / "surefire-reports", ignore_errors=True)  # this run's reports only
    legs = [f"-Dshmcache.test.jdk17={JDK17}"] + ([f"-Dshmcache.test.jdk25={JDK25}"] if JDK25 and BUILD_JDK else [])
    p = mvn(build, "package", *legs)
    assert p.returncode == 0, f"mvn package failed in jvm/ (reports in {build}/surefire-reports):\n{p.stdout}\n{p.stderr}"
    assert _reports(build, "jdk17") == {t: "17" for t in BASE_TESTS + SPARK_TESTS}
    if not legs[1:]:
        pytest.skip("the JDK 25 leg: no JDK 25 (jvm/find-jdk 25), or no JDK 22+ to build the jar's JDK 22+ classes")
    assert _reports(build, "jdk25") == {t: "25" for t in BASE_TESTS}, "the reader's tests, Unsafe denied"
    assert _reports(build, "jdk25-spark") == {t: "25" for t in SPARK_TESTS}, "the Spark decoder's, with Spark's flags"
    for out in (build / "surefire-reports").glob("jdk25*/*-output.txt"):
        assert not JVM_WARNING.search(out.read_text()), f"the JVM warned on JDK 25 ({out.name}):\n{out.read_text()}"
    assert not list(JVM_DIR.glob("hs_err_pid*.log")), "a JVM died in the tests"


def _version() -> str:
    return re.search(r"<artifactId>shmcache-jvm</artifactId>\s*<version>([^<]+)</version>",
                     (JVM_DIR / "pom.xml").read_text()).group(1)


@pytest.fixture(scope="module")
def jar(build) -> Path:
    """The runnable jar, built as scripts/setup builds it."""
    p = mvn(build, "package", "-DskipTests", timeout=900)
    assert p.returncode == 0, f"mvn package failed in jvm/:\n{p.stdout}\n{p.stderr}"
    return build / f"shmcache-jvm-{_version()}.jar"


def test_the_jar_is_multi_release_and_names_what_java_dash_jar_needs(jar):
    with zipfile.ZipFile(jar) as z:
        manifest = z.read("META-INF/MANIFEST.MF").decode().replace("\r\n", "\n")
        classes = z.namelist()
    assert "Main-Class: io.shmcache.cli.Main" in manifest
    if BUILD_JDK:  # the JDK 22+ classes, read by JDK 22+ in place of the base ones
        assert "Multi-Release: true" in manifest and "Enable-Native-Access: ALL-UNNAMED" in manifest
        assert {f"META-INF/versions/22/io/shmcache/{c}.class" for c in ("Jdk", "SegmentMapping", "NativeOpener")} \
            <= set(classes)
    # Jackson is Spark's: named by the manifest (copied to target/lib/), never a second copy inside
    assert not [c for c in classes if c.startswith(("net/jpountz/", "com/fasterxml/"))]
    class_path = re.search(r"Class-Path: ((?:.*\n )*.*)", manifest).group(1).replace("\n ", "").split()
    assert all((jar.parent / entry).is_file() for entry in class_path), class_path


@pytest.mark.parametrize("feature", ["17", "25"])
def test_the_runnable_jar_reads_a_python_writers_cache_with_java_dash_jar(jar, feature):
    home = JDK17 if feature == "17" else JDK25
    if home is None:
        pytest.skip(f"no JDK {feature} is installed (jvm/find-jdk {feature})")
    java = f"{home}/bin/java"
    name = f"jvm-jar-{os.getpid()}-{feature}"
    keys = [b"k" * 32, b"j" * 32, b"x" * 32]
    ways = {"java -jar": [java, "-jar", str(jar)]}
    if feature == "25":  # Unsafe denied; and no native access (the class path, no manifest): the opener thread
        ways["Unsafe denied"] = [java, "--sun-misc-unsafe-memory-access=deny", "-jar", str(jar)]
        ways["the class path"] = [java, "-cp", str(jar), "io.shmcache.cli.Main"]
    with shmcache.create(name, memory="4MiB", max_value=64) as w:
        try:
            w.set_many(keys[:2], [b"value one", b""])
            for way, argv in ways.items():
                run = lambda *args: subprocess.run([*argv, *args], capture_output=True, text=True, timeout=120)
                got = run("get", name, *(k.hex() for k in keys))
                assert (got.returncode, got.stdout, got.stderr) == (1, f"{b'value one'.hex()}\n\n-\n", ""), (way, got)
                for command in (["status", name], ["stats", name]):
                    st = run(*command)
                    assert st.returncode == 0 and st.stderr == "", (way, st)
                assert json.loads(run("status", name).stdout)["reason"] == "no-supervisor"
                watch = run("watch", name, keys[0].hex(), "0.5")
                assert watch.returncode == 0 and watch.stderr == "" and watch.stdout.endswith(
                    f" hit {b'value one'.hex()}\n"), (way, watch)
                ready = run("wait-ready", "--timeout", "0.2", name)  # not ready: exit 1, one line saying why
                assert ready.returncode == 1 and ready.stderr.startswith("shmcache-jvm: not-ready: ") \
                    and ready.stderr.count("\n") == 1, (way, ready)
                bad = run("get", name, "zz")
                assert (bad.returncode, bad.stdout) == (2, "") and bad.stderr.startswith("shmcache-jvm: bad-argument: ") \
                    and bad.stderr.count("\n") == 1, (way, bad)
        finally:
            shmcache.destroy(name)
