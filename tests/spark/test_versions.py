"""The jars on the classpath belong to the Spark that loads them: the Kafka connector
fetched by scripts/spark-jars is exactly the installed PySpark's version, and a
session refuses a connector of another Spark (the trap: PySpark 4.3.0 with the 4.2.0
connector, which setup used to fall back to)."""

import subprocess
import sys
from pathlib import Path

import pytest

from shmcache.spark import _session

REPO = Path(__file__).resolve().parents[2]


def test_fetched_connector_is_the_installed_pyspark():
    pyspark = pytest.importorskip("pyspark")
    names = [Path(j).name for j in _session.kafka_jars()]
    assert f"spark-sql-kafka-0-10_2.13-{pyspark.__version__}.jar" in names, names
    assert f"spark-token-provider-kafka-0-10_2.13-{pyspark.__version__}.jar" in names, names
    p = subprocess.run([sys.executable, str(REPO / "scripts" / "spark-jars"), "check"], capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 0 and p.stdout.strip() == pyspark.__version__, p.stderr


def test_a_connector_of_another_spark_is_refused(tmp_path, monkeypatch):
    pyspark = pytest.importorskip("pyspark")
    other = "4.3.0" if pyspark.__version__ != "4.3.0" else "4.2.0"
    for jar in (f"spark-sql-kafka-0-10_2.13-{other}.jar", "kafka-clients-3.9.2.jar"):
        (tmp_path / jar).write_bytes(b"")
    monkeypatch.setenv("SHMCACHE_SPARK_JARS", str(tmp_path))
    with pytest.raises(_session.SparkSetupError,
                       match=rf"do not match pyspark {pyspark.__version__}: expected "
                             rf"spark-sql-kafka-0-10_2.13-{pyspark.__version__}.jar"):
        _session.kafka_jars()
