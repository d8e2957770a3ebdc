"""The table: one cache's segment and everything that reads and writes it in place.

    layout.py, units.py          the segment's contract (header, sections, buckets, records)
    table.py, lifecycle.py       create, open, attach; exists, list, destroy
    reader.py, writer.py         the handles (the checks at attach, lookups, Packed; apply)
    reattach.py, reader_stats.py a handle that follows a name; the readers' companion
    _input.py, _pyobjects.py     what callers hand in, checked and flattened for the kernels
    _lookup.py, _kernels.py, _repair.py, _bucket.py, xxh64.py, _intrinsics.py   the kernels
    control/                     the control area, in the same segment (a sub-package)

The kernels' modules are the engine's own (`_*`: nothing outside engine/ imports them);
snapshots/ and everything above reach a table through the handles.

Importing the package imports no numba: each kernel module installs numba's cache
locators first (ipc/jitcache.py), so that layout.py, units.py and control/ cost what
they read."""
