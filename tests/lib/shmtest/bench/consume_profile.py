"""Where the time of bench/test_consume.py's consumers goes.

- The workers' own phase counters (consumer/worker/profile.py), from the line each
  worker logs when it stops: wall seconds in fetch, decode, apply and publish, summed
  over a run's workers.
- CPU seconds of every process involved, taken with psutil at the first applied
  entry and at caught up, so they cover the catch-up window only: the workers' main
  threads (decode, apply, publish, Python), the workers' other threads (librdkafka:
  fetching, parsing responses, copying messages), the supervisor, the broker, and for
  the in-process peers the benchmark process itself.
"""

from __future__ import annotations

import re

import psutil

from shmcache.consumer.worker.profile import PHASES

_LINE = re.compile(r"worker (\d+) profile: (?P<phases>.*?); cpu main (?P<main>[\d.]+) s, process (?P<proc>[\d.]+) s; "
                   r"(?P<messages>\d+) messages, (?P<entries>\d+) entries in (?P<batches>\d+) batches")
_PHASE = re.compile(r"(\w+) ([\d.]+) s")


def parse_profiles(text: str) -> dict | None:
    """The workers' profile lines of one run's log, summed (None if there are none)."""
    total: dict | None = None
    for m in _LINE.finditer(text):
        one = {k: float(v) for k, v in _PHASE.findall(m["phases"])}
        one.update(cpu_main=float(m["main"]), cpu_process=float(m["proc"]),
                   messages=int(m["messages"]), entries=int(m["entries"]), batches=int(m["batches"]), workers=1)
        if total is None:
            total = dict.fromkeys(one, 0)
        for k, v in one.items():
            total[k] += v
    return total


def _cpu(p: psutil.Process) -> tuple[float, float]:
    """(main thread, other threads) CPU seconds of a live process; (0, 0) if it is gone."""
    try:
        main = other = 0.0
        for t in p.threads():
            if t.id == p.pid:
                main += t.user_time + t.system_time
            else:
                other += t.user_time + t.system_time
        return main, other
    except psutil.Error:
        return 0.0, 0.0


def cpu_snapshot(roles: dict[str, list[psutil.Process]]) -> dict[str, float]:
    """CPU seconds per role, split into `<role> main` and `<role> threads`."""
    out: dict[str, float] = {}
    for role, procs in roles.items():
        main = other = 0.0
        for p in procs:
            a, b = _cpu(p)
            main, other = main + a, other + b
        out[f"{role} main"], out[f"{role} threads"] = main, other
    return out


# CPU times tick in 10 ms: over a shorter window the cores busy are noise. A smoke run's
# catch-up can take no measurable time at all, and the table once showed 10,000,000 cores
MIN_WINDOW_S = 0.5


def cores(before: dict[str, float], after: dict[str, float], seconds: float) -> dict[str, float]:
    """CPU cores each role kept busy over a window of `seconds` (CPU seconds / seconds); none
    (an empty dict: blank columns) over a window shorter than MIN_WINDOW_S."""
    if seconds < MIN_WINDOW_S:
        return {}
    return {k: (after[k] - before.get(k, 0.0)) / seconds for k in after}


def phase_shares(prof: dict) -> dict[str, float]:
    """Each phase's share of the workers' busy loop time (fetch + decode + apply + publish)."""
    busy = sum(prof.get(p, 0.0) for p in PHASES if p != "idle")
    return {p: prof.get(p, 0.0) / busy if busy else 0.0 for p in PHASES if p != "idle"}
