"""tests/spark: one local[2] SparkSession for the whole test session (with the Kafka
connector's jars), the real Kafka broker of tests/consumer/conftest.py, and the
`harness` of tests/consumer/_pipeline.py (real `shmcache run` supervisors, cleaned
up by pid, segments destroyed).

The broker fixtures are re-exported the way bench/conftest.py does it: the module
is loaded under a name of its own, so this directory's session-scoped
`kafka_broker` is a broker of its own, started on first use and stopped at the end.
"""

import importlib.util
import sys
import uuid
from pathlib import Path

import pytest

import shmcache

HERE = Path(__file__).resolve().parent
CONSUMER_TESTS = HERE.parent / "consumer"
if str(CONSUMER_TESTS) not in sys.path:
    sys.path.insert(0, str(CONSUMER_TESTS))  # for `import _pipeline`, as tests/consumer does


def _load_kafka_fixtures():
    name = "_shmcache_spark_tests_kafka_fixtures"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, CONSUMER_TESTS / "conftest.py")
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
    return sys.modules[name]


kafka_fixtures = _load_kafka_fixtures()
kafka_broker = kafka_fixtures.kafka_broker
kafka_admin = kafka_fixtures.kafka_admin
kafka_topic = kafka_fixtures.kafka_topic

from _pipeline import harness  # noqa: E402,F401  (a fixture: supervisors, readers, segments)


@pytest.fixture(scope="session")
def spark():
    """A local[2] session shared by every Spark test; stopped at the end."""
    pytest.importorskip("pyspark")
    from shmcache.spark import _session

    s = _session.session("shmcache-tests", master="local[2]", kafka=True,
                         conf={"spark.sql.shuffle.partitions": "2",
                               "spark.sql.execution.arrow.maxRecordsPerBatch": "1000"})
    try:
        yield s
    finally:
        s.stop()


@pytest.fixture
def cache_names():
    """Factory of unique cache names; every cache so named is destroyed after the test
    (destroy() also removes the readers' companion segment)."""
    names: list[str] = []

    def make(tag: str = "c") -> str:
        name = f"t-spark-{tag}-{uuid.uuid4().hex[:10]}"
        names.append(name)
        return name

    yield make
    for name in names:
        try:
            shmcache.destroy(name)
        except FileNotFoundError:
            pass


@pytest.fixture(scope="session")
def repo() -> Path:
    return HERE.parents[1]

