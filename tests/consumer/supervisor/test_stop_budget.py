"""A stop has one budget (`stop_timeout`), whatever hangs: a worker stopped (SIGSTOP) AND
the broker frozen (SIGSTOP: its connections stay open, nothing answers), against a broker of
the test's own.

Each phase of the stop waited its own bound: the drain (drain_timeout), the final commit
(10 s), leaving the group (5 s), librdkafka's close (15 s): 60 s with the defaults, past
the systemd unit's TimeoutStopSec=60 once the interpreter's exit is added. Now the drain
gets the budget less the final commit's minimum, and each later phase what is left: the
supervisor exits 0 within the budget (+ a margin for a loaded machine; the time taken is
printed), the hung worker is killed, no process of the supervisor is left, and once the
cache is destroyed nothing of it is in /dev/shm.

A broker frozen under a running supervisor with `--broker-wait` ends the run with
BrokerUnavailableError after its close was abandoned (consumer/supervisor/policy.py run): the
process still ends at once through os._exit (before, the error went on to the
interpreter's exit, which could wait for librdkafka's handle), with the command line's
one line naming the broker and exit 2, no traceback, no process left. (This exit did not
hang here without the try/finally either: the test holds the behaviour, it does not
reproduce a hang.)
"""

import datetime
import os
import signal
import time

import psutil

import shmcache

from shmtest.private_broker import broker_run
from shmtest.waits import running, wait_applied, wait_gone

PARTITIONS = 4
DRAIN_S = 6.0  # drain_timeout: the hung worker is killed at it
STOP_S = 12.0  # --stop-timeout: the whole stop's budget
MARGIN_S = 8.0  # for a loaded 2-core machine: the kill, the interpreter's exit


def _all_gone(run, r, procs: list[psutil.Process]) -> None:
    """The supervisor's processes are gone; the broker goes on; the cache, destroyed, leaves nothing."""
    wait_gone(procs)
    run.freeze(False)
    r.close()
    run.h.readers.remove(r)
    shmcache.destroy(run.name)
    assert not [f for f in os.listdir("/dev/shm") if run.name in f]


def test_a_stop_with_a_hung_worker_and_a_frozen_broker_fits_its_budget(tmp_path):
    with broker_run(tmp_path, "stop-budget", PARTITIONS, seed=59, batches=2 * PARTITIONS) as run:
        # no stale-worker kill: the stop alone must deal with the hung worker
        sup = run.supervisor("--stop-timeout", str(STOP_S), workers=2,
                             config={"drain_timeout": DRAIN_S, "worker_heartbeat_timeout": 600.0})
        r = run.attach(sup)
        r.wait_ready(timeout=120)
        wait_applied(r, run.ends, 120, sup)
        st = r.status()
        i = st["assigned"][0]["worker"]
        hung = psutil.Process(st["assigned"][0]["worker_pid"])
        procs = [psutil.Process(sup.pid), *sup.children()]  # the fork server and the workers
        assert len([p for p in procs if p.pid != sup.pid]) >= 3, procs
        hung.suspend()  # SIGSTOP
        try:
            run.freeze(True)
            t0 = time.monotonic()
            sup.signal(signal.SIGTERM)
            code = sup.wait(STOP_S + 120)
            took = time.monotonic() - t0
            print(f"\nSIGTERM with one worker hung and the broker frozen: exit {code} after {took:.1f} s "
                  f"(drain_timeout {DRAIN_S:g} s, stop_timeout {STOP_S:g} s)")
            log = sup.log_text()
            assert code == 0, log[-3000:]
            assert took <= STOP_S + MARGIN_S, (took, log[-3000:])
            assert f"worker {i} (pid {hung.pid}) did not stop within" in log, log[-3000:]
            assert "Traceback" not in log, log[-3000:]
            _all_gone(run, r, procs)
        finally:
            if running(hung):
                hung.resume()


def test_an_error_after_an_abandoned_close_still_exits_at_once(tmp_path):
    with broker_run(tmp_path, "stop-abandoned", 2, seed=61, batches=4) as run:
        # short librdkafka timeouts: the frozen broker is found out in seconds, not minutes
        sup = run.supervisor("--broker-wait", "3", workers=1,
                             sets=("socket.timeout.ms=5000", "session.timeout.ms=6000"))
        r = run.attach(sup)
        r.wait_ready(timeout=120)
        procs = [psutil.Process(sup.pid), *sup.children()]
        run.freeze(True)
        code = sup.wait(240)
        ended = datetime.datetime.now()
        log = sup.log_text()
        assert code == 2 and "Traceback" not in log, f"exit {code}:\n{log[-3000:]}"
        abandoned = [line for line in log.splitlines() if "did not close in" in line]  # the path of an abandoned close
        assert len(abandoned) == 1, log[-3000:]
        after = (ended - datetime.datetime.strptime(abandoned[0][:23], "%Y-%m-%d %H:%M:%S,%f")).total_seconds()
        print(f"\nexit {code} {after:.1f} s after the close was abandoned")
        assert after <= 10, (after, log[-3000:])  # at once, with room for a loaded machine
        last = log.strip().splitlines()[-1]
        assert last.startswith("shmcache: ") and run.bootstrap in last and "broker_wait 3" in last, log[-3000:]
        _all_gone(run, r, procs)
