"""A supervisor's stop (SIGTERM, SIGINT, an error) has one budget: `stop_timeout` seconds
(consumer/config.py, default 50) from its start, so that it fits in the systemd unit's
TimeoutStopSec=60 (deploy/shmcache@.service) with room for the interpreter's exit, even
when a worker hangs AND the broker stops answering. Its phases, in order, each given what
the budget has left:

    drain     every worker asked to stop, all waited for against one deadline, the ones
              left then killed (consumer/supervisor/worker_handle.py stop_all): drain_timeout, cut
              so that FINAL_MIN_S + CLOSE_MIN_S are left after it
    commit    the final commit of what was applied (consumer/supervisor/commits.py at_stop): up to
              FINAL_WAIT_S of what is left, never less than FINAL_MIN_S
    leave     leaving the group (a static member's unsubscribe, consumer/supervisor/policy.py):
              up to LEAVE_WAIT_S, only out of what is left beyond CLOSE_MIN_S; else skipped
    close     librdkafka's close: up to CLOSE_WAIT_S of what is left, never less than
              CLOSE_MIN_S; one not done by then is abandoned to the process's exit
              (os._exit, consumer/supervisor/policy.py run)
    snapshot  with a snapshot dir: first the periodic snapshot that was being written when
              the stop began, told then to give up (before the drain: a paced snapshot of a
              large cache takes minutes), waited for up to SNAPSHOT_WAIT_S of what is left;
              one still running after that (a write stuck on a hung disk) keeps the cache
              mapped until the process exits and there is no snapshot at this stop
              (consumer/supervisor/snapshot_policy.py at_stop). Then a clean stop's own snapshot, at full
              speed: skipped once the budget is spent

What a spent budget gives up, in this order: the snapshot (the previous ones stay), the
close and the group leave (the group then drops this member after its session timeout,
as if it had died), and last the commit of what was applied, which keeps FINAL_MIN_S
whatever the drain took (without a commit the partitions' next owner re-applies from the
last committed offset: harmless, only slower). So a stop takes at most stop_timeout, plus
what killing hung workers takes past the drain's deadline (a moment: SIGKILL is delivered
even to a stopped process; 5 s at most for ones in uninterruptible sleep, and 1 s for a
frozen fork server that never reports their exits: worker_handle.stop_all), which the
commit's and the close's minimums may then add to.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
import traceback

from shmcache.consumer.supervisor.commits import FINAL_WAIT_S
from shmcache.errors import ShmcacheError

log = logging.getLogger("shmcache.supervisor")

FINAL_MIN_S = 5.0  # the final commit's share, whatever the drain took
CLOSE_MIN_S = 1.0  # librdkafka's close against a broker that answers: well under this
LEAVE_WAIT_S = 5.0  # leaving the group: the revoke callback served
CLOSE_WAIT_S = 15.0  # librdkafka's close: against a broker that does not answer it waits minutes
SNAPSHOT_WAIT_S = 3.0  # a periodic snapshot told to give up as the stop began: it stops within a chunk


class StopBudget:
    """The deadline of one stop, `total` seconds from when it is made, and each phase's share."""

    def __init__(self, total: float):
        self.total = total
        self.deadline = time.monotonic() + total

    def left(self) -> float:
        return max(0.0, self.deadline - time.monotonic())

    def drain(self, drain_timeout: float) -> float:
        """The first phase, asked for as the stop begins."""
        return min(drain_timeout, max(0.0, self.total - FINAL_MIN_S - CLOSE_MIN_S))

    def commit(self) -> float:
        return min(FINAL_WAIT_S, max(FINAL_MIN_S, self.left() - CLOSE_MIN_S))

    def leave(self) -> float:
        """0 or less: no time to leave the group."""
        return min(LEAVE_WAIT_S, self.left() - CLOSE_MIN_S)

    def close(self) -> float:
        return max(CLOSE_MIN_S, min(CLOSE_WAIT_S, self.left()))

    def snapshot(self) -> float:
        """The wait for a periodic snapshot's thread, told to give up as the stop began; 0 if
        the budget is spent (it has had the whole stop to notice)."""
        return min(SNAPSHOT_WAIT_S, self.left())


def close_consumer(consumer, wait: float) -> bool:
    """consumer.close(), waited for at most `wait` seconds; False if it was abandoned. Against
    a broker that accepts connections but does not answer, librdkafka's close waits minutes for
    its LeaveGroup; one not done in time is left to the process's exit (the group drops this
    member after its session timeout, as if it had died)."""
    def close():
        try:
            consumer.close()
        except Exception as e:  # noqa: BLE001 - reported; the stop goes on
            log.warning("closing the Kafka consumer: %s", e)
    t = threading.Thread(target=close, name="kafka-close", daemon=True)
    t.start()
    t.join(wait)
    if t.is_alive():
        log.warning("the Kafka consumer did not close in %.1f s (the broker does not answer; the stop's budget); "
                    "leaving it to the process's exit", wait)
        return False
    return True


def error_exit_code(e: BaseException) -> int:
    """What the command line does with an exception out of `shmcache run` (cli/__init__.py main,
    which this layer may not import): a ShmcacheError, ValueError or OSError (e.g. the broker
    gone past broker_wait, BrokerUnavailableError) is one line on stderr and exit 2; SystemExit
    its own code (a text: printed, exit 2); anything else the interpreter's traceback and exit 1."""
    if isinstance(e, (ShmcacheError, ValueError, OSError)):
        print(f"shmcache: {e}", file=sys.stderr)
        return 2
    if isinstance(e, SystemExit):
        if isinstance(e.code, str):
            print(e.code, file=sys.stderr)
            return 2
        return e.code or 0
    traceback.print_exception(e)
    return 1


def exit_now(code: int) -> None:
    """End the process at once when the interpreter's own exit could wait without a bound: after
    an abandoned close (close_consumer False) on librdkafka's handle, which the close thread
    still holds; after a stop whose workers' exits their frozen fork server never reported
    (worker_handle.stop_all False), on multiprocessing's join of them. Everything else is
    shut by then; the logs and the standard streams are flushed."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
