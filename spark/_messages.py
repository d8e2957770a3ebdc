"""The publisher's two executor-side steps, over Arrow batches (no pyspark needed here).

1. `entry_batches`: txmeta rows -> entries `(tx_hash, action, kpart, content)`:
   the MetaBytes of each ADD (`txmeta.from_arrow` + `txmeta.encode`, whole batches),
   empty content for a DELETE, and the Kafka partition of the entry's own hash
   (`_partition`).
2. `message_batches`: entries sorted by (kpart, action) within each Spark partition
   -> Kafka records `(key, value, partition)`: runs of one kpart cut into messages
   of at most `max_entries` entries and `max_bytes` bytes, each encoded with
   `wire.encode_v1` / `encode_v2` (one compiled call per message, no per-entry
   Python). v1 records are keyed by their first tx hash (every entry's own
   partition is the key's); v2 records carry no key and name their partition.

Order: entries keep their input order within a message and messages leave in input
order, so the caller's sort (ADDs before DELETEs within a partition) is what Kafka
gets. A message may stop short of max_entries at a kpart change only; a run that
continues into the next Arrow batch is carried over, not cut.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit

from shmcache.formats import registry as wire_formats
from shmcache.formats import wire
from shmcache.spark import _keys, _partition

MAX_ENTRIES = 1024  # entries per message, as Teranode's validator batches them
# A message stays under Kafka's default 1 MiB limits (the producer's max.request.size,
# the broker's message.max.bytes) with room for the record batch's own headers.
MAX_BYTES = 900_000
WHO = "shmcache.spark.publish"


@dataclass
class Entries:
    """n entries as arrays: content i is data[offsets[i]:offsets[i + 1]]."""

    keys: np.ndarray  # (n, 32) uint8
    actions: np.ndarray  # (n,) uint8, wire.ADD / wire.DELETE
    kparts: np.ndarray  # (n,) int32, the Kafka partition of each key
    offsets: np.ndarray  # (n + 1,) int64
    data: np.ndarray  # uint8

    def __len__(self) -> int:
        return len(self.actions)

    @classmethod
    def from_arrow(cls, batch) -> "Entries":
        """From a batch with columns tx_hash, action, kpart, content (as entry_batches makes)."""
        keys, valid = _keys.from_arrow(batch.column("tx_hash"), wire.KEY_SIZE, "tx_hash", WHO)
        import pyarrow as pa

        content = batch.column("content")
        bufs = content.buffers()
        n = len(content)
        # int64 offsets when Spark sends large types (spark.sql.execution.arrow.useLargeVarTypes)
        width = np.int64 if pa.types.is_large_binary(content.type) else np.int32
        offsets = np.frombuffer(bufs[1], width, n + 1, np.dtype(width).itemsize * content.offset).astype(np.int64)
        data = np.frombuffer(bufs[2], np.uint8) if bufs[2] is not None else np.empty(0, np.uint8)
        return cls(keys, batch.column("action").to_numpy().astype(np.uint8),
                   batch.column("kpart").to_numpy().astype(np.int32), offsets, data)

    def slice(self, a: int, b: int) -> "Entries":
        o = self.offsets[a:b + 1]
        return Entries(self.keys[a:b], self.actions[a:b], self.kparts[a:b], o - o[0],
                       self.data[int(o[0]):int(o[-1])])

    @staticmethod
    def concat(a: "Entries", b: "Entries") -> "Entries":
        return Entries(np.concatenate([a.keys, b.keys]), np.concatenate([a.actions, b.actions]),
                       np.concatenate([a.kparts, b.kparts]),
                       np.concatenate([a.offsets[:-1] - a.offsets[0], b.offsets - b.offsets[0] + (a.offsets[-1] - a.offsets[0])]),
                       np.concatenate([a.data[int(a.offsets[0]):int(a.offsets[-1])],
                                       b.data[int(b.offsets[0]):int(b.offsets[-1])]]))


# -- step 1: rows -> entries -----------------------------------------------------------------------


def entry_batches(batches, *, action: int, partitions: int, fmt: str, key_col: str = "tx_hash"):
    """mapInArrow's function: txmeta rows (ADD) or bare hashes (DELETE) -> entries."""
    import pyarrow as pa

    from shmcache.formats import txmeta

    for batch in batches:
        keys, valid = _keys.from_arrow(batch.column(key_col), wire.KEY_SIZE, key_col, WHO)
        if not valid.all():
            raise ValueError(f"{WHO}: key column {key_col!r} has a null at row "
                             f"{int(np.flatnonzero(~valid)[0])} of this batch; every entry needs a tx hash")
        n = len(keys)
        if action == wire.ADD:
            offsets, data = txmeta.encode(txmeta.from_arrow(batch))
            lens = np.diff(offsets)
            if n and lens.max() > wire.MAX_VALUE:
                i = int(np.argmax(lens))
                raise ValueError(f"{WHO}: tx {keys[i].tobytes().hex()} encodes to {int(lens[i])} bytes of "
                                 f"MetaBytes; the wire format's limit is {wire.MAX_VALUE}")
        else:
            offsets, data = np.zeros(n + 1, np.int64), np.empty(0, np.uint8)
        kparts = _partition.partitions_of(keys, partitions, fmt)
        yield pa.RecordBatch.from_arrays(
            [_binary(np.arange(0, (n + 1) * wire.KEY_SIZE, wire.KEY_SIZE), keys),
             pa.array(np.full(n, action, np.int8)), pa.array(kparts), _binary(offsets, data)],
            names=["tx_hash", "action", "kpart", "content"])


def _binary(offsets: np.ndarray, data: np.ndarray):
    """A pyarrow BinaryArray over (offsets, data) without per-row objects."""
    import pyarrow as pa

    return pa.Array.from_buffers(pa.binary(), len(offsets) - 1,
                                 [None, pa.py_buffer(offsets.astype(np.int32)), pa.py_buffer(np.ascontiguousarray(data))])


# -- step 2: entries -> messages -------------------------------------------------------------------


@njit(cache=True, nogil=True)
def cut(kparts, sizes, max_entries, max_bytes, header):
    """Start index of each message, then n: a new message at every kpart change and
    whenever the next entry would pass max_entries or max_bytes (an entry alone
    larger than max_bytes is a message of its own)."""
    n = kparts.shape[0]
    starts = np.empty(n + 1, np.int64)
    m = 0
    count = 0
    nbytes = header
    for i in range(n):
        if i == 0 or kparts[i] != kparts[i - 1] or count == max_entries or nbytes + sizes[i] > max_bytes:
            starts[m] = i
            m += 1
            count = 0
            nbytes = header
        count += 1
        nbytes += sizes[i]
    starts[m] = n
    return starts[:m + 1]


def encode_messages(e: Entries, fmt: str, max_entries: int = MAX_ENTRIES, max_bytes: int = MAX_BYTES):
    """(keys, values, partitions) of the messages for entries `e`, in order: keys are
    the first tx hash of each message (v1) or None (v2)."""
    wf = wire_formats.get_spark(fmt)
    encoder, entry_header = wf.encode_message, wf.overhead("raw")
    sizes = entry_header + np.diff(e.offsets)
    starts = cut(e.kparts, sizes, max_entries, max_bytes, wf.header)
    keys, values, parts = [], [], []
    for a, b in zip(starts[:-1].tolist(), starts[1:].tolist()):  # one call per message
        values.append(encoder(e.keys[a:b], e.actions[a:b], (e.offsets[a:b + 1], e.data)))
        keys.append(e.keys[a].tobytes() if wf.by_message else None)  # v1: keyed by its first hash
        parts.append(int(e.kparts[a]))
    return keys, values, parts


def message_batches(batches, *, fmt: str, max_entries: int = MAX_ENTRIES, max_bytes: int = MAX_BYTES):
    """mapInArrow's function: sorted entries -> Kafka records (key, value, partition).

    The last run of each batch is held back and prepended to the next batch, so a
    run of one kpart that spans batches is cut only by the limits."""
    wf = wire_formats.get_spark(fmt)
    entry_header = wf.overhead("raw")
    pending: Entries | None = None
    for batch in batches:
        e = Entries.from_arrow(batch)
        if pending is not None:
            e = Entries.concat(pending, e)
        if len(e) == 0:
            continue
        other = np.flatnonzero(e.kparts != e.kparts[-1])
        tail = int(other[-1]) + 1 if len(other) else 0  # where the last kpart run starts
        # hold back the run's unfinished message: whole messages before it go now
        sizes = entry_header + np.diff(e.offsets[tail:])
        run_starts = cut(e.kparts[tail:], sizes, max_entries, max_bytes, wf.header)
        split = tail + int(run_starts[-2])
        pending = e.slice(split, len(e))
        if split:
            yield _records(*encode_messages(e.slice(0, split), fmt, max_entries, max_bytes))
    if pending is not None and len(pending):
        yield _records(*encode_messages(pending, fmt, max_entries, max_bytes))


def _records(keys, values, parts):
    import pyarrow as pa

    return pa.RecordBatch.from_arrays(
        [pa.array(keys, pa.binary()), pa.array(values, pa.binary()), pa.array(parts, pa.int32())],
        names=["key", "value", "partition"])
