"""Reading txmeta Parquet for the publish and audit jobs: which hashes are added,
which are deleted.

A source is Parquet of txmeta rows (`txmeta.table_schema()`: tx_hash and the
decoded columns; extra columns are ignored). Deletes come from either or both of:
- a boolean column (`delete_col`): a row where it is true is a DELETE of its hash,
  its other columns are ignored (they may be null); null counts as false;
- a second Parquet input (`deletes`) holding at least the key column.

Meaning, for publish and audit alike: a hash with a DELETE ends absent, even if
the same input also adds it (publish sends every ADD of a partition before its
DELETEs). Not defined: two ADD rows of one hash with different values (which
one the cache ends with depends on Spark's row order).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Source:
    adds: object  # DataFrame: key column + txmeta columns, one row per ADD
    deletes: object | None  # DataFrame: the key column only, one row per DELETE; None if no deletes asked for
    key_col: str


def read(spark, path, *, key_col: str = "tx_hash", delete_col: str | None = None, deletes=None,
         who: str) -> Source:
    from pyspark.sql import functions as F
    from pyspark.sql.types import BooleanType

    from shmcache.formats import txmeta
    from shmcache.spark import _keys

    df = spark.read.parquet(*_paths(path))
    if key_col not in df.columns:
        raise ValueError(f"{who}: {path}: no key column {key_col!r} (columns: {df.columns})")
    _keys.check_type(df.schema[key_col].dataType, key_col, who)
    fields = [name for name, _ in txmeta.arrow_fields()]
    missing = [c for c in fields if c not in df.columns]
    if missing:
        raise ValueError(f"{who}: {path}: not a txmeta table, columns {missing} are missing "
                         f"(see txmeta.table_schema(); has {df.columns})")
    dels = []
    adds = df
    if delete_col is not None:
        if delete_col not in df.columns:
            raise ValueError(f"{who}: {path}: no delete column {delete_col!r} (columns: {df.columns})")
        if not isinstance(df.schema[delete_col].dataType, BooleanType):
            raise TypeError(f"{who}: delete column {delete_col!r} is {df.schema[delete_col].dataType.simpleString()}, "
                            "expected boolean")
        flag = F.coalesce(F.col(delete_col), F.lit(False))
        adds = df.filter(~flag)
        dels.append(df.filter(flag).select(key_col))
    if deletes is not None:
        d = spark.read.parquet(*_paths(deletes))
        if key_col not in d.columns:
            raise ValueError(f"{who}: deletes {deletes}: no key column {key_col!r} (columns: {d.columns})")
        if d.schema[key_col].dataType != df.schema[key_col].dataType:
            raise TypeError(f"{who}: deletes {deletes}: key column {key_col!r} is "
                            f"{d.schema[key_col].dataType.simpleString()} but {path} has "
                            f"{df.schema[key_col].dataType.simpleString()}; use one type for both")
        dels.append(d.select(key_col))
    union = None
    for d in dels:
        union = d if union is None else union.unionByName(d)
    return Source(adds=adds.select(key_col, *fields), deletes=union, key_col=key_col)


def _paths(path) -> list[str]:
    return [str(p) for p in path] if isinstance(path, (list, tuple)) else [str(path)]
