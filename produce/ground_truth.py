"""The load generator's ground truth: every entry sent, as Parquet, and the state it leaves.

A Parquet file of every entry sent, in send order, written to PATH.tmp from a thread
of its own and renamed to PATH only once every message was acknowledged (a file at
PATH is complete). Columns: txmeta.table_schema() plus `deleted` (bool: the entry was
a DELETE, its value columns null), `seq` (int64, the entry's number in send order) and
`partition` (int32, where it was sent). `final_state()` gives the state the topic
leaves: for each tx_hash its row with the highest seq (produce/loadgen.py says why
that is well defined). `check_sample()` checks a cache against it (the demo's reader).
"""

from __future__ import annotations

import os
import queue
import threading
import time

import numpy as np

from shmcache.formats import txmeta
from shmcache.formats.wire import DELETE

GROUND_TRUTH_ROW_GROUP = 1 << 17  # rows buffered per Parquet row group
BATCH = 1024  # lookups per get_many_packed call in check_sample


def ground_truth_schema():
    import pyarrow as pa

    return txmeta.table_schema(extra=[("deleted", pa.bool_()), ("seq", pa.int64()), ("partition", pa.int32())])


def ground_truth_table(batches: list["GenBatch"], partitions: list[np.ndarray], seq0: int):
    """Consecutive batches as rows of the ground-truth schema (`partitions`: each entry's;
    seq from seq0). Built over many batches at once: the per-call cost of Arrow is paid once."""
    import pyarrow as pa

    keys = np.concatenate([b.keys for b in batches])
    is_delete = np.concatenate([b.actions for b in batches]) == DELETE
    n = len(keys)
    rank = np.zeros(n, np.int64)
    rank[~is_delete] = np.arange(n - int(is_delete.sum()))
    pick = pa.array(rank, mask=is_delete)  # a null index takes a null: DELETE rows have no value
    cols = {k: v.take(pick) for k, v in txmeta.to_arrow(_concat_meta([b.meta for b in batches])).items()}
    hash_offsets = pa.py_buffer(np.arange(0, (n + 1) * 32, 32, dtype=np.int32))
    tx_hash = pa.Array.from_buffers(pa.binary(), n, [None, hash_offsets, pa.py_buffer(keys)])
    return pa.Table.from_pydict({
        "tx_hash": tx_hash, **cols,
        "deleted": pa.array(is_delete),
        "seq": pa.array(np.arange(seq0, seq0 + n, dtype=np.int64)),
        "partition": pa.array(np.concatenate(partitions)),
    }, schema=ground_truth_schema())


def _concat_meta(metas: list[txmeta.Meta]) -> txmeta.Meta:
    """One Meta of the records of `metas`, in order (the offsets rebased)."""
    def offsets(arrays, sizes):
        base = np.cumsum([0, *sizes])
        return np.concatenate([np.zeros(1, np.int64)] + [o[1:] + base[i] for i, o in enumerate(arrays)])

    return txmeta.Meta(
        fee=np.concatenate([m.fee for m in metas]), size=np.concatenate([m.size for m in metas]),
        flags=np.concatenate([m.flags for m in metas]),
        parent_offsets=offsets([m.parent_offsets for m in metas], [len(m.parents) for m in metas]),
        parents=np.concatenate([m.parents for m in metas]),
        vout_offsets=offsets([m.vout_offsets for m in metas], [len(m.vouts) for m in metas]),
        vouts=np.concatenate([m.vouts for m in metas]),
        block_height=np.concatenate([m.block_height for m in metas]),
        valid=np.concatenate([m.valid for m in metas]))


class GroundTruthWriter:
    """Appends batches to PATH.tmp from a thread of its own, a row group (GROUND_TRUTH_ROW_GROUP
    rows) at a time, so building Arrow tables and writing Parquet overlap with producing.
    `commit()` waits for it and renames the file to PATH; `discard()` removes it."""

    QUEUE = 256  # batches in flight: a bound on memory if the disk is slower than the broker

    def __init__(self, path: str):
        import pyarrow.parquet as pq

        self.path = path
        self.tmp = path + ".tmp"
        # random hashes neither dictionary-encode nor compress well: don't spend CPU trying
        self._writer = pq.ParquetWriter(self.tmp, ground_truth_schema(), use_dictionary=False, compression="none")
        self._pending: list = []  # (batch, partitions) not yet written
        self._pending_seq0 = 0
        self._rows = 0
        self._queue: queue.Queue = queue.Queue(self.QUEUE)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="ground-truth-writer", daemon=True)
        self._thread.start()

    def add(self, b: "GenBatch", partitions: np.ndarray, seq0: int) -> None:
        """Queue a batch (its arrays must not change afterwards); raise if writing failed."""
        if self._error is not None:
            raise RuntimeError(f"writing the ground truth {self.tmp}: {self._error}") from self._error
        self._queue.put((b, partitions, seq0))

    def _run(self) -> None:
        try:
            while (item := self._queue.get()) is not None:
                b, parts, seq0 = item
                if not self._pending:
                    self._pending_seq0 = seq0
                self._pending.append((b, parts))
                self._rows += len(b)
                if self._rows >= GROUND_TRUTH_ROW_GROUP:
                    self._flush()
            self._flush()
        except BaseException as e:  # noqa: BLE001 - reported to the producing thread
            self._error = e
            while self._queue.get() is not None:  # drain, so add() and _stop() never block
                pass

    def _flush(self) -> None:
        if self._pending:
            table = ground_truth_table([b for b, _ in self._pending], [p for _, p in self._pending],
                                       self._pending_seq0)
            self._writer.write_table(table, row_group_size=GROUND_TRUTH_ROW_GROUP)
            self._pending, self._rows = [], 0

    def _stop(self) -> None:
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()

    def commit(self) -> None:
        self._stop()
        if self._error is not None:
            raise RuntimeError(f"writing the ground truth {self.tmp}: {self._error}") from self._error
        self._writer.close()
        os.replace(self.tmp, self.path)

    def discard(self) -> None:
        try:
            self._stop()
            self._writer.close()
        except Exception:  # noqa: BLE001 - a half-written file is removed either way
            pass
        try:
            os.unlink(self.tmp)
        except FileNotFoundError:
            pass


def final_state(path: str, columns: list[str] | None = None):
    """The state a ground-truth file describes: for each tx_hash, its row with the highest
    seq (so `deleted` says whether the hash is absent). `columns`: which to read (tx_hash,
    seq and deleted always are)."""
    import pyarrow.compute as pc
    import pyarrow.parquet as pq

    if columns is not None:
        columns = list(dict.fromkeys(["tx_hash", "seq", "deleted", *columns]))
    t = pq.read_table(path, columns=columns)
    last = t.group_by("tx_hash", use_threads=False).aggregate([("seq", "max")])
    return t.filter(pc.is_in(t["seq"], value_set=last["seq_max"]))  # seq is unique: one row per hash


def hashes_of(column) -> np.ndarray:
    """A column of 32-byte tx hashes (pyarrow binary, chunked or not) as an (n, 32) uint8 array."""
    import pyarrow as pa

    arr = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    arr = arr.cast(pa.binary())
    if arr.null_count:
        raise ValueError("tx_hash column holds a null")
    o = np.frombuffer(arr.buffers()[1], np.int32, len(arr) + 1, 4 * arr.offset)
    if len(arr) and (np.diff(o) != 32).any():
        raise ValueError("tx_hash column holds a value that is not 32 bytes")
    data = np.frombuffer(arr.buffers()[2], np.uint8)[o[0]:o[-1]] if len(arr) else np.empty(0, np.uint8)
    return data.reshape(-1, 32)


# -- checking a cache against it (the demo's reader process) -----------------------------------------


def _values_equal(o1, d1, o2, d2) -> np.ndarray:
    """Per row: is value i of (o1, d1) byte-equal to value i of (o2, d2)? Array operations only."""
    from shmcache.formats.registry import take

    l1, l2 = np.diff(o1), np.diff(o2)
    eq = l1 == l2
    idx = np.flatnonzero(eq & (l1 > 0))
    if len(idx):
        a_o, a_d = take(o1, d1, idx)
        _, b_d = take(o2, d2, idx)
        eq[idx] = np.add.reduceat((a_d != b_d).astype(np.int64), a_o[:-1]) == 0
    return eq


def check_sample(name: str, truth_path: str, sample: int, seed: int | None, min_seconds: float = 1.0) -> dict:
    """Look up `sample` sent hashes and check them against the ground truth; then time lookups."""
    import pyarrow.compute as pc

    from shmcache.engine import table
    from shmcache.formats.registry import take

    state = final_state(truth_path)
    rng = np.random.default_rng(seed)
    m = min(sample, state.num_rows)
    rows = state.take(np.sort(rng.choice(state.num_rows, m, replace=False)))
    keys = hashes_of(rows["tx_hash"])
    deleted = rows["deleted"].to_numpy(zero_copy_only=False).astype(bool)
    present = ~deleted
    exp_off, exp_data = txmeta.encode(txmeta.from_arrow(rows.filter(pc.invert(rows["deleted"]))))
    found = np.empty(m, bool)
    lens = np.zeros(m, np.int64)
    chunks = []
    with table.attach(name) as r:
        for s in range(0, m, BATCH):
            p = r.get_many_packed(keys[s:s + BATCH])
            found[s:s + BATCH] = p.found
            lens[s:s + BATCH] = np.diff(p.offsets)
            chunks.append(p.data[p.offsets[0]:p.offsets[-1]].copy())
        got_off = np.zeros(m + 1, np.int64)
        np.cumsum(lens, out=got_off[1:])
        got_data = np.concatenate(chunks) if chunks else np.empty(0, np.uint8)
        live_idx = np.flatnonzero(present)
        g_off, g_data = take(got_off, got_data, live_idx)
        right = _values_equal(g_off, g_data, exp_off, exp_data) & found[live_idx]
        # throughput: the same keys in random order, whole rounds, for at least min_seconds
        order = keys[rng.permutation(m)]
        lookups, spent = 0, 0.0
        while spent < min_seconds:
            t = time.perf_counter()
            for s in range(0, m, BATCH):
                r.get_many_packed(order[s:s + BATCH])
            spent += time.perf_counter() - t
            lookups += m
            if m == 0:
                break
    return {
        "pid": os.getpid(),
        "sampled": int(m),
        "present": int(present.sum()),
        "deleted": int(deleted.sum()),
        "present_hits": int(found[present].sum()),
        "right_values": int(right.sum()),
        "deleted_misses": int((~found[deleted]).sum()),
        "lookups": int(lookups),
        "lookup_seconds": spent,
    }


def reader_main(name, truth_path, sample, seed, out) -> None:
    """Entry point of the reader process (multiprocessing spawn)."""
    try:
        out.put(("ok", check_sample(name, truth_path, sample, seed)))
    except BaseException as e:  # noqa: BLE001 - reported by the parent
        out.put(("error", f"{type(e).__name__}: {e}"))
