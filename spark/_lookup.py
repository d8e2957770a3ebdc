"""`shmcache.spark.lookup`: look a DataFrame's keys up in this machine's cache.

    from shmcache.spark import lookup
    out = lookup(df, key_col="tx_hash", cache="txmeta", decode="txmeta")

Implemented with `DataFrame.mapInArrow`: each Arrow batch of `df` goes to an
executor's Python worker, which attaches the cache read-only once (see
_executor.py), converts the key column without per-row Python objects (_keys.py),
calls `get_many_packed` and appends the results as Arrow arrays built over the
returned buffers (`Packed.to_arrow`, `txmeta.to_arrow`).

Guaranteed: every input row comes out once, with its columns unchanged, in the
same order within its partition; `found` is true iff the key was in the cache when
its batch was looked up; a null key is a miss. Not guaranteed: a consistent
snapshot across batches or executors (the supervisor keeps writing; each key reads
as its value at some moment during the lookup, never a torn one), nor any entry's
presence (a cache evicts). On a cluster each executor reads its own machine's
replica, so two machines can briefly disagree while one catches up.
"""

from __future__ import annotations

from functools import partial

import numpy as np

WHO = "shmcache.spark.lookup"
DECODERS = (None, "txmeta")


def lookup(df, key_col: str = "tx_hash", cache: str = "txmeta", *, decode: str | None = None,
           value_col: str | None = "value", found_col: str = "found", barrier: bool = False):
    """`df` with `found_col` (boolean) and `value_col` (binary, null where not found;
    None leaves it out) appended, and with decode="txmeta" the MetaBytes fields
    (fee, size, flags, parents, parent_vouts, block_height; see txmeta.arrow_fields),
    null where not found or where the value does not parse.

    `key_col` is binary (raw keys) or string (hex). A wrong column type raises here;
    a key of the wrong length, and a cache missing on an executor's machine, raise
    when the plan runs (Spark wraps them in a PythonException that keeps the text).
    """
    from pyspark.sql.types import BooleanType, BinaryType, StructField, StructType

    from shmcache.spark import _keys

    if decode not in DECODERS:
        raise ValueError(f"{WHO}: decode={decode!r}; expected one of {DECODERS}")
    if key_col not in df.columns:
        raise ValueError(f"{WHO}: no key column {key_col!r} in {df.columns}")
    _keys.check_type(df.schema[key_col].dataType, key_col, WHO)
    new = [StructField(found_col, BooleanType())]
    if value_col is not None:
        new.append(StructField(value_col, BinaryType()))
    if decode == "txmeta":
        new += decoded_fields()
    clash = sorted({f.name for f in new} & set(df.columns))
    if clash or len({f.name for f in new}) != len(new):
        raise ValueError(f"{WHO}: output column(s) {clash or [f.name for f in new]} would clash with df's "
                         "columns or each other; rename them or pass value_col=/found_col=")
    schema = StructType(list(df.schema.fields) + new)
    fn = partial(lookup_batches, cache=cache, key_col=key_col, decode=decode, value_col=value_col,
                 found_col=found_col)
    return df.mapInArrow(fn, schema, barrier=barrier)


def decoded_fields():
    """The txmeta columns as Spark fields (from the one Arrow schema in txmeta.py)."""
    import pyarrow as pa
    from pyspark.sql.pandas.types import from_arrow_schema

    from shmcache import txmeta

    return list(from_arrow_schema(pa.schema(txmeta.arrow_fields())).fields)


# -- in the executors' Python workers -------------------------------------------------------------


def lookup_batches(batches, *, cache: str, key_col: str, decode: str | None, value_col: str | None,
                   found_col: str):
    """mapInArrow's function: each RecordBatch with the lookup's columns appended.

    Per batch, no per-row Python object: the key column's buffer viewed as (n, key_size)
    bytes (_keys.py), one get_many_packed, and the new columns built over the buffers it
    returns (pa.Array.from_buffers: the found bits, the values' offsets and bytes)."""
    import pyarrow as pa

    from shmcache.spark import _executor

    names = None
    for batch in batches:
        r = _executor.reader(cache, WHO)  # per batch: notices a re-created cache
        packed = packed_lookup(r, batch.column(key_col), key_col)
        n = len(packed.found)
        cols = batch.columns
        cols.append(pa.Array.from_buffers(pa.bool_(), n, [None, pa.py_buffer(np.packbits(packed.found,
                                                                                       bitorder="little"))]))
        if value_col is not None:
            cols.append(packed.to_arrow())
        if decode == "txmeta":
            from shmcache import txmeta

            fields = txmeta.to_arrow(txmeta.decode(packed.offsets, packed.data, packed.found))
            cols += list(fields.values())
        if names is None:
            names = batch.schema.names + [found_col] + ([value_col] if value_col is not None else [])
            names += list(fields) if decode == "txmeta" else []
        yield pa.RecordBatch.from_arrays(cols, names=names)


def packed_lookup(r, key_array, key_col: str):
    """get_many_packed over an Arrow key column; null keys are misses."""
    from shmcache.spark import _keys

    keys, valid = _keys.from_arrow(key_array, r.key_size, key_col, f"{WHO} (cache {r.name!r})")
    packed = r.get_many_packed(keys)
    if not valid.all():
        packed.found &= valid  # a null key's placeholder may exist in the cache: still a miss
    return packed


__all__ = ["lookup"]
