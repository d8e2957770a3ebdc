"""The upstream Teranode topic (`--format proto`, formats/proto.py) end to end, against the real
broker: the load generator (`shmcache produce --format proto`, both txHash forms) -> topic ->
`shmcache run --format proto` (a real supervisor and its workers) -> the table -> a reader
that checks every key's value and every delete against the ground truth; and malformed
messages mixed in, counted, logged with topic/partition/offset and skipped, the partition
not stalled."""

import os
import subprocess
import sys
import uuid

import numpy as np
import pyarrow.compute as pc
import pytest
from confluent_kafka import Consumer, Producer, TopicPartition

from shmcache.formats import partitioners, proto, txmeta, wire
from shmcache.produce import loadgen

from shmtest.supervisors import REPO, harness  # noqa: F401
from shmtest.topic_model import ADD, DELETE, KafkaProbe, check_table
from shmtest.waits import applied, assert_no_worker_restarted, wait_applied

PARTITIONS = 4


def _expected(path: str) -> dict[bytes, bytes | None]:
    """The ground truth's final state: each hash's value, None for a deleted one."""
    state = loadgen.final_state(path)
    keys = [k.tobytes() for k in loadgen.hashes_of(state["tx_hash"])]
    off, data = txmeta.encode(txmeta.from_arrow(state.filter(pc.invert(state["deleted"]))))
    live = iter(data[off[i]:off[i + 1]].tobytes() for i in range(len(off) - 1))
    return {k: None if d else next(live) for k, d in zip(keys, state["deleted"].to_pylist())}


def _messages(bootstrap: str, topic: str, ends: list[int]) -> list:
    """Every message of the topic up to `ends`, read back with a consumer of no group."""
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"t-proto-read-{uuid.uuid4().hex[:8]}",
                  "enable.auto.commit": False, "enable.partition.eof": False})
    out = []
    try:
        c.assign([TopicPartition(topic, p, 0) for p, e in enumerate(ends) if e])
        while len(out) < sum(ends):
            out += [m for m in c.consume(500, timeout=1.0) if m.error() is None]
    finally:
        c.close()
    return out


def _fill_and_check(harness, topic: str, path: str, adds: int, deletes: int, tag: str):
    """`shmcache run --format proto` over the topic: the table equals the ground truth."""
    probe = KafkaProbe(harness.bootstrap, topic, PARTITIONS)
    ends = probe.end_offsets()
    probe.close()
    name = harness.cache_name(tag)
    sup = harness.supervisor(name, topic, harness.group(tag), fmt="proto")
    r = harness.attach(name, sup=sup)
    wait_applied(r, ends, 90, sup)
    expected = _expected(path)
    assert sum(v is None for v in expected.values()) == deletes and len(expected) == adds
    check_table(r, expected)
    st = r.wait_ready(30)
    ws = st["workers"]
    assert (sum(w["adds"] for w in ws), sum(w["deletes"] for w in ws)) == (adds, deletes)
    assert sum(w["malformed"] for w in ws) == 0 and sum(w["messages"] for w in ws) == adds + deletes
    assert sup.terminate() == 0
    return ends


@pytest.mark.parametrize("form", proto.HASH_FORMS)
def test_the_generator_sends_a_hashs_delete_where_its_add_went(form):
    """Each message is keyed by its txHash as sent, so murmur2 of it is the entry's partition,
    and a DELETE's partition is its ADD's."""
    gen = loadgen.Generator("proto", 8, delete_share=0.3, rng=np.random.default_rng(4), proto_hash=form)
    added: dict[bytes, int] = {}
    deletes = 0
    for _ in range(100):
        b = gen.batch(64)
        parts = gen.partitions_of(b).tolist()
        fields = proto.hash_fields(b.keys, form)
        assert parts == [partitioners.murmur2_partition(f.tobytes(), 8) for f in fields]
        for k, a, p in zip(b.keys, b.actions.tolist(), parts):
            if a == ADD:
                added[k.tobytes()] = p
            else:
                assert added[k.tobytes()] == p
                deletes += 1
    assert deletes > 1000


def test_a_raw_proto_load_fills_the_cache_to_its_ground_truth(harness, kafka_topic, tmp_path):
    topic = kafka_topic(PARTITIONS)
    path = str(tmp_path / "truth.parquet")
    sent = loadgen.produce(loadgen.LoadConfig(bootstrap=harness.bootstrap, topic=topic, count=6_000, format="proto",
                                              batch_size=500, delete_share=0.25, seed=21, ground_truth=path))
    assert sent.messages == 6_000 and sent.deletes > 1_000
    ends = _fill_and_check(harness, topic, path, sent.adds, sent.deletes, "proto-raw")
    for m in _messages(harness.bootstrap, topic, ends)[:500]:  # what the topic holds: the raw releases' form
        msg = proto.message_class().FromString(m.value())
        assert len(msg.txHash) == 32 and m.key() == msg.txHash and msg.action in (ADD, DELETE)


def test_the_produce_command_sends_hex_txhashes_a_cache_fills_from(harness, kafka_topic, tmp_path):
    """`shmcache produce --format proto --proto-hash hex`: the string releases' form (chainhash's
    String(), bytes reversed), which `shmcache run` reads back to the same keys."""
    topic = kafka_topic(PARTITIONS)
    path = tmp_path / "sent.parquet"
    p = subprocess.run([sys.executable, "-m", "shmcache", "produce", "--bootstrap", harness.bootstrap, "--topic", topic,
                        "--count", "5000", "--format", "proto", "--proto-hash", "hex", "--delete-share", "0.2",
                        "--batch-size", "250", "--seed", "8", "--ground-truth", str(path)],
                       cwd=REPO, capture_output=True, text=True, timeout=180, env={**os.environ, "CI": "true"})
    assert p.returncode == 0, p.stderr
    assert "sent 5,000 entries" in p.stdout and "5,000 proto (hex txHash) messages" in p.stdout, p.stdout
    state = loadgen.final_state(str(path))
    deletes = sum(state["deleted"].to_pylist())
    ends = _fill_and_check(harness, topic, str(path), state.num_rows, deletes, "proto-hex")
    sent_keys = {k.tobytes() for k in loadgen.hashes_of(state["tx_hash"])}
    for m in _messages(harness.bootstrap, topic, ends)[:500]:
        msg = proto.message_class().FromString(m.value())
        assert len(msg.txHash) == 64 and m.key() == msg.txHash
        assert bytes.fromhex(msg.txHash.decode())[::-1] in sent_keys  # the hex is of the key reversed


def _pb(tx_hash: bytes, action: int = ADD, content: bytes = b"") -> bytes:
    return proto.message_class()(txHash=tx_hash, action=action, content=content).SerializeToString()


def _hex(key: bytes) -> bytes:
    return key[::-1].hex().encode()


def test_malformed_proto_messages_are_counted_and_skipped(harness, kafka_topic):
    """Each bad message sits between good ones in its partition, both txHash forms mixed (a
    deployment across releases). Expected: every good message applied, each bad one counted
    once and logged with topic/partition/offset, an unknown action counted apart, a DELETE
    after the damage applied, applied offsets past everything, nobody restarted."""
    topic = kafka_topic(2)
    rng = np.random.default_rng(46)
    expected: dict[bytes, bytes | None] = {}

    def good(i: int) -> bytes:
        k, v = rng.bytes(32), rng.bytes(int(rng.integers(61, 142)))
        expected[k] = v
        return _pb(k if i % 2 else _hex(k), ADD, v)

    dk, dv = rng.bytes(32), rng.bytes(90)  # added before the damage, deleted (hex) after it
    never = rng.bytes(32)  # only in bad messages: stays absent
    uk = rng.bytes(32)  # an unknown action: skipped, counted apart
    bad = {
        "not protobuf": b"\xff\xfe\xfd",
        "truncated": _pb(never, ADD, b"x" * 80)[:40],
        "empty": b"",
        "tombstone": None,
        "short txHash": _pb(never[:31], ADD, b"v"),
        "long hex": _pb(_hex(never) + b"0", ADD, b"v"),
        "not hex": _pb(b"z" + _hex(never)[1:], ADD, b"v"),
        "over max_value": _pb(never, ADD, b"y" * 5000),
        "a v1 message": wire.encode_v1([never], [ADD], [b"v" * 70]),
    }
    plan = [(0, good(0), None), (1, good(1), None), (0, _pb(dk, ADD, dv), None)]
    for i, (what, msg) in enumerate(bad.items()):
        plan += [(i % 2, msg, what), (i % 2, good(i), None)]
    plan += [(1, _pb(uk, 9, b"u"), None), (0, _pb(_hex(dk), DELETE), None), (0, good(0), None), (1, good(1), None)]
    expected.update({dk: None, never: None, uk: None})

    offsets, errors = {}, []

    def on_delivery(what):
        def cb(err, msg):
            if err is not None:
                errors.append(err)
            elif what:
                offsets[what] = (msg.partition(), msg.offset())
        return cb

    prod = Producer({"bootstrap.servers": harness.bootstrap, "enable.idempotence": True})
    for p, msg, what in plan:
        prod.produce(topic, msg, partition=p, on_delivery=on_delivery(what))
    assert prod.flush(30) == 0 and not errors, errors
    assert len(offsets) == len(bad)

    name = harness.cache_name("proto-malformed")
    sup = harness.supervisor(name, topic, harness.group("proto-malformed"), fmt="proto")
    r = harness.attach(name, sup=sup)
    probe = KafkaProbe(harness.bootstrap, topic, 2)
    ends = probe.end_offsets()
    probe.close()
    assert sum(ends) == len(plan)
    wait_applied(r, ends, 60, sup)  # applied moved past every bad message
    for what, (p, o) in offsets.items():
        assert applied(r, 2)[p] > o, (what, p, o)
    check_table(r, expected)
    st = r.wait_ready(30)
    assert sum(w["malformed"] for w in st["workers"]) == len(bad), st["workers"]  # each counted once
    assert sum(w["unknown_actions"] for w in st["workers"]) == 1
    assert sum(w["messages"] for w in st["workers"]) == len(plan)
    assert_no_worker_restarted(r)
    assert sup.running()
    text = sup.log_text()
    for what, (p, o) in offsets.items():
        assert f"malformed message {topic} [{p}] @ {o}:" in text, f"no log line for the {what} message at {p}/{o}"
    assert "txHash of 31 bytes" in text and "is not hex" in text and "exceeds max_value 4096" in text
    assert "Traceback" not in text
    assert sup.terminate() == 0
