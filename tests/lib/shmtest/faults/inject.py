"""The fault suite's injections and the wait for recovery: methods of _harness.Run (a mixin)."""

from __future__ import annotations

import contextlib
import dataclasses
import re
import signal
import sys
import time

import numpy as np
import psutil

from shmtest.faults.broker import alive as _alive
from shmtest.pods import ns_pid
from shmtest.supervisors import SupervisorProc
from shmtest.waits import poll_until


def log(cfg, msg: str) -> None:
    if cfg.verbose:
        print(f"[faults {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


@dataclasses.dataclass
class Fault:
    kind: str
    at: float  # time.monotonic() the clock started
    recovery: float | None = None
    false_ready: int = 0
    note: str = ""


class Injector:
    def _live_workers(self) -> set[int]:
        return {p.pid for p in self.sup.workers() if _alive(p)}

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
                if not (settled and st["rebalances"] >= 1 and st["supervisor_pid"] == sup.status_pid):
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
            return st if (st and st["supervisor_pid"] == sup.status_pid) or not sup.running() else None

        st = poll_until(seen, 180, "the restarted supervisor to take the cache", interval=0.005)
        return int(bool(st["ready"] and st["rebalances"] == 0 and st["supervisor_pid"] == sup.status_pid))

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
        kids = {ns_pid(p): p for p in self.sup.workers()}  # by the pids rows hold: their own namespace's
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
