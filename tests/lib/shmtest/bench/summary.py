"""The benchmarks' results and the summary table (bench/test_table.py; other modules add
their own sections through SUMMARIES), printed by bench/conftest.py at the end of a run.
It knows nothing of the peers: what a run was (its size, its batch) is in RESULTS's
("_meta", "_meta") entry, which bench/test_table.py fills."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import numpy as np

RESULTS: dict[tuple[str, str], dict] = {}  # (operation, peer) -> {"keys_per_s", "seconds", ...}
# ratio label (as in RATIOS) -> the ratio of each interleaved round (bench/test_table.py
# test_ratios_interleaved): both sides timed back to back, so slow drifts of a shared,
# noisy machine fall on both alike
INTERLEAVED: dict[str, list[float]] = {}
NOTES: list[str] = []
# Summaries of other benchmark modules (bench/test_consume.py), printed by conftest.py
# after this one: (section title, render() -> str ("" = nothing to show),
# save(directory) -> Path | None).
SUMMARIES: list = []

# (label, numerator (op, peer), denominator (op, peer), target)
RATIOS = [
    ("get_many_packed hit / dict get", ("get hit", "shmcache packed"), ("get hit", "dict"), 4.0),
    ("get_many_packed hit / Redis MGET", ("get hit", "shmcache packed"), ("get hit", "redis"), 15.0),
    ("get_many_packed hit / LMDB get", ("get hit", "shmcache packed"), ("get hit", "lmdb"), 12.0),
    ("set_many (offsets, data) / dict update", ("set", "shmcache packed"), ("set", "dict"), 2.0),
    ("set_many (list of bytes) / dict update", ("set", "shmcache list"), ("set", "dict"), None),
    ("2 reader processes / 1 reader process", ("readers", "2 processes"), ("readers", "1 process"), 1.8),
    ("reader beside full-speed writer / idle reader", ("readers", "1 beside a writer"), ("readers", "1 process"), 0.6),
    ("get_many (list) hit / dict get", ("get hit", "shmcache list"), ("get hit", "dict"), None),
    ("get_many_packed, keys a list / dict get", ("get hit", "shmcache keys list"), ("get hit", "dict"), None),
    ("set_many, keys and values lists / dict update", ("set", "shmcache keys list"), ("set", "dict"), None),
    # the list form within 1.3x of the array form (rate ratio >= 1/1.3)
    ("get_many_packed hit: keys list / array", ("get hit", "shmcache keys list"), ("get hit", "shmcache packed"),
     0.77),
    ("set_many: lists / (offsets, data) arrays", ("set", "shmcache keys list"), ("set", "shmcache packed"), 0.77),
    ("get_many_packed miss / dict get miss", ("get miss", "shmcache packed"), ("get miss", "dict"), None),
]

PEERS = ["shmcache packed", "shmcache list", "shmcache keys list", "dict", "lmdb", "redis"]


def record(op: str, peer: str, keys: int, seconds: float, **extra) -> float:
    rate = keys / seconds
    RESULTS[(op, peer)] = {"keys_per_s": rate, "seconds": seconds, "keys": keys, **extra}
    return rate


def fmt_rate(rate: float) -> str:
    return f"{rate / 1e6:.2f} M" if rate >= 1e6 else f"{rate / 1e3:.0f} k"


def render_summary(width: int = 110) -> str:
    """The results as plain text tables (rich, no terminal needed)."""
    import io

    from rich import box
    from rich.console import Console
    from rich.table import Table

    buf = io.StringIO()
    con = Console(file=buf, width=width, force_terminal=False, color_system=None)
    meta = RESULTS.get(("_meta", "_meta"), {})
    title = (f"shmcache engine benchmarks: N={meta.get('n', '?'):,} keys, batches of {meta.get('batch', '?')}, "
             f"{meta.get('mode', '')}, {os.cpu_count()} CPUs")
    t = Table(title=title + "\nkeys/s, higher is better", title_justify="left", box=box.ASCII2)
    t.add_column("operation")
    for p in PEERS:
        t.add_column(p, justify="right")
    for op in ("get hit", "get miss", "set", "fill (fresh, once)"):
        if any((op, p) in RESULTS for p in PEERS):
            t.add_row(op, *[fmt_rate(RESULTS[(op, p)]["keys_per_s"]) if (op, p) in RESULTS else "-" for p in PEERS])
    con.print(t)
    procs = [(p, r) for (op, p), r in RESULTS.items() if op == "readers"]
    if procs:
        t = Table(title="shmcache get_many_packed hit across processes\n(keys/s summed over reader processes)", title_justify="left", box=box.ASCII2)
        t.add_column("setup")
        t.add_column("keys/s", justify="right")
        t.add_column("note")
        for p, r in procs:
            note = f"readers on a CPU {r['reader_cpu_share']:.0%} of their wall time" if "reader_cpu_share" in r else ""
            if "writer_keys_per_s" in r:
                note += f"; writer re-set {fmt_rate(r['writer_keys_per_s'])} keys/s meanwhile"
            t.add_row(p, fmt_rate(r["keys_per_s"]), note)
        con.print(t)
    t = Table(title="ratios (targets from the issue; never asserted); 'met' judges the interleaved median "
                    "where there is one", title_justify="left", box=box.ASCII2)
    for c in ("ratio", "median rounds", "best rounds", "interleaved median", "target", "met"):
        t.add_column(c, justify="left" if c == "ratio" else "right")
    for label, num, den, target in RATIOS:
        want = "" if target is None else f">= {target:g}x"
        inter = INTERLEAVED.get(label)
        inter_v = float(np.median(inter)) if inter else None
        shown_inter = f"{inter_v:.2f}x ({len(inter)})" if inter else ""
        if num in RESULTS and den in RESULTS:
            v = RESULTS[num]["keys_per_s"] / RESULTS[den]["keys_per_s"]
            best = (f"{RESULTS[num]['best_keys_per_s'] / RESULTS[den]['best_keys_per_s']:.2f}x"
                    if "best_keys_per_s" in RESULTS[num] and "best_keys_per_s" in RESULTS[den] else "")
            judged = inter_v if inter_v is not None else v
            met = "" if target is None else ("yes" if judged >= target else "NO")
            t.add_row(label, f"{v:.2f}x", best, shown_inter, want, met)
        else:
            t.add_row(label, "n/a", "", shown_inter, want, "")
    con.print(t)
    if "load_average_at_start" in meta:
        con.print(f"load average (1 min) at start: {meta['load_average_at_start']:.2f}; "
                  f"at end: {os.getloadavg()[0]:.2f} (other processes on the machine skew the figures)")
    for note in NOTES:
        con.print(f"note: {note}")
    return buf.getvalue()


def ratios(key: str = "keys_per_s") -> dict[str, float]:
    return {label: RESULTS[num][key] / RESULTS[den][key]
            for label, num, den, _ in RATIOS if key in RESULTS.get(num, {}) and key in RESULTS.get(den, {})}


def save_json(directory: Path) -> Path:
    directory.mkdir(exist_ok=True)
    path = directory / f"table-{time.strftime('%Y%m%d-%H%M%S')}.json"
    path.write_text(json.dumps({
        "meta": {**RESULTS.get(("_meta", "_meta"), {}), "cpus": os.cpu_count()},
        "results": {f"{op} | {peer}": r for (op, peer), r in RESULTS.items() if op != "_meta"},
        "ratios": ratios(),
        "ratios_best_rounds": ratios("best_keys_per_s"),
        "ratios_interleaved": {k: {"median": float(np.median(v)), "rounds": v} for k, v in INTERLEAVED.items()},
        "notes": NOTES,
    }, indent=1))
    return path
