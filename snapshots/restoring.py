"""Restoring a snapshot: a new cache from a snapshot file (snapshots/format.py reads it,
every field checked before use: a snapshot is as untrusted as the segment).

`restore` creates the cache: of the snapshot's own geometry and layout version a
straight copy of each bucket (_kernels.copy_in); of any other, each live record
re-inserted through the Writer, oldest first, with the evictions a smaller table makes
counted. The snapshot's topic, format, topic id and applied offsets go into the new
cache's control area, so a supervisor started on it resumes each partition from there.
A restore that fails removes the cache it created.
"""

from __future__ import annotations

import logging
import os
import time

import numpy as np

from shmcache.engine import layout as L
from shmcache.engine import units
from shmcache.engine.lifecycle import destroy
from shmcache.errors import CacheSpaceError, MemoryTooSmallError, SnapshotCorruptError, SnapshotMismatchError
from shmcache.snapshots import _kernels as SK
from shmcache.snapshots.format import (Buffers, SnapshotInfo, buckets_per_chunk, check_expected, chunks, exact_memory,
                                       open_file, parse_header)

log = logging.getLogger("shmcache.snapshot")

READ_AHEAD = 512 << 20  # bytes of the file a restore asks the kernel to read while it creates the segment


def restore(path, name: str, *, memory=None, max_value: int | None = None, mode: int = 0o600,
            topic: str | None = None, wire_format: str | None = None, key_size: int | None = None,
            progress=None, own: bool = False) -> dict:
    """Create cache `name` from the snapshot at `path`: of the snapshot's geometry unless
    `memory` (or `max_value`) says otherwise. Returns what was done: entries, evictions,
    mode ("copy" or "re-insert"), seconds, the snapshot's info. A FIFO or anything else but
    a regular file at `path` is refused without blocking; `own` (a snapshot directory's
    file): also a symbolic link and a file of another user (format.open_file)."""
    from shmcache.engine import table

    path = os.fspath(path)
    t0 = time.monotonic()
    with open_file(path, own) as f:
        info = parse_header(f, path)
        check_expected(info, topic=topic, wire_format=wire_format, key_size=key_size)
        src = info.geometry
        maxv = src.max_value if max_value is None else max_value
        if memory is None and maxv == src.max_value and exact_memory(src):
            memory = exact_memory(src)
        elif memory is None:
            memory = src.size
        try:
            target = L.Geometry.plan(units.parse_bytes(memory), src.key_size, maxv)
        except MemoryTooSmallError as e:
            raise SnapshotMismatchError(f"snapshot {path}: its key size {src.key_size} and values up to {maxv} B do "
                                        f"not fit: {e}") from None
        same = target == src and info.layout_version == L.LAYOUT_VERSION
        try:  # the kernel reads the file's start while the segment is made (its 2 MiB pages zeroed)
            os.posix_fadvise(f.fileno(), 0, min(info.bytes, READ_AHEAD), os.POSIX_FADV_WILLNEED)
        except OSError:
            pass
        try:
            w = table.create(name, memory=memory, key_size=src.key_size, max_value=maxv, mode=mode)
        except CacheSpaceError as e:  # the snapshot's own size, when no memory= was given
            raise SnapshotMismatchError(f"snapshot {path}: a cache of {units.format_bytes(target.size)} does not fit: "
                                        f"{e}") from None
        try:
            ctl = w.control
            ctl.restore_started()
            nb = buckets_per_chunk(src)
            buf = Buffers(src, nb, allocate=False)
            dropped = 0
            me, _ = w.kernel_identity()  # the owner word its bucket locks are taken with
            for b0 in chunks(f, info, buf, nb):
                if same:
                    _copy_in(w, b0, nb, buf, me)
                else:
                    dropped += reinsert(w, src, nb, buf)
                if progress is not None:
                    progress(b0 + nb, L.NBUCKETS, f.tell())
            _publish(w, info)
            st = w.stats()
            evictions = (st["evictions"] + dropped) if not same else 0
            ctl.restore_done(st["entries"], evictions, int((time.monotonic() - t0) * 1e9), info.taken_ns)
        except BaseException:
            w.close()
            destroy(name, force=True)
            raise
    dt = time.monotonic() - t0
    out = {"name": name, "mode": "copy" if same else "re-insert", "entries": st["entries"],
           "evictions": evictions, "seconds": dt, "memory": target.size,
           "snapshot": info.to_dict()}
    w.close()
    log.info("cache %r restored from %s (%s): %d entries in %.2f s (%s/s)", name, path, out["mode"],
             out["entries"], dt, units.format_bytes(info.bytes / max(dt, 1e-9)))
    return out


def _copy_in(w, b0: int, nb: int, buf: Buffers, me: int) -> None:
    a = w.segment_arrays()
    meta, index, ring8 = a.meta, a.index, a.ring8
    geo = w.geometry
    bad = SK.copy_in(meta, index, ring8, geo.slots, geo.ring, b0, nb, buf.meta, buf.index, buf.lens, buf.ring, me)
    if bad >= 0:
        raise SnapshotCorruptError(f"cache {w.name!r}: bucket {bad} of the snapshot does not fit the geometry it "
                                   "claims (or another process writes the cache being restored)")
    odd = np.flatnonzero(buf.meta[L.M_VERSION::L.ROW_WORDS] & 1)
    for i in odd.tolist():  # copied mid-write (its writer had died): rebuild it from its ring
        w.rebuild_bucket(b0 + i)


def reinsert(w, src: L.Geometry, nb: int, buf: Buffers) -> int:
    """Apply the chunk's live records through the writer (another geometry); returns how
    many were dropped for a value over the new max_value."""
    most = int(buf.lens.sum()) // L.record_size(src.key_size, 0) + 1
    key_at = np.empty(most, np.int64)
    val_at = np.empty(most, np.int64)
    lens = np.empty(most, np.int64)
    n = SK.live_records(buf.meta, buf.lens, buf.ring, nb, src.ring, src.key_size, src.max_value, key_at, val_at, lens)
    keep = lens[:n] <= w.geometry.max_value
    dropped = n - int(keep.sum())
    key_at, val_at, lens = key_at[:n][keep], val_at[:n][keep], lens[:n][keep]
    keys = np.empty(len(key_at) * src.key_size, np.uint8)
    SK.gather_keys(buf.ring, key_at, len(key_at), src.key_size, keys)
    if len(key_at):
        w.apply(keys.reshape(-1, src.key_size), np.zeros(len(key_at), np.uint8),
                (val_at, lens, buf.ring[:int(buf.lens.sum())]))
    return dropped


def _publish(w, info: SnapshotInfo) -> None:
    """The snapshot's topic, format and offsets into the new cache's control area: a
    supervisor started on it resumes each partition from there."""
    ctl = w.control
    ctl.reset_partitions()
    ctl.partition_rows.restore_applied(info.offsets)
    ctl.set_topic(info.topic, len(info.offsets))
    ctl.set_topic_id(info.topic_id)  # the supervisor checks it against the topic's id now
    ctl.set_wire_format(info.wire_format)
