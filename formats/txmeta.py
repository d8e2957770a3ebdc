"""Teranode's txmeta value (`MetaBytes`): the cache value of a tx hash, in batches.

The content of an ADD entry on the txmeta topic (docs/design.md, wire format)::

    +------------+------------+----------+------------------+
    | fee u64 LE | size u64 LE| flags u8 | parentCount u32 LE|                   8 + 8 + 1 + 4 = 21 B
    +------------+------------+----------+------------------+
    | parentCount x 32 B parent tx hashes                   |
    +-------------------------------------------------------+
    | per parent: voutCount u32 LE, voutCount x u32 LE vout |
    +-------------------------------------------------------+
    | [block height u32 BE]                                 |  optional: present iff 4 bytes remain
    +-------------------------------------------------------+

One parent with one vout and no height is the smallest record (21 + 32 + 4 + 4 =
61 B); three parents with a vout each is 141 B. Values are handled as whole
batches (`Meta`: one numpy array a field, lists as offsets into flat arrays), so a
million values are encoded or decoded without a Python object each.

What `decode` checks: the fixed part fits; the parent count fits in what is left
(so a hostile count sizes nothing); every vout list fits; what remains after the
last list is 0 or 4 bytes. A value that fails is `valid=False` with its fields
zeroed and empty lists, never an exception.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numba import njit

from shmcache.engine.xxh64 import u32, u64

HASH = 32  # a parent tx hash
FIXED = 8 + 8 + 1 + 4  # fee + size + flags + parentCount = 21
HEIGHT = 4  # optional block height, big-endian u32
NO_HEIGHT = -1  # block_height of a record that carries none
MIN_SIZE = FIXED + HASH + 4 + 4  # one parent, one vout: 61


@dataclass(eq=False)
class Meta:
    """n txmeta records, column by column.

    Parents of record i are parents[parent_offsets[i]:parent_offsets[i + 1]]; the
    vouts of parent j (a row of `parents`) are vouts[vout_offsets[j]:vout_offsets[j + 1]].
    """

    fee: np.ndarray  # (n,) uint64
    size: np.ndarray  # (n,) uint64
    flags: np.ndarray  # (n,) uint8
    parent_offsets: np.ndarray  # (n + 1,) int64
    parents: np.ndarray  # (m, 32) uint8
    vout_offsets: np.ndarray  # (m + 1,) int64
    vouts: np.ndarray  # (k,) uint32
    block_height: np.ndarray  # (n,) int64, NO_HEIGHT where absent
    valid: np.ndarray  # (n,) bool: parsed cleanly (always True for generated records)

    def __len__(self) -> int:
        return int(self.fee.shape[0])


# -- generating --------------------------------------------------------------------------------


def generate(n: int, rng: np.random.Generator, *, max_parents: int = 3, max_vouts: int = 1,
             height_share: float = 0.5, parent_pool: np.ndarray | None = None) -> Meta:
    """n random Teranode-shaped records: 1..max_parents parents with 1..max_vouts vouts
    each, a block height on `height_share` of them. Parent hashes come from
    `parent_pool` ((p, 32) uint8, e.g. earlier tx hashes) when given, else random."""
    if n < 0 or max_parents < 1 or max_vouts < 1 or not 0.0 <= height_share <= 1.0:
        raise ValueError(f"generate(n={n}, max_parents={max_parents}, max_vouts={max_vouts}, "
                         f"height_share={height_share}): n >= 0, max_* >= 1, 0 <= height_share <= 1")
    npar = rng.integers(1, max_parents + 1, n)
    parent_offsets = np.zeros(n + 1, np.int64)
    np.cumsum(npar, out=parent_offsets[1:])
    m = int(parent_offsets[-1])
    if parent_pool is not None and len(parent_pool):
        parents = np.ascontiguousarray(parent_pool[rng.integers(0, len(parent_pool), m)], np.uint8)
    else:
        parents = rng.integers(0, 256, (m, HASH), np.uint8)
    nv = rng.integers(1, max_vouts + 1, m)
    vout_offsets = np.zeros(m + 1, np.int64)
    np.cumsum(nv, out=vout_offsets[1:])
    vouts = rng.integers(0, 8, int(vout_offsets[-1])).astype(np.uint32)
    height = np.where(rng.random(n) < height_share, rng.integers(800_000, 900_000, n), NO_HEIGHT)
    return Meta(fee=rng.integers(200, 50_000, n).astype(np.uint64),
                size=rng.integers(150, 1_000, n).astype(np.uint64),
                flags=(rng.random(n) < 0.01).astype(np.uint8),  # bit 0: coinbase, rare
                parent_offsets=parent_offsets, parents=parents, vout_offsets=vout_offsets, vouts=vouts,
                block_height=height.astype(np.int64), valid=np.ones(n, np.bool_))


# -- encoding ------------------------------------------------------------------------------------


def encoded_sizes(meta: Meta) -> np.ndarray:
    """Bytes of each record's MetaBytes."""
    npar = np.diff(meta.parent_offsets)
    # vout_offsets is cumulative over parents, so a record's vout count is a difference
    per_record_vouts = meta.vout_offsets[meta.parent_offsets[1:]] - meta.vout_offsets[meta.parent_offsets[:-1]]
    return (FIXED + npar * (HASH + 4) + per_record_vouts * 4
            + np.where(meta.block_height >= 0, HEIGHT, 0)).astype(np.int64)


def encode(meta: Meta) -> tuple[np.ndarray, np.ndarray]:
    """(offsets int64[n + 1], data uint8[]): record i is data[offsets[i]:offsets[i + 1]],
    the shape the cache's set_many and the wire encoders take."""
    _check(meta)
    n = len(meta)
    offsets = np.zeros(n + 1, np.int64)
    np.cumsum(encoded_sizes(meta), out=offsets[1:])
    data = np.empty(int(offsets[-1]), np.uint8)
    _encode(meta.fee, meta.size, meta.flags, meta.parent_offsets, np.ascontiguousarray(meta.parents).reshape(-1),
            meta.vout_offsets, meta.vouts, meta.block_height, offsets, data)
    return offsets, data


def _check(meta: Meta) -> None:
    """The kernels index by these offsets unchecked: a bad Meta raises here instead."""
    n, m = len(meta), len(meta.parents)
    for name, arr, want in (("size", meta.size, n), ("flags", meta.flags, n), ("block_height", meta.block_height, n),
                            ("parent_offsets", meta.parent_offsets, n + 1), ("vout_offsets", meta.vout_offsets, m + 1)):
        if arr.shape != (want,):
            raise ValueError(f"Meta.{name} has shape {arr.shape}; expected ({want},)")
    if meta.parents.ndim != 2 or meta.parents.shape[1] != HASH:
        raise ValueError(f"Meta.parents has shape {meta.parents.shape}; expected (m, {HASH})")
    for name, off, total in (("parent_offsets", meta.parent_offsets, m), ("vout_offsets", meta.vout_offsets, len(meta.vouts))):
        if off[0] != 0 or off[-1] != total or (np.diff(off) < 0).any():
            raise ValueError(f"Meta.{name} must rise from 0 to {total}")


@njit(cache=True, nogil=True)
def _put_le(data, p, v, nbytes):
    for i in range(nbytes):
        data[p + i] = (v >> np.uint64(8 * i)) & np.uint64(0xFF)


@njit(cache=True, nogil=True)
def _encode(fee, size, flags, parent_offsets, parents, vout_offsets, vouts, height, offsets, data):
    for i in range(fee.shape[0]):
        p = offsets[i]
        _put_le(data, p, np.uint64(fee[i]), 8)
        _put_le(data, p + 8, np.uint64(size[i]), 8)
        data[p + 16] = flags[i]
        a, b = parent_offsets[i], parent_offsets[i + 1]
        _put_le(data, p + 17, np.uint64(b - a), 4)
        p += FIXED
        for j in range(a * HASH, b * HASH):
            data[p] = parents[j]
            p += 1
        for j in range(a, b):
            va, vb = vout_offsets[j], vout_offsets[j + 1]
            _put_le(data, p, np.uint64(vb - va), 4)
            p += 4
            for v in range(va, vb):
                _put_le(data, p, np.uint64(vouts[v]), 4)
                p += 4
        if height[i] >= 0:
            h = np.uint64(height[i])
            for k in range(4):  # big-endian, as Teranode appends it
                data[p + k] = (h >> np.uint64(8 * (3 - k))) & np.uint64(0xFF)


# -- decoding ------------------------------------------------------------------------------------


def decode(offsets: np.ndarray, data: np.ndarray, present: np.ndarray | None = None) -> Meta:
    """Decode record i = data[offsets[i]:offsets[i + 1]] for each i where `present`
    (default: all). Absent or malformed records come back valid=False, zeroed, with
    no parents. Never raises on bad bytes."""
    offsets = np.ascontiguousarray(offsets, np.int64)
    data = np.ascontiguousarray(data).view(np.uint8).reshape(-1)
    n = len(offsets) - 1
    if n < 0 or (n and (offsets[0] < 0 or offsets[-1] > len(data) or (np.diff(offsets) < 0).any())):
        raise ValueError(f"offsets must rise from >= 0 to at most len(data)={len(data)}")
    present = np.ones(n, np.bool_) if present is None else np.ascontiguousarray(present, np.bool_)
    if present.shape != (n,):
        raise ValueError(f"present has shape {present.shape}; expected ({n},)")
    valid = np.zeros(n, np.bool_)
    npar = np.zeros(n, np.int64)
    nvout_total = np.zeros(n, np.int64)
    _scan(offsets, data, present, valid, npar, nvout_total)
    parent_offsets = np.zeros(n + 1, np.int64)
    np.cumsum(npar, out=parent_offsets[1:])
    m = int(parent_offsets[-1])
    first_vout = np.zeros(n + 1, np.int64)
    np.cumsum(nvout_total, out=first_vout[1:])
    out = Meta(fee=np.zeros(n, np.uint64), size=np.zeros(n, np.uint64), flags=np.zeros(n, np.uint8),
               parent_offsets=parent_offsets, parents=np.empty((m, HASH), np.uint8),
               vout_offsets=np.zeros(m + 1, np.int64), vouts=np.empty(int(first_vout[-1]), np.uint32),
               block_height=np.full(n, NO_HEIGHT, np.int64), valid=valid)
    _gather(offsets, data, valid, parent_offsets, first_vout, out.fee, out.size, out.flags,
            out.parents.reshape(-1), out.vout_offsets, out.vouts, out.block_height)
    return out


@njit(cache=True, nogil=True)
def _scan(offsets, data, present, valid, npar, nvout_total):
    """Validate each record; count its parents and vouts. Reads only bounds-checked bytes."""
    for i in range(present.shape[0]):
        if not present[i]:
            continue
        p, end = offsets[i], offsets[i + 1]
        if end - p < FIXED:
            continue
        pc = u32(data, p + 17)
        p += FIXED
        if pc > (end - p) // (HASH + 4):  # each parent needs its hash and a vout count
            continue
        p += pc * HASH
        total = 0
        ok = True
        for _ in range(pc):
            if end - p < 4:
                ok = False
                break
            vc = u32(data, p)
            p += 4
            if vc > (end - p) // 4:
                ok = False
                break
            p += vc * 4
            total += vc
        if ok and (end - p == 0 or end - p == HEIGHT):
            valid[i] = True
            npar[i] = pc
            nvout_total[i] = total


@njit(cache=True, nogil=True)
def _gather(offsets, data, valid, parent_offsets, first_vout, fee, size, flags, parents, vout_offsets, vouts,
            height):
    for i in range(valid.shape[0]):
        if not valid[i]:
            continue
        p, end = offsets[i], offsets[i + 1]
        fee[i] = u64(data, p)
        size[i] = u64(data, p + 8)
        flags[i] = data[p + 16]
        a, b = parent_offsets[i], parent_offsets[i + 1]
        p += FIXED
        for j in range(a * HASH, b * HASH):
            parents[j] = data[p]
            p += 1
        v = first_vout[i]
        for j in range(a, b):
            vc = u32(data, p)
            p += 4
            vout_offsets[j] = v
            for _ in range(vc):
                vouts[v] = np.uint32(u32(data, p))
                v += 1
                p += 4
            vout_offsets[j + 1] = v
        if end - p == HEIGHT:
            height[i] = (np.int64(data[p]) << 24) | (np.int64(data[p + 1]) << 16) | (np.int64(data[p + 2]) << 8) \
                | np.int64(data[p + 3])


def record(meta: Meta, i: int) -> dict:
    """Record i as one JSON-ready object, the one `get --decode txmeta` prints in every
    reader (docs/reader-contract.md) and golden/txmeta/cases.json expects: `{"fee", "size",
    "flags", "parents": [hex...], "parent_vouts": [[...]...], "block_height": N or None}`,
    or `{"valid": False}` for a malformed (or absent) record."""
    if not meta.valid[i]:
        return {"valid": False}
    a, b = int(meta.parent_offsets[i]), int(meta.parent_offsets[i + 1])
    return {"fee": int(meta.fee[i]), "size": int(meta.size[i]), "flags": int(meta.flags[i]),
            "parents": [bytes(meta.parents[j]).hex() for j in range(a, b)],
            "parent_vouts": [meta.vouts[meta.vout_offsets[j]:meta.vout_offsets[j + 1]].tolist() for j in range(a, b)],
            "block_height": None if meta.block_height[i] < 0 else int(meta.block_height[i])}


# -- Arrow (the txmeta table) -----------------------------------------------------------------
#
# One schema for every table of txmeta rows: the load generator's ground truth, the
# Parquet a Spark job publishes, the source an audit compares with, and the columns
# a Spark lookup decodes. Spark has no unsigned types, so fields are signed and wide
# enough (fees fit in 63 bits; a u32 vout or height in int64).

def arrow_fields():
    """The decoded columns, in order: (name, pyarrow type)."""
    import pyarrow as pa

    return [("fee", pa.int64()), ("size", pa.int64()), ("flags", pa.int32()),
            ("parents", pa.list_(pa.binary())), ("parent_vouts", pa.list_(pa.list_(pa.int64()))),
            ("block_height", pa.int64())]


def table_schema(extra=()):
    """tx_hash (binary, 32 bytes) + the decoded columns (+ extra (name, type) pairs)."""
    import pyarrow as pa

    return pa.schema([("tx_hash", pa.binary()), *arrow_fields(), *extra])


def to_arrow(meta: Meta) -> dict:
    """The decoded columns as pyarrow arrays (see arrow_fields), built from the flat
    arrays without per-row Python work. Invalid records are null in every column;
    block_height is null where absent."""
    import pyarrow as pa

    invalid = ~meta.valid
    types = dict(arrow_fields())
    m = len(meta.parents)
    hash_offsets = pa.py_buffer(np.arange(0, (m + 1) * HASH, HASH, dtype=np.int32))
    parents = pa.Array.from_buffers(pa.binary(), m, [None, hash_offsets,
                                                     pa.py_buffer(np.ascontiguousarray(meta.parents))])
    po = pa.array(meta.parent_offsets.astype(np.int32))
    vo = pa.array(meta.vout_offsets.astype(np.int32))
    inner = pa.ListArray.from_arrays(vo, pa.array(meta.vouts.astype(np.int64)))
    return {
        "fee": pa.array(meta.fee.astype(np.int64), mask=invalid),
        "size": pa.array(meta.size.astype(np.int64), mask=invalid),
        "flags": pa.array(meta.flags.astype(np.int32), mask=invalid),
        "parents": pa.ListArray.from_arrays(po, parents, mask=pa.array(invalid)).cast(types["parents"]),
        "parent_vouts": pa.ListArray.from_arrays(po, inner, mask=pa.array(invalid)).cast(types["parent_vouts"]),
        "block_height": pa.array(meta.block_height, mask=invalid | (meta.block_height < 0)),
    }


def from_arrow(table) -> Meta:
    """A Meta from a pyarrow Table or RecordBatch with the decoded columns (extra
    columns are ignored). A null in any column but block_height, or a parent hash
    that is not 32 bytes, raises ValueError naming the column and the row."""
    import pyarrow as pa
    import pyarrow.compute as pc

    n = table.num_rows
    cols = {}
    for name, typ in arrow_fields():
        if name not in table.column_names:
            raise ValueError(f"txmeta table: no column {name!r} (has {table.column_names})")
        col = table.column(name)
        if isinstance(col, pa.ChunkedArray):
            col = col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
        col = col.cast(typ)
        if name != "block_height" and col.null_count:
            raise ValueError(f"txmeta table: column {name!r} has a null at row {_first_null(col)}")
        cols[name] = col

    def offsets_of(lists):  # a list array's offsets, rebased to 0 (slices keep their parent's)
        o = np.frombuffer(lists.buffers()[1], np.int32, len(lists) + 1, 4 * lists.offset)
        return (o - o[0]).astype(np.int64)

    po = offsets_of(cols["parents"])
    hashes = pc.list_flatten(cols["parents"])
    if hashes.null_count:
        raise ValueError("txmeta table: column 'parents' holds a null hash")
    lens = pc.binary_length(hashes).to_numpy(zero_copy_only=False)
    if len(lens) and (lens != HASH).any():
        bad = int(np.flatnonzero(lens != HASH)[0])
        row = int(np.searchsorted(po, bad, side="right") - 1)
        raise ValueError(f"txmeta table: row {row} has a parent hash of {int(lens[bad])} bytes, not {HASH}")
    parents = np.frombuffer(_binary_data(hashes), np.uint8).reshape(-1, HASH)
    pv = cols["parent_vouts"]
    if not np.array_equal(offsets_of(pv), po):
        raise ValueError("txmeta table: 'parent_vouts' must hold one vout list per parent")
    inner = pc.list_flatten(pv)
    if inner.null_count:
        raise ValueError("txmeta table: column 'parent_vouts' holds a null list")
    vo = offsets_of(inner)
    vouts = pc.list_flatten(inner).to_numpy(zero_copy_only=False)
    if len(vouts) and (vouts.min() < 0 or vouts.max() > 0xFFFFFFFF):
        raise ValueError("txmeta table: a vout outside 0..2**32-1")
    height = cols["block_height"].fill_null(NO_HEIGHT).to_numpy(zero_copy_only=False).astype(np.int64)
    if (height > 0xFFFFFFFF).any() or (height < NO_HEIGHT).any():
        raise ValueError("txmeta table: a block_height outside 0..2**32-1")
    fee = cols["fee"].to_numpy(zero_copy_only=False)
    size = cols["size"].to_numpy(zero_copy_only=False)
    flags = cols["flags"].to_numpy(zero_copy_only=False)
    if (fee < 0).any() or (size < 0).any() or (flags < 0).any() or (flags > 255).any():
        raise ValueError("txmeta table: fee and size must be >= 0 and flags 0..255")
    return Meta(fee=fee.astype(np.uint64), size=size.astype(np.uint64), flags=flags.astype(np.uint8),
                parent_offsets=po, parents=np.ascontiguousarray(parents), vout_offsets=vo,
                vouts=vouts.astype(np.uint32), block_height=height, valid=np.ones(n, np.bool_))


def _first_null(col) -> int:
    return int(np.flatnonzero(col.is_null().to_numpy(zero_copy_only=False))[0])


def _binary_data(arr) -> bytes:
    """The bytes of a binary array's values, back to back (a copy of one buffer, no per-row work)."""
    import pyarrow as pa

    arr = arr.cast(pa.binary())
    o = np.frombuffer(arr.buffers()[1], np.int32, len(arr) + 1, 4 * arr.offset)
    return memoryview(arr.buffers()[2])[o[0]:o[-1]].tobytes() if len(arr) else b""
