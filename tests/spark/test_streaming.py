"""Structured Streaming against the real broker (spark/streaming.py):

- the streaming publish: txmeta Parquet files arrive in a directory; the query
  publishes them one file per micro-batch (3 batches), ends, more files arrive, and it
  starts again from its checkpoint (2 more batches, none repeated, none skipped); the
  topic then holds every row exactly where the batch publish puts it, and a real
  `shmcache run` fills a cache equal to the source;
- `lookup` on a stream: tx hashes read by Spark's Kafka source (several micro-batches
  of at most 400), enriched from that cache (by the JVM engine where the jar is built),
  written to a Parquet sink with a checkpoint; stopped, more hashes produced, restarted
  from the checkpoint: the output holds every hash once, found exactly when it is in the
  source, with its fields."""

import os
import shutil

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from shmcache.formats import partitioners, txmeta, wire
from shmcache.spark import _session, datagen, lookup, streaming

from shmtest.topic_model import KafkaProbe, check_table
from shmtest.waits import wait_applied

PARTITIONS = 4
FILES, ROWS = 5, 600


def _topic_entries(bootstrap, topic, ends):
    """{hash: MetaBytes} of every entry on the topic (and the count), checking each is in its own partition."""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"check-{topic}", "enable.auto.commit": False})
    out, n, seen = {}, 0, 0
    try:
        c.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
        while seen < sum(ends):
            for m in c.consume(100, timeout=5):
                assert m.error() is None, m.error()
                seen += 1
                b = wire.decode(m.value())
                assert b.error is None and 1 <= len(b) <= 1024
                for i in range(len(b)):
                    k = b.keys[i].tobytes()
                    assert partitioners.murmur2_partition(k, PARTITIONS) == m.partition()
                    out[k] = bytes(b.value(i))
                    n += 1
    finally:
        c.close()
    return out, n


def test_streaming_publish_and_lookup_restart_from_checkpoint(spark, harness, kafka_topic, tmp_path):
    from confluent_kafka import Producer

    topic = kafka_topic(PARTITIONS)
    inbox, staged, ck = tmp_path / "inbox", tmp_path / "staged", tmp_path / "ck-publish"
    inbox.mkdir()
    files = []
    for i in range(FILES):
        datagen.write(staged / str(i), ROWS, seed=100 + i, rows_per_file=ROWS)
        (f,) = sorted((staged / str(i)).glob("*.parquet"))
        files.append(f)

    def arrive(fs):
        for f in fs:
            shutil.copy(f, inbox / f".{f.parent.name}.tmp")
            os.rename(inbox / f".{f.parent.name}.tmp", inbox / f"part-{f.parent.name}.parquet")  # atomic

    reports = []
    arrive(files[:3])
    streaming.publish_stream(spark, str(inbox), harness.bootstrap, topic, checkpoint=str(ck),
                             trigger={"availableNow": True}, reports=reports).awaitTermination(600)
    assert [b for b, _ in reports] == [0, 1, 2] and sum(r.adds for _, r in reports) == 3 * ROWS
    arrive(files[3:])
    streaming.publish_stream(spark, str(inbox), harness.bootstrap, topic, checkpoint=str(ck),
                             trigger={"availableNow": True}, reports=reports).awaitTermination(600)
    assert [b for b, _ in reports] == [0, 1, 2, 3, 4] and sum(r.adds for _, r in reports) == FILES * ROWS

    src = pq.read_table(files).sort_by("tx_hash")
    offsets, data = txmeta.encode(txmeta.from_arrow(src))
    expected = {k: data[offsets[i]:offsets[i + 1]].tobytes() for i, k in enumerate(src.column("tx_hash").to_pylist())}
    probe = KafkaProbe(harness.bootstrap, topic, PARTITIONS)
    try:
        ends = probe.end_offsets()
    finally:
        probe.close()
    on_topic, n = _topic_entries(harness.bootstrap, topic, ends)
    assert n == FILES * ROWS and on_topic == expected  # every row once, nothing else

    name = harness.cache_name("stream")
    sup = harness.supervisor(name, topic, harness.group("stream"), memory="64MiB")
    r = harness.attach(name, sup=sup)
    wait_applied(r, ends, 120, sup)
    check_table(r, expected)

    # lookup on a stream of tx hashes from Spark's Kafka source
    hashes_topic = kafka_topic(1)
    rng = np.random.default_rng(3)
    known = list(expected)
    first = known[:900] + [rng.bytes(32) for _ in range(300)]
    second = known[900:1500] + [rng.bytes(32) for _ in range(200)]
    p = Producer({"bootstrap.servers": harness.bootstrap})

    def send(keys):
        for k in keys:
            p.produce(hashes_topic, value=k)
        assert p.flush(60) == 0

    out, ck2 = tmp_path / "enriched", tmp_path / "ck-lookup"

    def run_lookup():
        from pyspark.sql import functions as F

        stream = (spark.readStream.format("kafka").option("kafka.bootstrap.servers", harness.bootstrap)
                  .option("subscribe", hashes_topic).option("startingOffsets", "earliest")
                  .option("maxOffsetsPerTrigger", 400).load()
                  .select(F.col("value").alias("tx_hash"), F.col("offset")))
        enriched = lookup(stream, cache=name, decode="txmeta")
        # the JVM engine where the jar is built: the micro-batches' plan holds the batched lookup, no mapInArrow
        plan = enriched._jdf.queryExecution().analyzed().toString()
        jvm = _session.jvm_jar(required=False) is not None
        assert ("ShmcacheLookup shmcache lookup of 'tx_hash'" in plan) == jvm and ("MapInArrow" in plan) != jvm, plan
        q = (enriched.writeStream.format("parquet")
             .option("checkpointLocation", str(ck2)).trigger(availableNow=True).start(str(out)))
        q.awaitTermination(600)
        return q

    send(first)
    q1 = run_lookup()
    batches1 = len(q1.recentProgress)
    assert batches1 >= 3  # 1200 hashes, at most 400 per micro-batch
    send(second)
    run_lookup()
    got = pq.read_table(out)
    hs = got.column("tx_hash").to_pylist()
    assert sorted(hs) == sorted(first + second)  # every hash once: no gap, no repeat across the restart
    assert sorted(got.column("offset").to_pylist()) == list(range(len(first) + len(second)))
    found = dict(zip(hs, got.column("found").to_pylist()))
    assert all(found[k] == (k in expected) for k in hs)
    hit = got.filter(pc.field("found"))
    for col, _ in txmeta.arrow_fields():
        by_hash = dict(zip(hit.column("tx_hash").to_pylist(), hit.column(col).to_pylist()))
        want = dict(zip(src.column("tx_hash").to_pylist(), src.column(col).to_pylist()))
        assert all(by_hash[k] == want[k] for k in by_hash), col
