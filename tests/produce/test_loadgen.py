"""The load generator (produce/loadgen.py): its batches keep per-key order, its
ground truth is exactly what the topic holds, and it paces, waits and fails loudly.

The first group needs no broker; the rest produce to the real one and read the
topic back (`replay_topic`), never trusting the producer's own account.
"""

import os
import socket
import subprocess
import sys
import time
import uuid

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from shmcache.formats import partitioners, proto, registry, txmeta, wire
from shmcache.produce import loadgen

from shmtest.supervisors import REPO
from shmtest.topic_model import KafkaProbe, replay_topic

ADD, DELETE = wire.ADD, wire.DELETE


def _walk(gen: loadgen.Generator, batches: int, size: int):
    """Generate batches; return them with the partition of each entry."""
    out = []
    for _ in range(batches):
        b = gen.batch(size)
        out.append((b, gen.partitions_of(b)))
    return out


# -- generating, without a broker --------------------------------------------------------------


def _murmur2_each(keys, partitions):
    return np.array([partitioners.murmur2_partition(k.tobytes(), partitions) for k in keys])


# where each format's entries must land, worked out here, apart from formats/registry.py: a
# format added there fails the test below until its rule is written here
PLACED = {
    "v1": None,  # the batch's partition, by its first hash (checked below)
    "v2": lambda keys, n: partitioners.v2_partition(wire.xxh64_keys(keys), n),
    "kv": _murmur2_each,  # the producer's partitioner places each entry by its own key
    "proto": lambda keys, n: _murmur2_each(proto.hash_fields(keys, "raw"), n),  # by its txHash as sent
}


def test_every_format_of_the_registry_has_its_placement_here():
    assert set(PLACED) == set(registry.NAMES)


@pytest.mark.parametrize("fmt", registry.NAMES)
def test_every_hash_is_added_once_deleted_at_most_once_and_in_its_own_partition(fmt):
    partitions = 8
    gen = loadgen.Generator(fmt, partitions, delete_share=0.3, rng=np.random.default_rng(7))
    added: dict[bytes, int] = {}  # hash -> partition of its ADD
    deleted: set[bytes] = set()
    entries = deletes = 0
    for i, (b, parts) in enumerate(_walk(gen, 200, 64)):
        if fmt == "v1":
            # the message is keyed by its first hash; murmur2 of it must pick the batch's partition
            assert b.actions[0] == ADD
            assert partitioners.murmur2_partition(b.keys[0].tobytes(), partitions) == b.partition == i % partitions
            assert (parts == b.partition).all()
        else:
            assert (parts == PLACED[fmt](b.keys, partitions)).all()
        seen_here = set()
        for k, a, p in zip(b.keys, b.actions.tolist(), parts.tolist()):
            k = k.tobytes()
            if a == ADD:
                assert k not in added, "a hash was added twice"
                added[k] = p
                seen_here.add(k)
            else:
                assert k in added and k not in seen_here, "a DELETE of a hash not sent in an earlier batch"
                assert k not in deleted, "a hash was deleted twice"
                assert added[k] == p, "a DELETE went to another partition than its ADD"
                deleted.add(k)
                deletes += 1
        entries += len(b)
    assert entries == 200 * 64
    assert 0.25 < deletes / entries < 0.32  # the share, less the first batches that had nothing to delete


def test_values_are_teranode_metabytes():
    gen = loadgen.Generator("v1", 4, delete_share=0.1, rng=np.random.default_rng(3))
    gen.batch(100)
    previous = {k.tobytes() for k in gen.recent}
    b = gen.batch(1024)
    adds = b.actions == ADD
    lens = np.diff(b.offsets)
    assert (lens[~adds] == 0).all()
    assert lens[adds].min() >= txmeta.MIN_SIZE and lens[adds].max() <= 21 + 3 * (32 + 4 + 4) + 4
    m = txmeta.decode(b.offsets, b.data, adds)
    assert m.valid[adds].all()
    parents = np.diff(m.parent_offsets)[adds]
    assert parents.min() == 1 and parents.max() == 3
    # parents are the previous batch's new hashes: a transaction spends recent outputs
    assert {p.tobytes() for p in m.parents} <= previous
    # the encoded message decodes to the same entries
    batch = wire.decode(wire.encode_v1(b.keys, b.actions, (b.offsets, b.data)))
    assert batch.error is None and len(batch) == len(b)
    assert (batch.keys == b.keys).all() and (batch.actions == b.actions).all()


def test_pool_take_removes_exactly_the_hashes_it_returns():
    rng = np.random.default_rng(11)
    pool = loadgen._Pool()
    model: set[bytes] = set()
    for _ in range(300):
        keys = rng.integers(0, 256, (int(rng.integers(1, 200)), 32), np.uint8)
        pool.add(keys)
        model |= {k.tobytes() for k in keys}
        d = int(rng.integers(0, pool.n + 1))
        taken = {k.tobytes() for k in pool.take(d, rng)}
        assert len(taken) == d and taken <= model
        model -= taken
        assert {k.tobytes() for k in pool.keys[: pool.n]} == model


def test_ground_truth_file_describes_the_final_state(tmp_path):
    gen = loadgen.Generator("v2", 8, delete_share=0.2, rng=np.random.default_rng(5))
    path = str(tmp_path / "truth.parquet")
    w = loadgen.GroundTruthWriter(path)
    expected: dict[bytes, bytes | None] = {}
    seq = 0
    for b, parts in _walk(gen, 150, 1000):
        w.add(b, parts, seq)
        seq += len(b)
        for i, (k, a) in enumerate(zip(b.keys, b.actions.tolist())):
            expected[k.tobytes()] = b.data[b.offsets[i]:b.offsets[i + 1]].tobytes() if a == ADD else None
    assert not os.path.exists(path)  # only the .tmp until committed
    w.commit()
    assert not os.path.exists(path + ".tmp")
    t = pq.read_table(path)
    assert t.schema == loadgen.ground_truth_schema()
    assert t.num_rows == seq and t["seq"].to_pylist() == list(range(seq))
    assert pq.ParquetFile(path).metadata.num_row_groups > 1  # streamed, not one block
    state = loadgen.final_state(path)
    assert state.num_rows == len(expected)
    keys = [k.tobytes() for k in loadgen.hashes_of(state["tx_hash"])]
    dead = state["deleted"].to_pylist()
    assert {k for k, d in zip(keys, dead) if d} == {k for k, v in expected.items() if v is None}
    live = state.filter(pc.invert(state["deleted"]))
    off, data = txmeta.encode(txmeta.from_arrow(live))  # the values sent, rebuilt from the columns alone
    live_keys = [k for k, d in zip(keys, dead) if not d]
    for i, k in enumerate(live_keys):
        assert data[off[i]:off[i + 1]].tobytes() == expected[k]


def test_config_errors_name_the_setting():
    for kw, word in (({"format": "v3"}, "format"), ({"batch_size": 0}, "batch_size"), ({"rate": -1}, "rate"),
                     ({"delete_share": 1.0}, "delete_share"), ({"linger": -0.1}, "linger")):
        with pytest.raises(ValueError, match=word):
            loadgen.LoadConfig(bootstrap="x", topic="t", **kw).validate()


# -- producing to the real broker ---------------------------------------------------------------


@pytest.mark.parametrize("fmt", registry.NAMES)
def test_topic_holds_exactly_the_ground_truth(kafka_broker, kafka_topic, tmp_path, fmt):
    partitions = 4
    topic = kafka_topic(partitions)
    path = str(tmp_path / "truth.parquet")
    st = loadgen.produce(loadgen.LoadConfig(bootstrap=kafka_broker.bootstrap, topic=topic, count=20_000, format=fmt,
                                            batch_size=500, delete_share=0.2, seed=1, ground_truth=path))
    assert st.entries == 20_000 and st.adds + st.deletes == 20_000 and st.deletes > 2_000
    assert st.delivered == st.messages and st.ground_truth == path
    probe = KafkaProbe(kafka_broker.bootstrap, topic, partitions)
    ends = probe.end_offsets()
    probe.close()
    assert [st.end_offsets.get(p, 0) for p in range(partitions)] == ends
    assert st.messages == sum(ends)
    assert all(e > 0 for e in ends)
    # Apply the topic in partition order, as a consumer does: per-key order makes it the ground truth.
    table = replay_topic(kafka_broker.bootstrap, topic, ends, fmt)
    state = loadgen.final_state(path)
    keys = [k.tobytes() for k in loadgen.hashes_of(state["tx_hash"])]
    dead = state["deleted"].to_pylist()
    assert len(table) == len(keys) == st.adds
    live = state.filter(pc.invert(state["deleted"]))
    off, data = txmeta.encode(txmeta.from_arrow(live))
    i = 0
    for k, d in zip(keys, dead):
        if d:
            assert table[k] is None
        else:
            assert table[k] == data[off[i]:off[i + 1]].tobytes()
            i += 1


def test_rate_and_linger_send_partial_batches_on_time(kafka_broker, kafka_topic):
    topic = kafka_topic(2)
    t = time.monotonic()
    st = loadgen.produce(loadgen.LoadConfig(bootstrap=kafka_broker.bootstrap, topic=topic, count=3000, rate=5000,
                                            linger=0.05, batch_size=1024))
    took = time.monotonic() - t
    assert took >= 0.55  # 3000 entries at 5000/s
    # under the rate a batch holds what is due after about one linger (~250), not 1024
    assert st.messages >= 3000 / 1024 * 3, st.messages


def test_backpressure_waits_and_drops_nothing(kafka_broker, kafka_topic):
    topic = kafka_topic(2)
    # a local queue of 2 messages: produce() raises BufferError at once, and the generator must wait
    st = loadgen.produce(loadgen.LoadConfig(bootstrap=kafka_broker.bootstrap, topic=topic, count=50 * 256,
                                            batch_size=256, settings={"queue.buffering.max.messages": 2}))
    probe = KafkaProbe(kafka_broker.bootstrap, topic, 2)
    assert sum(probe.end_offsets()) == st.messages == st.delivered == 50
    probe.close()


def test_a_message_the_broker_refuses_fails_the_run_and_leaves_no_ground_truth(kafka_broker, kafka_topic, tmp_path):
    topic = kafka_topic(1)
    path = str(tmp_path / "truth.parquet")
    with pytest.raises(Exception, match="(?i)too large|size"):
        loadgen.produce(loadgen.LoadConfig(bootstrap=kafka_broker.bootstrap, topic=topic, count=2048,
                                           ground_truth=path, settings={"message.max.bytes": 10_000}))
    assert not os.path.exists(path) and not os.path.exists(path + ".tmp")


def test_produce_command_creates_the_topic_and_writes_the_ground_truth(kafka_broker, kafka_admin, tmp_path):
    topic = f"test-produce-{uuid.uuid4().hex[:10]}"
    path = tmp_path / "sent.parquet"
    try:
        p = subprocess.run([sys.executable, "-m", "shmcache", "produce", "--bootstrap", kafka_broker.bootstrap,
                            "--topic", topic, "--create-topic", "--partitions", "4", "--count", "5000",
                            "--format", "v2", "--seed", "3", "--ground-truth", str(path)],
                           cwd=REPO, capture_output=True, text=True, timeout=120, env={**os.environ, "CI": "true"})
        assert p.returncode == 0, p.stderr
        assert "sent 5,000 entries" in p.stdout and "every message acknowledged" in p.stdout
        assert "\x1b[" not in p.stdout + p.stderr  # no terminal: no control codes
        # and no bar: at most a plain progress line every 2 s (there was a blank line)
        assert all(ln.startswith(f"producing to {topic}: ") for ln in p.stderr.splitlines()), p.stderr
        assert pq.read_table(path).num_rows == 5000
        meta = kafka_admin.list_topics(topic=topic, timeout=10).topics[topic]
        assert len(meta.partitions) == 4
        # asked to create a topic that exists with another partition count: a clear error
        p = subprocess.run([sys.executable, "-m", "shmcache", "produce", "--bootstrap", kafka_broker.bootstrap,
                            "--topic", topic, "--create-topic", "--partitions", "3", "--count", "10"],
                           cwd=REPO, capture_output=True, text=True, timeout=120)
        assert p.returncode != 0 and "exists with 4 partitions, not 3" in p.stderr
    finally:
        for f in kafka_admin.delete_topics([topic], operation_timeout=10).values():
            try:
                f.result(timeout=15)
            except Exception:
                pass


@pytest.mark.parametrize("create", [False, True], ids=["topic", "create-topic"])
def test_produce_command_without_a_broker_says_so_in_one_line(create):
    """No broker at the address: one line naming it and the wait, exit 2, within --broker-wait
    (there was a traceback after 15 s of librdkafka's connect errors, ~20 lines a second, and
    with --create-topic a bare 'shmcache: ' after 30 s)."""
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    args = [sys.executable, "-m", "shmcache", "produce", "--bootstrap", f"127.0.0.1:{port}", "--topic", "t-nowhere",
            "--count", "10", "--broker-wait", "2"] + (["--create-topic"] if create else [])
    p = subprocess.run(args, cwd=REPO, capture_output=True, text=True, timeout=120, env={**os.environ, "CI": "true"})
    assert p.returncode == 2 and p.stdout == "", (p.returncode, p.stdout, p.stderr)
    assert p.stderr.startswith("shmcache: ") and p.stderr.count("\n") == 1, p.stderr[-3000:]
    assert f"no Kafka broker answered at 127.0.0.1:{port} within 2 s" in p.stderr, p.stderr
