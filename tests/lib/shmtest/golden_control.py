"""Golden control areas (docs/segment-format.md, section 14): the words a supervisor and its
workers publish, in the states a reader must judge, and the status every reader must give.

Each case is the base golden segment (tests/lib/shmtest/golden_segments.py) with control words patched
in. The words that only a live process or the clock can make are left for the test to
fill, and listed in the case's expectation:
- `live`: {file offset: role}: the owner word of a live process the test starts for that
  role (`supervisor`, `worker`);
- `locked`: [file offset]: the words whose owner lock (section 13) the test holds while
  the readers judge (an open-file-description write lock on the word's 8 bytes, taken by
  any process: the test itself will do). Every `live` word, and in the cases "in another
  PID namespace" words already in the file that name a process of another namespace
  (pid 1, which here is someone else): alive by their locks, never by their pids;
- `ages`: {file offset: seconds}: a time that many seconds before now on CLOCK_MONOTONIC
  (every case's H_AGE_CLOCK is AGE_CLOCK_MONOTONIC);
- `times`: {file offset: seconds}: a Kafka timestamp (unix milliseconds, the wall clock)
  that many seconds before now: a partition's P_APPLIED_TIME.
Not every live word is locked: H_PARTITION_TIMES holds the supervisor's owner word, but only
for readers to compare with H_SUPERVISOR's; its owner lock is H_SUPERVISOR's.
The expected status (`ready`, `caught_up`, `reason`, `why`) comes from how the case was
built, never from reading it. In `why`, `{supervisor_pid}` stands for the pid of the
supervisor's process and `{s}` for a whole number of seconds (an age the clock moves).
`behind_s` (where given) is each assigned partition's, by partition ({s}-like: within
BEHIND_SLACK_S of it, or null); `bounds` (where given) are readiness bounds with the `why`
each gives (engine/control/bound.py: "" within it).

    .venv/bin/python -m shmtest.golden_control   # rewrite golden/control/

Files: golden/control/<case>.shm.gz and golden/control/expect.json.
"""

from __future__ import annotations

import gzip
import json
import os
import time

from shmtest.golden_segments import CREATED_NS, DEAD_OWNER, GOLDEN, Segment, write_cases

# Owner words of processes in another PID namespace: pid 1 of a container (here pid 1 is
# init, whose start stamp is another), and a worker's pid there.
FOREIGN_SUPERVISOR = 1 << 32 | 424242
FOREIGN_WORKER = 7 << 32 | 424243

from shmcache.engine.control import layout as C
from shmcache.engine import layout as L

CONTROL = GOLDEN / "control"
TOPIC = b"txmeta"
UP = C.WORKER_STATES.index("up") + 1
BACKING_OFF = C.WORKER_STATES.index("backing-off") + 1


class Case:
    """A control area being built: words set now, live owners and ages left to the test."""

    def __init__(self, base: bytes):
        self.s = Segment(bytearray(base))
        self.live: dict[int, str] = {}
        self.foreign: set[int] = set()  # offsets of words of another namespace's live processes
        self.locks = True  # the test holds the owner locks of the live words
        self.ages: dict[int, float] = {}
        self.times: dict[int, float] = {}
        self.unlocked: set[int] = set()  # live words whose owner lock is another word's

    def h(self, word: int, value: int) -> None:
        self.s.set(word * L.WORD, value)

    def h_live(self, word: int, role: str) -> None:
        self.h(word, 0)
        self.live[word * L.WORD] = role

    def h_age(self, word: int, seconds: float) -> None:
        self.h(word, 0)
        self.ages[word * L.WORD] = seconds

    def h_times_kept(self) -> None:
        """H_PARTITION_TIMES: the live supervisor keeps the applied times (readers compare the
        word with H_SUPERVISOR; its lock is H_SUPERVISOR's)."""
        self.h_live(C.H_PARTITION_TIMES, "supervisor")
        self.unlocked.add(C.H_PARTITION_TIMES * L.WORD)

    def text(self, word: int, data: bytes) -> None:
        self.s.data[word * L.WORD:word * L.WORD + len(data)] = data

    def worker(self, i: int, k: int, value: int) -> int:
        off = self.s.geo.workers_off + (i * L.ROW_WORDS + k) * L.WORD
        self.s.set(off, value)
        return off

    def partition(self, p: int, k: int, value: int) -> int:
        off = self.s.geo.partitions_off + (p * L.ROW_WORDS + k) * L.WORD
        self.s.set(off, value)
        return off

    def applied_time(self, p: int, seconds_ago: float) -> None:
        """Partition p's last message applied was produced that many seconds before now."""
        self.times[self.partition(p, C.P_APPLIED_TIME, 0)] = seconds_ago

    def writer(self, i: int, k: int, value: int) -> int:
        off = self.s.geo.writers_off + (i * L.ROW_WORDS + k) * L.WORD
        self.s.set(off, value)
        return off


def _ready(base: bytes, nparts: int = 2, assigned: int | None = None) -> Case:
    """A supervisor alive and beating, the broker up, one worker up and beating, the first
    `assigned` (all) of `nparts` partitions assigned to it and caught up."""
    c = Case(base)
    c.h(L.H_TOPIC_LEN, len(TOPIC))
    c.text(L.H_TOPIC, TOPIC)
    c.h(L.H_PARTITIONS, nparts)
    c.h(C.H_AGE_CLOCK, C.AGE_CLOCK_MONOTONIC)
    c.h_live(C.H_SUPERVISOR, "supervisor")
    c.h_age(C.H_SUPERVISOR_HEARTBEAT, 0)
    c.h(C.H_REBALANCES, 1)
    c.h(C.H_BROKER_STATE, C.BROKER_UP)
    c.h(C.H_WORKER_STALE_NS, 30 * 10**9)
    c.h(C.H_WORKER_HANDLES, UP)
    c.live[c.worker(0, C.K_OWNER, 0)] = "worker"
    c.ages[c.worker(0, C.K_HEARTBEAT, 0)] = 0
    c.worker(0, C.K_STARTS, 1)
    for p in range(nparts if assigned is None else assigned):
        c.partition(p, C.P_ASSIGNED, 1)
        c.partition(p, C.P_OWNER, 1)
        for k in (C.P_APPLIED, C.P_HIGH_WATERMARK, C.P_LATEST):
            c.partition(p, k, 100 + p)
        c.partition(p, C.P_COMMITTED, 1 << C.COMMITTED_BITS | 100 + p + 1)  # generation 1, committed 100 + p
        c.partition(p, C.P_CAUGHT_UP, 1)
    return c


def build(base: bytes) -> dict[str, tuple[bytes, dict]]:
    cases: dict[str, tuple[bytes, dict]] = {}

    def add(name: str, c: Case, reason: str, why: str, about: str, caught_up: bool | None = None,
            behind_s: dict[int, float | None] | None = None, bounds: list[dict] | None = None) -> None:
        ready = reason == "ready"
        status = {"ready": ready, "caught_up": ready if caught_up is None else caught_up, "reason": reason, "why": why}
        if behind_s is not None:
            status["behind_s"] = {str(p): v for p, v in behind_s.items()}
        cases[f"control_{name}"] = (bytes(c.s.data), {
            "about": about, "live": {str(k): v for k, v in sorted(c.live.items())},
            "locked": sorted((set(c.live) - c.unlocked) | c.foreign) if c.locks else [],
            "ages": {str(k): v for k, v in sorted(c.ages.items())},
            "times": {str(k): v for k, v in sorted(c.times.items())},
            "status": status, **({"bounds": bounds} if bounds else {})})

    add("ready", _ready(base), "ready", "", "two partitions assigned to a live worker, caught up")

    c = _ready(base, 3)
    c.partition(1, C.P_CAUGHT_UP, 0)
    c.partition(1, C.P_APPLIED, 95)
    c.partition(1, C.P_LATEST, 120)
    c.partition(2, C.P_CAUGHT_UP, 0)
    c.partition(2, C.P_OWNER, 99)  # out of range: damage, no worker
    c.partition(2, C.P_APPLIED, -1)  # nothing applied, no watermark seen: its lag is unknown
    c.partition(2, C.P_LATEST, -1)
    c.partition(2, C.P_HIGH_WATERMARK, -1)
    add("lagging", c, "lagging", "partitions not caught up: 1 (lag 25), 2 (lag unknown, no worker)",
        "partition 1 behind its newest watermark; partition 2's owner word out of range (no worker), its lag unknown")

    c = _ready(base, 3)  # ready (a latch), but partitions 1 and 2 behind their newest watermarks
    c.h_times_kept()
    c.applied_time(0, 30)  # no lag: 0 s behind, whenever its last message was produced
    c.partition(1, C.P_LATEST, 141)  # applied 101: lag 40
    c.applied_time(1, 90)
    c.partition(2, C.P_LATEST, 105)  # applied 102: lag 3; its applied time unknown (0)
    add("ready_behind", c, "ready", "",
        "ready, partition 1 40 messages and 90 s behind, partition 2 3 messages behind and its time unknown: "
        "within some readiness bounds, past others", behind_s={0: 0, 1: 90, 2: None}, bounds=[
            {"max_lag": 40, "why": ""},
            {"max_lag": 39, "why": "partitions more than 39 messages behind: 1 (lag 40)"},
            {"max_lag": 0, "why": "partitions more than 0 messages behind: 1 (lag 40), 2 (lag 3)"},
            {"max_behind": 600, "why": "partitions more than 600.0 s behind: 2 (unknown)"},
            {"max_behind": 30.5, "why": "partitions more than 30.5 s behind: 1 ({s} s), 2 (unknown)"},
            {"max_lag": 3, "max_behind": 600,
             "why": "partitions more than 3 messages behind: 1 (lag 40); partitions more than 600.0 s behind: "
                    "2 (unknown)"}])

    c = _ready(base, 2)  # partition times kept by a supervisor gone: unknown, however recent
    c.h(C.H_PARTITION_TIMES, DEAD_OWNER)
    c.partition(1, C.P_LATEST, 111)  # applied 101: lag 10
    c.applied_time(1, 1)
    add("ready_times_untrusted", c, "ready", "",
        "ready, partition 1 10 messages behind; its applied time was kept by a supervisor no longer the cache's",
        behind_s={0: 0, 1: None}, bounds=[
            {"max_lag": 10, "why": ""},
            {"max_behind": 3600, "why": "partitions more than 3600.0 s behind: 1 (unknown)"}])

    c = _ready(base)
    c.h(C.H_SUPERVISOR, DEAD_OWNER)
    c.live.pop(C.H_SUPERVISOR * L.WORD)
    add("dead_supervisor", c, "no-supervisor", "no live supervisor", "the supervisor's process is gone")

    c = _ready(base)  # the daemon in a container of its own, the reader in another
    c.live.clear()
    c.h(C.H_SUPERVISOR, FOREIGN_SUPERVISOR)
    worker = c.worker(0, C.K_OWNER, FOREIGN_WORKER)
    c.foreign |= {C.H_SUPERVISOR * L.WORD, worker}
    add("ready_other_namespace", c, "ready", "",
        "ready, its supervisor and worker in another PID namespace (pids 1 and 7 there): alive by their owner locks")

    c = _ready(base)
    c.live.clear()
    c.h(C.H_SUPERVISOR, FOREIGN_SUPERVISOR)
    c.worker(0, C.K_OWNER, FOREIGN_WORKER)
    add("dead_other_namespace", c, "no-supervisor", "no live supervisor",
        "the supervisor of another PID namespace is gone (no owner lock), though pid 1 runs here")

    c = _ready(base)
    c.h(L.H_OWNER_LOCKS, 0)
    c.locks = False
    add("ready_pid_rule", c, "ready", "",
        "an earlier shmcache's segment (H_OWNER_LOCKS 0, no owner locks): its owners judged by pid")

    c = _ready(base)
    c.ages[C.H_SUPERVISOR_HEARTBEAT * L.WORD] = 120
    add("stale_supervisor", c, "supervisor-stale",
        "the supervisor (pid {supervisor_pid}) has not gone round its loop for {s} s: stopped or hung",
        "the supervisor lives, but its heartbeat is 120 s old")

    c = _ready(base)
    c.h(C.H_BROKER_STATE, C.BROKER_WAITING)
    c.h_age(C.H_BROKER_SINCE, 7)
    add("broker_waiting", c, "broker-waiting", "waiting for the Kafka broker for {s} s",
        "the supervisor has waited 7 s for the broker")

    c = _ready(base, 2, assigned=0)
    c.h_age(C.H_LOOKUP_FAILING_SINCE, 30)
    said = b"looking up where partitions [0, 1] start: the group coordinator did not answer"
    c.h(C.H_LOOKUP_TEXT_LEN, len(said))
    c.text(C.H_LOOKUP_TEXT, said)
    add("lookup_error", c, "lookup-error",
        "2 of 2 partitions wait to be handed out: the broker answers, but " + said.decode()
        + " (failing for {s} s)", "the look-up of where assigned partitions start fails")

    c = _ready(base, 2, assigned=0)
    add("no_partitions", c, "no-partitions", "no partitions assigned yet", "a topic of 2 partitions, none assigned")

    c = _ready(base)
    c.h(C.H_ASSIGNING, 1)
    add("assigning", c, "assigning", "an assignment is being published", "the assigning flag is up")

    c = _ready(base, 4, assigned=2)
    others = json.dumps([{"client_id": "shmcache-b", "host": "host-b", "instance_id": "b-1"}]).encode()
    c.h(C.H_GROUP_CHECKED, CREATED_NS)
    c.h(C.H_GROUP_MEMBERS, 2)
    c.h(C.H_GROUP_TEXT_LEN, len(others))
    c.text(C.H_GROUP_TEXT, others)
    c.text(C.H_ELSEWHERE, bytes([0, 0, 1, 1]))
    add("shared_group", c, "unassigned",
        "2 of 4 partitions not assigned to this cache (2 held by another member of the group: shmcache-b on host-b)",
        "another member of the consumer group holds partitions 2 and 3")

    c = _ready(base, 3, assigned=2)
    add("unassigned", c, "unassigned", "1 of 3 partitions not assigned to this cache",
        "partition 2 is assigned nowhere the group says")

    c = _ready(base)
    c.ages[c.s.geo.workers_off + (0 * L.ROW_WORDS + C.K_HEARTBEAT) * L.WORD] = 60
    add("stale_worker", c, "lagging",
        "partitions not caught up: 0 (lag 0, worker 0 stale, no heartbeat for {s} s), "
        "1 (lag 0, worker 0 stale, no heartbeat for {s} s)",
        "the worker lives, but its heartbeat is older than the supervisor's 30 s bound")

    c = _ready(base)
    c.live.pop(c.worker(0, C.K_OWNER, DEAD_OWNER))
    c.h(C.H_WORKER_HANDLES, BACKING_OFF)
    add("worker_backing_off", c, "lagging",
        "partitions not caught up: 0 (lag 0, worker 0 backing-off), 1 (lag 0, worker 0 backing-off)",
        "the worker died; the supervisor backs off before it restarts it")

    c = _ready(base)
    c.live[c.writer(0, L.W_OWNER, 0)] = "worker"
    c.writer(0, L.W_WAIT, 17 + 1)
    add("worker_waiting", c, "lagging",
        "partitions not caught up: 0 (lag 0, worker 0 waiting for bucket 17's lock, held by another live process), "
        "1 (lag 0, worker 0 waiting for bucket 17's lock, held by another live process)",
        "the worker waits for a bucket lock a live process holds")

    c = _ready(base)
    c.h(C.H_GAP_BITS, 1 << 1)
    c.h(C.H_GAP_OFFSETS, 1234)
    add("gap", c, "gap",
        "retention gap: the topic deleted 1,234 offsets of partitions [1] before this cache had them, so the table "
        "lacks what they held; restore a snapshot taken before, or start the supervisor with --accept-gaps to serve "
        "it as it is", "retention deleted offsets of partition 1 before the table had them", caught_up=True)

    c = _ready(base)
    c.h(C.H_GAP_BITS, 1 << 1)
    c.h(C.H_GAP_OFFSETS, 1234)
    c.h(C.H_ACCEPT_GAPS, 1)
    add("gap_accepted", c, "ready", "", "a retention gap, which the live supervisor was told to accept")
    return cases


def expectations(cases) -> str:
    doc = {"format": "docs/segment-format.md section 14, layout version %d" % L.LAYOUT_VERSION,
           "cases": {name: {"file": f"{name}.shm.gz", **exp} for name, (_, exp) in sorted(cases.items())}}
    return json.dumps(doc, indent=1, sort_keys=True) + "\n"


def write_all(base: bytes) -> None:
    cases = build(base)
    write_cases(CONTROL, cases, expectations(cases))


def load() -> dict:
    """golden/control/expect.json's cases."""
    return json.loads((CONTROL / "expect.json").read_text())["cases"]


def image(case: dict, owners: dict[str, int], now_ns: int) -> bytearray:
    """A case's segment with its live owner words, ages and times filled: owners {role:
    owner word of a live process}, now_ns CLOCK_MONOTONIC now (times: the wall clock's)."""
    data = bytearray(gzip.decompress((CONTROL / case["file"]).read_bytes()))
    s = Segment(data)
    for off, role in case["live"].items():
        s.set(int(off), owners[role])
    for off, seconds in case["ages"].items():
        s.set(int(off), now_ns - int(seconds * 1e9))
    now_ms = time.time_ns() // 10**6
    for off, seconds in case.get("times", {}).items():
        s.set(int(off), now_ms - int(seconds * 1000))
    return data


def hold_locks(path: str, case: dict) -> int:
    """Take the owner locks of the case's `locked` words on the file at `path`, on a file
    description of their own (open for writing): returns its fd; closing it drops them."""
    from shmcache.ipc import liveness

    fd = os.open(path, os.O_RDWR | os.O_CLOEXEC)
    for off in case["locked"]:
        assert liveness.lock_word(fd, int(off) // L.WORD), f"word at {off} of {path} is locked already"
    return fd


def why_pattern(case: dict, supervisor_pid: int, why: str | None = None) -> str:
    """The case's expected `why` (or this one, a bound's) as a regular expression ({s}: any whole
    number of seconds)."""
    import re

    text = (case["status"]["why"] if why is None else why).replace("{supervisor_pid}", str(supervisor_pid))
    return "^" + re.escape(text).replace(re.escape("{s}"), r"\d+") + "$"


BEHIND_SLACK_S = 60.0  # a golden's behind_s read within this of what it was built with (a loaded host)


def behind_wrong(case: dict, st: dict) -> list[str]:
    """How a status' behind_s differ from the case's (where it gives them): [] when they do not."""
    want = case["status"].get("behind_s")
    if want is None:
        return []
    got = {str(p["partition"]): p.get("behind_s") for p in st.get("assigned") or []}
    wrong = []
    for p, w in want.items():
        g = got.get(p, "absent")
        if w is None or g is None or g == "absent":
            ok = g is None and w is None
        else:
            ok = w <= g <= w + BEHIND_SLACK_S
        if not ok:
            wrong.append(f"partition {p}: behind_s {g}, wanted {w}")
    return wrong


if __name__ == "__main__":
    write_all(gzip.decompress((GOLDEN / "base.shm.gz").read_bytes()))
