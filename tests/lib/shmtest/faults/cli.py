"""`scripts/faults`: the fault suite at a chosen size; prints the table (tests/lib/shmtest/faults/harness.py)."""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import numpy as np

from shmtest.faults.harness import DEFAULT_SESSION_TIMEOUT, KINDS, Config, Run


def table(res: dict) -> str:
    cfg = res["config"]
    lines = [f"fault suite: {cfg['entries']:,} {cfg['format']} entries over {cfg['minutes']:g} min, "
             f"{cfg['partitions']} partitions, {cfg['workers']} workers, seed {cfg['seed']}, session timeout "
             f"{cfg['session_timeout'] or DEFAULT_SESSION_TIMEOUT:g} s",
             f"{'fault':<22}{'n':>3}{'min s':>8}{'median s':>10}{'max s':>8}  ready w/o assignment (samples)"]
    for k in KINDS:
        v = res["recovery"].get(k)
        if v:
            lines.append(f"{k:<22}{len(v):>3}{v[0]:>8.2f}{float(np.median(v)):>10.2f}{v[-1]:>8.2f}  "
                         f"{res['false_ready'].get(k, 0)}")
    lines.append("(recovery: from the fault, broker faults from the broker answering again, to ready with "
                 "every partition applying new messages)")
    lines.append(", ".join(f"{k} {v:,}" if isinstance(v, int) else f"{k} {v}" for k, v in res["counts"].items()))
    lines.append("FAILED:\n  " + "\n  ".join(res["failures"]) if res["failures"] else
                 "correct: nothing lost, extra or wrong; no bad read; committed == end; nothing left behind")
    return "\n".join(lines)


def main(argv=None) -> int:
    import argparse

    ap = argparse.ArgumentParser(prog="scripts/faults", description="shmcache's fault suite (issue 10)")
    ap.add_argument("--entries", type=int, default=2_000_000)
    ap.add_argument("--minutes", type=float, default=10.0)
    ap.add_argument("--format", choices=("v1", "v2", "kv"), default="v1")
    ap.add_argument("--seed", type=int, help="random seed of the plan and the faults (default: fresh, printed)")
    ap.add_argument("--partitions", type=int, default=8)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--session-timeout", type=float, default=0.0,
                    help="supervisors' session.timeout.ms in seconds (default: librdkafka's 45 s)")
    ap.add_argument("--faults", help="counts per kind, e.g. worker_kill=4,sup_kill=2 (member_join also leaves)")
    ap.add_argument("--late-orphans", action="store_true",
                    help="sup_kill: stop the old workers until the new ones started (a descheduled orphan)")
    ap.add_argument("--pod", action="store_true",
                    help="run each supervisor as pid 1 of a PID and mount namespace of its own, as a DaemonSet's "
                         "pod (needs root)")
    ap.add_argument("--dir", help="where the broker, plan and logs go (default /tmp/flt-<id>)")
    ap.add_argument("--json", help="also write the result to this file")
    a = ap.parse_args(argv)
    if a.entries < 1000 or a.minutes <= 0:
        ap.error("give --entries >= 1000 and --minutes > 0")
    if a.pod and a.late_orphans:
        ap.error("--late-orphans needs workers that outlive their supervisor; in a pod they die with it")
    cfg = Config(entries=a.entries, minutes=a.minutes, format=a.format,
                 seed=a.seed if a.seed is not None else random.randrange(1 << 31), partitions=a.partitions,
                 workers=a.workers, session_timeout=a.session_timeout, late_orphans=a.late_orphans,
                 pod=a.pod, workdir=a.dir or "")
    if a.faults:
        try:
            cfg.faults = {k: int(v) for k, v in (x.split("=") for x in a.faults.split(","))}
        except ValueError:
            ap.error(f"--faults {a.faults!r}: expected KIND=N[,KIND=N...]")
        bad = set(cfg.faults) - set(KINDS)
        if bad:
            ap.error(f"--faults: unknown kinds {sorted(bad)}; known: {', '.join(KINDS)}")
    print(f"seed {cfg.seed}", flush=True)
    res = Run(cfg).run()
    print(table(res), flush=True)
    if a.json:
        Path(a.json).write_text(json.dumps(res, indent=1))
    return 1 if res["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
