"""End to end on local[2], against the real broker and a real `shmcache run`:
generate Parquet -> publish through Spark's Kafka sink -> the supervisor fills the
cache -> lookup through Spark equals the source -> audit reports 0 mismatches; the
cache stays intact after the Spark sessions that read it stop.

v1 runs the commands as a user does (`python -m shmcache spark ...` child
processes, each with its own Spark session); v2 calls the functions on the shared
session. Both publish deletes together with the adds they delete (a column in v1,
a second input in v2), so the table is right only if every hash's DELETE lands in
its ADD's partition after it (DESIGN invariant 2)."""

import json
import subprocess
import sys

import pyarrow.parquet as pq
import pytest

import shmcache
from shmcache import cli
from shmcache.formats import partitioners, txmeta, wire
from shmcache.spark import audit, datagen, lookup, publish

from shmtest.topic_model import KafkaProbe, check_table
from shmtest.waits import wait_applied

PARTITIONS = 4


def _shmcache(*args, timeout=300):
    """Run `python -m shmcache ARGS` and return the JSON it printed (the last line)."""
    p = subprocess.run([sys.executable, "-m", "shmcache", *args], capture_output=True, text=True, timeout=timeout)
    return p.returncode, (json.loads(p.stdout.strip().splitlines()[-1]) if p.stdout.strip() else None), p.stderr


def _expected(src, dels=None) -> dict[bytes, bytes | None]:
    """The table the source must leave: every added hash -> its MetaBytes, deleted hashes -> None."""
    t = pq.read_table(src)
    if "deleted" in t.column_names:
        flag = t.column("deleted").to_numpy(zero_copy_only=False)
        gone = set(t.filter(flag).column("tx_hash").to_pylist())
        t = t.filter(~flag)
    else:
        gone = set()
    if dels is not None:
        gone |= set(pq.read_table(dels).column("tx_hash").to_pylist())
    offsets, data = txmeta.encode(txmeta.from_arrow(t))
    out = {k: data[offsets[i]:offsets[i + 1]].tobytes() for i, k in enumerate(t.column("tx_hash").to_pylist())}
    out.update(dict.fromkeys(gone))
    return out


def _check_topic(bootstrap, topic, fmt) -> int:
    """Every message on the topic: <= 1024 entries, each in the partition of its own hash,
    v1 keyed by its first hash; returns the number of entries."""
    from confluent_kafka import Consumer, TopicPartition

    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"check-{topic}", "enable.auto.commit": False})
    try:
        ends = [c.get_watermark_offsets(TopicPartition(topic, p), timeout=10)[1] for p in range(PARTITIONS)]
        c.assign([TopicPartition(topic, p, 0) for p in range(PARTITIONS)])
        seen, entries = 0, 0
        while seen < sum(ends):
            for m in c.consume(100, timeout=5):
                assert m.error() is None, m.error()
                seen += 1
                b = wire.decode(m.value())
                assert b.error is None and b.version == int(fmt[1]) and 1 <= len(b) <= 1024
                if fmt == "v1":
                    assert m.key() == b.keys[0].tobytes()
                    assert {partitioners.murmur2_partition(k.tobytes(), PARTITIONS) for k in b.keys} == {m.partition()}
                else:
                    assert m.key() is None
                    assert set(partitioners.v2_partition(b.hashes, PARTITIONS).tolist()) == {m.partition()}
                entries += len(b)
        return entries
    finally:
        c.close()


def _fill(harness, topic, fmt):
    """A supervisor on the topic; returns a reader once everything on the topic is applied."""
    name = harness.cache_name("spark")
    sup = harness.supervisor(name, topic, harness.group("spark"), fmt=fmt, memory="64MiB")
    r = harness.attach(name, sup=sup)
    probe = KafkaProbe(harness.bootstrap, topic, PARTITIONS)
    try:
        ends = probe.end_offsets()
    finally:
        probe.close()
    wait_applied(r, ends, 120, sup)
    return name, r


def _lookup_equals_source(spark, src, name, expected):
    """lookup(decode="txmeta") over every hash of the source: deleted ones not found,
    the others found with exactly the source's fields."""
    keys = spark.read.parquet(str(src)).select("tx_hash")
    got = lookup(keys, cache=name, decode="txmeta").toArrow()
    rows = {k: i for i, k in enumerate(got.column("tx_hash").to_pylist())}
    assert set(rows) == set(expected)
    found = got.column("found").to_pylist()
    assert [found[rows[k]] for k in expected] == [v is not None for v in expected.values()]
    src_t = pq.read_table(src)
    if "deleted" in src_t.column_names:
        src_t = src_t.filter(~src_t.column("deleted").to_numpy(zero_copy_only=False))
    live = [i for i, k in enumerate(src_t.column("tx_hash").to_pylist()) if expected[k] is not None]
    at = [rows[src_t.column("tx_hash")[i].as_py()] for i in live]
    for col, _ in txmeta.arrow_fields():
        want = src_t.column(col).to_pylist()
        have = got.column(col).to_pylist()
        assert [have[j] for j in at] == [want[i] for i in live], col


def test_v1_commands_end_to_end(spark, harness, kafka_topic, tmp_path, capsys):
    topic = kafka_topic(PARTITIONS)
    src = tmp_path / "src"
    rc, dg, err = _shmcache("spark", "datagen", str(src), "--rows", "20000", "--rows-per-file", "7000",
                            "--delete-share", "0.05", "--json")
    assert rc == 0, err
    assert (dg["rows"], dg["deletes"], dg["files"]) == (20000, 1000, 3)

    rc, pub, err = _shmcache("spark", "publish", str(src), "--bootstrap", harness.bootstrap, "--topic", topic,
                             "--delete-col", "deleted", "--json")
    assert rc == 0, err[-3000:]
    assert (pub["adds"], pub["deletes"], pub["partitions"]) == (20000, 1000, PARTITIONS)
    assert _check_topic(harness.bootstrap, topic, "v1") == 21000

    expected = _expected(src)
    name, r = _fill(harness, topic, "v1")
    check_table(r, expected)  # the 1000 hashes added and deleted in one run are gone
    _lookup_equals_source(spark, src, name, expected)

    rc, rep, err = _shmcache("spark", "audit", str(src), "--cache", name, "--delete-col", "deleted",
                             "--fail-on-mismatch", "--fail-on-miss", "--json")
    assert rc == 0, err[-3000:]
    assert rep["counts"] == {"hit": 19000, "miss": 0, "mismatch": 0, "absent": 1000, "stale": 0}
    assert rep["ok"] and not rep["failed"]

    # the audit's Spark session stopped and its process exited: the cache is intact
    assert shmcache.exists(name)
    check_table(r, expected)
    with shmcache.attach(name) as again:
        assert again.stats()["entries"] == 19000

    # a wrong value, a lost entry and a deleted hash that came back are reported, and fail
    live = [k for k, v in expected.items() if v is not None]
    dead = [k for k, v in expected.items() if v is None]
    with shmcache.open(name) as w:
        w.set(live[0], b"\x00" * 61)
        w.delete(live[1])
        w.set(dead[0], expected[live[2]])
    capsys.readouterr()
    assert cli.main(["spark", "audit", str(src), "--cache", name, "--delete-col", "deleted",
                     "--fail-on-mismatch", "--json"]) == 1
    rep = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert rep["counts"] == {"hit": 18998, "miss": 1, "mismatch": 1, "absent": 999, "stale": 1}
    assert rep["samples"]["mismatch"] == [{"tx_hash": live[0].hex(), "expected": expected[live[0]].hex(),
                                           "got": "00" * 61}]
    assert rep["samples"]["miss"][0]["tx_hash"] == live[1].hex()
    assert rep["samples"]["stale"][0]["tx_hash"] == dead[0].hex()


def test_v2_second_input_deletes(spark, harness, kafka_topic, tmp_path):
    topic = kafka_topic(PARTITIONS)
    src, dels = tmp_path / "src", tmp_path / "deletes"
    datagen.write(src, 8000, seed=5, rows_per_file=3000, delete_share=0.1, deletes_path=dels)
    rep = publish.publish(spark, str(src), harness.bootstrap, topic, format="v2", deletes=str(dels))
    assert (rep.adds, rep.deletes, rep.partitions, rep.format) == (8000, 800, PARTITIONS, "v2")
    assert _check_topic(harness.bootstrap, topic, "v2") == 8800
    assert rep.messages >= PARTITIONS and rep.bytes > 8000 * 61

    expected = _expected(src, dels)
    name, r = _fill(harness, topic, "v2")
    check_table(r, expected)
    _lookup_equals_source(spark, src, name, expected)
    result = audit.audit(spark, str(src), name, deletes=str(dels))
    assert result.ok and result.counts == {"hit": 7200, "miss": 0, "mismatch": 0, "absent": 800, "stale": 0}


def test_publish_checks_the_topic_first(spark, kafka_topic, kafka_broker, tmp_path):
    src = tmp_path / "src"
    datagen.write(src, 10)
    with pytest.raises(ValueError, match="topic 'no-such-topic' not found"):
        publish.publish(spark, str(src), kafka_broker.bootstrap, "no-such-topic")
    three = kafka_topic(3)
    with pytest.raises(ValueError, match="has 3 partitions; v2 needs a divisor of 8192"):
        publish.publish(spark, str(src), kafka_broker.bootstrap, three, format="v2")
    with pytest.raises(ValueError, match=r"not a txmeta table, columns \['fee'"):
        bare = tmp_path / "bare"
        spark.read.parquet(str(src)).select("tx_hash").write.parquet(str(bare))
        publish.publish(spark, str(bare), kafka_broker.bootstrap, three)
