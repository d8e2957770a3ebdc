"""Spark on Java 25 (issue 47): the Spark lookup tests that prove it, run again with Spark's
JVM on a JDK 25 (jvm/find-jdk 25), under both engines: the JVM engine (the batched lookup and
the row-at-a-time expression, the jar's JDK 22+ path: a MemorySegment, open(2) with
O_NONBLOCK) against the Python engine (mapInArrow: Arrow in Spark's JVM), the JVM's txmeta
decoder, a re-created cache re-attached, the readers' companion counted into, the owner
check. A SparkSession's JVM is the process's for its life, so the subset runs in a pytest of
its own, with JAVA_HOME set as a user sets it to point PySpark at a JDK (spark-submit starts
$JAVA_HOME/bin/java); its `spark` fixture (conftest.py) checks that the JVM is the one asked
for. Spark 4.2 gives its JVMs the flags Java 25 needs itself (JavaModuleOptions:
--add-opens for Arrow and Netty, --sun-misc-unsafe-memory-access=allow,
--enable-native-access=ALL-UNNAMED); nothing is added here. Skipped where no JDK 25 is
installed or the jar is not built."""

import os
import subprocess
import sys

import pytest

from shmcache.spark import _session

SUBSET = [
    "tests/spark/test_jvm_lookup.py::test_jvm_and_python_give_identical_rows[txmeta-value-False-batched]",
    "tests/spark/test_jvm_lookup.py::test_jvm_and_python_give_identical_rows[txmeta-value-False-expression]",
    "tests/spark/test_jvm_lookup.py::test_the_jvm_txmeta_decoder_matches_the_python_one_on_malformed_values",
    "tests/spark/test_jvm_lookup.py::test_a_recreated_cache_is_reattached",
    "tests/spark/test_jvm_lookup.py::test_hits_and_misses_are_counted_in_the_readers_companion",
    "tests/spark/test_jvm_lookup.py::test_owner_is_checked_by_the_jvm_reader_at_attach_and_reattach",
    "tests/spark/test_lookup.py::test_values_and_found[None]",
    "tests/spark/test_lookup.py::test_decode_txmeta",
]


def test_the_spark_lookups_pass_with_sparks_jvm_on_java_25(repo):
    pytest.importorskip("pyspark")
    if _session.jvm_jar(required=False) is None:
        pytest.skip("the shmcache JVM jar is not built (scripts/setup)")
    home = subprocess.run([str(repo / "jvm" / "find-jdk"), "25"], capture_output=True, text=True).stdout.strip()
    if not home:
        pytest.skip("no JDK 25 is installed (jvm/find-jdk 25)")
    env = {**os.environ, "JAVA_HOME": home, "SHMCACHE_TEST_SPARK_JAVA": "25"}
    p = subprocess.run([sys.executable, "-m", "pytest", *SUBSET, "-p", "no:cacheprovider", "-q", "-rs"], cwd=repo,
                       env=env, capture_output=True, text=True, timeout=900)
    assert p.returncode == 0 and f"{len(SUBSET)} passed" in p.stdout, \
        f"the Spark lookups on Java 25 (JAVA_HOME={home}):\n{p.stdout[-6000:]}\n{p.stderr[-3000:]}"
