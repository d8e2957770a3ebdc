"""Fixtures that run a real single-node Kafka broker (scripts/kafka) for every test
directory that needs one: no Docker, no mocks. The broker is started once per session,
bound to 127.0.0.1 only, and always stopped at the end. Also a fresh cache name (and a
factory of several) and the engine's child processes (`procs`). The helpers (real
supervisors, a topic's model, waits, the goldens' writers, ...) are one package, `shmtest`
(tests/lib), which scripts/setup installs.

The markers (registered in pyproject.toml) are put on each test here, from what it uses,
never by hand: `kafka` on a test whose fixtures reach the session broker or whose module
starts a broker of its own; `spark` on tests/spark's and any that uses a Spark session (or,
for a documentation example, imports shmcache.spark); `slow` on the other languages' suites
(tests/conformance, the Go and JVM readers' builds and tests) and the fault suite
(tests/faults). A long run elsewhere (a fault or torture run of its own, a build) carries
`slow` at the test, with its reason. `scripts/test --quick` runs what has none of them."""

import os
import time
from pathlib import Path

import pytest

# the fixtures the tests share with the benchmarks (bench/conftest.py)
from shmtest.fixtures import (cache_name, cache_names, kafka_admin, kafka_broker, kafka_topic,  # noqa: F401
                              procs, small_fs)

TESTS = Path(__file__).resolve().parent
# what a test module holds when it starts a broker of its own (tests/lib/shmtest/private_broker.py,
# dev/local_kafka.py, the demo): its tests use Kafka though no fixture of theirs names the session broker
PRIVATE_BROKERS = ("broker_run", "BrokerRun", "LocalBroker", "run_demo")
SLOW_FOLDERS = {"conformance", "faults"}
SLOW_FILES = {"test_go_reader.py", "test_jvm_reader.py"}  # each builds and runs another language's suite


def _marks(item) -> set[str]:
    """The markers a collected test takes from what it uses and where it is."""
    marks = set()
    path = Path(str(item.fspath)).resolve()
    where = path.relative_to(TESTS).parts if path.is_relative_to(TESTS) else ()
    fixtures = set(getattr(item, "fixturenames", ()))
    module = getattr(item, "module", None)
    if "kafka_broker" in fixtures or any(hasattr(module, name) for name in PRIVATE_BROKERS):
        marks.add("kafka")
    code = getattr(getattr(item, "callspec", None), "params", {}).get("code", "")
    if (where[:1] == ("spark",) or "spark" in fixtures
            or (isinstance(code, str) and ("shmcache.spark" in code or "pyspark" in code))):
        marks.add("spark")
    if where[:1] and (where[0] in SLOW_FOLDERS or where[-1] in SLOW_FILES):
        marks.add("slow")
    return marks


def pytest_collection_modifyitems(config, items):
    for item in items:
        for name in sorted(_marks(item)):
            item.add_marker(getattr(pytest.mark, name))
    # the longest groups first (pytest-xdist hands groups out in this order), stable otherwise
    items.sort(key=lambda item: -_GROUP_WEIGHT.get(group_of(item.nodeid), 0))


# Running in parallel (scripts/test: pytest-xdist, `--dist loadfile`), a group of tests runs on
# one worker, in order: a test file, so that its tests share its fixtures and run one at a
# time, as some must (tests/consumer/test_warm.py moves the install's warm-up marker away and
# back); the files that use the session's Spark, one group, so that one worker starts one Spark.
SPARK_SESSION_FILES = {f"tests/spark/{f}.py" for f in ("test_jvm_lookup", "test_lookup", "test_pipeline",
                                                        "test_publish_broker", "test_streaming")}
SPARK_GROUP = "tests/spark (the session's Spark)"
# The groups that take longest (seconds of one run on 2 cores, three workers, 2026-11-29), started
# first so that none of them starts last and leaves the other workers idle; a group not named
# here is short. Only the order of the run depends on these figures, never what runs.
_GROUP_WEIGHT = {
    "tests/conformance/test_conformance.py": 600, "tests/conformance/test_watch.py": 150, SPARK_GROUP: 750,
    "tests/test_jvm_reader.py": 340, "tests/consumer/supervisor/test_broker_frozen_assign.py": 260,
    "tests/spark/test_cluster.py": 250, "tests/test_go_reader.py": 190, "bench/test_cluster.py": 175,
    "tests/test_docs.py": 170, "bench/test_jvm_paths.py": 160, "bench/test_consume.py": 150,
    "tests/spark/test_java25.py": 150, "tests/consumer/test_pipeline_rebalance.py": 135,
    "tests/consumer/supervisor/test_snapshots.py": 130, "tests/faults/test_faults.py": 160,
    "tests/consumer/supervisor/test_broker_outage.py": 110, "tests/conformance/test_across_namespaces.py": 120,
    "tests/consumer/test_kit.py": 75, "tests/conformance/test_arguments.py": 90, "bench/test_restart_hits.py": 55,
}


def group_of(nodeid: str) -> str:
    """The group of the test with this node id: its file, or the Spark session's group."""
    path = nodeid.split("::", 1)[0]
    return SPARK_GROUP if path in SPARK_SESSION_FILES else path


def pytest_xdist_make_scheduler(config, log):
    """`--dist loadfile`, by group_of's groups rather than by file alone, in the order collected."""
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class GroupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return group_of(nodeid)

    config.option.loadscopereorder = False  # the collected order: the longest first
    return GroupScheduling(config, log)


def pytest_terminal_summary(terminalreporter, config):
    """scripts/test's run tells its own duration, setup included, and whether it kept to its
    budget (SHMCACHE_TEST_STARTED and SHMCACHE_TEST_BUDGET, set by scripts/test)."""
    started = os.environ.get("SHMCACHE_TEST_STARTED")
    if not started or hasattr(config, "workerinput"):
        return
    took = time.time() - float(started)
    line = f"scripts/test: setup and tests took {int(took // 60)} min {int(took % 60)} s"
    budget = float(os.environ.get("SHMCACHE_TEST_BUDGET") or 0)
    if budget:
        line += (f", within its budget of {budget / 60:g} min" if took <= budget
                 else f", OVER its budget of {budget / 60:g} min: find what grew (--durations=30)")
    terminalreporter.write_line(line)

