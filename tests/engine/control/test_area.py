"""The control area's public model (engine/control/area.py) on a real segment: a Writer's
`.control` (ControlArea) writes, a Reader's `.control` (ControlView, on a PROT_READ
mapping) reads what they wrote.

Pinned: reset_supervisor zeroes what belongs to one supervisor's run (its counters, the
assigning flag, the commit in flight, the group words, the worker handles) and keeps
what lives with the segment (topic, partition rows, snapshot and restore words, gap
bits); a worker handle's word round-trips state, deaths in a row (capped) and the
restart due; flag_gap/has_gap per partition at the word edges and out of range; and
status()'s readiness rules, built up step by step with this test process as the
supervisor (and its worker): ready only with every partition assigned here, no
assignment being published, every partition caught up, no retention gap unless the
live supervisor accepts gaps, and never with a dead supervisor; and never while a
partition's worker is starting, backing off, dead or stale (its heartbeat older than
the supervisor's bound), whatever the partition's flag says.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import uuid

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import shmcache
from shmcache.engine.control import layout as C
from shmcache.engine import layout as L
from shmcache.engine.control.area import SUPERVISOR_COUNTERS, ControlArea, ControlView
from shmcache.errors import CacheNotReadyError
from shmcache.ipc import liveness


def poke(w, word: int, value: int) -> None:
    """Header word `word` of Writer w's segment, written by hand: a state the test plants
    (damage, a supervisor between two of its stores, words an earlier shmcache left) that
    no named write of ControlArea makes."""
    w.segment_arrays().header[word] = value


PROPERTY = settings(deadline=None, max_examples=150, suppress_health_check=[HealthCheck.function_scoped_fixture])


@pytest.fixture
def handles():
    """(writer, reader) on one fresh small cache; both closed and the cache destroyed after."""
    name = f"t-control-{uuid.uuid4().hex[:10]}"
    w = shmcache.create(name, memory="4MiB", max_value=64)
    try:
        r = shmcache.attach(name)
        try:
            assert isinstance(w.control, ControlArea) and type(r.control) is ControlView
            yield w, r
        finally:
            r.close()
    finally:
        w.close()
        shmcache.destroy(name)


# -- named writes ------------------------------------------------------------------------------------


def test_no_control_word_is_written_by_its_index():
    """The area has a method per fact it publishes and none that takes a word's index: a
    write from outside the engine cannot land in a word it does not mean."""
    assert not hasattr(ControlArea, "set_word")


def test_each_named_write_shows_in_status(handles):
    """What each of the supervisor's and a restore's named writes publishes, as a reader's
    status() shows it (a live supervisor: this process)."""
    w, r = handles
    c = w.control
    assert c.claim_supervisor() == 0
    c.reset_supervisor()
    st = r.status()
    assert st["broker"] == "connecting" and st["metrics_port"] is None

    c.set_metrics_port(9123)
    with pytest.raises(KeyError):
        c.count("no such counter")  # a counter is named by its status() key
    for i, name in enumerate(SUPERVISOR_COUNTERS):
        c.count(name)
        c.count(name, i)
    since = time.monotonic_ns() - 4 * 10**9
    c.broker_waiting(since)
    st = r.status()
    assert st["metrics_port"] == 9123
    assert {k: st[k] for k in SUPERVISOR_COUNTERS} == {k: 1 + i for i, k in enumerate(SUPERVISOR_COUNTERS)}
    assert st["broker"] == "waiting for the broker" and st["broker_waiting_s"] >= 4
    assert st["reason"] == "broker-waiting"
    c.broker_up()
    assert r.status()["broker"] == "up" and r.status()["broker_waiting_s"] is None
    c.broker_connecting()
    assert r.status()["broker"] == "connecting"
    c.set_metrics_port(0)
    assert r.status()["metrics_port"] is None

    for name in (*C.WIRE_FORMATS, "", "no-such-format"):
        c.set_wire_format(name)
        code = r.control.word(C.H_WIRE_FORMAT)
        assert (C.WIRE_FORMATS[code - 1] if code else "") == (name if name in C.WIRE_FORMATS else "")

    assert r.status()["restore"]["state"] == "none"
    c.no_valid_snapshot()
    assert r.status()["restore"]["state"] == "no valid snapshot"
    c.restore_started()
    assert r.status()["restore"]["state"] == "restoring"
    taken = time.time_ns() - 60 * 10**9
    c.restore_done(1234, 5, 2_500_000_000, taken)
    restore = r.status()["restore"]
    assert restore["state"] == "restored" and (restore["entries"], restore["evictions"]) == (1234, 5)
    assert restore["seconds"] == 2.5 and restore["snapshot_age_s"] == pytest.approx(60, abs=5)

    c.snapshot_failed()
    c.record_snapshot(time.time_ns() - 10**9, 4096, 300_000_000)
    c.record_snapshot(time.time_ns(), 8192, 200_000_000)
    snap = r.status()["snapshot"]
    assert (snap["count"], snap["failures"], snap["bytes"], snap["seconds"]) == (2, 1, 8192, 0.2)
    assert snap["age_s"] < 5


# -- reset_supervisor ----------------------------------------------------------------------------

SEGMENT_WORDS = {  # what a new supervisor must keep: they describe the table, not a run
    C.H_RESTORE_STATE: C.RESTORE_DONE, C.H_RESTORE_ENTRIES: 1234, C.H_RESTORE_NS: 5_000_000,
    C.H_RESTORE_EVICTIONS: 7, C.H_RESTORE_TAKEN_NS: 1_700_000_000_000_000_000,
    C.H_SNAPSHOT_TAKEN_NS: 1_700_000_001_000_000_000, C.H_SNAPSHOT_BYTES: 4096, C.H_SNAPSHOT_NS: 123,
    C.H_SNAPSHOTS: 3, C.H_SNAPSHOT_FAILURES: 1, C.H_WIRE_FORMAT: 2,
}


def test_reset_supervisor_zeroes_a_runs_words_and_keeps_the_segments(handles):
    w, r = handles
    c = w.control
    c.set_topic("the-topic", 4)
    c.partitions[2, C.P_APPLIED] = 99
    c.partition_rows.record_commit(2, 90)
    for word, v in SEGMENT_WORDS.items():
        poke(w, word, v)
    assert c.flag_gap(3, 50) and c.flag_gap(64, 5)
    for i, name in enumerate(SUPERVISOR_COUNTERS):
        c.count(name, 10 + i)
    poke(w, C.H_ASSIGNING, 1)
    poke(w, C.H_COMMIT_PENDING_SINCE, time.monotonic_ns())
    c.set_group(3, [{"client_id": "other", "host": "h", "instance_id": ""}], {1: 0})
    c.set_worker_handle(5, "backing-off", 4, time.time_ns() + 10**9)
    poke(w, C.H_METRICS_PORT, 9999)
    before, before_mono = time.time_ns(), time.monotonic_ns()
    poke(w, C.H_AGE_CLOCK, C.AGE_CLOCK_WALL)  # as an earlier shmcache left it

    c.reset_supervisor(metrics_port=8080)

    v = r.control
    assert v.counters() == dict.fromkeys(SUPERVISOR_COUNTERS, 0)
    assert [v.word(x) for x in (C.H_ASSIGNING, C.H_COMMIT_PENDING_SINCE, C.H_ACCEPT_GAPS)] == [0, 0, 0]
    assert [v.word(x) for x in (C.H_GROUP_MEMBERS, C.H_GROUP_CHECKED)] == [0, 0]  # no group seen yet
    assert all(v.word(C.H_ELSEWHERE + j) == 0 for j in range(L.MAX_PARTITIONS // L.WORD))
    assert all(v.word(C.H_WORKER_HANDLES + i) == 0 for i in range(L.MAX_WORKERS))
    assert v.worker_handle(5) == (None, 0, None)
    assert v.word(C.H_METRICS_PORT) == 8080
    assert v.word(C.H_SUPERVISOR_STARTED) >= before  # a time of day
    assert v.word(C.H_AGE_CLOCK) == C.AGE_CLOCK_MONOTONIC and v.word(C.H_SUPERVISOR_HEARTBEAT) >= before_mono
    # what lives with the segment stays
    assert {word: v.word(word) for word in SEGMENT_WORDS} == SEGMENT_WORDS
    assert (v.topic, v.npartitions) == ("the-topic", 4)
    assert v.partitions[2, C.P_APPLIED] == 99 and v.status()["assigned"] == [] and c.partition_rows.committed(2) == 90
    assert v.has_gap(3) and v.has_gap(64) and not v.has_gap(2) and v.word(C.H_GAP_OFFSETS) == 55
    c.reset_supervisor(accept_gaps=True)
    assert v.word(C.H_ACCEPT_GAPS) == 1 and v.has_gap(3)


# -- worker handles ---------------------------------------------------------------------------------


@PROPERTY
@given(i=st.integers(0, L.MAX_WORKERS - 1), state=st.sampled_from(C.WORKER_STATES),
       failures=st.integers(-3, 0x1FFFF),
       restart_at_ns=st.one_of(st.just(0), st.integers(-10**18, 0), st.integers(1, 2**63 - 1),
                               st.integers(1_700_000_000 * 10**9, 2_000_000_000 * 10**9)))
def test_a_worker_handle_round_trips(handles, i, state, failures, restart_at_ns):
    w, r = handles
    neighbours = [r.control.word(C.H_WORKER_HANDLES + j) for j in range(L.MAX_WORKERS)]
    w.control.set_worker_handle(i, state, failures, restart_at_ns)
    tenths = max(0, restart_at_ns) // 100_000_000
    due = tenths / 10 if tenths > 0 and state == "backing-off" else None
    assert r.control.worker_handle(i) == (state, min(max(failures, 0), 0xFFFF), due)
    assert w.control.worker_handle(i) == r.control.worker_handle(i)
    after = [r.control.word(C.H_WORKER_HANDLES + j) for j in range(L.MAX_WORKERS)]
    assert after[:i] + after[i + 1:] == neighbours[:i] + neighbours[i + 1:]  # one word, one worker


def test_a_backing_off_handle_shows_in_status(handles):
    w, r = handles
    w.control.claim_supervisor()
    w.control.workers[3, C.K_STARTS] = 2  # the supervisor started it (no process claimed the row)
    due = time.time_ns() + 5 * 10**9
    w.control.set_worker_handle(3, "backing-off", 2, due)
    (row,) = r.status()["workers"]
    assert (row["worker"], row["state"], row["restart_failures"], row["alive"]) == (3, "backing-off", 2, False)
    assert row["next_restart_s"] == pytest.approx(due / 1e9, abs=0.11)


# -- retention gaps -------------------------------------------------------------------------------

EDGES = [0, 1, 62, 63, 64, 65, 127, 128, L.MAX_PARTITIONS - 64, L.MAX_PARTITIONS - 1]
PARTITION = st.one_of(st.sampled_from(EDGES + [-1, L.MAX_PARTITIONS, L.MAX_PARTITIONS + 63, -(2**40)]),
                      st.integers(-100, L.MAX_PARTITIONS + 100))


@PROPERTY
@given(flags=st.lists(st.tuples(PARTITION, st.integers(0, 10**9)), max_size=12))
def test_flag_gap_sets_one_bit_per_partition(handles, flags):
    w, r = handles
    c = w.control
    for word in range(C.H_GAP_BITS, C.H_GAP_BITS + L.MAX_PARTITIONS // 64):  # a fresh start per example
        poke(w, word, 0)
    poke(w, C.H_GAP_OFFSETS, 0)
    c.set_topic("t", L.MAX_PARTITIONS)
    header = [r.control.word(h) for h in range(L.HEADER_WORDS)]
    flagged: set[int] = set()
    total = 0
    for p, n in flags:
        new = 0 <= p < L.MAX_PARTITIONS and p not in flagged
        assert c.flag_gap(p, n) is new, (p, flagged)
        if new:
            flagged.add(p)
            total += n
    for p in set(EDGES) | {p for p, _ in flags}:
        assert r.control.has_gap(p) is (p in flagged), p
    assert r.control.word(C.H_GAP_OFFSETS) == total
    st_ = r.status()
    assert st_["gap_partitions"] == sorted(flagged) and st_["gap_offsets"] == total
    gap_words = range(C.H_GAP_BITS, C.H_GAP_BITS + L.MAX_PARTITIONS // 64)
    others = [h for h in range(L.HEADER_WORDS) if h not in gap_words and h != C.H_GAP_OFFSETS]
    assert [r.control.word(h) for h in others] == [header[h] for h in others]  # nothing else written
    assert sum(bin(r.control.word(h) & (2**64 - 1)).count("1") for h in gap_words) == len(flagged)


# -- readiness --------------------------------------------------------------------------------------


def _assign(c, p: int, applied: int, hw: int, caught_up: bool) -> None:
    """What the supervisor publishes at assignment (and a worker once caught up)."""
    row = c.partitions[p]
    row[[C.P_APPLIED, C.P_HIGH_WATERMARK, C.P_LATEST, C.P_OWNER]] = [applied, hw, hw, 1]
    row[C.P_CAUGHT_UP] = int(caught_up)
    c.partition_rows.reassign(p)
    row[C.P_ASSIGNED] = 1


def _worker_up(c, i: int = 0, beat_age_s: float = 0.0) -> None:
    """This process claims worker row i, as a worker does once its kernels are loaded, and
    the supervisor's handle says up; its last heartbeat `beat_age_s` ago."""
    c.worker_row(i).claim(liveness.owner_word())  # its owner lock too: a status in another process sees it live
    c.workers[i, C.K_HEARTBEAT] = time.monotonic_ns() - int(beat_age_s * 1e9)
    c.workers[i, C.K_STARTS] = 1
    c.set_worker_handle(i, "up", 0)


def _not_ready(r, why: str) -> dict:
    st_ = r.status()
    assert not st_["ready"], st_
    with pytest.raises(CacheNotReadyError, match=why):
        r.wait_ready(timeout=0)
    return st_


def _dead_owner_word() -> int:
    """The owner word of a process that has exited (and been reaped)."""
    p = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    try:
        word = liveness.owner_word(p.pid)
    finally:
        p.stdin.close()
        p.wait(timeout=60)
    assert not liveness.is_alive(word)
    return word


def test_a_writer_row_taken_over_from_a_dead_owner_waits_for_no_lock(cache_name):
    """W_WAIT says a writer waits for a bucket's lock (status: a worker waiting for bucket N).
    A row is reused once its owner died, counters and all: every row here is a dead
    owner's, each left saying it waited (or holding what an earlier layout counted in that
    word). The writer that takes one over does not wait; its counters carry on."""
    me, dead = liveness.owner_word(), _dead_owner_word()

    def mine(w) -> list[int]:
        return [i for i, o in enumerate(w.control.writers[:, L.W_OWNER].tolist()) if o == me]

    with shmcache.create(cache_name, memory="64MiB") as first:
        rows = first.control.writers
        held = mine(first)
        others = [i for i in range(L.MAX_WRITERS) if i not in held]
        rows[others, L.W_OWNER] = dead
        rows[others, L.W_WAIT] = 18
        rows[others, L.W_CORRUPTIONS] = 7
        with shmcache.open(cache_name) as w:  # this process again: the row it holds is not free
            (taken,) = set(mine(w)) - set(held)
            row = w.control.writers[taken]
            assert row[L.W_WAIT] == 0 and row[L.W_CORRUPTIONS] == 7, row
            w.set(b"k" * 32, b"v")
            assert w.get(b"k" * 32) == b"v" and row[L.W_WAIT] == 0


def test_a_failing_lookup_reads_back_whole_or_not_at_all(handles):
    """The supervisor's word on a look-up that fails while the partitions wait: its text
    (cut to fit at a character's boundary, never mid-character), since when, cleared when
    one succeeds; read while being written (-1), it is none; a length the segment's damage
    made too long is read as the most that fits."""
    w, r = handles
    c = w.control
    assert r.control.lookup_failure() == {"lookup_error": "", "lookup_failing_s": None}
    c.set_lookup_failure("looking up where partitions [0, 1] start: coordinator not available", time.monotonic_ns())
    got = r.control.lookup_failure()
    assert got["lookup_error"] == "looking up where partitions [0, 1] start: coordinator not available"
    assert 0 <= got["lookup_failing_s"] < 60
    long = "a" + "é" * C.LOOKUP_TEXT_MAX  # 2 bytes each after one: the cut falls mid-character
    c.set_lookup_failure(long, time.monotonic_ns())
    text = r.control.lookup_failure()["lookup_error"]
    assert text == "a" + "é" * (C.LOOKUP_TEXT_MAX // 2 - 1) and len(text.encode()) == C.LOOKUP_TEXT_MAX - 1
    poke(w, C.H_LOOKUP_FAILING_SINCE, -1)  # the supervisor between its stores
    assert r.control.lookup_failure() == {"lookup_error": "", "lookup_failing_s": None}
    c.set_lookup_failure("x", time.monotonic_ns())
    poke(w, C.H_LOOKUP_TEXT_LEN, 1 << 40)  # damage
    assert len(r.control.lookup_failure()["lookup_error"]) == C.LOOKUP_TEXT_MAX
    c.set_lookup_failure("", 0)
    assert r.control.lookup_failure() == {"lookup_error": "", "lookup_failing_s": None}


def test_readiness_is_built_up_by_the_supervisors_writes(handles):
    w, r = handles
    c = w.control
    _not_ready(r, "no live supervisor")
    # this process is the supervisor, as consumer/supervisor/startup.py open_cache publishes one
    c.reset_partitions()
    c.disown_partitions()
    c.reset_supervisor()
    w.control.claim_supervisor()
    _worker_up(c)
    c.set_topic("t", 0)
    st_ = _not_ready(r, "no partitions assigned yet")
    assert st_["supervisor_alive"] and not st_["caught_up"]

    c.set_topic("t", 3)
    _assign(c, 0, 10, 10, True)
    _assign(c, 1, 5, 20, False)
    st_ = _not_ready(r, "1 of 3 partitions not assigned to this cache")
    assert st_["unassigned"] == [2] and not st_["caught_up"]

    poke(w, C.H_ASSIGNING, 1)  # the supervisor is publishing an assignment
    _assign(c, 2, 0, 0, True)
    st_ = _not_ready(r, "an assignment is being published")
    assert st_["assigning"] and st_["unassigned"] == []
    poke(w, C.H_ASSIGNING, 0)

    st_ = _not_ready(r, r"partitions not caught up: 1 \(lag 15\)")
    assert not st_["caught_up"] and not st_["assigning"]

    c.partitions[1, [C.P_APPLIED, C.P_CAUGHT_UP]] = [20, 1]  # the worker caught up
    st_ = r.wait_ready(timeout=0)
    assert st_["ready"] and st_["caught_up"] and not st_["gaps_accepted"]

    assert c.flag_gap(1, 1234)  # retention deleted offsets of partition 1 before the table had them
    st_ = _not_ready(r, r"retention gap: .* 1,234 offsets of partitions \[1\] .*--accept-gaps")
    assert st_["caught_up"] and not st_["gaps_accepted"]

    c.reset_supervisor(accept_gaps=True)  # a supervisor that serves the table as it is
    st_ = r.wait_ready(timeout=0)
    assert st_["ready"] and st_["caught_up"] and st_["gaps_accepted"] and st_["gap_partitions"] == [1]

    w.control.release_supervisor()  # the same words, but its supervisor is gone (and with it its lock)
    poke(w, C.H_SUPERVISOR, _dead_owner_word())
    st_ = _not_ready(r, "no live supervisor")
    assert not st_["supervisor_alive"] and not st_["caught_up"] and not st_["gaps_accepted"]
    w.control.claim_supervisor()
    assert r.wait_ready(timeout=0)["ready"]


def test_a_partition_is_not_caught_up_while_its_worker_is_down_or_stale(handles):
    """The flag says caught up; the worker that holds the partition says otherwise: not ready,
    with the reason, for each way a worker can be gone (the supervisor's handle says so, the
    process is dead, or it stopped beating for longer than the supervisor's bound)."""
    w, r = handles
    c = w.control
    c.reset_partitions()
    c.disown_partitions()
    c.reset_supervisor(worker_stale_s=2.0)
    w.control.claim_supervisor()
    c.set_topic("t", 2)
    _worker_up(c, 0)
    _worker_up(c, 1)
    _assign(c, 0, 10, 10, True)
    _assign(c, 1, 7, 7, True)
    c.partitions[1, C.P_OWNER] = 2  # worker 1
    assert r.wait_ready(timeout=0)["ready"]

    for state in ("backing-off", "stopping"):  # (a live row whose handle says starting is one just up)
        c.set_worker_handle(1, state, 1)
        st_ = _not_ready(r, rf"partitions not caught up: 1 \(lag 0, worker 1 {state}\)")
        assert [p["caught_up"] for p in st_["assigned"]] == [True, False]
        assert st_["assigned"][1]["worker_down"] == state
    c.set_worker_handle(1, "up", 1)
    assert r.wait_ready(timeout=0)["ready"]

    _worker_up(c, 1, beat_age_s=5.0)  # alive, but no heartbeat for 5 s: hung or stopped
    st_ = _not_ready(r, r"partitions not caught up: 1 \(lag 0, worker 1 stale, no heartbeat for 5 s\)")
    assert st_["workers"][1]["stale"] and st_["workers"][1]["state"] == "up" and not st_["workers"][0]["stale"]
    _worker_up(c, 1, beat_age_s=1.0)  # within the bound
    assert r.wait_ready(timeout=0)["ready"]
    poke(w, C.H_AGE_CLOCK, C.AGE_CLOCK_WALL)  # words an earlier shmcache wrote: time.time_ns(), read as such
    poke(w, C.H_SUPERVISOR_HEARTBEAT, time.time_ns())
    c.workers[0:2, C.K_HEARTBEAT] = [time.time_ns(), time.time_ns() - 5 * 10**9]
    _not_ready(r, r"partitions not caught up: 1 \(lag 0, worker 1 stale, no heartbeat for 5 s\)")
    c.workers[1, C.K_HEARTBEAT] = time.time_ns()
    assert r.wait_ready(timeout=0)["ready"]
    poke(w, C.H_AGE_CLOCK, C.AGE_CLOCK_MONOTONIC)
    c.beat()
    _worker_up(c, 0)
    _worker_up(c, 1, beat_age_s=1.0)
    c.reset_supervisor(worker_stale_s=0.5)  # a supervisor with a tighter bound
    w.control.claim_supervisor()
    _not_ready(r, "worker 1 stale")

    _worker_up(c, 1)
    c.worker_row(1).release()  # the process is gone, its lock with it; the supervisor has not seen it yet
    c.workers[1, C.K_OWNER] = _dead_owner_word()
    st_ = _not_ready(r, r"partitions not caught up: 1 \(lag 0, worker 1 starting\)")
    assert not st_["workers"][1]["alive"]
    c.partitions[1, C.P_OWNER] = 0  # no worker at all
    _not_ready(r, r"partitions not caught up: 1 \(lag 0, no worker\)")


@pytest.mark.parametrize("since", [0, -(2**62), 2**62], ids=["between-stores", "negative", "future"])
def test_a_wait_for_the_broker_without_its_start_reads_as_0_s_everywhere(handles, since):
    """The supervisor marks the broker back with two stores (SINCE = 0, then STATE = UP): a look
    between them, or a damaged word, sees "waiting" with no start. status(), wait_ready's
    reason, `shmcache status` and `shmcache top` must all show it (a wait of 0 s), where
    each once raised TypeError formatting None."""
    from shmcache.cli import top_view

    w, r = handles
    c = w.control
    c.reset_supervisor()
    w.control.claim_supervisor()
    poke(w, C.H_BROKER_SINCE, time.monotonic_ns() - 3 * 10**9)
    poke(w, C.H_BROKER_STATE, C.BROKER_WAITING)
    assert r.status()["broker_waiting_s"] == pytest.approx(3, abs=1)  # an ordinary wait

    poke(w, C.H_BROKER_SINCE, since)
    st_ = _not_ready(r, "waiting for the Kafka broker for 0 s")
    assert st_["broker"] == "waiting for the broker" and st_["broker_waiting_s"] == 0.0
    assert "waiting for the broker (0 s)" in top_view.render(r.name, top_view.Snapshot.read(r)).renderables[0].plain
    cli = subprocess.run([sys.executable, "-m", "shmcache", "status", r.name], capture_output=True, text=True,
                         timeout=120, env={**os.environ, "COLUMNS": "200"})
    assert cli.returncode == 0 and "waiting for the broker (0 s)" in cli.stdout, cli.stdout + cli.stderr

    poke(w, C.H_BROKER_STATE, C.BROKER_UP)  # answered: no wait, whatever SINCE still says
    assert r.status()["broker"] == "up" and r.status()["broker_waiting_s"] is None


_COUNTING_WORKER = """
import sys
import shmcache
from shmcache.engine.control import layout as C

w = shmcache.open(sys.argv[1])
me, row = w.control.workers[0], w.control.partitions[0]
print("go", flush=True)
for _ in range(int(sys.argv[2])):
    me[C.K_ADDS] += 1  # a worker counts a batch's entries, then publishes the offset after it
    row[C.P_APPLIED] += 1
"""


def test_counters_read_by_status_include_every_offset_it_shows(handles):
    """A worker counts a batch's entries before it publishes the offset after the batch, so
    a status() that shows an offset must show counters that include it: the partition rows
    are read before the worker rows. Read the other way round, a reader that saw a cache
    caught up could see adds short of what the offsets say was applied (seen: a benchmark's
    99,971 adds for 100,000 applied). A process counts and publishes, one entry at a time,
    as fast as it can, while this one reads status() over and over."""
    w, r = handles
    c = w.control
    c.reset_supervisor()
    w.control.claim_supervisor()
    _worker_up(c)
    c.set_topic("t", 1)
    _assign(c, 0, 0, 0, True)
    p = subprocess.Popen([sys.executable, "-c", _COUNTING_WORKER, w.name, "3000000"], stdout=subprocess.PIPE,
                         text=True)
    try:
        assert p.stdout.readline().strip() == "go"
        seen = set()
        while p.poll() is None and len(seen) < 2000:
            st_ = r.status()
            applied, adds = st_["assigned"][0]["applied"], st_["workers"][0]["adds"]
            assert adds >= applied, (adds, applied)
            seen.add(applied)
    finally:
        p.kill()
        p.wait(timeout=60)
    assert len(seen) >= 100, len(seen)  # the reads ran while the counting did
