"""Snapshots: a live cache to a file, and a new cache from that file (`shmcache snapshot`,
`shmcache restore`, the supervisor's warm restarts).

    format.py     the file: its layout (drawn there), and reading it back with every field
                  checked (the contract between writing and restoring)
    writing.py    write(): the buckets copied under their seqlocks, the file written light
                  on the readers beside it and renamed into place whole
    restoring.py  restore(): a new cache from a file, a straight copy or a re-insert
    _kernels.py   the compiled copies out of and into a segment

A layer above the engine: it works on a handle's mapped sections (segment_arrays) and
publishes through its control area; nothing in the engine needs it. The public calls are
here by name (`shmcache.snapshot`, `shmcache.restore` and `shmcache.verify_snapshot` are
write, restore and verify)."""

from shmcache.snapshots.format import SnapshotInfo, read_header, verify
from shmcache.snapshots.restoring import restore
from shmcache.snapshots.writing import check_destination, final_name, lower_priority, remove_if_abandoned, write

__all__ = ["SnapshotInfo", "check_destination", "final_name", "lower_priority", "read_header", "remove_if_abandoned",
           "restore", "verify", "write"]
