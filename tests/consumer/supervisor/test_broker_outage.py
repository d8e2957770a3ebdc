"""The broker is not always there (issue 9), against a broker of the test's own that it
stops and starts again (the session broker stays up for everyone else):

- a supervisor started before the broker runs, says "waiting for the broker" in
  status(), `shmcache status`, `shmcache top` and the metrics, logs one line per
  retry and none of librdkafka's connect errors, and fills the table once the
  broker answers; wait_ready() then returns;
- the broker going away while it runs: status says so, and when the broker is back
  the same workers (no restart) carry on and the table is complete;
- a broker that stops answering (SIGSTOP: its connections stay open, nothing replies)
  while a commit is due: the supervisor's loop goes on (heartbeat, status) with the
  commit shown in flight, the commit lands once the broker answers again, and a stop
  while it does not answer still ends, its final commit given up after a bound;
- `--broker-wait S` fails fast: one line naming the bootstrap servers, no
  traceback, exit 2, and the cache removed if this run created it (a cache that
  existed before is kept, with its entries); and a running supervisor whose broker
  goes away gives up at the bound, not at its next backed-off retry.
"""

import json
import os
import re
import subprocess
import sys
import urllib.request

import shmcache

from shmtest.private_broker import broker_run, free_ports
from shmtest.supervisors import Harness
from shmtest.topic_model import check_table
from shmtest.waits import assert_no_worker_restarted, poll_until, wait_applied

PARTITIONS = 3
WAITING = "waiting for the broker"


def _cli(*args) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "shmcache", *args], capture_output=True, text=True,
                          timeout=120, stdin=subprocess.DEVNULL)


def _metric(port: int, name: str, cache: str) -> float | None:
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    for line in text.splitlines():
        if line.startswith(f'shmcache_{name}{{cache="{cache}"}} '):
            return float(line.split()[-1])
    return None


def _owners(r) -> dict[int, tuple]:
    """partition -> (worker index, worker pid)."""
    return {p["partition"]: (p["worker"], p["worker_pid"]) for p in r.status()["assigned"]}


def test_supervisor_waits_for_the_broker_and_rides_out_an_outage(tmp_path):
    with broker_run(tmp_path, "outage", PARTITIONS, seed=7) as run:
        b, name = run.broker, run.name
        b.stop()  # started once, to make the topic; the supervisor then starts while it is down
        mport = free_ports(1)[0]
        sup = run.supervisor(config={"metrics_port": mport})
        r = poll_until(lambda: shmcache.exists(name) and shmcache.attach(name), 60, "the cache to appear")
        run.h.readers.append(r)

        def waiting():
            assert sup.running(), sup.log_text()[-3000:]
            st = r.status()
            return st["broker"] == WAITING and st["broker_waiting_s"] is not None
        poll_until(waiting, 60, lambda: f"status to say {WAITING!r}: {r.status()}")
        assert not r.status()["ready"] and r.status()["topic"] == run.topic
        status = _cli("status", name, "--json")
        assert status.returncode == 0, status.stderr
        assert json.loads(status.stdout)["broker"] == WAITING
        status = _cli("status", name)
        assert WAITING in status.stdout, status.stdout
        top = _cli("top", name, "--once", "--interval", "0.1")
        assert top.returncode == 0 and WAITING in top.stdout, top.stdout + top.stderr
        assert _metric(mport, "broker_up", name) == 0.0
        assert _metric(mport, "broker_waiting_seconds", name) > 0

        b.start()  # the broker comes: the supervisor joins, then fills the table
        ends = run.produce(60)
        wait_applied(r, ends, 120, sup)
        st = r.wait_ready(timeout=120)
        assert st["broker"] == "up"
        assert _metric(mport, "broker_up", name) == 1.0
        check_table(r, run.model.snapshot())
        assert_no_worker_restarted(r)
        owners = _owners(r)
        assert sorted(owners) == list(range(PARTITIONS))

        # while running: the broker goes away, status says so, and it comes back
        b.stop()
        poll_until(lambda: r.status()["broker"] == WAITING, 120,
                   lambda: f"status to say {WAITING!r} after the broker stopped: {r.status()}")
        assert sup.running(), sup.log_text()[-3000:]
        b.start()
        poll_until(lambda: r.status()["broker"] == "up", 120, lambda: f"the broker to be seen again: {r.status()}")
        ends = run.produce(60)
        wait_applied(r, ends, 120, sup)
        r.wait_ready(timeout=120)
        check_table(r, run.model.snapshot())
        assert_no_worker_restarted(r)  # same worker processes: nothing restarted
        assert _owners(r) == owners  # each partition with the worker it had

        log = sup.log_text()
        assert "Connection refused" not in log and "FAIL" not in log, log[-3000:]  # no librdkafka spam
        retries = [line for line in log.splitlines() if "waiting for the Kafka broker" in line]
        assert retries, log[-3000:]  # one line per retry: said, not silent
        assert sup.terminate() == 0
        assert shmcache.exists(name)  # a cache that ran stays for its readers


def _commit_due_with_the_broker_frozen(run, r, sup) -> None:
    """Produce, wait until the workers applied it, freeze the broker: repeated until a commit
    of what they applied is still due with the broker frozen, proven by one in flight for
    1 s. (A commit the broker answered just before the freeze is still handled after it:
    a gap between committed and applied seen at that moment can close.)"""
    def settled():
        st = r.status()
        due = any(p["committed"] != p["applied"] for p in st["assigned"])
        if due and (st["commit_pending_s"] or 0) >= 1:
            return "unanswered"
        return "made" if not due and st["commit_pending_s"] is None else None

    for _ in range(20):
        ends = run.produce(5)
        wait_applied(r, ends, 120, sup)
        run.freeze(True)
        if poll_until(settled, 60, lambda: f"a commit made or left unanswered: {r.status()}") == "unanswered":
            return
        run.freeze(False)
    raise AssertionError("every commit was made before the broker could be frozen: 20 tries")


def _loop_alive_while_the_commit_waits(r, sup) -> dict:
    """Wait until status shows a commit in flight for 5 s; the supervisor's loop must beat
    all along (a synchronous commit blocks it: its heartbeat goes stale)."""
    def waiting():
        st = r.status()
        assert sup.running(), sup.log_text()[-3000:]
        assert st["supervisor_heartbeat_age_s"] < 8, f"the supervisor's loop is blocked: {st}"
        return st if (st["commit_pending_s"] or 0) >= 5 else None
    return poll_until(waiting, 60, lambda: f"a commit in flight for 5 s: {r.status()}")


def test_a_broker_that_stops_answering_never_stops_the_supervisor(tmp_path):
    with broker_run(tmp_path, "frozen", PARTITIONS, seed=11) as run:
        name = run.name
        sup = run.supervisor(config={"commit_interval": 0.5})
        r = poll_until(lambda: shmcache.exists(name) and shmcache.attach(name), 60, "the cache to appear")
        run.h.readers.append(r)

        _commit_due_with_the_broker_frozen(run, r, sup)
        st = _loop_alive_while_the_commit_waits(r, sup)
        assert st["ready"] and st["broker"] == "up"  # the table is whole; only the commit waits
        status = _cli("status", name)
        assert "waited" in status.stdout and "for Kafka" in status.stdout, status.stdout
        run.freeze(False)

        def committed():
            st = r.status()
            done = st["commit_pending_s"] is None and all(p["committed"] == p["applied"] for p in st["assigned"])
            return st if done else None
        poll_until(committed, 120, lambda: f"the commit to land once the broker answers: {r.status()}")
        check_table(r, run.model.snapshot())
        assert_no_worker_restarted(r)

        # a stop while the broker does not answer: the final commit is given up, the stop ends
        _commit_due_with_the_broker_frozen(run, r, sup)
        assert sup.terminate(timeout=120) == 0, sup.log_text()[-3000:]
        log = sup.log_text()
        assert "final commit" in log and ("not confirmed" in log or "skipped" in log), log[-3000:]
        run.freeze(False)
        check_table(r, run.model.snapshot())  # the cache stays, whole, for its readers


def test_broker_wait_fails_fast_and_removes_only_a_cache_it_created(tmp_path):
    port = free_ports(1)[0]  # nothing listens there
    bootstrap = f"127.0.0.1:{port}"
    h = Harness(tmp_path, bootstrap)
    try:
        fresh = h.cache_name("bw-fresh")
        run = _cli("run", "--name", fresh, "--bootstrap", bootstrap, "--topic", "t-none", "--memory", "64MiB",
                   "--broker-wait", "2")
        assert run.returncode == 2, run.stderr[-3000:]
        last = run.stderr.strip().splitlines()[-1]
        assert bootstrap in last and fresh in last and "broker" in last, run.stderr[-3000:]
        assert "Traceback" not in run.stderr and "FAIL" not in run.stderr, run.stderr[-3000:]
        assert not shmcache.exists(fresh)
        assert not os.path.exists(f"/dev/shm/.shmcache-{fresh}.readers")

        kept = h.cache_name("bw-kept")
        with shmcache.create(kept, memory="64MiB") as w:
            w.set(b"k" * 32, b"value")
            before = w.creation_id
        run = _cli("run", "--name", kept, "--bootstrap", bootstrap, "--topic", "t-none", "--broker-wait", "2")
        assert run.returncode == 2, run.stderr[-3000:]
        assert bootstrap in run.stderr.strip().splitlines()[-1]
        with shmcache.attach(kept) as r:
            assert r.creation_id == before and r.get(b"k" * 32) == b"value"
    finally:
        h.close()


RUN_WAIT = 8  # --broker-wait of the test below: the retries (0.5, 1, 2, 4 s apart, then 5) pass it at ~11.5 s


def test_a_running_supervisor_gives_up_on_the_broker_at_broker_wait(tmp_path):
    """The broker goes away under a running supervisor started with --broker-wait 8: it exits 2
    with one line saying how long the broker has not answered, which is the bound and one last
    probe (PROBE_TIMEOUT_S), not the next retry of its backoff (it said 12 s)."""
    from shmcache.kafka.broker import PROBE_TIMEOUT_S

    with broker_run(tmp_path, "outage-bound", PARTITIONS, seed=9) as run:
        sup = run.supervisor("--broker-wait", str(RUN_WAIT))
        r = run.attach(sup)
        wait_applied(r, run.produce(30), 120, sup)
        r.wait_ready(timeout=120)
        run.broker.stop()
        code = sup.wait(120)
        log = sup.log_text()
        assert code == 2 and "Traceback" not in log, f"exit {code}:\n{log[-3000:]}"
        last = log.strip().splitlines()[-1]
        said = re.search(r"has not answered for (\d+) s \(broker_wait 8 s\)", last)
        assert last.startswith("shmcache: ") and run.bootstrap in last and said, log[-3000:]
        # the bound, one last probe, and a loop's round: well short of the next retry (~11.5 s)
        assert RUN_WAIT <= int(said.group(1)) <= RUN_WAIT + PROBE_TIMEOUT_S + 1.5, last
        check_table(r, run.model.snapshot())  # the cache stays, whole, for its readers
