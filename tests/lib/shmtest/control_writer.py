"""The one writer of control areas for the cross-language checks: the real Python engine sets
a cache's control words as a scenario says, and the Python reader's status() of it is the
answer the Go reader (go/status_test.go) and the Java reader (StatusTest.java) must give,
field by field. (The golden control areas, golden/control/, are golden_control.py's.)

    python -P -m shmtest.control_writer NAME
                        creates cache NAME (a Writer), prints "ready", then answers lines:
      scenario S        sets the control words as scenario S says (each from a clean
                        state, as tests/engine/control/test_area.py sets them) and prints the
                        Python reader's status() of NAME as one JSON line
      status OTHER      prints the Python reader's status() of cache OTHER as one JSON line
    At end of input it stops the processes it started and destroys NAME.

The live processes a scenario names (workers, a second member's partitions) are `sleep`
processes this script starts; a dead owner word is one of a process it started and reaped.
The owner locks of the live words (docs/segment-format.md, section 13) are held by this
script, on a file description of its own (LOCKS), as their owners would hold them.
"""

import json
import os
import subprocess
import sys
import time

import shmcache
from shmcache.engine.control import layout as C
from shmcache.engine import layout as L
from shmcache.engine import owners
from shmcache.ipc import liveness

SLEEPERS = []
LIVE: set[int] = set()
LOCKS = -1  # the file description that holds the live words' owner locks (main opens it)


def live_word() -> int:
    p = subprocess.Popen(["sleep", "600"])
    SLEEPERS.append(p)
    LIVE.add(liveness.owner_word(p.pid))
    return liveness.owner_word(p.pid)


def hold(index: int, word: int) -> None:
    """The owner lock of file word `index` held when `word` names a live process, else not."""
    if word == liveness.owner_word() or word in LIVE:
        assert liveness.lock_word(LOCKS, index)
    else:
        liveness.unlock_word(LOCKS, index)


def set_supervisor(c, word: int) -> None:
    """The supervisor word, and its owner lock as that word's owner would hold it."""
    c._h[C.H_SUPERVISOR] = word
    hold(C.H_SUPERVISOR, word)


def dead_word() -> int:
    p = subprocess.Popen(["sleep", "600"])
    word = liveness.owner_word(p.pid)
    p.kill()
    p.wait()
    assert not liveness.is_alive(word)
    return word


def clean(w, nparts: int, **supervisor) -> None:
    """A fresh supervisor (this process) of a topic of nparts partitions, no workers."""
    c = w.control
    c.reset_partitions()
    c.disown_partitions()
    c.clear_workers()
    c.reset_supervisor(**supervisor)
    h = c._h
    h[C.H_GAP_BITS:C.H_GAP_BITS + 16] = 0
    h[C.H_GAP_OFFSETS] = 0
    h[C.H_BROKER_STATE] = C.BROKER_UP
    h[C.H_BROKER_SINCE] = 0
    w.control.writers[:, L.W_WAIT] = 0
    for i in range(L.MAX_WORKERS):
        hold(owners.worker_row_word(i), 0)
    set_supervisor(c, liveness.owner_word())
    c.set_topic("txmeta-go", nparts)


def worker(w, i: int, owner: int, beat_age_s: float = 0.0, state: str = "up", failures: int = 0,
           restart_in_s: float = 0.0) -> None:
    """Worker row i in use by `owner`, its counts its own (so that a reader's rows can be told
    apart), as the supervisor's handle says `state` (backing off: `failures` deaths in a row,
    its restart due in `restart_in_s`)."""
    c = w.control
    c.workers[i, C.K_HEARTBEAT] = time.monotonic_ns() - int(beat_age_s * 1e9)
    c.workers[i, C.K_OWNER] = owner
    hold(owners.worker_row_word(i), owner)
    c.workers[i, C.K_STARTS] = 1 + failures
    c.workers[i, [C.K_ADDS, C.K_DELETES, C.K_MESSAGES, C.K_MALFORMED, C.K_UNKNOWN]] = [
        1000 * (i + 1), 10 * (i + 1), 100 + i, i, 2 * i]
    c.set_worker_handle(i, state, failures, time.time_ns() + int(restart_in_s * 1e9) if restart_in_s else 0)


def assign(w, p: int, applied: int, hw: int, caught_up: bool, owner: int = 1, latest: int | None = None) -> None:
    row = w.control.partitions[p]
    row[[C.P_APPLIED, C.P_HIGH_WATERMARK, C.P_LATEST, C.P_OWNER]] = [applied, hw, hw if latest is None else latest,
                                                                     owner]
    row[C.P_CAUGHT_UP] = int(caught_up)
    row[C.P_ASSIGNED] = 1


def scenario(w, s: str, workers: list[int]) -> None:
    c = w.control
    if s == "ready":
        clean(w, 3)
        worker(w, 0, workers[0])
        for p in range(3):
            assign(w, p, 10 + p, 10 + p, True)
    elif s == "no-supervisor":  # the words a live supervisor would be read by, left as they are
        clean(w, 2)
        worker(w, 0, workers[0])
        assign(w, 0, 5, 9, False)
        c.set_lookup_failure("not read without a live supervisor", time.monotonic_ns())
        c._h[C.H_BROKER_STATE] = C.BROKER_WAITING
        c._h[C.H_ACCEPT_GAPS] = 1
        set_supervisor(c, 0)
    elif s == "dead-supervisor":
        clean(w, 2)
        worker(w, 0, dead_word())
        worker(w, 1, workers[1])
        assign(w, 0, 5, 9, False)
        assign(w, 1, 9, 9, True, owner=2)
        c.set_group(2, [{"client_id": "b", "host": "hb", "instance_id": ""}], {1: 0})
        set_supervisor(c, dead_word())
    elif s == "stale-supervisor":
        clean(w, 1)
        worker(w, 0, workers[0])
        assign(w, 0, 1, 1, True)
        c._h[C.H_SUPERVISOR_HEARTBEAT] = time.monotonic_ns() - 25 * 10**9
    elif s == "broker-waiting":
        clean(w, 1)
        c._h[C.H_BROKER_SINCE] = time.monotonic_ns() - 3 * 10**9
        c._h[C.H_BROKER_STATE] = C.BROKER_WAITING
    elif s == "broker-waiting-no-start":
        clean(w, 1)
        c._h[C.H_BROKER_STATE] = C.BROKER_WAITING
    elif s == "broker-unknown-state":
        clean(w, 1)
        c._h[C.H_BROKER_STATE] = 7
        worker(w, 0, workers[0])
        assign(w, 0, 3, 3, True)
    elif s == "lookup-error":
        clean(w, 3)
        worker(w, 0, workers[0])
        assign(w, 0, 3, 3, True)
        c.set_lookup_failure("looking up where partitions [1, 2] start: coordinator not available \u2013 retrying",
                             time.monotonic_ns() - 4 * 10**9)
    elif s == "lookup-empty-text":  # a failing look-up with no text: not the lookup-error row
        clean(w, 1)
        c.set_lookup_failure("", 0)
        c._h[C.H_LOOKUP_FAILING_SINCE] = time.monotonic_ns()
    elif s == "no-partitions":
        clean(w, 4)
    elif s == "assigning":
        clean(w, 2)
        worker(w, 0, workers[0])
        assign(w, 0, 1, 1, True)
        assign(w, 1, 1, 1, True)
        c.set_assigning(True)
    elif s == "unassigned":
        clean(w, 3)
        worker(w, 0, workers[0])
        assign(w, 0, 1, 1, True)
    elif s == "shared-group":  # two listed members, one unlisted, a partition both here and elsewhere
        clean(w, 6)
        worker(w, 0, workers[0])
        assign(w, 0, 1, 1, True)
        assign(w, 1, 1, 1, True)
        c.set_group(4, [{"client_id": "shmcache-b", "host": "host-b", "instance_id": "b-1"},
                        {"client_id": "shmcache-c", "host": "host-c", "instance_id": ""}],
                    {1: 0, 2: 0, 3: 1, 5: 7})
    elif s == "elsewhere-only":
        clean(w, 2)
        c.set_group(2, [{"client_id": "x", "host": "y", "instance_id": "z"}], {0: 0, 1: 0})
    elif s == "group-odd-text":  # a member text that is JSON, but not all strings
        clean(w, 2)
        worker(w, 0, workers[0])
        assign(w, 0, 1, 1, True)
        raw = b'[{"client_id": 7, "host": null, "instance_id": true}, {"host": "h"}]'
        group_text(c, 3, raw, bytes([0, 1]))
    elif s == "group-bad-text":  # not JSON: no members listed; the partition is held by an unlisted one
        clean(w, 2)
        worker(w, 0, workers[0])
        assign(w, 0, 1, 1, True)
        group_text(c, 2, b"[{not json", bytes([0, 1]))
    elif s == "lagging":
        clean(w, 25, worker_stale_s=2.0)
        worker(w, 0, workers[0])
        worker(w, 1, workers[1], state="backing-off", failures=3, restart_in_s=4.0)
        worker(w, 2, workers[2], state="stopping")
        worker(w, 3, workers[3], beat_age_s=6.0)
        worker(w, 4, dead_word())
        worker(w, 5, workers[4])
        w.control.writers[63, [L.W_OWNER, L.W_WAIT]] = [workers[4], 18]
        for p in range(25):
            assign(w, p, 100 * p, 100 * p + p % 3, p % 3 == 0, owner=1 + p % 6)
        # the Kafka time of the last message applied: a minute and p seconds ago, unknown on every fourth
        c._h[C.H_PARTITION_TIMES] = c._h[C.H_SUPERVISOR]
        for p in range(25):
            c.partitions[p, C.P_APPLIED_TIME] = 0 if p % 4 == 3 else int(time.time() * 1000) - (60 + p) * 1000
        assign(w, 6, -1, -1, False, owner=0, latest=-1)  # no worker, lag unknown
        assign(w, 7, 5, 2, False, owner=99, latest=3)  # owner out of range, applied past the target
    elif s == "worker-stale":  # every partition caught up, its one worker's heartbeat 30 s old
        clean(w, 3, worker_stale_s=5.0)
        worker(w, 0, workers[0], beat_age_s=30.0)
        for p in range(3):
            assign(w, p, 10 + p, 10 + p, True)
    elif s == "worker-not-running":
        clean(w, 1)
        assign(w, 0, 1, 1, True, owner=5)  # worker 4's row is not in use
    elif s == "gap":
        clean(w, 40)
        worker(w, 0, workers[0])
        for p in range(40):
            assign(w, p, 1, 1, True)
        for p in range(1, 40):
            c.flag_gap(p, 1_234_567)
    elif s == "gap-accepted":
        clean(w, 2, accept_gaps=True)
        worker(w, 0, workers[0])
        assign(w, 0, 1, 1, True)
        assign(w, 1, 1, 1, True)
        c.flag_gap(1, 12)
    elif s == "gap-unassigned":  # a gap on a partition not assigned here
        clean(w, 2)
        worker(w, 0, workers[0])
        assign(w, 0, 1, 1, True)
        c.flag_gap(1, 3)
    elif s == "wall-clock":  # words an earlier shmcache wrote: times of day
        clean(w, 2, worker_stale_s=2.0)
        worker(w, 0, workers[0])
        worker(w, 1, workers[1])
        assign(w, 0, 1, 1, True)
        assign(w, 1, 1, 1, True, owner=2)
        c._h[C.H_AGE_CLOCK] = C.AGE_CLOCK_WALL
        c._h[C.H_SUPERVISOR_HEARTBEAT] = time.time_ns()
        c.workers[0:2, C.K_HEARTBEAT] = [time.time_ns(), time.time_ns() - 5 * 10**9]
    elif s == "stopped":  # no supervisor: every worker not alive is stopped
        clean(w, 2)
        worker(w, 0, dead_word(), state="backing-off")
        worker(w, 1, workers[0])
        assign(w, 0, 1, 2, True)
        assign(w, 1, 1, 2, True, owner=2)
        set_supervisor(c, 0)
    else:
        raise SystemExit(f"unknown scenario {s!r}")


def group_text(c, members: int, raw: bytes, where: bytes) -> None:
    h = c._h
    h[C.H_GROUP_CHECKED] = -1
    text = c._bytes(C.H_GROUP_TEXT, C.GROUP_TEXT_MAX)
    text[:] = 0
    text[:len(raw)] = list(raw)
    area = c._bytes(C.H_ELSEWHERE, L.MAX_PARTITIONS)
    area[:] = 0
    area[:len(where)] = list(where)
    h[C.H_GROUP_TEXT_LEN] = len(raw)
    h[C.H_GROUP_MEMBERS] = members
    h[C.H_GROUP_CHECKED] = time.time_ns()


def main() -> None:
    name = sys.argv[1]
    global LOCKS
    w = shmcache.create(name, memory="4MiB", max_value=64)
    LOCKS = os.open(f"/dev/shm/{name}", os.O_RDWR | os.O_CLOEXEC)
    try:
        workers = [live_word() for _ in range(5)]
        r = shmcache.attach(name)
        print("ready", flush=True)
        for line in sys.stdin:
            what, arg = line.split()
            if what == "scenario":
                scenario(w, arg, workers)
                print(json.dumps(r.status()), flush=True)
            else:
                with shmcache.attach(arg) as other:
                    print(json.dumps(other.status()), flush=True)
        r.close()
    finally:
        for p in SLEEPERS:
            p.kill()
            p.wait()
        w.close()
        shmcache.destroy(name, force=True)


if __name__ == "__main__":
    main()
