"""The segment's control area: per-partition progress and per-worker rows.

Who writes what (one writer per word, so no locks are needed):
- the supervisor: topic and partition count in the header, its own counters
  (commits, commit failures, rebalances, lost partitions), start time, metrics
  port and the broker's state (consumer/broker.py); per partition the high
  watermark at assignment, owner, assigned flag, generation, committed offset,
  and the latest watermark at assignment only; a worker row's start count;
- the owning worker: its partitions' applied offset, caught-up flag and, after
  each batch, latest watermark (the high watermark of its last fetch), and its
  own row (owner word, heartbeat, counters).
Readers (status, wait_ready, metrics) only read. Values are published with
plain 8-byte stores, which x86 makes atomic for aligned words; a reader may see
one partition's row a moment older than another's.
"""

from __future__ import annotations

import time

import numpy as np

from shmcache.consumer import broker as broker_mod
from shmcache.consumer import snapshots
from shmcache.engine import layout as L
from shmcache.errors import CacheNotReadyError
from shmcache.ipc import liveness

STALE_HEARTBEAT_S = 10.0


def partitions(handle) -> np.ndarray:
    return handle._partitions.reshape(L.MAX_PARTITIONS, L.ROW_WORDS)


def workers(handle) -> np.ndarray:
    return handle._workers.reshape(L.MAX_WORKERS, L.ROW_WORDS)


def topic(handle) -> str:
    n = min(max(int(handle._header[L.H_TOPIC_LEN]), 0), L.TOPIC_MAX)  # the segment is untrusted
    raw = handle._header[L.H_TOPIC:L.H_TOPIC + L.TOPIC_MAX // L.WORD].tobytes()[:n]
    return raw.decode("utf-8", "replace")


def set_topic(handle, name: str, npartitions: int) -> None:
    raw = name.encode()
    if len(raw) > L.TOPIC_MAX:
        raise ValueError(f"topic name {name!r} is longer than {L.TOPIC_MAX} bytes")
    words = np.zeros(L.TOPIC_MAX // L.WORD, np.int64)
    words.view(np.uint8)[: len(raw)] = np.frombuffer(raw, np.uint8)
    h = handle._header
    h[L.H_TOPIC:L.H_TOPIC + len(words)] = words
    h[L.H_TOPIC_LEN] = len(raw)
    h[L.H_PARTITIONS] = npartitions


SUPERVISOR_COUNTERS = {  # status() key -> header word
    "commits": L.H_COMMITS,
    "commit_failures": L.H_COMMIT_FAILURES,
    "commits_deferred": L.H_COMMITS_DEFERRED,
    "rebalances": L.H_REBALANCES,
    "partitions_lost": L.H_PARTITIONS_LOST,
}


def reset_supervisor(handle, metrics_port: int = 0) -> None:
    """A supervisor starts: its counters count from zero (as the worker rows do)."""
    h = handle._header
    for word in SUPERVISOR_COUNTERS.values():
        h[word] = 0
    h[L.H_ASSIGNING] = 0  # a supervisor killed mid-assignment may have left it set
    set_group(handle, 0, [], {})
    h[L.H_SUPERVISOR_STARTED] = time.time_ns()
    h[L.H_METRICS_PORT] = metrics_port


def count(handle, word: int, n: int = 1) -> None:
    """Add to one of the supervisor's header counters (the supervisor is their only writer)."""
    handle._header[word] += n


def reset_partitions(handle) -> None:
    """A new topic for this segment: forget progress made on another topic."""
    rows = partitions(handle)
    rows[:] = 0
    rows[:, [L.P_APPLIED, L.P_HIGH_WATERMARK, L.P_COMMITTED, L.P_LATEST]] = -1


def disown_partitions(handle) -> None:
    """A supervisor starts: nothing the last one assigned is assigned now (DESIGN invariant 10).

    Only the applied offsets stay (they say what the table holds). The generation moves on,
    so a worker of a dead supervisor that is still finishing a batch publishes nothing more,
    and the readiness target is unknown until this supervisor assigns the partition again."""
    rows = partitions(handle)
    rows[:, [L.P_ASSIGNED, L.P_OWNER, L.P_CAUGHT_UP]] = 0
    rows[:, L.P_HIGH_WATERMARK] = -1
    rows[:, L.P_GENERATION] += 1


def _header_bytes(handle, word: int, n: int) -> np.ndarray:
    return handle._header.view(np.uint8)[word * L.WORD:word * L.WORD + n]


def set_group(handle, members: int, others: list[dict], elsewhere: dict[int, int]) -> None:
    """Publish the consumer group as the supervisor saw it: `members` in all (0 unknown),
    the other members (dicts of client_id, host, instance_id), and the partitions each
    holds ({partition: index in `others`}). Fits what does not fit: drops members from the
    end of the text (their partitions show as held by an unlisted member)."""
    import json

    h = handle._header
    h[L.H_GROUP_CHECKED] = -1  # writing: a reader ignores what it reads now
    listed = list(others)
    raw = json.dumps(listed, separators=(",", ":")).encode()
    while len(raw) > L.GROUP_TEXT_MAX:
        listed.pop()
        raw = json.dumps(listed, separators=(",", ":")).encode()
    text = _header_bytes(handle, L.H_GROUP_TEXT, L.GROUP_TEXT_MAX)
    text[:] = 0
    text[:len(raw)] = np.frombuffer(raw, np.uint8)
    where = _header_bytes(handle, L.H_ELSEWHERE, L.MAX_PARTITIONS)
    where[:] = 0
    for p, i in elsewhere.items():
        if 0 <= p < L.MAX_PARTITIONS:
            where[p] = min(i, len(listed)) + 1  # len(listed): a member not in the text
    h[L.H_GROUP_TEXT_LEN] = len(raw)
    h[L.H_GROUP_MEMBERS] = members
    h[L.H_GROUP_CHECKED] = time.time_ns() if members else 0


def _group(handle, nparts: int, damaged: list[str]) -> dict:
    """The group words, read between two looks at their version; a torn read is retried."""
    import json

    h = handle._header
    for _ in range(5):
        v = int(h[L.H_GROUP_CHECKED])
        if v <= 0:
            return {"members": None, "others": [], "elsewhere": {}, "checked_s": None}
        n = int(h[L.H_GROUP_TEXT_LEN])
        members = int(h[L.H_GROUP_MEMBERS])
        raw = _header_bytes(handle, L.H_GROUP_TEXT, L.GROUP_TEXT_MAX).tobytes()[:max(0, min(n, L.GROUP_TEXT_MAX))]
        where = _header_bytes(handle, L.H_ELSEWHERE, L.MAX_PARTITIONS)[:nparts].copy()
        if int(h[L.H_GROUP_CHECKED]) != v:
            continue
        try:
            others = json.loads(raw.decode()) if raw else []
            if not isinstance(others, list) or not all(isinstance(o, dict) for o in others):
                raise ValueError("not a list of members")
        except ValueError as e:
            damaged.append(f"group members text ({e})")
            others = []
        if not 0 <= n <= L.GROUP_TEXT_MAX:
            damaged.append(f"group text length {n} (should be 0..{L.GROUP_TEXT_MAX})")
        others = [{k: str(o.get(k, "")) for k in ("client_id", "host", "instance_id")} for o in others]
        elsewhere = {int(p): int(where[p]) - 1 for p in np.flatnonzero(where)}
        unlisted = []
        for p, i in elsewhere.items():
            if i < len(others):
                others[i].setdefault("partitions", []).append(p)
            else:
                unlisted.append(p)
        for o in others:
            o.setdefault("partitions", [])
        if unlisted:
            others.append({"client_id": "?", "host": "?", "instance_id": "", "partitions": unlisted})
        return {"members": members if members > 0 else None, "others": others, "elsewhere": elsewhere,
                "checked_s": v / 1e9}
    return {"members": None, "others": [], "elsewhere": {}, "checked_s": None}


def status(handle) -> dict:
    """Readiness and progress, from shared memory alone (no broker round trip).

    The segment is untrusted (DESIGN invariant 9): a word out of its range is named in
    "damaged" and read as nothing (no owner, no partitions), never raised on."""
    h = handle._header
    damaged: list[str] = []
    nparts = int(h[L.H_PARTITIONS])
    if not 0 <= nparts <= L.MAX_PARTITIONS:
        damaged.append(f"partition count {nparts} (should be 0..{L.MAX_PARTITIONS})")
        nparts = 0
    tlen = int(h[L.H_TOPIC_LEN])
    if not 0 <= tlen <= L.TOPIC_MAX:
        damaged.append(f"topic length {tlen} (should be 0..{L.TOPIC_MAX})")
    rows = partitions(handle)
    wrows = workers(handle)
    now = time.time_ns()
    sup = int(h[L.H_SUPERVISOR])
    # An assignment is published row by row: read the rows between two looks at the
    # rebalance count and the assigning flag, and call nothing ready across a change.
    rebalances, assigning = int(h[L.H_REBALANCES]), int(h[L.H_ASSIGNING])
    parts = []
    here = set()
    for p in range(nparts):
        r = rows[p].tolist()
        if not r[L.P_ASSIGNED]:
            continue
        owner = r[L.P_OWNER] - 1
        if not -1 <= owner < L.MAX_WORKERS:
            damaged.append(f"partition {p}: owner {owner + 1} (should be 0..{L.MAX_WORKERS})")
            owner = -1
        applied = r[L.P_APPLIED]
        latest = max(r[L.P_LATEST], r[L.P_HIGH_WATERMARK], applied)  # never shown below applied
        here.add(p)
        parts.append({
            "partition": p,
            "worker": owner if owner >= 0 else None,
            "worker_pid": liveness.word_pid(int(wrows[owner, L.K_OWNER])) if owner >= 0 else None,
            "applied": applied,
            "high_watermark": r[L.P_HIGH_WATERMARK],
            "latest": latest,
            "lag": max(0, latest - max(applied, 0)) if latest >= 0 else None,
            "committed": r[L.P_COMMITTED],
            "caught_up": bool(r[L.P_CAUGHT_UP]),
            "gap": snapshots.has_gap(h, p),  # retention deleted offsets this table never had
        })
    sup_alive = bool(sup) and liveness.is_alive(sup)
    ws = []
    for i in range(L.MAX_WORKERS):
        r = wrows[i].tolist()
        if not r[L.K_OWNER] and not r[L.K_STARTS]:
            continue
        alive = bool(r[L.K_OWNER]) and liveness.is_alive(r[L.K_OWNER])
        ws.append({
            "worker": i,
            "pid": liveness.word_pid(r[L.K_OWNER]) if r[L.K_OWNER] else None,
            "alive": alive,
            # a worker claims its row once its imports are done; until then, or after it died,
            # a running supervisor is (re)starting it
            "state": "up" if alive else "starting" if sup_alive else "stopped",
            "heartbeat_age_s": (now - r[L.K_HEARTBEAT]) / 1e9 if r[L.K_HEARTBEAT] else None,
            "starts": r[L.K_STARTS],
            "adds": r[L.K_ADDS],
            "deletes": r[L.K_DELETES],
            "messages": r[L.K_MESSAGES],
            "malformed": r[L.K_MALFORMED],
            "unknown_actions": r[L.K_UNKNOWN],
        })
    group = _group(handle, nparts, damaged) if sup_alive else {"members": None, "others": [], "elsewhere": {},
                                                                 "checked_s": None}
    settled = not assigning and not h[L.H_ASSIGNING] and int(h[L.H_REBALANCES]) == rebalances
    started = int(h[L.H_SUPERVISOR_STARTED])
    # ready means the whole topic, now (DESIGN invariant 10): every partition assigned here
    # by the live supervisor (whose start disowned every row a dead one left) and caught up
    whole = nparts > 0 and len(here) == nparts
    # while the broker does not answer, nobody can say where the topic ends: not ready
    broker = broker_mod.status_fields(h) if sup_alive else {"broker": None, "broker_waiting_s": None}
    return {
        "name": handle.name,
        "topic": topic(handle),
        "partitions": nparts,
        "supervisor_pid": liveness.word_pid(sup) if sup > 0 else None,
        "supervisor_alive": sup_alive,
        "assigned": parts,
        # partitions of the topic not assigned here; those another group member holds are
        # in "elsewhere" and under "group_others"
        "unassigned": [p for p in range(nparts) if p not in here],
        "elsewhere": sorted(p for p in group["elsewhere"] if p not in here),
        "group_members": group["members"],
        "group_others": group["others"],
        "shared_group": bool(group["others"]) or (group["members"] or 0) > 1,
        "workers": ws,
        "ready": (settled and sup_alive and whole and broker["broker"] != "waiting for the broker"
                  and all(p["caught_up"] for p in parts)),
        "assigning": not settled,
        # the last (or current) supervisor's counters, since it started
        **{k: int(h[w]) for k, w in SUPERVISOR_COUNTERS.items()},
        "supervisor_started_s": started / 1e9 if started > 0 else None,
        "metrics_port": int(h[L.H_METRICS_PORT]) if 0 < int(h[L.H_METRICS_PORT]) <= 65535 else None,
        "damaged": damaged,
        # "up", "connecting" or "waiting for the broker" (None without a live supervisor)
        **broker,
        **snapshots.status_fields(h, nparts),  # restore, snapshot, gap_partitions, gap_offsets
    }


def wait_ready(handle, timeout: float | None = None, poll: float = 0.05) -> dict:
    """Block until every partition of the topic is assigned here and caught up (DESIGN invariants 7, 10).

    Returns the status; raises CacheNotReadyError naming the lagging partitions on timeout."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        st = status(handle)
        if st["ready"]:
            return st
        if deadline is not None and time.monotonic() >= deadline:
            if not st["supervisor_alive"]:
                why = "no live supervisor"
            elif st["broker"] == "waiting for the broker":
                why = f"waiting for the Kafka broker for {st['broker_waiting_s']:.0f} s"
            elif not st["assigned"] and not st["elsewhere"]:
                why = "no partitions assigned yet"
            elif st["assigning"]:
                why = "an assignment is being published"
            elif st["unassigned"]:
                why = f"{len(st['unassigned'])} of {st['partitions']} partitions not assigned to this cache"
                if st["elsewhere"]:
                    who = ", ".join(f"{o['client_id']} on {o['host']}" for o in st["group_others"])
                    why += f" ({len(st['elsewhere'])} held by another member of the group: {who})"
            else:
                lagging = [f"{p['partition']} (lag {p['lag']})" for p in st["assigned"] if not p["caught_up"]]
                why = "partitions not caught up: " + ", ".join(lagging[:20])
            raise CacheNotReadyError(f"cache {handle.name!r} not ready after {timeout:.1f} s: {why}")
        time.sleep(poll)
