"""Publish txmeta rows from Parquet to the txmeta topic through Spark's Kafka sink.

    from shmcache.spark import publish, session
    spark = session("publish", kafka=True)
    report = publish.publish(spark, "txmeta.parquet", "broker:9092", "txmeta", format="v1")

    shmcache spark publish txmeta.parquet --bootstrap broker:9092 --topic txmeta

The plan (each step a Spark stage; no per-entry Python anywhere):
1. rows -> entries (`_messages.entry_batches`, mapInArrow): the MetaBytes of each
   ADD, empty content for each DELETE (see _source.py for where deletes come
   from), and `kpart`, the Kafka partition of the entry's own hash: murmur2 (v1,
   Kafka's partitioner for keyed records) or the bucket range (v2).
2. repartition by kpart, sort within partitions by (kpart, action): all entries of
   one Kafka partition meet in one Spark task, ADDs before DELETEs.
3. entries -> messages (`_messages.message_batches`, mapInArrow): runs of one kpart
   cut into messages of <= 1024 entries (and <= max_bytes), encoded with
   `wire.encode_v1` / `encode_v2`.
4. Spark's Kafka sink (spark-sql-kafka): v1 records keyed by their first tx hash, so
   Kafka's murmur2 partitioner places each message in the partition of every entry
   in it; v2 records with their partition set and no key.

Checked with the broker (confluent-kafka on the driver): before step 4, every partition
of the topic has a leader that answers for it (a new topic's partitions are refused to
producers for a moment after their leaders are named: kafka/topics.py); after it,
each partition grew by at least the messages the tasks wrote there, else
KafkaRequestError naming it (a message acknowledged but never written, as librdkafka
does; more is fine: a retried task's first attempt, or another writer). Under the
caller's acks=0 or 1 a finished task says nothing of what the broker appended, so a
short partition is looked at again until it is full or stops moving (SETTLE_QUIET).

Guaranteed (DESIGN invariant 2): every entry lands in the partition of its own hash,
and within a partition each hash's ADD precedes its DELETE from the same run, since
one task produces all of a partition's messages in order through an idempotent
producer (acks=all). Deletes of hashes added by an earlier run land after them.
Not guaranteed: exactly-once. A failed task is retried and re-sends its messages
(re-applying an ADD/DELETE sequence leaves the same table: invariant 6); speculative
execution (`spark.speculation`, off by default) must stay off, since two attempts of
one task would interleave a partition's messages.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass
from functools import partial

from shmcache.kafka import client as kafka_client
from shmcache.kafka import topics
from shmcache.formats import registry as wire_formats
from shmcache.formats import wire
from shmcache.errors import BrokerUnavailableError, KafkaRequestError
from shmcache.spark import _messages

WHO = "shmcache.spark.publish"
ENTRY_SCHEMA = "tx_hash binary, action byte, kpart int, content binary"
RECORD_SCHEMA = "key binary, value binary, partition int"
# Producer settings of the sink (Spark's `kafka.`-prefixed options); the caller's win.
PRODUCER = {
    "acks": "all",
    "enable.idempotence": "true",  # retries keep the order within a partition
    "compression.type": "lz4",
    "linger.ms": "5",
}
SETTLE_QUIET = 5.0  # seconds a short topic's end offsets stay still before acks=0/1 messages count as lost


@dataclass
class PublishReport:
    topic: str
    format: str
    partitions: int
    adds: int  # ADD entries sent
    deletes: int  # DELETE entries sent
    messages: int
    bytes: int  # message values, before compression
    seconds: float

    def to_dict(self) -> dict:
        return asdict(self)


def publish(spark, path, bootstrap: str, topic: str, *, format: str = "v1", key_col: str = "tx_hash",
            delete_col: str | None = None, deletes=None, partitions: int | None = None,
            max_entries: int = _messages.MAX_ENTRIES, max_bytes: int = _messages.MAX_BYTES,
            kafka_options: dict[str, str] | None = None) -> PublishReport:
    """Send the txmeta rows of Parquet `path` (and its deletes) to `topic`; returns
    once every message is acknowledged. `partitions` is the topic's partition count,
    asked of the broker when not given (needs confluent-kafka on the driver)."""
    from shmcache.spark import _source

    wf = _format(format)
    if not 1 <= max_entries <= _messages.MAX_ENTRIES * 64:
        raise ValueError(f"{WHO}: max_entries={max_entries} must be 1..{_messages.MAX_ENTRIES * 64}")
    if max_bytes < wire.V2_HEADER + wire.V2_ENTRY_HEADER + wire.MAX_VALUE:
        raise ValueError(f"{WHO}: max_bytes={max_bytes} cannot hold one entry of the largest value")
    t0 = time.monotonic()
    if partitions is None:
        partitions = topic_partitions(bootstrap, topic)
    try:
        wf.check_topic(partitions)
    except ValueError as e:
        raise ValueError(f"{WHO}: topic {topic!r}: {e}") from None
    src = _source.read(spark, path, key_col=key_col, delete_col=delete_col, deletes=deletes, who=WHO)
    return send(spark, src.adds, src.deletes, bootstrap, topic, format=format, key_col=key_col,
                partitions=partitions, max_entries=max_entries, max_bytes=max_bytes, kafka_options=kafka_options,
                t0=t0)


def send(spark, adds, deletes, bootstrap: str, topic: str, *, format: str, key_col: str, partitions: int,
         max_entries: int = _messages.MAX_ENTRIES, max_bytes: int = _messages.MAX_BYTES,
         kafka_options: dict[str, str] | None = None, t0: float | None = None) -> PublishReport:
    """Steps 1-4 of the plan over DataFrames: `adds` (key_col and the txmeta columns) and
    `deletes` (key_col; or None). publish() and the streaming publish (streaming.py, each
    micro-batch) both go through here; returns once every message is acknowledged."""
    from pyspark.sql import functions as F

    t0 = time.monotonic() if t0 is None else t0
    sc = spark.sparkContext
    counts = {name: sc.accumulator(0) for name in ("adds", "deletes", "messages", "bytes")}
    written = sc.accumulator([0] * partitions, _PerPartition())  # messages the tasks wrote, per partition
    starts = _answering(bootstrap, topic, partitions)
    step1 = partial(_messages.entry_batches, partitions=partitions, fmt=format, key_col=key_col)
    entries = adds.mapInArrow(partial(_counted, step1, counts["adds"], action=wire.ADD), ENTRY_SCHEMA)
    if deletes is not None:
        entries = entries.unionByName(
            deletes.mapInArrow(partial(_counted, step1, counts["deletes"], action=wire.DELETE), ENTRY_SCHEMA))
    tasks = max(1, min(partitions, int(spark.conf.get("spark.sql.shuffle.partitions"))))
    ordered = entries.repartition(tasks, "kpart").sortWithinPartitions("kpart", "action")
    step3 = partial(_messages.message_batches, fmt=format, max_entries=max_entries, max_bytes=max_bytes)
    records = ordered.mapInArrow(partial(_records_counted, step3, counts["messages"], counts["bytes"], written,
                                         partitions),
                                 RECORD_SCHEMA)
    # v1: a message goes where its key (its first hash) does; v2: to its bucket's partition, given
    records = (records.drop("partition") if wire_formats.get_spark(format).by_message
               else records.select(F.col("value"), F.col("partition")))

    w = records.write.format("kafka").option("kafka.bootstrap.servers", bootstrap).option("topic", topic)
    options = {**PRODUCER, **(kafka_options or {})}
    for k, v in options.items():
        w = w.option(f"kafka.{k}", v)
    try:
        w.save()
    except Exception as e:  # py4j's AnalysisException: the message is all there is to go by
        if "KAFKA_DATA_SOURCE_NOT_ENABLED" in str(e) or "Failed to find data source: kafka" in str(e):
            from shmcache.spark._session import SparkSetupError

            raise SparkSetupError(
                f"{WHO}: this SparkSession cannot load Spark's Kafka sink; build it with "
                "shmcache.spark.session(kafka=True) (which puts the connector's jars on spark.jars) "
                "before any other session starts, or set spark.jars yourself") from e
        raise
    _check_grown(bootstrap, topic, starts, written.value, settle=str(options["acks"]).lower() not in ("all", "-1"))
    return PublishReport(topic=topic, format=format, partitions=partitions, adds=counts["adds"].value,
                         deletes=counts["deletes"].value, messages=counts["messages"].value,
                         bytes=counts["bytes"].value, seconds=time.monotonic() - t0)


def _format(name: str):
    """The registry's format (formats/registry.py) if Spark writes it; a ValueError naming it, if not."""
    try:
        return wire_formats.get_spark(name)
    except ValueError as e:
        raise ValueError(f"{WHO}: {e}") from None


def topic_partitions(bootstrap: str, topic: str, timeout: float = 30.0) -> int:
    """The partition count of `topic`, from the broker's metadata."""
    try:
        from confluent_kafka import KafkaException
    except ImportError:
        raise ImportError(f"{WHO}: asking the broker for {topic!r}'s partitions needs confluent-kafka "
                          "(pip install 'shmcache[kafka]'), or pass partitions=") from None
    admin = kafka_client.quiet_admin(bootstrap)  # an absent broker is said once, by the error below
    try:
        meta = admin.list_topics(topic, timeout=timeout)
    except KafkaException as e:
        raise BrokerUnavailableError(f"{WHO}: no Kafka broker answered at {bootstrap} within {timeout:g} s "
                                     f"({kafka_client.error_text(e)})") from None
    t = meta.topics.get(topic)
    if t is None or t.error is not None or not t.partitions:
        raise ValueError(f"{WHO}: topic {topic!r} not found on {bootstrap}"
                         + (f" ({t.error})" if t is not None and t.error is not None else "")
                         + "; create it first (its partition count fixes where each hash goes)")
    return len(t.partitions)


def _answering(bootstrap: str, topic: str, partitions: int, timeout: float = 30.0) -> list[int]:
    """Each partition's end offset, once every partition's leader answers for it."""
    return _ends(kafka_client.quiet_admin(bootstrap), topic, partitions, timeout, then="nothing was sent")


def _ends(admin, topic: str, partitions: int, timeout: float = 30.0, *, then: str) -> list[int]:
    try:
        ends = topics.wait_answering(admin, topic, range(partitions), timeout)
    except TimeoutError as e:
        raise BrokerUnavailableError(f"{WHO}: {e}; {then}") from None
    return [ends[p] for p in range(partitions)]


def _check_grown(bootstrap: str, topic: str, starts: list[int], written: list[int], *, settle: bool = False,
                 quiet: float = SETTLE_QUIET) -> None:
    """Each partition grew by at least what the tasks wrote there (see the module's docstring).
    With `settle` (the caller's acks=0 or 1: a task's end does not mean the broker has
    appended, nor made visible, what it sent) a short partition is looked at again until it
    is full, or its end offsets stop moving for `quiet` seconds."""
    admin = kafka_client.quiet_admin(bootstrap)
    then = "what the sink wrote is not checked"
    ends = _ends(admin, topic, len(starts), then=then)
    moved = time.monotonic()
    short = _short(starts, ends, written)
    while settle and short and time.monotonic() - moved < quiet:
        time.sleep(0.1)
        now = _ends(admin, topic, len(starts), then=then)
        if now != ends:
            ends, moved = now, time.monotonic()
            short = _short(starts, ends, written)
    if short:
        raise KafkaRequestError(f"{WHO}: topic {topic!r} does not hold every message Spark's Kafka sink wrote: "
                                f"{'; '.join(short[:5])}")


def _short(starts: list[int], ends: list[int], written: list[int]) -> list[str]:
    return [f"[{p}] {w} written, grew by {e - s} ({s} -> {e})"
            for p, (s, e, w) in enumerate(zip(starts, ends, written)) if e - s < w]


# -- in the executors ------------------------------------------------------------------------------
# Counters ride on Spark accumulators: summed on the driver when the job ends (a retried
# task counts twice; the figures are a report, not a check).


class _PerPartition:
    """An accumulator of per-partition counts (a list of ints, added element by element)."""

    def zero(self, value):
        return [0] * len(value)

    def addInPlace(self, a, b):  # noqa: N802 - pyspark's AccumulatorParam names it so
        return [x + y for x, y in zip(a, b)]


def _counted(step, acc, batches, *, action):
    for out in step(batches, action=action):
        acc.add(out.num_rows)
        yield out


def _records_counted(step, messages, nbytes, written, partitions, batches):
    import numpy as np
    import pyarrow.compute as pc

    for out in step(batches):
        messages.add(out.num_rows)
        written.add(np.bincount(out.column("partition").to_numpy(), minlength=partitions).tolist())
        nbytes.add(int(pc.sum(pc.binary_length(out.column("value"))).as_py() or 0))
        yield out
