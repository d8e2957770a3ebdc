"""Decode a whole consume() batch of txmeta messages in one pass: one Batch for all of them.

A worker applies what one `consume()` call returned (up to `batch_messages` messages,
~140 KB and 1024 entries each) as ONE table batch instead of one per message: the
fixed Python cost of a decode and an apply is paid once per call. The messages' bytes
are copied, back to back, into a buffer the caller keeps and reuses (`Scratch`): the
table's apply takes one value buffer, and a reused buffer is a plain memcpy where a
fresh `b"".join` pays a page fault per 4 KiB. The decoded arrays are the Scratch's
too, for the same reason. Each message is then walked once, its entries checked and
gathered in the same pass (not a scan for the counts, then a gather, which would walk
every entry twice).

Only the clean case takes this path, and it must give exactly what `wire.decode`
gives message by message (tests/formats/test_wire_batch.py checks that on clean,
damaged and ambiguous messages): every message scans cleanly as v1, or as v2 with
every sent xxh64 equal to its key's. For anything else (a damaged message, a v2
header that is not v2, a wrong hash, v1 and v2 mixed in one batch) `decode_many`
returns None and the caller decodes message by message with `wire.decode`, which
says what is wrong, keeps an intact v1 prefix and counts the damage. Order is kept:
entries come out message after message, in the order given.
"""

from __future__ import annotations

import numpy as np

from shmcache.formats import _wire_kernels as _k
from shmcache.formats import wire


_MIN_ENTRY = wire.KEY_SIZE + _k.ACTION_SIZE + _k.LEN_SIZE  # the smallest entry (v1, empty content): 37 B


def _grown(a: np.ndarray, n: int) -> np.ndarray:
    """a itself if it has n rows, else a new array of at least n (and twice a's) rows."""
    return a if a.shape[0] >= n else np.empty((max(n, 2 * a.shape[0]), *a.shape[1:]), a.dtype)


class Scratch:
    """What decode_many writes into, kept by the caller and reused: the messages' bytes back
    to back, and the decoded entries' arrays, sized for the most entries those bytes can
    hold (one per _MIN_ENTRY bytes; the pages of rows never written are never touched).
    Grows until release() (a worker's, when it goes idle). A Batch decoded into it is valid until the next decode_many
    with the same Scratch."""

    def __init__(self) -> None:
        self.buf = np.empty(0, np.uint8)
        self.keys = np.empty((0, wire.KEY_SIZE), np.uint8)
        self.actions = np.empty(0, np.uint8)
        self.starts = np.empty(0, np.int64)
        self.lens = np.empty(0, np.int32)
        self.hashes = np.empty(0, np.uint64)

    def release(self) -> int:
        """Drop the buffers (the next take() grows them again); the bytes they held."""
        held = sum(a.nbytes for a in (self.buf, self.keys, self.actions, self.starts, self.lens, self.hashes))
        self.__init__()
        return held

    def take(self, n: int) -> np.ndarray:
        """n bytes of the buffer, and rows for every entry n bytes of messages can hold."""
        self.buf = _grown(self.buf, n)
        rows = n // _MIN_ENTRY
        self.keys, self.actions, self.starts, self.lens, self.hashes = (
            _grown(a, rows) for a in (self.keys, self.actions, self.starts, self.lens, self.hashes))
        return self.buf[:n]


def decode_many(values: list, scratch: Scratch, *, max_value: int = wire.MAX_VALUE) -> wire.Batch | None:
    """The entries of the messages `values` (bytes each; None counts as empty), in order,
    as one Batch whose arrays lie in `scratch`; None unless every message is clean and
    all are of one version (then decode them one by one with wire.decode). Each message's
    bytes are walked once: checked and gathered in the same pass."""
    wire.check_max_value(max_value)
    m = len(values)
    ends = np.empty(m, np.int64)
    total = 0
    for i, v in enumerate(values):
        total += 0 if v is None else len(v)
        ends[i] = total
    buf = scratch.take(total)
    pos = 0
    for v, end in zip(values, ends.tolist()):
        if v:
            buf[pos:end] = np.frombuffer(v, np.uint8)
        pos = end
    starts = np.empty(m, np.int64)
    starts[:1] = 0
    starts[1:] = ends[:-1]
    data = buf.view()
    data.flags.writeable = False  # the kernels compile for read-only input (as wire.decode's)
    scanned = np.empty((m, _k.M_COLUMNS), np.int64)
    bad, kept = _k.decode_clean_many(data, starts, ends, wire.KEY_SIZE, max_value, scanned, scratch.keys.reshape(-1),
                                     scratch.actions, scratch.starts, scratch.lens, scratch.hashes)
    if bad:
        return None
    versions = scanned[:, _k.M_VERSION]
    v2 = bool(versions[0] == 2) if m else False
    if m and (versions != versions[0]).any():
        return None  # v1 and v2 in one batch: rare (a producer switching over); one by one
    keys = scratch.keys[:kept]
    hashes = scratch.hashes[:kept]
    if v2 and (wire.xxh64_keys(keys) != hashes).any():
        return None  # a wrong xxh64: the message is not v2 (wire.py rule 5); wire.decode says which
    return wire.Batch(keys, scratch.actions[:kept], scratch.starts[:kept], scratch.lens[:kept], data,
                      2 if v2 else 1, int(scanned[:, _k.M_DECLARED].sum()), int(scanned[:, _k.M_UNKNOWN].sum()), None,
                      -1, hashes=hashes if v2 else None, delete_payloads=int(scanned[:, _k.M_DELETE_PAYLOADS].sum()))
