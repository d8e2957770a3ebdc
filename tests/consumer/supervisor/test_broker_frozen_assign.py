"""A broker that stops answering while an assignment asks it where the partitions start
(consumer/supervisor/start_offsets.py: the group's committed offsets, the partitions' watermarks), against
a broker of the test's own. The freeze is put exactly there: the broker sits behind a
gate (tests/lib/shmtest/kafka_gate.py) that stops every connection at the supervisor's
first OffsetFetch (committed offsets) or ListOffsets (watermarks) request; the broker is
SIGSTOPped while the request waits at the gate, then the gate opens onto the frozen broker.

The supervisor must not exit (it did: the KafkaException left consumer.poll() as a
traceback, exit 1). It says "waiting for the broker", logs each retry of the lookup,
gives no worker a partition whose start it does not know, and once the broker answers
(SIGCONT) it carries on: everything produced is in the cache, and the group's committed
offsets equal the applied offsets, which equal the topic's end. With `--broker-wait` it
gives up past that bound instead: one line naming the broker, exit 2, no traceback.

A lookup can fail while the broker answers (its metadata): the group's committed offsets
never given to the look-up (the gate holds its OffsetFetch, on every connection it
opens, while the broker answers everything else), or an error such as an authorisation
failure. That is not "waiting for the broker": the log
says the broker answers and what failed, and `--broker-wait` bounds it as well (it
flipped between waiting and up, each answer starting the wait again, so the bound never
ran out).

The whole look-up has one bound, LOOKUP_TIMEOUT_S, however many partitions it asks about.
It asked each partition's watermarks in turn, each request bounded: against a broker that
answers each request in 1 s, 24 partitions took 48 s (up to 24 x 5 s, the supervisor's
loop doing nothing else meanwhile); now all are asked at once. A frozen broker fails the
look-up within the bound, 24 partitions or 3, and a thawed one fills the whole cache.
"""

import os
import subprocess
import sys
import time
from datetime import datetime

from shmcache.kafka.broker import PROBE_TIMEOUT_S
from shmcache.consumer.supervisor.start_offsets import LOOKUP_TIMEOUT_S, ROLE
from shmcache.engine.control.status import why

from shmtest.kafka_gate import LIST_OFFSETS, OFFSET_FETCH, SUPERVISOR_CLIENT
from shmtest.private_broker import broker_run
from shmtest.topic_model import KafkaProbe, check_table
from shmtest.waits import applied, poll_until, wait_applied

PARTITIONS = 3
WAITING = "waiting for the broker"


def _gated_run(tmp_path, tag: str, *, seed: int, batches: int, partitions: int = PARTITIONS):
    """The stage of every test here: a broker of the test's own behind the gate, topic
    t-<tag>, `batches` Model batches on it (tests/lib/shmtest/private_broker.py broker_run)."""
    return broker_run(tmp_path, tag, partitions, seed=seed, batches=batches, gated=True)


def _rides_it_out(run, r, sup) -> None:
    """While frozen: running, waiting for the broker, the lookup retried, no partition given
    to a worker. After SIGCONT: everything in the cache, committed == applied == end."""
    partitions = run.partitions
    def waiting():
        assert sup.running(), sup.log_text()[-3000:]
        return r.status()["broker"] == WAITING
    poll_until(waiting, 60, lambda: f"status to say {WAITING!r}: {r.status()}\n{sup.log_text()[-3000:]}")
    st = r.status()
    assert st["assigned"] == [] and not st["ready"], st  # no worker got a partition it cannot start
    poll_until(lambda: "still waiting for the Kafka broker" in sup.log_text(), 60,
               lambda: f"a retry while the broker is frozen:\n{sup.log_text()[-3000:]}")
    log = sup.log_text()
    received = log.index(f"assignment of partitions {list(range(partitions))} received")
    failed = log.index(f"does not answer (looking up where partitions {list(range(partitions))} start")
    assert received < failed, log[-3000:]  # the freeze hit the lookup inside the assignment
    assert sup.running() and "Traceback" not in log, log[-3000:]

    run.freeze(False)
    ends = run.produce(30)
    wait_applied(r, ends, 120, sup)
    st = r.wait_ready(timeout=120)
    assert st["broker"] == "up" and sorted(p["partition"] for p in st["assigned"]) == list(range(partitions))
    check_table(r, run.model.snapshot())
    probe = KafkaProbe(run.bootstrap, run.topic, partitions, group=run.group)
    try:
        poll_until(lambda: probe.committed() == applied(r, partitions) == ends, 60,
                   lambda: f"committed {probe.committed()} == applied {applied(r, partitions)} == end {ends}")
    finally:
        probe.close()
    assert "answers again" in sup.log_text()


def test_a_broker_frozen_in_an_assignments_lookup_is_waited_for(tmp_path):
    with _gated_run(tmp_path, "assign-frozen", seed=23, batches=30) as run:
        # at start-up, a new group: frozen at the committed offsets
        sup = run.start_frozen_at(OFFSET_FETCH)
        r = run.attach(sup)
        _rides_it_out(run, r, sup)
        assert sup.terminate() == 0

        # restarted, the group's offsets committed: frozen at the watermarks
        sup = run.start_frozen_at(LIST_OFFSETS)
        assert run.gate.request[0] == LIST_OFFSETS
        assert run.gate.request[1].startswith(f"{SUPERVISOR_CLIENT}{run.name}@")
        _rides_it_out(run, r, sup)
        assert sup.terminate() == 0

        # with --broker-wait, a broker that stays frozen ends the run: one line, exit 2
        sup = run.start_frozen_at(OFFSET_FETCH, "--broker-wait", "3")
        code = sup.wait(120)
        log = sup.log_text()
        assert code == 2 and "Traceback" not in log, f"exit {code}:\n{log[-3000:]}"
        last = log.strip().splitlines()[-1]
        assert last.startswith("shmcache: ") and run.bootstrap in last and "broker_wait 3" in last, log[-3000:]
        run.freeze(False)
        check_table(r, run.model.snapshot())  # the cache stays, whole, for its readers


def test_a_lookup_failing_while_the_broker_answers_is_bounded(tmp_path):
    with _gated_run(tmp_path, "assign-coordinator", seed=29, batches=10) as run:
        # the look-up's OffsetFetch (the group's committed offsets) is never answered, on any
        # connection of its client (one is made anew after each failed look-up)
        run.gate.slow_down({OFFSET_FETCH}, SUPERVISOR_CLIENT, 3600, suffix=f"/{ROLE}")
        sup = run.supervisor("--broker-wait", "12")
        r = run.attach(sup)
        parts = list(range(PARTITIONS))

        def said():  # status names the failing look-up while the partitions wait for it
            assert sup.running(), sup.log_text()[-3000:]
            st = r.status()
            return st if st["lookup_error"] else None
        st = poll_until(said, 120, lambda: f"status to name the failing look-up: {r.status()}")
        assert st["lookup_error"].startswith(f"looking up where partitions {parts} start: ") and not st["ready"], st
        assert st["broker"] == "up" and st["lookup_failing_s"] >= 0, st
        assert why(st).startswith(f"{PARTITIONS} of {PARTITIONS} partitions wait to be handed out: the broker "
                                  f"answers, but looking up where partitions {parts} start: "), why(st)
        out = subprocess.run([sys.executable, "-m", "shmcache", "status", run.name], capture_output=True, text=True,
                             timeout=60, env={**os.environ, "COLUMNS": "400"})
        assert "wait to be handed out" in out.stdout, out.stdout + out.stderr
        code = sup.wait(90)
        log = sup.log_text()
        assert code == 2 and "Traceback" not in log, f"exit {code}:\n{log[-3000:]}"
        assert f"the Kafka broker at {run.bootstrap} answers, but looking up where partitions {parts} start failed" \
            in log, log[-3000:]
        last = log.strip().splitlines()[-1]
        assert last.startswith("shmcache: ") and f"partitions {parts}" in last and "broker_wait 12" in last, log[-3000:]
        assert r.status()["lookup_error"] == ""  # no live supervisor: nobody's look-up fails


def test_watermarks_that_time_out_hand_out_nothing(tmp_path):
    """The look-up's ListOffsets held on its own connection (the supervisor's admin client's)
    while everything else answers. librdkafka 2.16 gives a ListOffsets that timed out as
    offsets -1001, not as an error (seen in a CI run: a frozen broker's partitions
    "assigned" from -1001, the workers fetching nothing and the partitions lost): the
    look-up must fail as one that timed out, status must say what the partitions wait for,
    and no partition may be handed out at -1001. The gate holds one connection once: the
    next look-up (a new client) gets through and the cache fills whole. Only the look-up's
    client is held: the supervisor's high-watermark look sends ListOffsets too, and held
    when it came first (seen in a CI run), it let the look-up through."""
    with _gated_run(tmp_path, "assign-lo-timeout", seed=41, batches=10) as run:
        run.gate.hold_at({LIST_OFFSETS}, SUPERVISOR_CLIENT, connection_only=True, suffix=f"/{ROLE}")
        sup = run.supervisor()
        r = run.attach(sup)
        failed = f"answers, but looking up where partitions {list(range(PARTITIONS))} start failed"
        poll_until(lambda: failed in sup.log_text() or not sup.running(), 120,
                   lambda: f"the look-up to fail:\n{sup.log_text()[-3000:]}")
        assert run.gate.held.is_set() and "no watermarks for partitions" in sup.log_text(), sup.log_text()[-3000:]
        wait_applied(r, run.ends, 120, sup)
        r.wait_ready(timeout=120)
        check_table(r, run.model.snapshot())
        handed = [ln for ln in sup.log_text().splitlines() if " assigned {" in ln]
        assert handed and not any("-1001" in ln for ln in handed), "\n".join(handed)
        assert sup.terminate() == 0


MANY = 24
WAIT = 8  # --broker-wait, s
MARGIN = 15.0  # s: the noisy, shared machine's
SLOW_S = 1.0  # a slow broker's time for each watermark request of the supervisor's


def _logged_at(log: str, text: str) -> float:
    """When the supervisor logged the first line with `text` (its timestamp, in s)."""
    line = next(ln for ln in log.splitlines() if text in ln)
    return datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()


def test_a_slow_broker_costs_one_lookup_not_one_a_partition(tmp_path):
    """A broker that answers each of the supervisor's watermark requests in SLOW_S: the
    look-up of 24 partitions waits for that once (both ends of all partitions, in two
    requests), not once a partition (two requests each: 48 s, the loop doing nothing else)."""
    parts = list(range(MANY))
    with _gated_run(tmp_path, "assign-slow", seed=37, batches=60, partitions=MANY) as run:
        run.gate.slow_down({LIST_OFFSETS}, SUPERVISOR_CLIENT, SLOW_S)
        sup = run.supervisor()
        r = run.attach(sup)
        poll_until(lambda: "assigned {" in sup.log_text() or not sup.running(), 2 * MANY * SLOW_S + 120,
                   "the assignment's look-up")
        log = sup.log_text()
        took = _logged_at(log, "assigned {") - _logged_at(log, f"assignment of partitions {parts} received")
        assert took <= LOOKUP_TIMEOUT_S + MARGIN, \
            f"the look-up took {took:.1f} s ({run.gate.slowed} requests slowed by {SLOW_S:g} s)\n{log[-3000:]}"
        assert run.gate.slowed >= 2 and "does not answer" not in log and "answers, but" not in log, log[-3000:]
        wait_applied(r, run.ends, 120, sup)
        r.wait_ready(timeout=120)
        check_table(r, run.model.snapshot())
        assert sup.terminate() == 0


VERY_SLOW_S = 3.5  # a look-up's two ListOffsets (one connection, in turn) 7 s: past the first bound, within the next


def test_a_broker_slower_than_the_lookups_bound_is_waited_for(tmp_path):
    """A broker that answers each of the supervisor's watermark requests in VERY_SLOW_S, more
    than a whole first look-up may take (LOOKUP_TIMEOUT_S): a look-up that times out while the
    broker answers doubles the next one's bound (up to lookup.LOOKUP_TIMEOUT_MAX_S), so the
    partitions are handed out after a failure or two, and the cache fills whole. With the bound
    fixed, every look-up timed out: the cache never said ready, and --broker-wait ended the run."""
    assert LOOKUP_TIMEOUT_S - 0.5 < 2 * VERY_SLOW_S < 2 * LOOKUP_TIMEOUT_S - 0.5  # admin requests end 0.5 s early
    with _gated_run(tmp_path, "assign-very-slow", seed=43, batches=20) as run:
        run.gate.slow_down({LIST_OFFSETS}, SUPERVISOR_CLIENT, VERY_SLOW_S)
        sup = run.supervisor()
        r = run.attach(sup)
        poll_until(lambda: "assigned {" in sup.log_text() or not sup.running(), 180,
                   lambda: f"the partitions to be handed out:\n{sup.log_text()[-3000:]}")
        log = sup.log_text()
        assert f"the next look-up waits up to {2 * LOOKUP_TIMEOUT_S:g} s" in log, log[-3000:]
        handed = [ln for ln in log.splitlines() if " assigned {" in ln]
        assert handed and not any("-1001" in ln for ln in handed), "\n".join(handed)
        wait_applied(r, run.ends, 120, sup)
        r.wait_ready(timeout=120)
        check_table(r, run.model.snapshot())
        assert r.status()["lookup_error"] == ""
        assert sup.terminate() == 0


def test_a_frozen_lookup_of_many_partitions_costs_one_bound(tmp_path):
    """24 partitions, the broker frozen at the look-up's watermarks: the look-up fails within
    its one bound; `--broker-wait` is honoured from there; and a supervisor that waits
    carries on, the cache whole, once the broker answers."""
    parts = list(range(MANY))
    failed = f"does not answer (looking up where partitions {parts} start"
    with _gated_run(tmp_path, "assign-many", seed=31, batches=60, partitions=MANY) as run:
        # with --broker-wait: the look-up's failure, then the wait, then exit 2
        sup = run.start_frozen_at(LIST_OFFSETS, "--broker-wait", str(WAIT))
        code = sup.wait(MANY * LOOKUP_TIMEOUT_S + 120)
        took = time.monotonic() - run.gate.held_at
        log = sup.log_text()
        assert code == 2 and "Traceback" not in log, f"exit {code} after {took:.1f} s:\n{log[-3000:]}"
        assert failed in log and f"broker_wait {WAIT}" in log.strip().splitlines()[-1], log[-3000:]
        bound = LOOKUP_TIMEOUT_S + PROBE_TIMEOUT_S + WAIT
        assert took <= bound + MARGIN, f"exit {took:.1f} s after the freeze; the bound is {bound:g} s\n{log[-3000:]}"
        run.freeze(False)

        # without: the failure is reported within one look-up's bound; thawed, all is well
        sup = run.start_frozen_at(LIST_OFFSETS)
        r = run.attach(sup)
        poll_until(lambda: failed in sup.log_text() or not sup.running(), MANY * LOOKUP_TIMEOUT_S + 60,
                   "the look-up's failure")
        took = time.monotonic() - run.gate.held_at
        bound = LOOKUP_TIMEOUT_S + PROBE_TIMEOUT_S
        assert took <= bound + MARGIN, f"the failure reported {took:.1f} s after the freeze; the bound is {bound:g} s"
        _rides_it_out(run, r, sup)
        assert sup.terminate() == 0


SLOW_FETCH_S = 6.0  # the supervisor's OffsetFetch (committed offsets): past a first look-up's bound, within the next
FRESH_S = 3.0  # the supervisor's heartbeat is never older than this while it waits (it beats each second)


def test_the_supervisor_beats_while_a_slow_broker_gives_committed_offsets(tmp_path):
    """A broker that answers the supervisor's OffsetFetch (the group's committed offsets) in
    SLOW_FETCH_S: the look-up waits for it (a first one times out, the next one's bound
    doubles), and all along the supervisor goes round its loop, its heartbeat never older
    than FRESH_S between the assignment's arrival and its hand-out. committed() blocked the
    loop without a beat for up to the look-up's bound (20 s at most), and the supervisor was
    shown as stale, "stopped or hung", past 10 s."""
    # the first look-up times out; the second, from >= 5 s with a 10 s bound, has its answer by 12 s
    # (its request queued behind the first's on the coordinator connection)
    assert LOOKUP_TIMEOUT_S < SLOW_FETCH_S and 2 * SLOW_FETCH_S < 3 * LOOKUP_TIMEOUT_S - 0.5
    parts = list(range(PARTITIONS))
    with _gated_run(tmp_path, "assign-slow-fetch", seed=47, batches=20) as run:
        run.gate.slow_down({OFFSET_FETCH}, SUPERVISOR_CLIENT, SLOW_FETCH_S)
        sup = run.supervisor()
        r = run.attach(sup)
        ages = []  # the supervisor's heartbeat age, sampled while its look-ups wait

        def handed_out():
            assert sup.running(), sup.log_text()[-3000:]
            log = sup.log_text()
            if f"assignment of partitions {parts} received" in log:
                ages.append(r.status()["supervisor_heartbeat_age_s"])
            return "assigned {" in log

        poll_until(handed_out, 180, lambda: f"the partitions to be handed out:\n{sup.log_text()[-3000:]}")
        log = sup.log_text()
        assert f"the next look-up waits up to {2 * LOOKUP_TIMEOUT_S:g} s" in log, log[-3000:]
        assert run.gate.slowed >= 2 and len(ages) > 20, (run.gate.slowed, ages)
        assert max(ages) < FRESH_S, f"the supervisor's heartbeat was {max(ages):.1f} s old while it waited " \
            f"for committed offsets ({len(ages)} looks)\n{log[-3000:]}"
        wait_applied(r, run.ends, 120, sup)
        r.wait_ready(timeout=120)
        check_table(r, run.model.snapshot())
        assert sup.terminate() == 0
