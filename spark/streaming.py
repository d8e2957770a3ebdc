"""Structured Streaming: `lookup` on a stream, and a streaming publish.

    from shmcache.spark import streaming
    q = streaming.publish_stream(spark, "incoming/", bootstrap, "txmeta", checkpoint="ckpt/publish")
    q.awaitTermination()   # or q.stop(); start again with the same checkpoint to carry on

    hashes = spark.readStream.format("kafka").option("subscribe", "tx-hashes")...load()
    enriched = lookup(hashes.select(F.col("value").alias("tx_hash")), cache="txmeta", decode="txmeta")
    enriched.writeStream.format("parquet").option("checkpointLocation", ...).start(path)

`lookup` needs nothing special: Spark runs its plan on each micro-batch of a streaming
DataFrame as on a batch one (each executor reads its own machine's cache). Its default
engine is the JVM one whenever the session loads the shmcache jar (session() puts it on
spark.jars, which Spark ships to the executors): the keys are looked up 256 at a time by
the jar's lookup node, which each micro-batch's plan holds (and with decode="txmeta"
decoded by the jar's shmcache_txmeta), with no Python worker. Without the jar it is the Python engine's
`mapInArrow`. The same rows either way (tests/spark/test_jvm_lookup.py).

`publish_stream` reads txmeta rows (the Parquet schema of txmeta.table_schema) from a
directory that files arrive in, or from any streaming DataFrame with those columns
(`stream=`), and sends each micro-batch through the batch publish's own plan
(publish.send: grouping by Kafka partition, ADDs before DELETEs, <= 1024 entries per
message, the idempotent producer with acks=all) from `foreachBatch`. Guaranteed: each
micro-batch is published at least once: Spark records a batch as done in the
checkpoint only after foreachBatch returned, i.e. after every message was
acknowledged, so a query stopped or killed mid-batch re-publishes that batch when it
starts again from the checkpoint, and no batch is skipped (re-applying is harmless:
DESIGN invariant 6). Not guaranteed: exactly once, nor order across micro-batches
of one hash's ADD and a DELETE in a later file (they land in its partition in
micro-batch order).
"""

from __future__ import annotations

from shmcache.spark import publish as _publish

WHO = "shmcache.spark.streaming"


def txmeta_stream(spark, path: str, *, files_per_trigger: int = 1):
    """Parquet files of txmeta rows arriving under `path`, as a streaming DataFrame."""
    from pyspark.sql.pandas.types import from_arrow_schema

    from shmcache.formats import txmeta

    schema = from_arrow_schema(txmeta.table_schema())
    return spark.readStream.schema(schema).option("maxFilesPerTrigger", files_per_trigger).parquet(str(path))


def publish_stream(spark, path_or_none, bootstrap: str, topic: str, *, checkpoint: str, stream=None,
                   format: str = "v1", key_col: str = "tx_hash", partitions: int | None = None,
                   trigger: dict | None = None, kafka_options: dict[str, str] | None = None, reports=None):
    """Start a streaming query that publishes every micro-batch of txmeta rows (files under
    `path_or_none`, or `stream`) to `topic`; returns the StreamingQuery. `trigger` is
    passed to writeStream.trigger (e.g. {"availableNow": True}); `reports`, a list,
    collects each batch's (batch id, PublishReport)."""
    _publish._format(format)  # a format Spark writes (formats/registry.py), or a ValueError naming it
    if stream is None:
        if path_or_none is None:
            raise ValueError(f"{WHO}: give a directory of Parquet files or stream=")
        stream = txmeta_stream(spark, path_or_none)
    if partitions is None:
        partitions = _publish.topic_partitions(bootstrap, topic)

    def each(batch_df, batch_id):
        rep = _publish.send(spark, batch_df, None, bootstrap, topic, format=format, key_col=key_col,
                            partitions=partitions, kafka_options=kafka_options)
        if reports is not None:
            reports.append((batch_id, rep))

    w = stream.writeStream.foreachBatch(each).option("checkpointLocation", str(checkpoint))
    if trigger:
        w = w.trigger(**trigger)
    return w.start()


__all__ = ["publish_stream", "txmeta_stream"]
