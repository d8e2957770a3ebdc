"""Lag is current (issue 9): "latest" is the high watermark of each partition's last
fetch, published by the worker that owns it after every batch, so status(), `top` and
shmcache_partition_lag_messages show a cache that is behind as behind, and latest is
never below applied.

The hardest cases for a periodic refresh: small bursts produced after the supervisor
caught up, each applied within moments (right then, latest must equal their end: a
refresh every few seconds still shows the previous one, below applied); then a big
burst applied by a rate-limited worker (max_rate, small batches) over several seconds,
which must be seen behind (lag > 0) before it catches up. Every status() sample must
have latest >= applied and lag = latest - applied.
"""


from shmtest.supervisors import harness  # noqa: F401
from shmtest.topic_model import KafkaProbe, Model
from shmtest.waits import poll_until, wait_applied

PARTITIONS = 2
BATCHES = 120  # ~26 entries each: ~3,100 entries, several seconds at MAX_RATE
MAX_RATE = 600  # entries/s per worker
ROUNDS = 3


def test_lag_is_current_and_latest_never_below_applied(harness, kafka_topic):
    topic = kafka_topic(PARTITIONS)
    name = harness.cache_name("lag")
    sup = harness.supervisor(name, topic, harness.group("lag"), workers=1, max_rate=MAX_RATE,
                             config={"batch_messages": 2})
    r = harness.attach(name, sup=sup)
    r.wait_ready(timeout=120)  # an empty topic: caught up at offset 0

    samples = []

    def sample():
        st = r.status()
        for p in st["assigned"]:
            samples.append((p["partition"], p["applied"], p["latest"], p["lag"]))
        return st

    model = Model("v1", PARTITIONS, seed=3)
    probe = KafkaProbe(harness.bootstrap, topic, PARTITIONS)
    try:
        _bursts(harness, topic, model, probe, r, sup, sample)
    finally:
        probe.close()
    assert sup.running(), sup.log_text()[-3000:]
    below = [s for s in samples if s[2] < s[1]]
    assert not below, f"latest below applied in {len(below)} of {len(samples)} samples, e.g. {below[:5]}"
    wrong = [s for s in samples if s[3] != s[2] - max(s[1], 0)]
    assert not wrong, f"lag != latest - applied: {wrong[:5]}"
    behind = [s for s in samples if s[3] > 0]
    assert len({s[1] for s in behind}) > 1, "the cache was seen behind at one applied offset only"


def _bursts(harness, topic, model, probe, r, sup, sample):
    # small bursts: the moment a burst is applied, latest shows its end (a periodic refresh
    # of the watermark would still show the one before: latest below applied)
    for _ in range(ROUNDS):
        burst = harness.producer(topic, model, rate=1000, max_batches=PARTITIONS * 2)
        burst.start()
        burst.finish()
        ends = probe.end_offsets()
        wait_applied(r, ends, 120, sup)
        got = {p["partition"]: (p["applied"], p["latest"], p["lag"]) for p in sample()["assigned"]}
        assert got == {p: (e, e, 0) for p, e in enumerate(ends)}, (got, ends)

    # a big burst: seen behind while the rate-limited worker catches up
    prod = harness.producer(topic, model, rate=1000, max_batches=BATCHES)
    prod.start()
    # behind: the worker's fetches bring the new watermark long before it has applied up to it
    poll_until(lambda: any(p["lag"] and p["lag"] > 0 for p in sample()["assigned"]), 120,
               lambda: f"a partition shown behind: {r.status()['assigned']}", interval=0.01)
    prod.finish()
    ends = probe.end_offsets()

    def caught_up():
        st = sample()
        return all(p["applied"] >= ends[p["partition"]] and p["latest"] == ends[p["partition"]] and p["lag"] == 0
                   for p in st["assigned"])

    poll_until(caught_up, 180, lambda: f"applied and latest to reach {ends}: {r.status()['assigned']}",
               interval=0.01)
