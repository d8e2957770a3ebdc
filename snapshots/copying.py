"""A cache's live entries copied into another segment of its cache, of another size: an
online resize's copy (engine/resizing.py makes the segment; consumer/supervisor/resizing.py
drives it). The same two steps a snapshot and a re-insert restore take, with no file
between them: each chunk of buckets copied out of the old segment, every bucket
consistent (snapshots/writing.py copy_chunk, which waits out a bucket mid-write), then its
live records re-inserted into the new one through its writer (snapshots/restoring.py
reinsert), oldest first in each bucket. The bucket count is the same, so a key lands in
the bucket it was in, and the order its bucket evicts in is kept.
"""

from __future__ import annotations

import time

import numpy as np

from shmcache.engine import layout as L
from shmcache.snapshots.format import Buffers, buckets_per_chunk
from shmcache.snapshots.restoring import reinsert
from shmcache.snapshots.writing import copy_chunk


def copy_entries(old, new, progress=None) -> dict:
    """Copy every live entry of `old` (a Reader or Writer; its writers held, or the copy is
    of each bucket as it stood when copied) into `new` (a Writer on an empty segment of the
    same key size and max_value). `progress(buckets done, buckets)` after each chunk.
    Returns entries (in `new` after the copy), evictions (the copy made: a smaller ring),
    and seconds."""
    t0 = time.monotonic()
    geo = old.geometry
    _, _, meta, index, ring8 = old.segment_arrays()[:5]
    nb = buckets_per_chunk(geo)
    buf = Buffers(geo, nb)
    counts = np.zeros(2, np.int64)
    before = new.stats()["evictions"]
    for b0 in range(0, L.NBUCKETS, nb):
        copy_chunk(old, meta, index, ring8, geo, b0, nb, buf, counts, None, new.name)
        reinsert(new, geo, nb, buf)  # drops nothing: the same max_value
        if progress is not None:
            progress(b0 + nb, L.NBUCKETS)
    st = new.stats()
    return {"entries": st["entries"], "evictions": st["evictions"] - before, "seconds": time.monotonic() - t0}
