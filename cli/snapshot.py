"""`shmcache snapshot NAME PATH`: a snapshot of a live cache (snapshots/writing.py).

Each shows a progress bar on a terminal and, without one (a log, CI), a plain line
every few seconds; both end with one line saying what was done and at what rate.
"""

from __future__ import annotations

import json
import time

from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, TextColumn, TimeElapsedColumn, TransferSpeedColumn

from shmcache.cli.progress import ProgressLine
from shmcache.engine import layout as L
from shmcache.engine import units


class BucketProgress(ProgressLine):
    """progress(done, total, bytes) for snapshots.write and restore, drawn with rich or printed plainly."""

    def __init__(self, console: Console, what: str):
        super().__init__(console, (TextColumn(what), BarColumn(), TextColumn("{task.percentage:>3.0f}%"),
                                   DownloadColumn(), TransferSpeedColumn(), TimeElapsedColumn()), L.NBUCKETS)
        self.what, self.t0 = what, time.monotonic()

    def __call__(self, done: int, total: int, nbytes: int) -> None:
        def plain() -> str:
            secs = max(time.monotonic() - self.t0, 1e-9)
            return (f"{self.what}: {100 * done // total}% of the buckets, {units.format_bytes(nbytes)}, "
                    f"{nbytes / secs / 1e9:.2f} GB/s")
        self.update(plain, completed=done, total=total)


HELP = "write a snapshot of a live cache to a file"


def add_arguments(p) -> None:
    p.add_argument("name", help="the cache")
    p.add_argument("path", help="the snapshot file to write (written beside it as PATH.<random>.tmp, then renamed); "
                                  "if a file is there it must be a snapshot")
    p.add_argument("--rate", metavar="BYTES", help="bytes/s to write at most, e.g. 128MiB (default: unlimited)")
    p.add_argument("--idle", action="store_true",
                   help="run at SCHED_IDLE (only on CPU time nothing else wants), as shmcache run's snapshots do")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def run(a) -> int:
    import shmcache
    from shmcache import snapshots

    rate = 0 if a.rate in (None, "0") else units.parse_bytes(a.rate, what="--rate")
    if a.idle:
        snapshots.lower_priority()  # this process does nothing else
    console = Console(stderr=a.json)
    t0 = time.monotonic()
    with shmcache.attach(a.name) as r, BucketProgress(console, f"snapshot {a.name}") as bar:
        info = snapshots.write(r, a.path, progress=bar, rate=rate)
    dt = time.monotonic() - t0
    if a.json:
        print(json.dumps({**info.to_dict(), "seconds": dt}))
    else:
        console.print(f"snapshot of {a.name}: {info.path}, {info.entries:,} entries, {units.format_bytes(info.bytes)} in "
                      f"{dt:.2f} s ({info.bytes / max(dt, 1e-9) / 1e9:.2f} GB/s); offsets {list(info.offsets)}",
                      markup=False, highlight=False)  # the path is text, not markup
    return 0


