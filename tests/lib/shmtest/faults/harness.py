"""The fault suite (issue 10): a real broker of its own, a real `shmcache run`, a producer
streaming a seeded plan (shmtest/faults/stream.py) and a reader process checking every value it reads,
while faults are injected at seeded random moments; at the end the table is compared with
the model of what was produced, and recovery times are tabulated (reported, never asserted).

Faults (each waits for recovery before the next; the clock starts at the fault, or for
broker faults when the broker answers again):
  worker_kill          SIGKILL of a worker that owns partitions
  worker_kill_catchup  a worker is stopped (SIGSTOP) while a burst is produced, continued,
                       and SIGKILLed once it applies again (mid catch-up; the supervisor's
                       "repaired N buckets" log line counts kills that held a bucket lock)
  sup_term / sup_kill  SIGTERM (must exit 0) / SIGKILL of the supervisor only, and a restart
                       with the same arguments
  broker_term / broker_kill   SIGTERM / SIGKILL of the broker, restart on the same port and data
  broker_outage        SIGKILL of the broker, restart after longer than the session timeout
  member_join / member_leave  a second `shmcache run` (its own cache) joins the group, then
                       leaves it with SIGTERM (must exit 0)
Recovered = the cache's current supervisor has been assigned partitions (rebalances >= 1) and
says ready, and every partition applied a message produced after the fault (join: the two
caches together; after a restart also one more than it held when first assigned, so that
orphaned workers' progress does not count). `false_ready` counts looks (the first one right
after a restart, then every 50 ms) where a supervisor not yet assigned anything says ready.
With `late_orphans` (--late-orphans), a sup_kill stops the workers while they apply a burst
and lets them go on only after the new workers applied past them (a descheduled orphan).

Asserted at the end (AssertionError listing every failure): the producer had no failed
delivery; the reader saw no torn, foreign or never-written value; the table equals the model
(lost / extra / wrong = 0, no eviction); every malformed message was logged at its exact
offset and nothing else was; committed == end offsets (running and after the final SIGTERM,
which exits 0); every recovery happened within its bound; no process or segment is left.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import numpy as np
import psutil

from shmtest.faults import stream as _stream
from shmtest.faults.checks import Checks, compare  # noqa: F401 (compare: test_faults.py)
from shmtest.faults.inject import Fault, Injector, log  # noqa: F401
from shmtest.pods import pod
from shmtest.faults.broker import Broker, alive as _alive
from shmtest.supervisors import SupervisorProc
from shmtest.topic_model import KafkaProbe
from shmtest.waits import poll_until

KINDS = ("worker_kill", "worker_kill_catchup", "sup_term", "sup_kill", "broker_term", "broker_kill",
         "broker_outage", "member_join", "member_leave")
DEFAULT_SESSION_TIMEOUT = 45.0  # librdkafka's session.timeout.ms
# The default faults of a 10-minute run; shorter or longer runs scale them (at least 1 each).
PER_10_MINUTES = {"worker_kill": 4, "worker_kill_catchup": 4, "sup_term": 2, "sup_kill": 2, "broker_term": 1,
                  "broker_kill": 1, "broker_outage": 1, "member_join": 1}


@dataclasses.dataclass
class Config:
    entries: int = 2_000_000
    minutes: float = 10.0
    format: str = "v1"
    seed: int = 1
    partitions: int = 8
    workers: int = 2
    batch: int = 0  # entries per batch (mean); 0 = about 5 messages/s per partition
    malformed: int = 6
    lookups_per_s: float = 100_000
    session_timeout: float = 0.0  # seconds; 0 = librdkafka's default (45 s)
    faults: dict = dataclasses.field(default_factory=dict)  # kind -> count; empty: per_10_minutes scaled
    burst_share: float = 0.05  # entries a burst sends ahead (catch-up kills, late orphans), of all
    skip_after_end: bool = True  # no fault once the stream ended (the smoke injects them all anyway)
    late_orphans: bool = False  # sup_kill: the old workers go on only after the new ones started
    # each supervisor pid 1 of a pod of its own (tests/lib/shmtest/pods.py: PID and mount namespaces),
    # as a DaemonSet runs it; the reader and the checks stay in this namespace. A sup_kill there
    # kills the whole pod (no orphans: late_orphans does not apply)
    pod: bool = False
    workdir: str = ""
    verbose: bool = True

    def __post_init__(self):
        if self.pod and self.late_orphans:
            raise ValueError("late_orphans needs the workers to outlive their supervisor, which a pod does not allow")
        if not self.faults:
            self.faults = {k: max(1, round(n * self.minutes / 10)) for k, n in PER_10_MINUTES.items()}

    @property
    def session(self) -> float:
        return self.session_timeout or DEFAULT_SESSION_TIMEOUT


# -- one run -------------------------------------------------------------------------------------

class Run(Injector, Checks):
    """One fault run: setup, the faults (shmtest/faults/inject.py), the checks at the end (shmtest/faults/checks.py), teardown."""

    def __init__(self, cfg: Config):
        self.cfg = cfg
        self.rng = random.Random(cfg.seed)
        self.tag = f"flt-{uuid.uuid4().hex[:8]}"
        self.dir = Path(cfg.workdir or f"/tmp/{self.tag}")
        self.dir.mkdir(parents=True, exist_ok=True)
        self.name, self.name2 = f"{self.tag}-a", f"{self.tag}-b"
        self.topic, self.group = f"{self.tag}-topic", f"{self.tag}-group"
        self.broker = Broker(self.dir / "kafka")
        self.sups: list[SupervisorProc] = []  # every incarnation, both members
        self.sup: SupervisorProc | None = None
        self.sup2: SupervisorProc | None = None
        self.reader_proc: subprocess.Popen | None = None
        self.reader_stats: dict = {}
        self.producer: _stream.StreamProducer | None = None
        self.cache = None
        self.faults: list[Fault] = []
        self.failures: list[str] = []
        self.counts: dict = {}
        self.readers: dict = {}  # cache name -> Reader, for status()
        self.seen: dict[int, psutil.Process] = {}  # every supervisor and descendant ever seen

    # -- plumbing ------------------------------------------------------------------------------

    def _start_sup(self, name: str) -> SupervisorProc:
        cfg = self.cfg
        n = sum(s.name == name for s in self.sups)
        sets = (f"session.timeout.ms={int(cfg.session_timeout * 1000)}",) if cfg.session_timeout else ()
        sup = SupervisorProc(self.dir / f"{name}-{n}.log", name, self.broker.bootstrap, self.topic, self.group,
                             workers=cfg.workers, fmt=cfg.format, memory=self.memory, commit_interval=0.5,
                             sets=sets, wrap=pod if cfg.pod else None)
        self.sups.append(sup)
        sup.start()
        self.seen[sup.pid] = psutil.Process(sup.pid)
        return sup

    def _status(self, name: str) -> dict | None:
        """The cache's status, from a Reader kept per cache (the segment outlives supervisors)."""
        import shmcache

        r = self.readers.get(name)
        if r is None:
            try:
                r = self.readers[name] = shmcache.attach(name)
            except (FileNotFoundError, shmcache.ShmcacheError):
                return None
        return r.status()

    def _close_reader(self, name: str) -> None:
        r = self.readers.pop(name, None)
        if r is not None:
            r.close()

    def _applied(self, st: dict | None) -> dict[int, int]:
        return {a["partition"]: a["applied"] for a in (st or {}).get("assigned", [])}

    def _remember_children(self) -> None:
        for s in (self.sup, self.sup2):
            if s is not None and s.running():
                for p in s.children():
                    self.seen.setdefault(p.pid, p)

    def _ends(self) -> np.ndarray:
        return self.producer.acked_end.copy()

    @staticmethod
    def expand(faults: dict, shuffle=None) -> list[str]:
        """The faults to inject, in a (seeded) random order; a join is followed by its leave."""
        kinds = []
        for k, n in faults.items():
            if k == "member_join":
                kinds += ["member"] * n
            elif k != "member_leave":
                kinds += [k] * n
        if shuffle is not None:
            shuffle(kinds)
        out = []
        for k in kinds:
            out += ["member_join", "member_leave"] if k == "member" else [k]
        return out

    def schedule(self) -> list[str]:
        return self.expand(self.cfg.faults, self.rng.shuffle)

    def setup(self) -> None:
        cfg = self.cfg
        from shmcache.kafka import topics

        batch = cfg.batch or max(8, int(cfg.entries / (cfg.minutes * 60) / (cfg.partitions * 5)))
        log(cfg, f"seed {cfg.seed}: planning {cfg.entries:,} {cfg.format} entries in batches of ~{batch}")
        self.plan = _stream.make_plan(cfg.format, cfg.partitions, cfg.entries, cfg.seed, batch, cfg.malformed)
        self.plan_path = self.dir / "plan.npz"
        self.plan.save(self.plan_path)
        adds = int((self.plan.entry_action == _stream.ADD).sum())
        self.memory = f"{max(64, adds * 512 // (1 << 20) + 1)}MiB"
        self.broker.start()
        log(cfg, f"broker {self.broker.bootstrap} (pid {self.broker.proc.pid}), dir {self.dir}")
        topics.create_topic(self.broker.bootstrap, self.topic, cfg.partitions)
        self.sup = self._start_sup(self.name)
        self.progress_path = str(self.dir / "progress")
        self.producer = _stream.StreamProducer(self.plan, self.broker.bootstrap, self.topic, cfg.minutes * 60,
                                               self.progress_path)
        self.stop_path = self.dir / "reader.stop"
        self.reader_proc = subprocess.Popen(
            [sys.executable, "-P", "-m", "shmtest.faults.stream", "reader", str(self.plan_path), self.name,
             self.progress_path, str(self.stop_path), str(cfg.lookups_per_s)],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=open(self.dir / "reader.log", "wb"), text=True)
        threading.Thread(target=self._read_reader, daemon=True).start()
        poll_until(lambda: (self._status(self.name) or {}).get("ready") or not self.sup.running(), 180,
                   "the cache to be ready")
        assert self.sup.running(), f"supervisor exited:\n{self.sup.log_text()[-3000:]}"
        self.producer.start()

    def _read_reader(self) -> None:
        for line in self.reader_proc.stdout:
            with contextlib.suppress(ValueError):
                self.reader_stats = json.loads(line)

    def inject(self) -> None:
        cfg = self.cfg
        kinds = self.schedule()
        span = cfg.minutes * 60 * 0.8
        t0 = self.producer.started
        for i, kind in enumerate(kinds):
            at = max(t0 + (i + self.rng.uniform(0.2, 0.8)) * span / len(kinds), time.monotonic() + 1.0)
            while time.monotonic() < at and not self.producer.done.is_set():
                self._remember_children()
                time.sleep(0.1)
            if self.producer.done.is_set() and cfg.skip_after_end and kind != "member_leave":
                # recovery means progress of a flowing stream: no fault after it ended
                self.counts["faults skipped (the stream had ended)"] = len(kinds) - i
                log(cfg, f"the stream ended: {len(kinds) - i} faults not injected")
                break
            log(cfg, f"fault {i + 1}/{len(kinds)}: {kind}")
            self.faults.append(self.fault(kind))

    def finish(self) -> None:
        cfg = self.cfg
        import shmcache

        poll_until(lambda: self.producer.done.is_set(), cfg.minutes * 60 + 600, "the producer to finish")
        if self.producer.error is not None:
            self.failures.append(f"producer: {self.producer.error}")
            return
        ends = self._ends()
        probe = KafkaProbe(self.broker.bootstrap, self.topic, cfg.partitions, group=self.group)
        try:
            assert probe.end_offsets() == ends.tolist(), (probe.end_offsets(), ends.tolist())
            poll_until(lambda: (st := self._status(self.name)) and st["ready"] and all(
                self._applied(st).get(p, -1) >= ends[p] for p in range(cfg.partitions)), 300,
                lambda: f"every partition applied to its end {ends.tolist()}: {self._applied(self._status(self.name))}")
            poll_until(lambda: probe.committed() == ends.tolist(), 120,
                       lambda: f"committed {probe.committed()} to equal the end offsets {ends.tolist()}")
            self.stop_reader()
            with shmcache.attach(self.name) as r:
                self.check_table(r)
            self._remember_children()
            self.sup.signal(signal.SIGTERM)
            code = self.sup.wait(120)
            if code != 0:
                self.failures.append(f"final SIGTERM: supervisor exit code {code}, not 0")
            committed = probe.committed()
            if committed != ends.tolist():
                self.failures.append(f"after the final SIGTERM committed {committed} != end offsets {ends.tolist()}")
        finally:
            probe.close()
        self.check_logs()

    def stop_reader(self) -> None:
        self.stop_path.touch()
        try:
            self.reader_proc.wait(60)
        except subprocess.TimeoutExpired:
            self.reader_proc.kill()
            self.failures.append("reader did not stop")
        deadline = time.monotonic() + 10
        while not self.reader_stats.get("final") and time.monotonic() < deadline:
            time.sleep(0.05)
        st = self.reader_stats
        self.counts["reads"] = st.get("lookups", 0)
        self.counts["read hits"] = st.get("hits", 0)
        self.counts["bad reads"] = st.get("bad", 0)
        if not st.get("final"):
            self.failures.append(f"the reader gave no final count (exit {self.reader_proc.returncode}); "
                                 f"see {self.dir / 'reader.log'}")
        if st.get("bad"):
            self.failures.append(f"reader: {st['bad']} torn, foreign or never-written values: {st['problems']}")
        if not st.get("hits"):
            self.failures.append("reader: no hit at all (it checked nothing)")

    def _destroy(self, name: str) -> None:
        import shmcache

        with contextlib.suppress(FileNotFoundError, shmcache.ShmcacheError):
            shmcache.destroy(name)

    def teardown(self) -> None:
        """Stop everything we started (by pid), remove the segments; record what was left."""
        if self.producer is not None:
            self.producer.close()
        if self.reader_proc is not None and self.reader_proc.poll() is None:
            self.stop_path.touch()
            try:
                self.reader_proc.wait(30)
            except subprocess.TimeoutExpired:
                self.reader_proc.kill()
        self._remember_children()
        for s in self.sups:  # a run cut short leaves the current supervisors running
            if s.running():
                s.cleanup()
        seen = list(self.seen.values())
        # orphaned workers of SIGKILLed supervisors must exit on their own
        deadline = time.monotonic() + 60
        while any(_alive(p) for p in seen) and time.monotonic() < deadline:
            time.sleep(0.1)
        left = [p.pid for p in seen if _alive(p)]
        for s in self.sups:
            s.cleanup()  # closes the log files; kills what it remembers, if anything is left
        for p in seen:
            with contextlib.suppress(psutil.Error):
                if _alive(p):
                    p.kill()
        self.broker.stop()
        deadline = time.monotonic() + 30
        while any(_alive(p) for p in self.broker.seen) and time.monotonic() < deadline:
            time.sleep(0.1)
        left += [p.pid for p in self.broker.seen if _alive(p)]
        if left:
            self.failures.append(f"processes left running: {left}")
        for n in (self.name, self.name2):
            self._close_reader(n)
            self._destroy(n)
        shm = [e for e in os.listdir("/dev/shm") if self.tag in e]
        if shm:
            self.failures.append(f"segments left in /dev/shm: {shm}")

    def run(self) -> dict:
        t0 = time.monotonic()
        try:
            self.setup()
            self.inject()
            self.finish()
        except AssertionError as e:
            self.failures.append(str(e))
        finally:
            self.teardown()
        self.counts["seconds"] = round(time.monotonic() - t0, 1)
        return self.result()

    def result(self) -> dict:
        by: dict[str, list[float]] = {}
        for f in self.faults:
            if f.recovery is not None:
                by.setdefault(f.kind, []).append(f.recovery)
        return {"config": dataclasses.asdict(self.cfg), "dir": str(self.dir), "tag": self.tag,
                "faults": [dataclasses.asdict(f) | {"at": None} for f in self.faults],
                "recovery": {k: sorted(v) for k, v in by.items()},
                "false_ready": {k: sum(f.false_ready for f in self.faults if f.kind == k) for k in KINDS},
                "counts": self.counts, "failures": self.failures}
