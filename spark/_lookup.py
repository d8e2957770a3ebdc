"""`shmcache.spark.lookup`: look a DataFrame's keys up in this machine's cache.

    from shmcache.spark import lookup
    out = lookup(df, key_col="tx_hash", cache="txmeta", decode="txmeta")

Two engines give the same rows. engine="jvm" (the default when the shmcache JVM jar
is built, see _session.py) looks keys up inside the executors' JVM (jvm/: a Java reader of
the segment): a node of the query's plan that looks a partition's keys up 256 at a time,
their cache misses overlapped (io.shmcache.spark.BatchLookups; Spark prunes columns and
pushes filters on the input's columns below it, and plans it in each micro-batch of a
streaming query); decode="txmeta" with shmcache_txmeta (the same decoder in Java), so no row
goes through a Python worker at all. engine="python" uses `DataFrame.mapInArrow`: each
Arrow batch of `df` goes to an executor's Python worker, which attaches the cache
read-only once (see _executor.py), converts the key column without per-row Python
objects (_keys.py), calls `get_many_packed` and appends the results as Arrow arrays
built over the returned buffers (`Packed.to_arrow`, `txmeta.to_arrow`). barrier=True
is a mapInArrow stage: it takes the Python engine.

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
ENGINES = (None, "jvm", "python")


def lookup(df, key_col: str = "tx_hash", cache: str = "txmeta", *, decode: str | None = None,
           value_col: str | None = "value", found_col: str = "found", barrier: bool = False,
           engine: str | None = None, owner: int | str | None = None):
    """`df` with `found_col` (boolean) and `value_col` (binary, null where not found;
    None leaves it out) appended, and with decode="txmeta" the MetaBytes fields
    (fee, size, flags, parents, parent_vouts, block_height; see txmeta.arrow_fields),
    null where not found or where the value does not parse.

    `key_col` is binary (raw keys) or string (hex). A wrong column type raises here;
    a key of the wrong length, and a cache missing on an executor's machine, raise
    when the plan runs (Spark wraps them in an exception that keeps the text).

    `engine`: "jvm" (the default when the shmcache JVM jar is built, the session loads it,
    and barrier is not given) or "python"; see the module docstring.

    `owner` (a user name or uid, e.g. "shmcache"): each executor refuses a cache whose file
    another user owns (naming both: CacheOwnerError in a Python worker, the JVM reader's
    ShmcacheException.WrongOwner), at its first attach and at every re-attach to a
    re-created cache, before reading anything of it. The name is looked up on each
    executor's machine.
    """
    from pyspark.sql.types import BooleanType, BinaryType, StructField, StructType

    from shmcache.spark import _keys

    if decode not in DECODERS:
        raise ValueError(f"{WHO}: decode={decode!r}; expected one of {DECODERS}")
    if engine not in ENGINES:
        raise ValueError(f"{WHO}: engine={engine!r}; expected one of {ENGINES}")
    if engine == "jvm" and barrier:
        raise ValueError(f"{WHO}: barrier=True is a mapInArrow stage: use engine='python'")
    if owner is not None and (isinstance(owner, bool) or not isinstance(owner, (int, str)) or owner == ""
                              or (isinstance(owner, int) and owner < 0)):
        raise ValueError(f"{WHO}: owner={owner!r}; expected a user name or a uid")
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
    if engine is None:
        engine = "jvm" if not barrier and _jvm_usable(df.sparkSession) else "python"
    if engine == "jvm":
        return _lookup_jvm(df, key_col, cache, decode, value_col, found_col, owner)
    schema = StructType(list(df.schema.fields) + new)
    fn = partial(lookup_batches, cache=cache, key_col=key_col, decode=decode, value_col=value_col,
                 found_col=found_col, owner=owner)
    return df.mapInArrow(fn, schema, barrier=barrier)


def _lookup_jvm(df, key_col, cache, decode, value_col, found_col, owner):
    """The lookup, and the txmeta decoding, as Spark SQL functions in the executors' JVM."""
    from pyspark.sql import functions as F

    _register_jvm(df.sparkSession)
    cols = [F.col(f"`{c}`") for c in df.columns]
    args = [F.lit(cache), F.col(f"`{key_col}`")] + ([F.lit(str(owner))] if owner is not None else [])
    batched = JVM_BATCHED
    if value_col is None and decode is None:
        if batched:
            return _batched(df, key_col, cache, owner, found_col, values=False)
        return df.select(*cols, F.call_function("shmcache_contains", *args).alias(found_col))
    tmp = value_col or f"__shmcache_value_{found_col}"
    if batched:  # chunks of rows looked up together, their cache misses overlapped (BatchLookups)
        staged = _batched(df, key_col, cache, owner, tmp, values=True)
    else:
        # the lookup in a projection of its own (it is not deterministic: Spark keeps it apart and
        # evaluates it once a row), then what is derived from its value
        staged = df.select(*cols, F.call_function("shmcache_get", *args).alias(tmp))
    value = F.col(f"`{tmp}`")
    out = [value.isNotNull().alias(found_col)] + ([value] if value_col is not None else [])
    if decode is None:
        return staged.select(*cols, *out)
    meta = f"__shmcache_txmeta_{found_col}"
    staged = staged.select(*cols, value, F.call_function("shmcache_txmeta", value).alias(meta))
    fields = [F.col(f"`{meta}`").getField(f.name).alias(f.name) for f in decoded_fields()]
    return staged.select(*cols, *out, *fields)


# engine="jvm": the batched lookup (io.shmcache.spark.BatchLookups, a node of the plan looking up 256 keys
# at a time, their misses overlapped), measured at 2.2x the row-at-a-time expression (bench/README.md "The
# JVM lookup"); False: the SQL functions shmcache_get / shmcache_contains a row at a time (the bench's).
JVM_BATCHED = True


def _batched(df, key_col, cache, owner, out_col, values):
    """df with out_col appended by the batched JVM lookup: the value (binary) or, values=False, found."""
    from pyspark.sql import DataFrame

    jdf = df.sparkSession._jvm.io.shmcache.spark.BatchLookups.lookup(
        df._jdf, key_col, cache, None if owner is None else str(owner), out_col, values)
    return DataFrame(jdf, df.sparkSession)


_REGISTERED: set[int] = set()  # ids of the JVM sessions the functions are registered in


def _jvm_usable(spark) -> bool:
    """Whether the JVM engine can run here: the jar is built for this Spark and the session
    loads its functions (a session started without the jar on spark.jars cannot)."""
    from shmcache.spark._session import SparkSetupError, jvm_jar

    if jvm_jar(required=False) is None:
        return False
    try:
        _register_jvm(spark)
    except SparkSetupError:
        return False
    return True


def _register_jvm(spark) -> None:
    """shmcache_get / shmcache_contains in this session (idempotent): session() starts it with
    them as an extension; a session started otherwise gets them here, if the jar is loaded."""
    from shmcache.spark._session import JVM_BUILD, SparkSetupError, jvm_jar

    jvm_jar()  # built, and for this Spark
    js = spark._jsparkSession
    if id(js) in _REGISTERED:
        return
    try:
        spark._jvm.io.shmcache.spark.Functions.register(js)
    except TypeError:  # py4j: no such class (a JavaPackage is not callable)
        raise SparkSetupError(
            f"{WHO}: engine='jvm': this SparkSession cannot load io.shmcache.spark.Functions: start it with "
            "shmcache.spark.session() (which puts the shmcache JVM jar on spark.jars), or set spark.jars to "
            f"the jar yourself ({JVM_BUILD}); or use engine='python'") from None
    _REGISTERED.add(id(js))


def decoded_fields():
    """The txmeta columns as Spark fields (from the one Arrow schema in formats/txmeta.py)."""
    import pyarrow as pa
    from pyspark.sql.pandas.types import from_arrow_schema

    from shmcache.formats import txmeta

    return list(from_arrow_schema(pa.schema(txmeta.arrow_fields())).fields)


# -- in the executors' Python workers -------------------------------------------------------------


def lookup_batches(batches, *, cache: str, key_col: str, decode: str | None, value_col: str | None,
                   found_col: str, owner: int | str | None = None):
    """mapInArrow's function: each RecordBatch with the lookup's columns appended.

    Per batch, no per-row Python object: the key column's buffer viewed as (n, key_size)
    bytes (_keys.py), one get_many_packed, and the new columns built over the buffers it
    returns (pa.Array.from_buffers: the found bits, the values' offsets and bytes)."""
    import pyarrow as pa

    from shmcache.spark import _executor

    names = None
    for batch in batches:
        r = _executor.reader(cache, WHO, owner)  # per batch: notices a re-created cache (and checks its owner)
        packed = packed_lookup(r, batch.column(key_col), key_col)
        n = len(packed.found)
        cols = batch.columns
        cols.append(pa.Array.from_buffers(pa.bool_(), n, [None, pa.py_buffer(np.packbits(packed.found,
                                                                                       bitorder="little"))]))
        if value_col is not None:
            cols.append(packed.to_arrow())
        if decode == "txmeta":
            from shmcache.formats import txmeta

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
