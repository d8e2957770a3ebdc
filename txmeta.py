"""Teranode's txmeta value (`MetaBytes`): the cache value of a tx hash, in batches.

The content of an ADD entry on the txmeta topic (DESIGN.md, wire format)::

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
    n = len(meta)
    offsets = np.zeros(n + 1, np.int64)
    np.cumsum(encoded_sizes(meta), out=offsets[1:])
    data = np.empty(int(offsets[-1]), np.uint8)
    _encode(meta.fee, meta.size, meta.flags, meta.parent_offsets, np.ascontiguousarray(meta.parents).reshape(-1),
            meta.vout_offsets, meta.vouts, meta.block_height, offsets, data)
    return offsets, data


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


@njit(inline="always")
def _u32le(d, p):
    return np.int64(d[p]) | (np.int64(d[p + 1]) << 8) | (np.int64(d[p + 2]) << 16) | (np.int64(d[p + 3]) << 24)


@njit(inline="always")
def _u64le(d, p):
    v = np.uint64(0)
    for k in range(8):
        v |= np.uint64(d[p + k]) << np.uint64(8 * k)
    return v


@njit(cache=True, nogil=True)
def _scan(offsets, data, present, valid, npar, nvout_total):
    """Validate each record; count its parents and vouts. Reads only bounds-checked bytes."""
    for i in range(present.shape[0]):
        if not present[i]:
            continue
        p, end = offsets[i], offsets[i + 1]
        if end - p < FIXED:
            continue
        pc = _u32le(data, p + 17)
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
            vc = _u32le(data, p)
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
        fee[i] = _u64le(data, p)
        size[i] = _u64le(data, p + 8)
        flags[i] = data[p + 16]
        a, b = parent_offsets[i], parent_offsets[i + 1]
        p += FIXED
        for j in range(a * HASH, b * HASH):
            parents[j] = data[p]
            p += 1
        v = first_vout[i]
        for j in range(a, b):
            vc = _u32le(data, p)
            p += 4
            vout_offsets[j] = v
            for _ in range(vc):
                vouts[v] = np.uint32(_u32le(data, p))
                v += 1
                p += 4
            vout_offsets[j + 1] = v
        if end - p == HEIGHT:
            height[i] = (np.int64(data[p]) << 24) | (np.int64(data[p + 1]) << 16) | (np.int64(data[p + 2]) << 8) \
                | np.int64(data[p + 3])


# -- Arrow ---------------------------------------------------------------------------------------


def to_arrow(meta: Meta) -> dict:
    """Arrow columns (pyarrow arrays, no per-row Python work): fee, size (uint64), flags
    (uint8), parents (list<fixed_size_binary(32)>), parent_vouts (list<list<uint32>>),
    block_height (int64, null where absent). Invalid records are null in every column."""
    import pyarrow as pa

    n = len(meta)
    invalid = ~meta.valid
    mask = pa.array(invalid)
    parents = pa.FixedSizeBinaryArray.from_buffers(pa.binary(HASH), len(meta.parents),
                                                   [None, pa.py_buffer(np.ascontiguousarray(meta.parents))])
    po = pa.array(meta.parent_offsets.astype(np.int32))
    vo = pa.array(meta.vout_offsets.astype(np.int32))
    inner = pa.ListArray.from_arrays(vo, pa.array(meta.vouts, pa.uint32()))
    return {
        "fee": pa.array(meta.fee, mask=invalid),
        "size": pa.array(meta.size, mask=invalid),
        "flags": pa.array(meta.flags, mask=invalid),
        "parents": pa.ListArray.from_arrays(po, parents, mask=mask),
        "parent_vouts": pa.ListArray.from_arrays(po, inner, mask=mask),
        "block_height": pa.array(meta.block_height, mask=invalid | (meta.block_height < 0)),
    } if n else {
        "fee": pa.array([], pa.uint64()), "size": pa.array([], pa.uint64()), "flags": pa.array([], pa.uint8()),
        "parents": pa.array([], pa.list_(pa.binary(HASH))), "parent_vouts": pa.array([], pa.list_(pa.list_(pa.uint32()))),
        "block_height": pa.array([], pa.int64()),
    }
