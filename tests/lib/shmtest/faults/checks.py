"""The fault suite's checks at the end of a run (the table against the model, the logs):
methods of _harness.Run (a mixin), and `compare`."""

from __future__ import annotations

import re

import numpy as np

from shmtest.faults import stream as _stream


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


class Checks:
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
