"""tests/spark: one local[2] SparkSession for the whole test session (with the Kafka
connector's jars), and the `harness` of tests/lib/shmtest/supervisors.py (real `shmcache
run` supervisors, cleaned up by pid, segments destroyed). The Kafka broker is the
session's one, from tests/conftest.py.
"""

import os
from pathlib import Path

import pytest

import shmcache

HERE = Path(__file__).resolve().parent

from shmtest.supervisors import harness  # noqa: F401 (a fixture: supervisors, readers, segments)


@pytest.fixture(scope="session")
def spark():
    """A local[2] session shared by every Spark test; stopped at the end. With
    SHMCACHE_TEST_SPARK_JAVA=25 (test_java25.py's run), its JVM must be that JDK's, taking the
    jar's JDK 22+ path."""
    pytest.importorskip("pyspark")
    from shmcache.spark import _session

    s = _session.session("shmcache-tests", master="local[2]", kafka=True,
                         conf={"spark.sql.shuffle.partitions": "2",
                               "spark.sql.execution.arrow.maxRecordsPerBatch": "1000"})
    try:
        want = os.environ.get("SHMCACHE_TEST_SPARK_JAVA")
        if want:
            jvm = s.sparkContext._jvm
            assert jvm.java.lang.Runtime.version().feature() == int(want), jvm.System.getProperty("java.version")
            assert jvm.io.shmcache.Segment.access() == "memory-segment open-nonblock", jvm.io.shmcache.Segment.access()
        yield s
    finally:
        s.stop()


@pytest.fixture(scope="session")
def repo() -> Path:
    return HERE.parents[1]

