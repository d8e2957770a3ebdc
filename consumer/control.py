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
from shmcache.engine import layout as L
from shmcache.errors import CacheNotReadyError
from shmcache.ipc import liveness

STALE_HEARTBEAT_S = 10.0


def partitions(handle) -> np.ndarray:
    return handle._partitions.reshape(L.MAX_PARTITIONS, L.ROW_WORDS)


def workers(handle) -> np.ndarray:
    return handle._workers.reshape(L.MAX_WORKERS, L.ROW_WORDS)


def topic(handle) -> str:
    n = int(handle._header[L.H_TOPIC_LEN])
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
    "rebalances": L.H_REBALANCES,
    "partitions_lost": L.H_PARTITIONS_LOST,
}


def reset_supervisor(handle, metrics_port: int = 0) -> None:
    """A supervisor starts: its counters count from zero (as the worker rows do)."""
    h = handle._header
    for word in SUPERVISOR_COUNTERS.values():
        h[word] = 0
    h[L.H_ASSIGNING] = 0  # a supervisor killed mid-assignment may have left it set
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


def status(handle) -> dict:
    """Readiness and progress, from shared memory alone (no broker round trip)."""
    h = handle._header
    nparts = int(h[L.H_PARTITIONS])
    rows = partitions(handle)
    wrows = workers(handle)
    now = time.time_ns()
    sup = int(h[L.H_SUPERVISOR])
    # An assignment is published row by row: read the rows between two looks at the
    # rebalance count and the assigning flag, and call nothing ready across a change.
    rebalances, assigning = int(h[L.H_REBALANCES]), int(h[L.H_ASSIGNING])
    parts = []
    for p in range(min(nparts, L.MAX_PARTITIONS)):
        r = rows[p].tolist()
        if not r[L.P_ASSIGNED]:
            continue
        owner = r[L.P_OWNER] - 1
        applied = r[L.P_APPLIED]
        latest = max(r[L.P_LATEST], r[L.P_HIGH_WATERMARK], applied)  # never shown below applied
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
    settled = not assigning and not h[L.H_ASSIGNING] and int(h[L.H_REBALANCES]) == rebalances
    started = int(h[L.H_SUPERVISOR_STARTED])
    return {
        "name": handle.name,
        "topic": topic(handle),
        "partitions": nparts,
        "supervisor_pid": liveness.word_pid(sup) if sup else None,
        "supervisor_alive": sup_alive,
        "assigned": parts,
        "workers": ws,
        "ready": settled and sup_alive and bool(parts) and all(p["caught_up"] for p in parts),
        "assigning": not settled,
        # the last (or current) supervisor's counters, since it started
        **{k: int(h[w]) for k, w in SUPERVISOR_COUNTERS.items()},
        "supervisor_started_s": started / 1e9 if started else None,
        "metrics_port": int(h[L.H_METRICS_PORT]) or None,
        # "up", "connecting" or "waiting for the broker" (None without a live supervisor)
        **(broker_mod.status_fields(h) if sup_alive else {"broker": None, "broker_waiting_s": None}),
    }


def wait_ready(handle, timeout: float | None = None, poll: float = 0.05) -> dict:
    """Block until every partition assigned to this node is caught up (DESIGN invariant 7).

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
            elif not st["assigned"]:
                why = "no partitions assigned yet"
            elif st["assigning"]:
                why = "an assignment is being published"
            else:
                lagging = [f"{p['partition']} (lag {p['lag']})" for p in st["assigned"] if not p["caught_up"]]
                why = "partitions not caught up: " + ", ".join(lagging[:20])
            raise CacheNotReadyError(f"cache {handle.name!r} not ready after {timeout:.1f} s: {why}")
        time.sleep(poll)
