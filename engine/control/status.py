"""status() and wait_ready() of a control area (engine/control/area.py), assembled from the
view's public readers: the header words (`view.word`), the partition and worker rows,
the group, the broker's state and the supervisor's counters.

The segment is untrusted (docs/design.md, invariant 8): a word out of its range is named in
status's "damaged" and read as nothing, never raised on. Ready means the whole topic,
now (invariant 10): every partition assigned here by the live supervisor and caught up,
the assignment settled, the broker answering. A partition is caught up only while its
worker is up and its heartbeat younger than the live supervisor's bound
(H_WORKER_STALE_NS): one starting, backing off, stopping, dead or stale (hung, stopped)
applies nothing, whatever the partition's flag says.
"""

from __future__ import annotations

import time

from shmcache.engine.control import layout as C
from shmcache.engine.control.bound import beyond
from shmcache.engine.control.rows import committed_of
from shmcache.engine import layout as L
from shmcache.errors import CacheNotReadyError
from shmcache.ipc import liveness

# A live supervisor whose heartbeat (H_SUPERVISOR_HEARTBEAT) is older than this is shown as
# stale in status() and `shmcache top`: alive, but not going round its loop (hung, stopped,
# or blocked in a broker call or a rebalance for that long). The cache is not ready then.
STALE_HEARTBEAT_S = 10.0

# The group as status() shows it while no live supervisor has checked it.
NO_GROUP = {"members": None, "others": [], "elsewhere": {}, "checked_s": None}


def _age(view, word: int, now: int) -> float | None:
    """Seconds since the time in header word `word`, on the age clock (`now`); None if it holds none."""
    t = view.word(word)
    return max(0.0, (now - t) / 1e9) if t > 0 else None


def _worker_down(w: dict | None) -> str | None:
    """Why a partition's worker cannot keep it applied now (None: it is up and beating)."""
    if w is None:
        return "not running"
    if w["state"] != "up":
        return w["state"]
    if w["stale"]:
        return f"stale, no heartbeat for {w['heartbeat_age_s']:.0f} s"
    if w["waiting_for_bucket"] is not None:
        return f"waiting for bucket {w['waiting_for_bucket']}'s lock, held by another live process"
    return None


def _partition_rows(view, nparts: int, gapped: set[int], damaged: list[str], now_ms: int) -> list[dict]:
    wrows = view.workers
    # the applied times are kept by the supervisor H_PARTITION_TIMES names (an older one kept
    # its generations in that word): trusted only while it is the cache's supervisor
    sup = view.word(C.H_SUPERVISOR)
    timed = sup != 0 and view.word(C.H_PARTITION_TIMES) == sup
    parts = []
    for p in range(nparts):
        r = view.partitions[p].tolist()
        if not r[C.P_ASSIGNED]:
            continue
        owner = r[C.P_OWNER] - 1
        if not -1 <= owner < L.MAX_WORKERS:
            damaged.append(f"partition {p}: owner {owner + 1} (should be 0..{L.MAX_WORKERS})")
            owner = -1
        applied = r[C.P_APPLIED]
        latest = max(r[C.P_LATEST], r[C.P_HIGH_WATERMARK], applied)  # never shown below applied
        lag = max(0, latest - max(applied, 0)) if latest >= 0 else None
        t = r[C.P_APPLIED_TIME] if timed else 0
        parts.append({
            "partition": p,
            "worker": owner if owner >= 0 else None,
            "worker_pid": liveness.word_pid(int(wrows[owner, C.K_OWNER])) if owner >= 0 else None,
            "applied": applied,
            "high_watermark": r[C.P_HIGH_WATERMARK],
            "latest": latest,
            "lag": lag,
            # seconds since the last message applied was produced, while there is lag (0 without;
            # None unknown): how far behind the topic the table is in time
            "behind_s": (0.0 if lag == 0 else max(0.0, (now_ms - t) / 1e3) if lag and t > 0 else None),
            "committed": committed_of(r[C.P_COMMITTED]),
            "caught_up": bool(r[C.P_CAUGHT_UP]),  # and its worker up and beating: _judge_workers
            "worker_down": None,  # why its worker applies nothing now (None: up and beating)
            "gap": p in gapped,  # retention deleted offsets this table never had
        })
    return parts


def _judge_workers(parts: list[dict], ws: list[dict]) -> None:
    """Each partition caught up only while its worker is up and beating (read after the rows)."""
    by_index = {w["worker"]: w for w in ws}
    for p in parts:
        p["worker_down"] = _worker_down(by_index.get(-1 if p["worker"] is None else p["worker"]))
        p["caught_up"] = p["caught_up"] and p["worker_down"] is None


def _worker_rows(view, sup_alive: bool, now: int) -> list[dict]:
    bound = view.word(C.H_WORKER_STALE_NS) if sup_alive else 0  # the live supervisor's, ns; 0 none
    # a writer's lock wait (L.W_WAIT) by its owner word: a worker's writer row is its process's
    waits = {o: w for o, w in view.writers[:, [L.W_OWNER, L.W_WAIT]].tolist() if o and 0 < w <= L.NBUCKETS}
    ws = []
    for i in range(L.MAX_WORKERS):
        r = view.workers[i].tolist()
        if not r[C.K_OWNER] and not r[C.K_STARTS]:
            continue
        alive = view.worker_alive(i)
        published, failures, restart_at = view.worker_handle(i) if sup_alive else (None, 0, None)
        if alive:  # backing-off: killed by the supervisor, not gone yet
            state = published if published in ("stopping", "backing-off") else "up"
        elif not sup_alive:
            state = "stopped"
        else:  # a worker claims its row once its imports are done; until then the supervisor starts it
            state = published if published in ("backing-off", "stopping", "stopped") else "starting"
        ws.append({
            "worker": i,
            "pid": liveness.word_pid(r[C.K_OWNER]) if r[C.K_OWNER] else None,
            "alive": alive,
            "state": state,
            # the supervisor's restart backoff: deaths in a row, and when the next restart is due
            "restart_failures": failures,
            "next_restart_s": restart_at,
            "heartbeat_age_s": (now - r[C.K_HEARTBEAT]) / 1e9 if r[C.K_HEARTBEAT] else None,
            # up, but its heartbeat is older than the supervisor's bound: hung or stopped
            "stale": alive and bound > 0 and r[C.K_HEARTBEAT] > 0 and now - r[C.K_HEARTBEAT] > bound,
            # up and beating, but its write waits for a lock a live process holds (engine/writer.py)
            "waiting_for_bucket": waits[r[C.K_OWNER]] - 1 if alive and r[C.K_OWNER] in waits else None,
            "starts": r[C.K_STARTS],
            "adds": r[C.K_ADDS],
            "deletes": r[C.K_DELETES],
            "messages": r[C.K_MESSAGES],
            "malformed": r[C.K_MALFORMED],
            "unknown_actions": r[C.K_UNKNOWN],
        })
    return ws


def status(view) -> dict:
    """Readiness and progress, from shared memory alone (no broker round trip)."""
    word = view.word
    damaged: list[str] = []
    nparts = view.npartitions
    if not 0 <= nparts <= L.MAX_PARTITIONS:
        damaged.append(f"partition count {nparts} (should be 0..{L.MAX_PARTITIONS})")
        nparts = 0
    tlen = word(L.H_TOPIC_LEN)
    if not 0 <= tlen <= L.TOPIC_MAX:
        damaged.append(f"topic length {tlen} (should be 0..{L.TOPIC_MAX})")
    now = time.time_ns()  # for the snapshot words: times of day
    age_now = view.age_now_ns()  # for the heartbeats and the waits (C.H_AGE_CLOCK)
    sup = view.supervisor
    # An assignment is published row by row: read the rows between two looks at the
    # rebalance count and the assigning flag, and call nothing ready across a change.
    rebalances, assigning = word(C.H_REBALANCES), word(C.H_ASSIGNING)
    gap_parts = [p for p in range(nparts) if view.has_gap(p)]  # each bit read once
    sup_alive = view.supervisor_alive()
    # the partition rows before the worker rows: a worker counts a batch's entries before it
    # publishes the offsets after it, so counters read after the offsets include them all
    parts = _partition_rows(view, nparts, set(gap_parts), damaged, now // 1_000_000)
    ws = _worker_rows(view, sup_alive, age_now)
    _judge_workers(parts, ws)
    here = {p["partition"] for p in parts}
    group = view.group(nparts, damaged) if sup_alive else dict(NO_GROUP)
    settled = not assigning and not word(C.H_ASSIGNING) and word(C.H_REBALANCES) == rebalances
    started = word(C.H_SUPERVISOR_STARTED)
    beat_age = _age(view, C.H_SUPERVISOR_HEARTBEAT, age_now) if sup_alive else None
    # ready means the whole topic, now (DESIGN invariant 10): every partition assigned here
    # by the live supervisor (whose start disowned every row a dead one left) and caught up
    whole = nparts > 0 and len(here) == nparts
    # while the broker does not answer, nobody can say where the topic ends: not ready
    broker = view.broker() if sup_alive else {"broker": None, "broker_waiting_s": None}
    port = word(C.H_METRICS_PORT)
    # a live supervisor that stopped going round its loop (SIGSTOP, a hang) restarts no dead
    # worker and sees no new partition of the topic: what it published is not "now" any more
    sup_stale = beat_age is not None and beat_age > STALE_HEARTBEAT_S
    caught_up = (settled and sup_alive and not sup_stale and whole and broker["broker"] != "waiting for the broker"
                 and all(p["caught_up"] for p in parts))
    gaps = any(p["gap"] for p in parts)
    accepted = sup_alive and bool(word(C.H_ACCEPT_GAPS))
    st = {
        "name": view.name,
        "topic": view.topic,
        "topic_id": view.topic_id,  # the Kafka id of the topic the table's offsets belong to; "" unknown
        "partitions": nparts,
        "supervisor_pid": liveness.word_pid(sup) if sup > 0 else None,
        "supervisor_alive": sup_alive,
        # seconds since the live supervisor last went round its loop; stale past STALE_HEARTBEAT_S
        "supervisor_heartbeat_age_s": beat_age,
        "supervisor_stale": sup_stale,
        "assigned": parts,
        # partitions of the topic not assigned here; those another group member holds are
        # in "elsewhere" and under "group_others"
        "unassigned": [p for p in range(nparts) if p not in here],
        "elsewhere": sorted(p for p in group["elsewhere"] if p not in here),
        "group_members": group["members"],
        "group_others": group["others"],
        "shared_group": bool(group["others"]) or (group["members"] or 0) > 1,
        "workers": ws,
        # applied up to the high watermark everywhere, by the live supervisor, the broker answering
        "caught_up": caught_up,
        # ...and nothing the topic's retention deleted before this table had it, unless the
        # live supervisor was told to serve such a table (`run --accept-gaps`)
        "ready": caught_up and (not gaps or accepted),
        "gaps_accepted": accepted,
        "assigning": not settled,
        # the last (or current) supervisor's counters, since it started
        **view.counters(),
        # seconds the live supervisor's commit has waited for Kafka's answer (None: none waits)
        "commit_pending_s": _age(view, C.H_COMMIT_PENDING_SINCE, age_now) if sup_alive else None,
        "supervisor_started_s": started / 1e9 if started > 0 else None,
        "metrics_port": port if 0 < port <= 65535 else None,
        "damaged": damaged,
        # "up", "connecting" or "waiting for the broker" (None without a live supervisor)
        **broker,
        # a failing look-up of where assigned partitions start: its error and for how long
        **(view.lookup_failure() if sup_alive else {"lookup_error": "", "lookup_failing_s": None}),
        **snapshot_fields(view, gap_parts, now),  # restore, snapshot, gap_partitions, gap_offsets
    }
    st["reason"], st["why"] = reason_why(st)  # the same words from every reader (docs/reader-contract.md)
    return st


def snapshot_fields(view, gap_parts: list[int], now: int) -> dict:
    """status()'s restore, last-snapshot and gap fields (snapshots/restoring.py writes the
    restore words, the supervisor's snapshot policy the others)."""
    word = view.word
    return {
        "restore": {"state": C.RESTORE_STATE_NAMES.get(word(C.H_RESTORE_STATE), "damaged"),
                    "entries": word(C.H_RESTORE_ENTRIES),
                    "seconds": word(C.H_RESTORE_NS) / 1e9,
                    "evictions": word(C.H_RESTORE_EVICTIONS),
                    "snapshot_age_s": _age(view, C.H_RESTORE_TAKEN_NS, now)},
        "snapshot": {"age_s": _age(view, C.H_SNAPSHOT_TAKEN_NS, now), "bytes": word(C.H_SNAPSHOT_BYTES),
                     "seconds": word(C.H_SNAPSHOT_NS) / 1e9, "count": word(C.H_SNAPSHOTS),
                     "failures": word(C.H_SNAPSHOT_FAILURES)},
        "gap_partitions": gap_parts,
        "gap_offsets": word(C.H_GAP_OFFSETS),
    }


def wait_ready(view, timeout: float | None = None, poll: float = 0.05, max_lag: int | None = None,
               max_behind: float | None = None) -> dict:
    """Block until every partition of the topic is assigned here and caught up (DESIGN invariants 7, 10)
    and, with a bound, no partition is more than max_lag messages or max_behind seconds behind
    (engine/control/bound.py).

    Returns the status; raises CacheNotReadyError naming the lagging partitions on timeout."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        st = view.status()
        over = beyond(st, max_lag, max_behind) if st["ready"] else ""
        if st["ready"] and not over:
            return st
        if deadline is not None and time.monotonic() >= deadline:
            raise CacheNotReadyError(f"cache {view.name!r} not ready after {timeout:.1f} s: {over or why(st)}")
        time.sleep(poll)


def why(st: dict) -> str:
    """Why a status is not ready, in words ("" when it is)."""
    return reason_why(st)[1]


def reason_why(st: dict) -> tuple[str, str]:
    """(reason, why): why a status is not ready, as a word and as a sentence, by the table of
    docs/segment-format.md section 14 that every reader follows; ("ready", "") when it is."""
    if st["ready"]:
        return "ready", ""
    if not st["supervisor_alive"]:
        return "no-supervisor", "no live supervisor"
    if st["supervisor_stale"]:
        return "supervisor-stale", (f"the supervisor (pid {st['supervisor_pid']}) has not gone round its loop for "
                                    f"{st['supervisor_heartbeat_age_s']:.0f} s: stopped or hung")
    if st["broker"] == "waiting for the broker":
        return "broker-waiting", f"waiting for the Kafka broker for {st['broker_waiting_s']:.0f} s"
    if st["lookup_error"]:
        return "lookup-error", (f"{len(st['unassigned'])} of {st['partitions']} partitions wait to be handed out: "
                                f"the broker answers, but {st['lookup_error']} (failing for "
                                f"{st['lookup_failing_s']:.0f} s)")
    if not st["assigned"] and not st["elsewhere"]:
        return "no-partitions", "no partitions assigned yet"
    if st["assigning"]:
        return "assigning", "an assignment is being published"
    if st["unassigned"]:
        text = f"{len(st['unassigned'])} of {st['partitions']} partitions not assigned to this cache"
        if st["elsewhere"]:
            who = ", ".join(f"{o['client_id']} on {o['host']}" for o in st["group_others"])
            text += f" ({len(st['elsewhere'])} held by another member of the group: {who})"
        return "unassigned", text
    lagging = [f"{p['partition']} (lag {'unknown' if p['lag'] is None else p['lag']}"
               + (")" if not p.get("worker_down") else ", no worker)" if p["worker"] is None
                  else f", worker {p['worker']} {p['worker_down']})")
               for p in st["assigned"] if not p["caught_up"]]
    if not lagging and st["gap_partitions"]:
        return "gap", (f"retention gap: the topic deleted {st['gap_offsets']:,} offsets of partitions "
                       f"{st['gap_partitions'][:32]} before this cache had them, so the table lacks what they held; "
                       "restore a snapshot taken before, or start the supervisor with --accept-gaps to serve it as "
                       "it is")
    return "lagging", "partitions not caught up: " + ", ".join(lagging[:20])
