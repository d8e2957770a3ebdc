"""Example Parquet of txmeta rows, any size: the input of publish and audit.

    shmcache spark datagen /tmp/txmeta --rows 1000000 [--delete-share 0.01 [--deletes-out /tmp/deletes]]

Writes `part-NNNNN.parquet` files of up to `rows_per_file` rows each, with the one
txmeta schema (`txmeta.table_schema()`): tx_hash (32 random bytes) and the decoded
MetaBytes fields (`txmeta.generate`: 1-3 parents, whose hashes are earlier rows'
tx hashes as in a real chain, a block height on half of them). Plain pyarrow, no
Spark: chunk by chunk, so memory stays at one file's worth whatever `rows` is.
Deterministic for a given seed and rows_per_file.

Deletes, optional: a share of the hashes is also deleted, either as extra rows with
`deleted = true` (and null txmeta fields) in the same files (then every row has the
`deleted` column), or as a second Parquet input of bare hashes (`deletes_path`),
the two forms publish and audit accept.

Not guaranteed: unique hashes. They are random 32-byte strings, so a repeat is
as likely as a SHA-256 collision.
"""

from __future__ import annotations

import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

DELETE_COL = "deleted"


@dataclass
class DatagenReport:
    path: str
    rows: int  # txmeta rows (ADDs)
    deletes: int  # hashes also deleted
    files: int
    bytes: int  # on disk
    seconds: float

    def to_dict(self) -> dict:
        return asdict(self)


def write(path, rows: int, *, seed: int = 0, rows_per_file: int = 250_000, delete_share: float = 0.0,
          deletes_path=None, overwrite: bool = False) -> DatagenReport:
    """Write `rows` txmeta rows under directory `path` (see the module docstring)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from shmcache.formats import txmeta

    if not isinstance(rows, int) or rows < 0:
        raise ValueError(f"datagen: rows={rows!r} must be an int >= 0")
    if rows_per_file < 1:
        raise ValueError(f"datagen: rows_per_file={rows_per_file!r} must be >= 1")
    if not 0.0 <= delete_share <= 1.0:
        raise ValueError(f"datagen: delete_share={delete_share!r} must be in [0, 1]")
    t0 = time.monotonic()
    out = _prepare(Path(path), overwrite)
    dout = _prepare(Path(deletes_path), overwrite) if deletes_path is not None else None
    with_column = delete_share > 0 and dout is None
    schema = txmeta.table_schema([(DELETE_COL, pa.bool_())] if with_column else [])
    ndel = nfiles = 0
    parents = None  # the previous chunk's hashes: parents of this chunk's transactions
    for i, start in enumerate(range(0, rows, rows_per_file)):
        n = min(rows_per_file, rows - start)
        rng = np.random.default_rng([seed, i])
        keys = rng.integers(0, 256, (n, 32), np.uint8)
        meta = txmeta.generate(n, rng, parent_pool=parents)
        parents = keys
        cols = {"tx_hash": _hashes(keys), **txmeta.to_arrow(meta)}
        gone = np.sort(rng.choice(n, int(round(n * delete_share)), replace=False)) if delete_share else np.empty(0, int)
        ndel += len(gone)
        if with_column:
            cols[DELETE_COL] = pa.array(np.zeros(n, np.bool_))
            table = pa.Table.from_pydict(cols, schema=schema)
            dels = pa.table({"tx_hash": _hashes(keys[gone]), DELETE_COL: pa.array(np.ones(len(gone), np.bool_))})
            table = pa.concat_tables([table, dels], promote_options="default").cast(schema)
        else:
            table = pa.Table.from_pydict(cols, schema=schema)
            if dout is not None and len(gone):
                pq.write_table(pa.table({"tx_hash": _hashes(keys[gone])}), dout / f"part-{i:05d}.parquet")
        pq.write_table(table, out / f"part-{i:05d}.parquet")
        nfiles += 1
    size = sum(f.stat().st_size for d in (out, dout) if d is not None for f in d.glob("*.parquet"))
    return DatagenReport(path=str(out), rows=rows, deletes=ndel, files=nfiles, bytes=size,
                         seconds=time.monotonic() - t0)


def _hashes(keys: np.ndarray):
    """An Arrow binary array of the rows of an (n, 32) uint8 array, without per-row objects."""
    import pyarrow as pa

    n = len(keys)
    return pa.Array.from_buffers(pa.binary(), n, [None, pa.py_buffer(np.arange(0, 32 * (n + 1), 32, dtype=np.int32)),
                                                  pa.py_buffer(np.ascontiguousarray(keys))])


def _prepare(d: Path, overwrite: bool) -> Path:
    """An empty directory `d` (its old part files removed if overwrite)."""
    d.mkdir(parents=True, exist_ok=True)
    old = list(d.glob("part-*.parquet"))
    if old and not overwrite:
        raise FileExistsError(f"datagen: {d} already holds {len(old)} part files (overwrite=True / --overwrite replaces them)")
    for f in old:
        os.unlink(f)
    return d
