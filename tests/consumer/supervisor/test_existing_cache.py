"""`shmcache run` on a cache that is already there (`shmcache create` made it): the cache
keeps its geometry. A --memory too small for run's default max_value is no error (memory
is for creating a cache); the workers decode against the cache's own max_value, so an
entry over it is malformed, not applied; a --max-value the cache does not have is
refused, naming both, and the cache is left as it was."""

import os

import numpy as np
from confluent_kafka import Producer

import shmcache
from shmcache.formats import wire
from shmcache.ipc.segment import path_of

from shmtest.supervisors import harness  # noqa: F401
from shmtest.topic_model import ADD, check_table
from shmtest.waits import assert_no_worker_restarted, wait_applied

MAX_VALUE = 256  # the created cache's; run's default is 4096


def _produce(bootstrap: str, topic: str, messages: list[bytes]) -> None:
    errors = []
    prod = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for m in messages:
        prod.produce(topic, m, partition=0, on_delivery=lambda err, msg: err and errors.append(err))
    assert prod.flush(30) == 0 and not errors, errors


def test_run_on_a_cache_created_smaller_keeps_its_geometry(harness, kafka_topic):
    topic = kafka_topic(1)
    rng = np.random.default_rng(71)
    keys = [rng.integers(0, 256, 32, np.uint8).tobytes() for _ in range(6)]
    vals = [rng.integers(0, 256, int(rng.integers(61, 142)), np.uint8).tobytes() for _ in range(6)]
    # the hardest case: over the cache's max_value, yet well under run's default (4096), in
    # the middle of a message; v1's framing past such an entry is not trusted
    vals[3] = b"y" * (MAX_VALUE + 1)
    _produce(harness.bootstrap, topic, [wire.encode_v1(keys[0:2], [ADD] * 2, vals[0:2]),
                                        wire.encode_v1(keys[2:5], [ADD] * 3, vals[2:5]),
                                        wire.encode_v1(keys[5:6], [ADD], vals[5:6])])
    name = harness.cache_name("existing-small")
    shmcache.create(name, memory="4MiB", max_value=MAX_VALUE).close()
    size = os.path.getsize(path_of(name))
    # 4 MiB could not hold 4096-byte values: run would refuse to create such a cache
    sup = harness.supervisor(name, topic, harness.group("existing-small"), memory="4MiB", workers=1)
    r = harness.attach(name, sup=sup)
    wait_applied(r, [3], 60, sup)
    check_table(r, {keys[0]: vals[0], keys[1]: vals[1], keys[2]: vals[2], keys[3]: None, keys[4]: None,
                    keys[5]: vals[5]})
    st = r.status()
    assert sum(w["malformed"] for w in st["workers"]) == 1, st["workers"]
    assert_no_worker_restarted(r)
    assert r.max_value == MAX_VALUE and os.path.getsize(path_of(name)) == size
    assert "Traceback" not in sup.log_text()
    assert sup.terminate() == 0


def test_run_refuses_a_max_value_the_existing_cache_does_not_have(harness, kafka_topic):
    topic = kafka_topic(1)
    name = harness.cache_name("existing-other")
    with shmcache.create(name, memory="4MiB", max_value=MAX_VALUE) as w:
        w.set(b"k" * 32, b"kept")
    sup = harness.supervisor(name, topic, harness.group("existing-other"), memory="4MiB",
                             args=("--max-value", "512"))
    code = sup.wait(60)
    text = sup.log_text()
    assert code not in (None, 0), f"exit code {code}:\n{text[-3000:]}"
    assert f"exists with key_size=32, max_value={MAX_VALUE}" in text and "max_value=512" in text, text[-3000:]
    assert "Traceback" not in text, text[-3000:]
    with shmcache.attach(name) as r:
        assert r.get(b"k" * 32) == b"kept" and r.status()["supervisor_pid"] is None
