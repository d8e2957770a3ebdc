"""Snapshots: a live cache to a file, and a new cache from that file.

The file's format, and reading it back checked: engine/snapshot_format.py. How the
file is written light on the readers beside it: engine/_snapshot_io.py.

Writing (`write`): the partitions' applied offsets are read first, then the buckets
are copied a chunk at a time (bounded memory, snapshot_format.CHUNK_BYTES), each bucket under its
seqlock as a reader reads it (_snapshot_kernels.copy_out: never torn, and no writer
waits); the file is written to a temporary file beside PATH whose name is its
writer's own (PATH.<16 hex digits>.tmp), fsynced, renamed to PATH and its directory
fsynced, so PATH is always a whole snapshot or the previous one, however many
write to it at once (the last rename wins). A write that fails, or that its caller
cancels (the `cancel` event: SnapshotCancelled), removes its temporary file; a writer
holds a lock on its own until the rename, so the next write to PATH removes those whose
writer was killed (and none being written); PATH is refused if it holds anything but a snapshot (a cache's
segment, another file, a directory, a link), and a name ending in .tmp is refused
(that is what an unfinished snapshot is called, and no reader takes it). Why replaying from
offsets taken before the copy gives the table Kafka's order implies: docs/design.md,
"Snapshots".

Reading (`read_header`, `verify`, `restore`): every field is checked before use
(a snapshot is as untrusted as the segment); a truncated file, a failed checksum or
a file that is no snapshot raises SnapshotCorruptError, another topic, format or key
size SnapshotMismatchError. `restore` creates the cache: of the snapshot's own
geometry and layout version a straight copy of each bucket (_snapshot_kernels.copy_in);
of any other, each live record re-inserted through the Writer, oldest first, with
the evictions a smaller table makes counted. A restore that fails removes the cache
it created.
"""

from __future__ import annotations

import json
import logging
import os
import stat
import struct
import time

import numpy as np
import xxhash

from shmcache.engine import _repair
from shmcache.engine import _snapshot_kernels as SK
from shmcache.engine.control import layout as C
from shmcache.engine import layout as L
from shmcache.engine import units
from shmcache.engine._snapshot_io import TMP_SUFFIX, SnapshotOut, cancelled, fsync_dir, remove_abandoned
from shmcache.engine._snapshot_io import remove_if_abandoned  # noqa: F401 - part of this module's API
from shmcache.engine._snapshot_io import final_name  # noqa: F401 - part of this module's API
from shmcache.engine._snapshot_io import lower_priority  # noqa: F401 - part of this module's API
from shmcache.engine.lifecycle import destroy
from shmcache.engine.snapshot_format import (CHUNK, CHUNK_MAGIC, END, END_MAGIC, FORMAT_VERSION, HEAD, MAGIC, Buffers,
                                             SnapshotInfo, buckets_per_chunk, check_expected, chunks, exact_memory,
                                             format_of, open_file, parse_header, topic_of)
from shmcache.engine.snapshot_format import read_header, verify  # noqa: F401 - part of this module's API
from shmcache.errors import (CacheSpaceError, MemoryTooSmallError, SnapshotCorruptError, SnapshotError,
                             SnapshotMismatchError)
from shmcache.ipc import liveness
from shmcache.ipc.atomics import cas_word, load_word
from shmcache.ipc.segment import kind_of

log = logging.getLogger("shmcache.snapshot")

SPIN_LIMIT = 2000  # copy tries of one bucket before Python yields the CPU
STUCK_S = 1.0  # a bucket mid-write this long under a dead (or no) lock holder is copied as it stands
READ_AHEAD = 512 << 20  # bytes of the file a restore asks the kernel to read while it creates the segment


# -- writing ---------------------------------------------------------------------------------


def write(handle, path: str, *, progress=None, rate: int = 0, cancel=None) -> SnapshotInfo:
    """Write a snapshot of the cache `handle` maps (a Reader or a Writer) to `path`.

    rate: bytes of file per second at most (0: as fast as it goes); see engine/_snapshot_io.py for what
    else keeps a snapshot light on the readers beside it. progress(buckets done,
    buckets in all, bytes written) is called after each chunk.
    cancel: a threading.Event (or None) that asks this snapshot to give up: looked at before
    each chunk, while a bucket mid-write is waited for, and waited on by the rate's pauses,
    so a paced snapshot stops within a chunk's copy and write of it being set (a supervisor's
    stop: consumer/snapshot_policy.py). Then SnapshotCancelled, `path` untouched, no temporary file.

    SnapshotError if `path` ends in .tmp or holds anything but a snapshot
    (check_destination); OSError naming `path` if the file cannot be written (a full
    disk: ENOSPC). Either way `path` is untouched and no temporary file is left."""
    path = os.fspath(path)
    if path.endswith(TMP_SUFFIX):
        raise SnapshotError(f"snapshot path {path!r}: a name ending in {TMP_SUFFIX} is what an unfinished snapshot "
                            "is called (no reader takes it)")
    check_destination(path)
    header, parts, meta, index, ring8 = handle.segment_arrays()[:5]
    geo = handle.geometry
    t0 = time.monotonic()
    nparts = min(max(int(header[L.H_PARTITIONS]), 0), L.MAX_PARTITIONS)
    rows = parts.reshape(L.MAX_PARTITIONS, L.ROW_WORDS)
    # the offsets first, before any bucket is copied (docs/design.md, Snapshots)
    offsets = tuple(int(x) for x in rows[:nparts, C.P_APPLIED].tolist())
    taken = time.time_ns()
    entries = int(meta.reshape(L.NBUCKETS, L.ROW_WORDS)[:, L.M_LIVE].sum())
    head = {"layout_version": L.LAYOUT_VERSION, "nbuckets": L.NBUCKETS, "key_size": geo.key_size,
            "max_value": geo.max_value, "slots": geo.slots, "ring": geo.ring, "size": geo.size,
            "topic": topic_of(header), "wire_format": format_of(header), "partitions": nparts,
            "offsets": list(offsets), "taken_ns": taken, "name": handle.name,
            "creation_id": int(header[L.H_CREATION_ID]), "entries": entries,
            "topic_id": handle.control.topic_id}
    raw = json.dumps(head, separators=(",", ":")).encode()
    nb = buckets_per_chunk(geo)
    buf = Buffers(geo, nb)
    counts = np.zeros(2, np.int64)
    sums = xxhash.xxh3_64()
    remove_abandoned(path)  # what writers of PATH that were killed left beside it
    try:
        out = SnapshotOut(path, rate, cancel)
    except OSError as e:
        raise _not_written(e, path, f"could not create a file in {os.path.dirname(os.path.abspath(path))}") from e
    tmp = out.path
    try:
        out.write(HEAD.pack(MAGIC, FORMAT_VERSION, len(raw)) + raw + struct.pack("<Q", xxhash.xxh3_64_intdigest(raw)))
        for b0 in range(0, L.NBUCKETS, nb):
            _copy_chunk(handle.name, meta, index, ring8, geo, b0, nb, buf, counts, cancel, path)
            n = int(buf.lens.sum())
            views = (buf.meta, buf.index, buf.lens, buf.ring[:n])
            h = xxhash.xxh3_64()
            for v in views:
                h.update(v)
            digest = h.intdigest()
            sums.update(struct.pack("<Q", digest))
            out.write(CHUNK.pack(CHUNK_MAGIC, b0, nb, 0, buf.fixed(nb) + n, digest))
            for v in views:
                out.write(v)
            out.chunk_done()
            if progress is not None:
                progress(b0 + nb, L.NBUCKETS, out.size)
        handle.raise_if_lost()  # a segment cut short under the copy gave zero pages, not the table
        out.write(END.pack(END_MAGIC, L.NBUCKETS // nb, 0, entries, sums.intdigest()))
        out.finish()
        size = out.size
        check_destination(path)  # again: nothing else came to be at PATH while this one was written
        os.rename(tmp, path)
        out.close()  # after the rename: until then its lock says the .tmp is being written
    except BaseException as e:
        try:
            os.unlink(tmp)  # first: whatever else fails, no temporary file is left
        except OSError:
            pass
        finally:
            out.close()
        if isinstance(e, OSError):
            raise _not_written(e, path, f"its temporary file {os.path.basename(tmp)} was removed") from e
        raise
    try:
        fsync_dir(path)
    except OSError as e:
        raise OSError(e.errno, f"snapshot {path} was written, but its directory's fsync failed: "
                      f"{e.strerror or e}") from e
    if counts[1]:
        log.warning("cache %r: %d buckets had head/tail words no writer leaves; written empty", handle.name,
                    int(counts[1]))
    dt = time.monotonic() - t0
    log.info("cache %r: snapshot %s, %d entries, %s in %.2f s (%s/s)", handle.name, path, entries,
             units.format_bytes(size), dt, units.format_bytes(size / max(dt, 1e-9)))
    return SnapshotInfo(path, geo, L.LAYOUT_VERSION, head["topic"], head["wire_format"], offsets, taken, entries,
                        handle.name, size, head["topic_id"])


def check_destination(path: str) -> None:
    """SnapshotError unless `path` is free for a snapshot: nothing there, or a snapshot
    (a file that starts with the snapshot magic, whole or not), which the new one
    replaces. Anything else is refused by name and kind: a cache's segment, another
    file, a directory, a link, a device."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    except OSError as e:
        raise SnapshotError(f"snapshot {path}: cannot look at what is there ({e.strerror}); nothing was written") from e
    if not stat.S_ISREG(st.st_mode):
        kind = kind_of(st.st_mode)
        raise SnapshotError(f"snapshot {path}: there is {kind} at that path, not a snapshot; refusing to replace it "
                            "(give the path of a snapshot file to write)")
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            first = os.pread(fd, len(MAGIC), 0)
        finally:
            os.close(fd)
    except OSError as e:
        raise SnapshotError(f"snapshot {path}: a file is there and cannot be read to check that it is a snapshot "
                            f"({e.strerror}); refusing to replace it") from e
    if first == MAGIC:
        return
    if len(first) == len(MAGIC) and int.from_bytes(first, "little") == L.MAGIC:
        what = "a shmcache cache segment (a cache's shared memory)"
    elif st.st_size == 0:
        what = "an empty file"
    else:
        what = f"a file of {units.format_bytes(st.st_size)} that is not a shmcache snapshot (it starts with {first!r})"
    raise SnapshotError(f"snapshot {path}: there is {what} at that path; refusing to replace it (a snapshot only "
                        "replaces a snapshot)")


def _not_written(e: OSError, path: str, what: str) -> OSError:
    """The OSError `e` again (its errno, so its type), saying which snapshot was not written and why."""
    message = f"snapshot {path} not written: {e.strerror or e} ({what}; {path} is untouched)"
    return OSError(message) if e.errno is None else OSError(e.errno, message)


def _copy_chunk(name, meta, index, ring8, geo, b0, nb, buf, counts, cancel, path) -> None:
    """Copy buckets b0..b0+nb into buf, each consistently; yield to writers in between.
    SnapshotCancelled once `cancel` is set (before the copy, and while a bucket is waited for)."""
    i, force, stuck_at, since = 0, -1, -1, 0.0
    while True:
        if cancel is not None and cancel.is_set():
            raise cancelled(path)
        pos = int(buf.lens[:i].sum())
        i = SK.copy_out(meta, index, ring8, geo.slots, geo.ring, b0, i, nb, pos, buf.meta, buf.index, buf.lens,
                        buf.ring, SPIN_LIMIT, force, counts)
        if i >= nb:
            return
        b = b0 + i
        if b != stuck_at:
            stuck_at, since = b, time.monotonic()
        owner = int(load_word(meta, b * L.ROW_WORDS + L.M_LOCK))
        if time.monotonic() - since > STUCK_S and (owner == 0 or not liveness.is_alive(owner)):
            log.warning("cache %r: bucket %d stays mid-write with no live writer; copied as it stands (the "
                        "restore rebuilds it)", name, b)
            force = b
        else:
            os.sched_yield()


# -- restoring -------------------------------------------------------------------------------


def restore(path, name: str, *, memory=None, max_value: int | None = None, mode: int = 0o600,
            topic: str | None = None, wire_format: str | None = None, key_size: int | None = None,
            progress=None, own: bool = False) -> dict:
    """Create cache `name` from the snapshot at `path`: of the snapshot's geometry unless
    `memory` (or `max_value`) says otherwise. Returns what was done: entries, evictions,
    mode ("copy" or "re-insert"), seconds, the snapshot's info. A FIFO or anything else but
    a regular file at `path` is refused without blocking; `own` (a snapshot directory's
    file): also a symbolic link and a file of another user (snapshot_format.open_file)."""
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
            me = liveness.owner_word()
            for b0 in chunks(f, info, buf, nb):
                if same:
                    _copy_in(w, b0, nb, buf, me)
                else:
                    dropped += _reinsert(w, src, nb, buf)
                if progress is not None:
                    progress(b0 + nb, L.NBUCKETS, f.tell())
            _publish(w, info)
            st = w.stats()
            ctl.restore_done(st["entries"], (st["evictions"] + dropped) if not same else 0,
                             int((time.monotonic() - t0) * 1e9), info.taken_ns)
        except BaseException:
            w.close()
            destroy(name, force=True)
            raise
    dt = time.monotonic() - t0
    out = {"name": name, "mode": "copy" if same else "re-insert", "entries": st["entries"],
           "evictions": ctl.word(C.H_RESTORE_EVICTIONS), "seconds": dt, "memory": target.size,
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
        b = b0 + i
        if cas_word(meta, b * L.ROW_WORDS + L.M_LOCK, 0, me) == 0:
            _repair.repair_bucket(meta, index, ring8, a.ring64, a.geo, b)


def _reinsert(w, src: L.Geometry, nb: int, buf: Buffers) -> int:
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
