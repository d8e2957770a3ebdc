"""The fault suite (issue 10): a real broker of its own, a real `shmcache run`, a producer
streaming a seeded plan (_stream.py) and a reader process checking every value it reads,
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
import re
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import numpy as np
import psutil

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(REPO / "tests" / "consumer"))
import _stream  # noqa: E402
from _broker import Broker, alive as _alive  # noqa: E402
from _pipeline import KafkaProbe, SupervisorProc, poll_until  # noqa: E402

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
    workdir: str = ""
    verbose: bool = True

    def __post_init__(self):
        if not self.faults:
            self.faults = {k: max(1, round(n * self.minutes / 10)) for k, n in PER_10_MINUTES.items()}

    @property
    def session(self) -> float:
        return self.session_timeout or DEFAULT_SESSION_TIMEOUT


def log(cfg: Config, msg: str) -> None:
    if cfg.verbose:
        print(f"[faults {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def compare(r, plan, present: np.ndarray, seq: np.ndarray, sent: int) -> tuple[int, int, int, int, str]:
    """Every plan key looked up in the table against the model: (lost, extra, wrong, bad,
    first problem); wrong counts present keys with any other value than the model's, bad
    those of them that are no value ever written for the key (torn, foreign, unsent)."""
    lost = extra = wrong = bad = 0
    problem = ""
    for s in range(0, len(plan.keys), 100_000):
        idx = np.arange(s, min(s + 100_000, len(plan.keys)))
        p = r.get_many_packed(plan.keys[idx])
        nb, got, prob = _stream.check_values(p.found, p.offsets, p.data, idx, plan, sent)
        found = np.asarray(p.found, bool)
        lost += int((present[idx] & ~found).sum())
        extra += int((~present[idx] & found).sum())
        wrong += int((present[idx] & found & (got != seq[idx])).sum())
        bad += nb
        problem = problem or prob
    return lost, extra, wrong, bad, problem


# -- one run -------------------------------------------------------------------------------------

@dataclasses.dataclass
class Fault:
    kind: str
    at: float  # time.monotonic() the clock started
    recovery: float | None = None
    false_ready: int = 0
    note: str = ""


class Run:
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
                             sets=sets)
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

    def _live_workers(self) -> set[int]:
        out = set()
        for p in self.sup.children():
            with contextlib.suppress(psutil.Error):
                cmd = " ".join(p.cmdline())
                if "spawn_main" in cmd and "resource_tracker" not in cmd and _alive(p):
                    out.add(p.pid)
        return out

    def _wait_recovered(self, fault: Fault, names: list[str], bound: float, killed: int = 0) -> None:
        """Until each cache's CURRENT supervisor has been assigned partitions (rebalances >= 1: a
        restarted one starts from 0) and says ready, and every partition applied a message produced
        after the fault and, after a restart, a message more than it held when first assigned (so
        progress made by orphaned workers of a killed supervisor does not count).

        With two members in the group (after a join), once the partitions have moved neither
        cache holds the whole topic, so the right answer is the opposite: each says its group
        is shared and is NOT ready. (Until the move the first one still holds, and has
        applied, every partition: ready then is true, not a false claim.)"""
        shared = len(names) > 1
        target = self._ends() + 1
        based: set[str] = set()
        deadline = time.monotonic() + bound
        tick = 0
        while True:
            ok = True
            best = np.full(self.cfg.partitions, -1, np.int64)
            for n in names:
                st = self._status(n)
                sup = self.sup if n == self.name else self.sup2
                if st is None or sup is None:
                    ok = False
                    continue
                if st["ready"] and st["rebalances"] == 0:
                    fault.false_ready += 1
                settled = st["shared_group"] and not st["ready"] if shared else st["ready"]
                if not (settled and st["rebalances"] >= 1 and st["supervisor_pid"] == sup.pid):
                    ok = False
                    continue
                applied = self._applied(st)
                if n not in based:
                    based.add(n)
                    for p, a in applied.items():
                        target[p] = max(target[p], a + 1)
                for p, a in applied.items():
                    best[p] = max(best[p], a)
            want = np.minimum(target, self.producer.acked_end) if self.producer.done.is_set() else target
            if ok and killed:  # the killed worker was replaced
                live = self._live_workers()
                ok = killed not in live and len(live) == self.cfg.workers
            if ok and (best >= want).all():
                break
            if tick % 20 == 0:
                self._remember_children()
            tick += 1
            for s in (self.sup, self.sup2):
                if s is not None and not s.running() and s.proc.returncode is not None:
                    raise AssertionError(f"supervisor {s.name} exited with {s.proc.returncode} during "
                                         f"{fault.kind}:\n{s.log_text()[-3000:]}")
            if self.producer.error is not None:
                raise AssertionError(f"producer failed: {self.producer.error}")
            if time.monotonic() > deadline:
                sts = {n: self._status(n) for n in names}
                raise AssertionError(f"no recovery {bound:.0f} s after {fault.kind} (a stuck partition?): "
                                     f"target {want.tolist()}, applied "
                                     f"{ {n: self._applied(s) for n, s in sts.items()} }, ready "
                                     f"{ {n: (s or {}).get('ready') for n, s in sts.items()} }")
            time.sleep(0.05)
        fault.recovery = time.monotonic() - fault.at

    def _first_look(self, sup: SupervisorProc) -> int:
        """Status at the first moment the new supervisor's pid is in the header: 1 if it says ready
        before this supervisor was assigned anything (rebalances == 0), else 0."""
        def seen():
            st = self._status(self.name)
            return st if (st and st["supervisor_pid"] == sup.pid) or not sup.running() else None

        st = poll_until(seen, 180, "the restarted supervisor to take the cache", interval=0.005)
        return int(bool(st["ready"] and st["rebalances"] == 0 and st["supervisor_pid"] == sup.pid))

    def _worker_pids(self) -> set[int]:
        return {w["pid"] for w in self._status(self.name)["workers"] if w["pid"]}

    def _late_orphans(self, orphans: list[psutil.Process], held: np.ndarray) -> None:
        """The old workers of a SIGKILLed supervisor, stopped until the new supervisor was assigned
        and its workers applied past everything produced when they were stopped (`held`), go on
        (and find their supervisor gone): whatever they still write is stale, which the final
        comparison shows. Also counted: worker rows that no longer name their live worker once the
        orphans exited (`worker rows cleared by orphans`)."""
        def new_rows():
            kids = {p.pid for p in self.sup.children()}
            st = self._status(self.name)
            ws = st["workers"]
            applied = self._applied(st)
            return (len(ws) == self.cfg.workers and all(w["pid"] in kids and w["alive"] for w in ws)
                    and st["rebalances"] >= 1 and all(applied.get(p, -1) >= held[p] for p in range(len(held))))

        poll_until(lambda: new_rows() or not self.sup.running(), 120 + 2 * self.cfg.session,
                   "the new workers to apply past the stopped orphans")
        for w in orphans:
            with contextlib.suppress(psutil.NoSuchProcess):
                w.resume()
        poll_until(lambda: not any(_alive(w) for w in orphans), 60, "the orphaned workers to exit")
        kids = {p.pid for p in self.sup.children()}
        cleared = sum(1 for w in self._status(self.name)["workers"] if not (w["pid"] in kids and w["alive"]))
        self.counts["worker rows cleared by orphans"] = self.counts.get("worker rows cleared by orphans", 0) + cleared

    def _repaired(self) -> int:
        """Buckets the current supervisor repaired after a worker died holding their locks."""
        return sum(int(n) for n in re.findall(r"repaired (\d+) buckets the dead worker", self.sup.log_text()))

    def _worker(self) -> tuple[psutil.Process, list[int]]:
        """A live worker of the current supervisor and the partitions status says it owns. A
        worker's row can name no pid (see the report of issue 10's suite: an orphaned worker
        that exits late clears the row its successor claimed); then any worker, all partitions."""
        st = self._status(self.name)
        kids = {}
        for p in self.sup.children():
            with contextlib.suppress(psutil.Error):
                cmd = " ".join(p.cmdline())
                if "spawn_main" in cmd and "resource_tracker" not in cmd:
                    kids[p.pid] = p
        if not kids:
            raise AssertionError(f"supervisor {self.sup.pid} has no worker process")
        named = sorted({a["worker_pid"] for a in st["assigned"] if a["worker_pid"] in kids})
        if named:
            pid = self.rng.choice(named)
            return kids[pid], [a["partition"] for a in st["assigned"] if a["worker_pid"] == pid]
        return kids[self.rng.choice(sorted(kids))], [a["partition"] for a in st["assigned"]]

    # -- faults --------------------------------------------------------------------------------

    def fault(self, kind: str) -> Fault:
        cfg = self.cfg
        bound = 120 + 2 * cfg.session
        names = [self.name]
        f = Fault(kind, time.monotonic())
        repaired_before = self._repaired()
        if kind == "worker_kill":
            w, _ = self._worker()
            f.at = time.monotonic()
            with contextlib.suppress(psutil.NoSuchProcess):
                w.kill()
        elif kind == "worker_kill_catchup":
            w, mine = self._worker()
            with contextlib.suppress(psutil.NoSuchProcess):
                w.suspend()
            try:
                want = self.producer.burst(max(2000, int(cfg.entries * cfg.burst_share)))
                poll_until(lambda: self.producer.sent >= want or self.producer.done.is_set(), 120,
                           "the burst to be sent")
                msgs = len(self.producer.msg_entries)
                poll_until(lambda: self.producer.acked >= msgs or self.producer.error is not None, 120,
                           "the burst to be acknowledged")
                before = self._applied(self._status(self.name))
            finally:
                with contextlib.suppress(psutil.NoSuchProcess):
                    w.resume()
            ends = self._ends()

            def applying():
                now = self._applied(self._status(self.name))
                return (any(now.get(p, -1) > before.get(p, -1) for p in mine) or not _alive(w)
                        or all(now.get(p, -1) >= ends[p] for p in mine))  # nothing was left to apply

            poll_until(applying, 60, "the stopped worker to apply again")
            time.sleep(self.rng.uniform(0, 0.05))  # a random moment of the catch-up
            ends = self._ends()
            applied = self._applied(self._status(self.name))
            f.note = f"lag {sum(max(0, int(ends[p]) - applied.get(p, 0)) for p in mine)}"
            f.at = time.monotonic()
            with contextlib.suppress(psutil.NoSuchProcess):
                w.kill()
        elif kind in ("sup_term", "sup_kill"):
            self._remember_children()
            orphans, held = [], None
            if kind == "sup_kill" and cfg.late_orphans:
                # a burst, and once the workers apply it they are stopped (most likely inside a
                # consumed batch) and go on only after the new workers applied past them
                want = self.producer.burst(max(2000, int(cfg.entries * cfg.burst_share)))
                poll_until(lambda: self.producer.sent >= want or self.producer.done.is_set(), 120,
                           "the burst to be sent")
                before = self._applied(self._status(self.name))
                ends = self._ends()

                def applying():
                    now = self._applied(self._status(self.name))
                    return (any(a > before.get(p, -1) for p, a in now.items())
                            or all(now.get(p, -1) >= ends[p] for p in range(cfg.partitions)))

                poll_until(applying, 60, "the workers to apply the burst")
                orphans = [w for w in self.sup.children() if w.pid in self._worker_pids()]
                for w in orphans:
                    with contextlib.suppress(psutil.NoSuchProcess):
                        w.suspend()
                held = self._ends()
            self.sup.signal(signal.SIGTERM if kind == "sup_term" else signal.SIGKILL)
            code = self.sup.wait(cfg.session + 90)
            if kind == "sup_term" and code != 0:
                self.failures.append(f"supervisor SIGTERM: exit code {code}, not 0")
            if code is None:
                self.sup.kill()
                self.failures.append("supervisor did not exit after SIGTERM")
            self.sup = self._start_sup(self.name)
            f.false_ready += self._first_look(self.sup)
            if orphans:
                self._late_orphans(orphans, held)
        elif kind in ("broker_term", "broker_kill", "broker_outage"):
            self.broker.signal(signal.SIGTERM if kind == "broker_term" else signal.SIGKILL)
            down = time.monotonic()
            if kind == "broker_outage":
                time.sleep(cfg.session + 3)  # the fault: away for longer than the session timeout
            self.broker.start()
            f.note = f"down {time.monotonic() - down:.1f} s"
            f.at = time.monotonic()
        elif kind == "member_join":
            self.sup2 = self._start_sup(self.name2)
            names = [self.name, self.name2]
        elif kind == "member_leave":
            self._remember_children()
            self.sup2.signal(signal.SIGTERM)
            code = self.sup2.wait(cfg.session + 90)
            if code != 0:
                self.failures.append(f"second member SIGTERM: exit code {code}, not 0")
            self.sup2.reap_children(30)
            self.sup2 = None
        else:
            raise ValueError(f"unknown fault kind {kind!r}")
        self._wait_recovered(f, names, bound, killed=w.pid if kind.startswith("worker_kill") else 0)
        if kind.startswith("worker_kill"):
            n = self._repaired() - repaired_before
            f.note += f"{', ' if f.note else ''}{n} locked buckets repaired"
        if kind == "member_join":  # the join took partitions from the first member
            st = self._status(self.name)
            f.note = f"first member kept {len(st['assigned'])} of {cfg.partitions} partitions"
        if kind == "member_leave":
            self._close_reader(self.name2)
            self._destroy(self.name2)
        log(cfg, f"{kind}: recovered in {f.recovery:.2f} s {f.note}"
            + (f" (ready claimed without an assignment in {f.false_ready} samples)" if f.false_ready else ""))
        return f

    # -- the run -------------------------------------------------------------------------------

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
        from shmcache.consumer import topics

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
            [sys.executable, str(HERE / "_stream.py"), "reader", str(self.plan_path), self.name,
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

    def check_table(self, r) -> None:
        pr = self.producer
        plan = self.plan
        if min(pr.msg_offset, default=0) < 0:
            self.failures.append("a message has no delivery report")
            return
        part = np.array(pr.msg_part, np.int64)
        off = np.array(pr.msg_offset, np.int64)
        # Kafka keeps each partition in the order sent (idempotent producer): check, then trust offsets
        reordered = sum(int((np.diff(off[part == p]) <= 0).sum()) for p in range(self.cfg.partitions))
        if reordered:
            self.failures.append(f"{reordered} messages landed out of send order")
        present, seq = _stream.model(plan, pr.msg_entries, part, off, pr.malformed)
        np.savez(self.dir / "delivered.npz", part=part, off=off, sizes=[len(e) for e in pr.msg_entries],
                 entries=np.concatenate(pr.msg_entries))  # for a post-mortem
        lost, extra, wrong, bad, problem = compare(r, plan, present, seq, plan.entries)
        if lost or extra or wrong:
            problem += "; " + self._explain(r, present, seq, part, off)
        ev = r.stats()["evictions"]
        self.counts.update({"keys": len(plan.keys), "expected present": int(present.sum()), "lost": lost,
                            "extra": extra, "wrong": wrong, "evictions": ev})
        if lost or extra or wrong:
            self.failures.append(f"table != model: {lost} lost, {extra} extra, {wrong} wrong values "
                                 f"({bad} not a value ever written for its key) {problem}")
        if ev:
            self.failures.append(f"{ev} evictions (the cache is too small for the check)")

    def _explain(self, r, present, seq, part, off) -> str:
        """Up to 8 keys that differ: the model's entry and the one found, with partition and offset."""
        pr, plan = self.producer, self.plan
        msg_of = np.empty(plan.entries, np.int64)
        for m, e in enumerate(pr.msg_entries):
            msg_of[e] = m
        out = []
        for s in range(0, len(plan.keys), 100_000):
            idx = np.arange(s, min(s + 100_000, len(plan.keys)))
            p = r.get_many_packed(plan.keys[idx])
            _, got, _ = _stream.check_values(p.found, p.offsets, p.data, idx, plan, plan.entries)
            found = np.asarray(p.found, bool)
            diff = np.flatnonzero((present[idx] != found) | (present[idx] & (got != seq[idx])))
            for j in diff[:8 - len(out)].tolist():
                k = int(idx[j])
                last = int(np.flatnonzero(plan.entry_key == k)[-1])

                def where(q):
                    return "-" if q < 0 else f"seq {q} (p{part[msg_of[q]]}@{off[msg_of[q]]})"
                out.append(f"key {k}: want {'absent' if not present[k] else where(int(seq[k]))}, "
                           f"got {'absent' if not found[j] else where(int(got[j]))}, last entry {where(last)} "
                           f"{'ADD' if plan.entry_action[last] == _stream.ADD else 'DELETE'}")
            if len(out) >= 8:
                break
        return "; ".join(out)

    def check_logs(self) -> None:
        pr = self.producer
        want = {(pr.msg_part[m], pr.msg_offset[m]) for m in pr.malformed}
        pat = re.compile(r"malformed message " + re.escape(self.topic) + r" \[(\d+)\] @ (\d+)")
        got = set()
        text = ""
        for s in self.sups:
            if s.name == self.name:
                t = s.log_text()
                text += t
                got |= {(int(a), int(b)) for a, b in pat.findall(t)}
        self.counts["malformed sent"] = len(want)
        self.counts["malformed logged at their offsets"] = len(want & got)
        if got != want:
            self.failures.append(f"malformed messages: sent at {sorted(want)}, logged at {sorted(got)}")
        all_logs = "".join(s.log_text() for s in self.sups)
        self.counts["buckets repaired after kills"] = sum(int(n) for n in re.findall(r"repaired (\d+) buckets", all_logs))
        self.counts["commit failures logged"] = len(re.findall(r"commit of .* failed", all_logs))
        self.counts["tracebacks logged"] = all_logs.count("Traceback (most recent call last)")
        self.counts["EOFError tracebacks"] = len(re.findall(r"^EOFError", all_logs, re.M))

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
