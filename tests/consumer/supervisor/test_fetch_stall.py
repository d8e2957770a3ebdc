"""A worker whose Kafka consumer stops fetching some of its partitions, with no error, while the
broker holds more (consumer/supervisor/watermarks.py, "a stalled fetch"): what librdkafka 2.16
did to two of a worker's partitions after the broker restarted, in a CI run, the worker
beating all along and the partitions showing no lag.

The stall is made on demand, against a broker of the test's own behind the gate
(tests/lib/shmtest/kafka_gate.py): the gate stops worker 0's connection at its first Fetch
request after it is armed, and librdkafka's socket.timeout.ms is its longest (300 s), so the
worker's consumer gives nothing up itself within the test. The supervisor must see the
partitions stalled and have the worker fetch them through a new consumer: everything
produced reaches the table, through the same worker process, nothing applied twice or
skipped (the table equals the model's).
"""

from shmtest.kafka_gate import SUPERVISOR_CLIENT
from shmtest.private_broker import broker_run
from shmtest.topic_model import check_table
from shmtest.waits import assert_no_worker_restarted, poll_until, wait_applied

PARTITIONS = 3
FETCH = 1  # the Kafka protocol's Fetch request


def _owners(r) -> dict[int, tuple[int, int]]:
    """partition -> (worker index, worker pid)."""
    return {p["partition"]: (p["worker"], p["worker_pid"]) for p in r.status()["assigned"]}


def test_a_worker_whose_fetch_stalls_fetches_again_through_a_new_consumer(tmp_path):
    with broker_run(tmp_path, "stall", PARTITIONS, seed=13, batches=2, gated=True) as run:
        sup = run.supervisor(sets=("socket.timeout.ms=300000",))
        r = run.attach(sup)
        wait_applied(r, run.ends, 120, sup)
        r.wait_ready(timeout=120)
        owners = _owners(r)
        stalled = sorted(p for p, (w, _) in owners.items() if w == 0)
        assert stalled, owners

        run.gate.hold_at({FETCH}, SUPERVISOR_CLIENT, connection_only=True, suffix="/worker-0")
        poll_until(run.gate.held.is_set, 60, "worker 0's next fetch to reach the gate")
        ends = run.produce(3)
        wait_applied(r, ends, 120, sup)  # worker 0's connection is still held: a new consumer fetched them

        log = sup.log_text()
        said = [ln for ln in log.splitlines() if "fetched nothing for" in ln]
        assert len(said) == 1 and f"partitions {stalled} of worker 0" in said[0], log[-3000:]
        assert f"worker 0: partitions {stalled} fetched nothing while the broker held more: fetching" in log, \
            log[-3000:]
        r.wait_ready(timeout=60)
        assert_no_worker_restarted(r)
        assert _owners(r) == owners  # the same worker processes
        check_table(r, run.model.snapshot())
