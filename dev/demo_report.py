"""What `shmcache demo` (dev/demo.py) shows: the produce-and-catch-up progress (two bars on a
terminal, a line every PLAIN_PROGRESS_S without one) and, at the end, the checks on
what the table holds and the summary table. It reads the demo's public state only."""

from __future__ import annotations

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from shmcache.produce.ground_truth import BATCH
from shmcache.engine.units import format_bytes

PLAIN_PROGRESS_S = 5.0  # seconds between progress lines when there is no terminal
BAR_INTERVAL_S = 0.1  # the bars are redrawn at most this often while entries are produced


class CatchUpBars:
    """Entries produced and applied since t0, as bars (a context manager)."""

    def __init__(self, console: Console, total: int, t0: float):
        self.console, self.total, self.t0 = console, total, t0
        self.progress = Progress(TextColumn("{task.description:>8}"), BarColumn(),
                                 TextColumn("{task.completed:>12,} entries"),
                                 TextColumn("{task.fields[rate]:>10,.0f}/s"), TimeElapsedColumn(),
                                 console=console, transient=not console.is_terminal)
        self.last_bar, self.last_line = 0.0, t0

    def __enter__(self) -> "CatchUpBars":
        self.progress.__enter__()
        self.produced = self.progress.add_task("produced", total=self.total, rate=0.0)
        self.applied = self.progress.add_task("applied", total=self.total, rate=0.0)
        return self

    def __exit__(self, *exc) -> None:
        self.progress.__exit__(*exc)

    def due(self, now: float) -> bool:
        """The bars were last drawn BAR_INTERVAL_S ago or more."""
        return now - self.last_bar >= BAR_INTERVAL_S

    def show(self, now: float, produced: int, applied: int, *, produced_bar: bool = True) -> None:
        """Draw the counts (the produced bar only while producing); without a terminal the
        bars are not drawn: a line every PLAIN_PROGRESS_S instead."""
        self.last_bar = now
        elapsed = max(now - self.t0, 1e-9)
        if produced_bar:
            self.progress.update(self.produced, completed=produced, rate=produced / elapsed)
        self.progress.update(self.applied, completed=min(applied, self.total), rate=applied / elapsed)
        if not self.console.is_terminal and now - self.last_line >= PLAIN_PROGRESS_S:
            self.last_line = now
            self.console.print(f"  {now - self.t0:5.1f} s: {produced:,} entries produced, {applied:,} applied")


def summarize(demo) -> None:
    """Check what the table holds against the ground truth (demo.check each) and print the
    summary table."""
    s = demo.reader.stats()
    st = demo.reader.status()
    sent, rd = demo.sent, demo.read
    live = sent.adds - sent.deletes  # every hash is ADDed once and DELETEd at most once
    malformed = sum(w["malformed"] for w in st["workers"])
    demo.check(rd["present_hits"] == rd["present"], f"{rd['present'] - rd['present_hits']} present hashes missed")
    demo.check(rd["right_values"] == rd["present"],
               f"{rd['present'] - rd['right_values']} present hashes without the exact value sent")
    demo.check(rd["deleted_misses"] == rd["deleted"], f"{rd['deleted'] - rd['deleted_misses']} deleted hashes hit")
    demo.check(s["entries"] == live, f"table holds {s['entries']:,} entries; the ground truth says {live:,}")
    demo.check(s["evictions"] == 0, f"{s['evictions']:,} evictions")
    demo.check(malformed == 0, f"{malformed} malformed messages")
    looked = rd["present"] + rd["deleted"]
    hit_rate = rd["present_hits"] / rd["present"] if rd["present"] else 1.0
    t = Table(title=f"shmcache demo: {sent.entries:,} entries, {demo.fmt}, {demo.partitions} partitions, "
                    f"{demo.workers} workers", show_header=False, title_justify="left")
    t.add_column(justify="left")
    t.add_column(justify="right")
    rows = [
        ("entries produced", f"{sent.entries:,} ({sent.adds:,} ADD, {sent.deletes:,} DELETE)"),
        ("produced", f"{sent.entries / max(sent.seconds, 1e-9):,.0f} entries/s"),
        ("entries applied", f"{demo.applied_entries:,}"),
        ("applied", f"{demo.applied_entries / max(demo.apply_seconds, 1e-9):,.0f} entries/s "
                    "(first sent to last applied)"),
        ("behind the producer", f"{demo.behind_seconds:.1f} s after the last acknowledgement"),
        ("table entries", f"{s['entries']:,} (expected {live:,})"),
        ("memory used", f"{format_bytes(s['bytes_used'])} ({s['bytes_used'] / s['capacity_bytes']:.1%} of "
                        f"{format_bytes(s['capacity_bytes'])} ring)"),
        ("segment", f"{format_bytes(s['memory'])} in /dev/shm"),
        ("evictions", f"{s['evictions']:,}"),
        ("lock takeovers", f"{s['lock_takeovers']:,}"),
        ("malformed messages", f"{malformed:,}"),
        ("commits / rebalances", f"{st['commits']:,} / {st['rebalances']:,}"),
        ("sampled hashes", f"{looked:,} ({rd['present']:,} present, {rd['deleted']:,} deleted)"),
        ("hit rate (present)", f"{hit_rate:.2%} ({rd['present_hits']:,} hits, "
                               f"{rd['right_values']:,} with the exact value)"),
        ("deleted that missed", f"{rd['deleted_misses']:,} of {rd['deleted']:,}"),
        ("lookups", f"{rd['lookups'] / max(rd['lookup_seconds'], 1e-9):,.0f} /s"),
        ("reader process", f"pid {rd['pid']}, batches of {BATCH}, random order"),
        ("readers' hits / misses", f"{s['reader_hits']:,} / {s['reader_misses']:,}"),
    ]
    for r in rows:
        t.add_row(*r)
    demo.console.print(t)
