"""Where a worker's time goes: wall-clock counters per phase of its loop, logged once when
it stops, for bench/test_consume.py's breakdown (bench/README.md).

Phases, each the wall time of one step of `Worker.run`, summed over the loop:
- fetch:   `consumer.consume()` calls that returned messages (librdkafka hands over
           what its fetcher thread queued; includes the wait when the queue ran dry);
- idle:    `consume()` calls that returned nothing (caught up, or waiting for data);
- decode:  checking the messages and decoding them into arrays (formats/wire.py);
- apply:   `Writer.apply` of the decoded entries (hash, lock, copy into the table);
- publish: applied offsets, watermarks, heartbeat, flow control, the command pipe.
Beside them, CPU seconds: the worker's main thread (all of the above that is not
waiting) and the whole process (the difference is librdkafka's own threads: fetching
and parsing responses). A few clock reads per consume() call, not per message.

The log line (parsed by bench/test_consume.py's `parse_profiles`; keep them in step):
    worker 0 profile: fetch 1.234 s, idle 0.5 s, decode ... ; cpu main 3.2 s, process 4.1 s; 1200 messages, 1228800 entries in 30 batches
"""

from __future__ import annotations

import logging
import os
import time

PHASES = ("fetch", "idle", "decode", "apply", "publish")

log = logging.getLogger("shmcache.worker")


class Profile:
    __slots__ = ("ns", "messages", "entries", "batches", "_t")

    def __init__(self) -> None:
        self.ns = dict.fromkeys(PHASES, 0)
        self.messages = self.entries = self.batches = 0
        self._t = time.perf_counter_ns()

    def mark(self, phase: str | None = None) -> None:
        """Charge the time since the last mark to `phase` (None: to nothing)."""
        now = time.perf_counter_ns()
        if phase is not None:
            self.ns[phase] += now - self._t
        self._t = now

    def report(self, index: int) -> None:
        times = os.times()
        phases = ", ".join(f"{p} {self.ns[p] / 1e9:.3f} s" for p in PHASES)
        log.info("worker %d profile: %s; cpu main %.3f s, process %.3f s; %d messages, %d entries in %d batches",
                 index, phases, time.thread_time(), times.user + times.system,
                 self.messages, self.entries, self.batches)
