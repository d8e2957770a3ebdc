"""The Spark side of shmcache (PySpark, optional: pip install 'shmcache[spark]').

- `lookup(df, key_col="tx_hash", cache="txmeta", decode=None)`: look a DataFrame's
  keys up in this machine's cache from the executors (`_lookup.py`).
- `publish.publish(spark, path, bootstrap, topic, format="v1")`: Parquet of txmeta
  rows -> the txmeta topic in the wire format, through Spark's Kafka sink.
- `audit.audit(spark, path, cache)`: a Parquet source of truth against the cache.
- `datagen.write(path, rows)`: example Parquet of txmeta rows, any size.
- `streaming.publish_stream(spark, dir, bootstrap, topic, checkpoint=...)`: txmeta rows
  arriving as files (or any stream) published continuously, each micro-batch at least
  once through publish's plan; `lookup` works on streaming DataFrames as they are.
- `cluster`: N machines on one host (scripts/cluster), each with its own /dev/shm.
- `session(...)`: a local SparkSession with the Kafka connector's jars (`_session.py`).

Each job is also a command: `shmcache spark datagen|publish|lookup|audit`. Nothing
here imports pyspark until it is used.
"""

from shmcache.spark._lookup import lookup
from shmcache.spark._session import session

__all__ = ["lookup", "session"]
