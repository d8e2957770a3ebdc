"""`shmcache restore PATH NAME`: a cache created from a snapshot (snapshots/restoring.py), with the
snapshot command's progress display."""

from __future__ import annotations

import json

from rich.console import Console

from shmcache.cli.args import mode_arg
from shmcache.cli.snapshot import BucketProgress

HELP = "create a cache from a snapshot file"


def add_arguments(p) -> None:
    p.add_argument("path", help="a snapshot file")
    p.add_argument("name", help="the cache to create (it must not exist)")
    p.add_argument("--memory", help="cache size (default: the snapshot's; another size re-inserts every entry)")
    p.add_argument("--max-value", type=int, help="largest value (default: the snapshot's)")
    p.add_argument("--mode", type=mode_arg, default=0o600, help="octal file mode (default 600)")
    p.add_argument("--json", action="store_true", help="print one JSON object")


def run(a) -> int:
    from shmcache import snapshots

    console = Console(stderr=a.json)
    with BucketProgress(console, f"restore {a.name}") as bar:
        out = snapshots.restore(a.path, a.name, memory=a.memory, max_value=a.max_value, mode=a.mode, progress=bar)
    if a.json:
        print(json.dumps(out))
    else:
        s = out["snapshot"]
        console.print(f"restored {a.name} from {a.path} ({out['mode']}): {out['entries']:,} entries, "
                      f"{out['evictions']:,} evicted, in {out['seconds']:.2f} s "
                      f"({s['bytes'] / max(out['seconds'], 1e-9) / 1e9:.2f} GB/s); topic {s['topic']!r}, "
                      f"offsets {s['offsets']} (shmcache run resumes from there)",
                      markup=False, highlight=False)  # the path and the topic are text, not markup
    return 0
