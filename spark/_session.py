"""SparkSessions for the jobs, tests and benchmarks, with the Kafka connector's jars.

`session()` builds (or returns the running) SparkSession. Locally (`local[N]`, the
default) it is kept small: no UI, no console progress bars, few shuffle partitions,
and executors' Python workers run this interpreter (PYSPARK_PYTHON defaults to
sys.executable, so they import this shmcache). With kafka=True the connector's jars
go on `spark.jars` from local files fetched by scripts/setup (scripts/spark-jars):
nothing is resolved from the network at run time. `spark.jars` are shipped to a
cluster's executors by Spark itself.

The shmcache JVM jar (jvm/, built by scripts/setup: `cd jvm && mvn -q package`) goes on
`spark.jars` too whenever it is there, with its Spark SQL functions (shmcache_get,
shmcache_contains) as a session extension (`spark.sql.extensions`); `lookup(...,
engine="jvm")` needs it (`jvm_jar()`: $SHMCACHE_JVM_JAR, else jvm/target/). A jar built
for another Spark than the installed PySpark is refused, saying how to rebuild it.

Where the Kafka jars come from, first match wins:
1. SHMCACHE_SPARK_JARS: a directory of jars or a comma-separated list of jar files;
2. .cache/spark/pyspark-<version>/kafka-jars/ in the repo (scripts/spark-jars).
A missing directory raises an error that says how to fetch it.

Not guaranteed: settings that only apply when the JVM starts (spark.jars, driver
memory) cannot change on a session that is already running; `session()` then
returns it as it is (publish says so if the Kafka sink is then missing).
"""

from __future__ import annotations

import glob
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_MASTER = "local[2]"
CONNECTOR = "spark-sql-kafka-0-10_2.13"
LOCAL_CONF = {
    "spark.ui.enabled": "false",
    "spark.ui.showConsoleProgress": "false",
    "spark.sql.shuffle.partitions": "4",  # local[2]: a handful of tasks, not 200
    "spark.sql.adaptive.enabled": "true",
    # local: the driver and its executors talk over loopback only
    "spark.driver.host": "127.0.0.1",
    "spark.driver.bindAddress": "127.0.0.1",
}


JVM_EXTENSION = "io.shmcache.spark.Functions"
JVM_BUILD = "build it with scripts/setup (or: cd jvm && mvn -q package; Java 17+ and Maven)"


class SparkSetupError(RuntimeError):
    """PySpark, the Kafka connector jars or the shmcache JVM jar are not installed where expected."""


def jvm_jar(required: bool = True) -> str | None:
    """The shmcache JVM jar ($SHMCACHE_JVM_JAR, else jvm/target/shmcache-jvm-*.jar), checked to be
    built for the installed PySpark's Spark; None when there is none and not `required`."""
    given = os.environ.get("SHMCACHE_JVM_JAR")
    if given:
        if not os.path.isfile(given):
            raise SparkSetupError(f"SHMCACHE_JVM_JAR={given!r} is not a file; {JVM_BUILD}")
        jar = given
    else:
        found = sorted(glob.glob(str(REPO / "jvm" / "target" / "shmcache-jvm-*.jar")))
        if not found:
            if required:
                raise SparkSetupError(f"the shmcache JVM jar is not in {REPO / 'jvm' / 'target'} (engine='jvm' "
                                      f"needs it); {JVM_BUILD}, or use engine='python'")
            return None
        jar = found[-1]
    check_jvm_jar(jar)
    return jar


def check_jvm_jar(jar: str) -> None:
    """The jar's manifest must name the installed PySpark's Spark version (jvm/pom.xml writes it)."""
    import zipfile

    version = _pyspark_version()
    try:
        with zipfile.ZipFile(jar) as z:
            manifest = z.read("META-INF/MANIFEST.MF").decode("utf-8", "replace")
    except (OSError, KeyError, zipfile.BadZipFile) as e:
        raise SparkSetupError(f"{jar} is not a shmcache JVM jar ({e}); {JVM_BUILD}") from None
    built = next((line.split(":", 1)[1].strip() for line in manifest.splitlines()
                  if line.startswith("Shmcache-Spark-Version:")), None)
    if built != version:
        raise SparkSetupError(
            f"{jar} was built for Spark {built}, but pyspark is {version}: rebuild it with "
            f"`cd jvm && mvn -q package -Dspark.version={version}` (or install the pyspark that "
            "pyproject.toml pins)")


def kafka_jars() -> list[str]:
    """Local paths of the Kafka connector jars (see the module docstring)."""
    given = os.environ.get("SHMCACHE_SPARK_JARS")
    if given:
        if os.path.isdir(given):
            jars = sorted(glob.glob(os.path.join(given, "*.jar")))
        else:
            jars = [j for j in given.split(",") if j]
        missing = [j for j in jars if not os.path.isfile(j)]
        if not jars or missing:
            raise SparkSetupError(f"SHMCACHE_SPARK_JARS={given!r}: no jars there, or missing files {missing}")
        check_connector(jars)
        return jars
    d = jars_dir()
    jars = sorted(glob.glob(str(d / "*.jar")))
    if not jars:
        raise SparkSetupError(
            f"the Spark Kafka connector jars for pyspark {_pyspark_version()} are not in {d}; "
            "fetch them with scripts/setup (or scripts/spark-jars fetch; Java 17+ and Maven needed), "
            "or point SHMCACHE_SPARK_JARS at a directory of spark-sql-kafka-0-10_2.13 and its dependencies")
    check_connector(jars)
    return jars


def check_connector(jars: list[str]) -> None:
    """The connector jar among `jars` must be the installed pyspark's own version: a
    connector built for another Spark loads and then fails in ways hard to trace."""
    version = _pyspark_version()
    found = [os.path.basename(j) for j in jars if os.path.basename(j).startswith(CONNECTOR + "-")]
    if found and found != [f"{CONNECTOR}-{version}.jar"]:
        raise SparkSetupError(
            f"the Spark Kafka connector jars {found} do not match pyspark {version}: expected "
            f"{CONNECTOR}-{version}.jar; fetch the matching one with scripts/spark-jars fetch "
            "(or install the pyspark that pyproject.toml pins)")


def jars_dir() -> Path:
    """Where scripts/spark-jars puts the jars for the installed pyspark."""
    return REPO / ".cache" / "spark" / f"pyspark-{_pyspark_version()}" / "kafka-jars"


def _pyspark_version() -> str:
    try:
        import pyspark
    except ImportError:
        raise SparkSetupError("shmcache.spark needs PySpark: pip install 'shmcache[spark]' "
                              "(PySpark 4.x needs Java 17+ and pandas < 3)") from None
    return pyspark.__version__


def session(app: str = "shmcache", *, master: str | None = None, kafka: bool = False,
            conf: dict[str, str] | None = None, log_level: str = "ERROR"):
    """The running SparkSession, or a new one: `master` (default $SHMCACHE_SPARK_MASTER,
    else local[2]), the connector's jars when kafka=True, the shmcache JVM jar when built,
    then `conf` on top."""
    _pyspark_version()
    from pyspark.sql import SparkSession

    running = SparkSession.getActiveSession()
    if running is not None:
        return running
    master = master or os.environ.get("SHMCACHE_SPARK_MASTER") or DEFAULT_MASTER
    settings: dict[str, str] = {}
    if master.startswith("local"):
        settings.update(LOCAL_CONF)
        # Spark starts Python workers with $PYSPARK_PYTHON, else `python3` on PATH, which
        # may not have shmcache: locally, use this interpreter.
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")  # read by the JVM as it starts
    jars = kafka_jars() if kafka else []
    jar = jvm_jar(required=False)
    if jar is not None:
        jars.append(jar)
        settings["spark.sql.extensions"] = JVM_EXTENSION
    if jars:
        settings["spark.jars"] = ",".join(jars)
    settings.update(conf or {})
    b = SparkSession.builder.master(master).appName(app)
    for k, v in settings.items():
        b = b.config(k, v)
    spark = b.getOrCreate()
    spark.sparkContext.setLogLevel(log_level)
    return spark

