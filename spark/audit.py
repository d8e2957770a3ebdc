"""Audit: compare a Parquet source of truth with this machine's cache.

    from shmcache.spark import audit, session
    report = audit.audit(session("audit"), "txmeta.parquet", "txmeta")
    report.ok, report.counts, report.samples

    shmcache spark audit txmeta.parquet --cache txmeta [--fail-on-mismatch] [--json]

Every hash of the source is looked up from the executors (as `lookup` does) and
put in one class:

| status   | expected (the source)          | the cache                      |
| -------- | ------------------------------ | ------------------------------ |
| hit      | present with value V           | present with exactly V         |
| miss     | present with value V           | absent                         |
| mismatch | present with value V           | present with another value     |
| absent   | deleted                        | absent                         |
| stale    | deleted                        | present                        |

V is the MetaBytes that `txmeta.encode` makes of the row, compared byte for byte.
Deletes come from a column or a second input, as for publish (_source.py). A hash
both added and deleted is expected deleted.

The report holds the count of each class and up to `samples` examples of each
(hash, expected and found value in hex). `ok` means no mismatch and nothing stale;
misses are reported, not failed on by default: a cache may evict (see its
`evictions` stat), or still be catching up (`shmcache status`).

Not guaranteed: a snapshot. The supervisor keeps applying while the audit reads,
so an audit during traffic can count entries that were correct a moment later;
audit a topic at rest, or after `wait_ready`, to get exact figures. Each batch is
aggregated on its executor; only counts and samples reach the driver.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from functools import partial

import numpy as np

WHO = "shmcache.spark.audit"
STATUSES = ("hit", "miss", "mismatch", "absent", "stale")
HIT, MISS, MISMATCH, ABSENT, STALE = range(len(STATUSES))
EXPECT = "_shmcache_expect_present"  # the internal column: True = expect the row's value, False = expect absent
RESULT_SCHEMA = "status string, n long, hashes array<binary>, expected array<binary>, got array<binary>"


@dataclass
class AuditReport:
    source: str
    cache: str
    counts: dict[str, int]  # status -> rows
    samples: dict[str, list[dict]] = field(default_factory=dict)  # status -> [{tx_hash, expected, got}] (hex)
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        """No value differs and nothing deleted is still there (misses allowed)."""
        return self.counts["mismatch"] == 0 and self.counts["stale"] == 0

    @property
    def total(self) -> int:
        return sum(self.counts.values())

    def to_dict(self) -> dict:
        return {**asdict(self), "ok": self.ok, "total": self.total}


def audit(spark, path, cache: str, *, key_col: str = "tx_hash", delete_col: str | None = None, deletes=None,
          samples: int = 5) -> AuditReport:
    """Compare Parquet `path` (txmeta rows, plus deletes) with cache `cache` (see module docstring)."""
    from pyspark.sql import functions as F

    from shmcache.spark import _source

    if samples < 0:
        raise ValueError(f"{WHO}: samples={samples} must be >= 0")
    t0 = time.monotonic()
    src = _source.read(spark, path, key_col=key_col, delete_col=delete_col, deletes=deletes, who=WHO)
    present = src.adds
    if src.deletes is not None:
        gone = src.deletes.select(key_col).distinct()
        present = present.join(gone, key_col, "left_anti")
        rows = present.withColumn(EXPECT, F.lit(True)).unionByName(
            gone.withColumn(EXPECT, F.lit(False)), allowMissingColumns=True)
    else:
        rows = present.withColumn(EXPECT, F.lit(True))
    fn = partial(audit_batches, cache=cache, key_col=key_col, samples=samples)
    counts = dict.fromkeys(STATUSES, 0)
    found: dict[str, list[dict]] = {s: [] for s in STATUSES}
    for r in rows.mapInArrow(fn, RESULT_SCHEMA).collect():  # a few rows per batch
        counts[r.status] += r.n
        room = samples - len(found[r.status])
        for h, e, g in list(zip(r.hashes, r.expected, r.got))[:max(room, 0)]:
            found[r.status].append({"tx_hash": bytes(h).hex(), "expected": None if e is None else bytes(e).hex(),
                                    "got": None if g is None else bytes(g).hex()})
    return AuditReport(source=str(path), cache=cache, counts=counts,
                       samples={s: v for s, v in found.items() if v}, seconds=time.monotonic() - t0)


# -- in the executors ------------------------------------------------------------------------------


def audit_batches(batches, *, cache: str, key_col: str, samples: int):
    """mapInArrow's function: per batch, one row per status that occurs: its count and
    up to `samples` examples."""
    import pyarrow as pa
    import pyarrow.compute as pc

    from shmcache.formats import txmeta
    from shmcache.spark import _executor
    from shmcache.spark._lookup import packed_lookup

    for batch in batches:
        if batch.column(key_col).null_count:
            raise ValueError(f"{WHO}: the source has a null {key_col!r}; every row needs a tx hash")
        r = _executor.reader(cache, WHO)
        packed = packed_lookup(r, batch.column(key_col), key_col)
        expect = batch.column(EXPECT).to_numpy(zero_copy_only=False).astype(np.bool_)
        got = packed.to_arrow()
        n = batch.num_rows
        want = pa.nulls(n, pa.binary())
        status = np.where(packed.found, STALE, ABSENT).astype(np.int8)
        idx = np.flatnonzero(expect)
        if len(idx):
            offsets, data = txmeta.encode(txmeta.from_arrow(batch.take(pa.array(idx))))
            exp = pa.Array.from_buffers(pa.binary(), len(idx), [None, pa.py_buffer(offsets.astype(np.int32)),
                                                                pa.py_buffer(data)])
            same = pc.equal(exp, got.take(pa.array(idx))).fill_null(False).to_numpy(zero_copy_only=False)
            status[idx] = np.where(~packed.found[idx], MISS, np.where(same, HIT, MISMATCH))
            want = _scatter(exp, idx, n)
        keys = batch.column(key_col)
        out = {"status": [], "n": [], "hashes": [], "expected": [], "got": []}
        for s in np.unique(status).tolist():
            rows = np.flatnonzero(status == s)
            pick = pa.array(rows[:samples])
            out["status"].append(STATUSES[s])
            out["n"].append(len(rows))
            out["hashes"].append(_as_binary(keys.take(pick)).to_pylist())
            out["expected"].append(want.take(pick).to_pylist())
            out["got"].append(got.take(pick).to_pylist())
        yield pa.RecordBatch.from_pydict(out, schema=pa.schema([
            ("status", pa.string()), ("n", pa.int64()), ("hashes", pa.list_(pa.binary())),
            ("expected", pa.list_(pa.binary())), ("got", pa.list_(pa.binary()))]))


def _scatter(values, idx: np.ndarray, n: int):
    """A length-n array with values[j] at row idx[j], null elsewhere."""
    import pyarrow as pa

    pos = np.full(n, -1, np.int64)
    pos[idx] = np.arange(len(idx))
    return values.take(pa.array(pos, mask=pos < 0))


def _as_binary(keys):
    """Sample hashes as bytes: hex-string key columns are decoded for the report."""
    import pyarrow as pa

    if pa.types.is_string(keys.type) or pa.types.is_large_string(keys.type):
        return pa.array([None if k is None else bytes.fromhex(k) for k in keys.to_pylist()], pa.binary())
    return keys.cast(pa.binary())
