"""The public surface of the handles (docs/python-api.md): a Reader has no write methods
at all, one apply takes every form of values, no private keyword on the constructors,
`from shmcache import *` never shadows the builtin open(), and every public call says
what it does (the API reference, docs/api.md, is made of these docstrings)."""

import inspect

import numpy as np
import pytest

import shmcache


def test_import_star_leaves_the_builtin_open_alone():
    assert "open" not in shmcache.__all__
    assert shmcache.open is shmcache.engine.table.open_writer  # the attribute stays
    scope: dict = {}
    exec("from shmcache import *", scope)
    assert "open" not in scope and "attach" in scope and "Reader" in scope


def _public_calls():
    """(name, object) of every public call: the face's names (shmcache.open too), each public
    method and property of its classes (and of the handle follow() returns), the snapshot
    calls, the txmeta codec and the Spark jobs."""
    from shmcache import snapshots
    from shmcache.engine.reattach import Followed
    from shmcache.formats import txmeta
    from shmcache.spark import lookup, publish, session

    faces = {n: getattr(shmcache, n) for n in [*shmcache.__all__, "open"] if n not in shmcache.errors.__all__}
    faces["Followed"] = Followed
    for n, o in faces.items():
        yield f"shmcache.{n}", o
        if inspect.isclass(o):
            for m in dir(o):
                if m.startswith("_") and m not in ("__enter__", "__exit__", "__contains__", "__len__"):
                    continue
                static = inspect.getattr_static(o, m)
                if isinstance(static, property) or inspect.isfunction(static) or isinstance(static, classmethod):
                    yield f"shmcache.{n}.{m}", static
    for n in snapshots.__all__:
        yield f"shmcache.snapshots.{n}", getattr(snapshots, n)
    for n in ("Meta", "decode", "encode", "generate", "to_arrow", "from_arrow", "arrow_fields"):
        yield f"shmcache.txmeta.{n}", getattr(txmeta, n)
    for n, o in (("lookup", lookup), ("publish", publish), ("session", session)):
        yield f"shmcache.spark.{n}", o


def test_every_public_call_says_what_it_does():
    calls = list(_public_calls())
    assert len(calls) > 60  # the walk finds the API at all
    bare = sorted(n for n, o in calls if len((getattr(o, "__doc__", None) or "").strip()) < 20)
    assert not bare, f"public calls without a docstring: {bare}"


def test_constructors_have_no_private_keyword():
    assert list(inspect.signature(shmcache.Reader).parameters) == ["name", "owner"]  # attach(owner=)
    assert list(inspect.signature(shmcache.Writer).parameters) == ["name"]


def test_a_reader_has_no_write_methods(cache_name):
    w = shmcache.create(cache_name, memory="40MiB", max_value=64)
    try:
        with shmcache.attach(cache_name) as r:
            for method in ("set", "set_many", "delete", "delete_many", "apply", "apply_spans", "repair_dead_locks"):
                assert not hasattr(r, method), method
            assert not hasattr(r.control, "set_word")
        assert not hasattr(w, "apply_spans")  # one write path: apply
    finally:
        w.close()


def test_apply_takes_values_in_each_form_with_the_same_result(cache_name):
    keys = np.random.default_rng(3).integers(0, 256, (5, 32), np.uint8)
    vals = [b"", b"a", b"bc", b"def", b"ghij"]
    data = np.frombuffer(b"".join(vals), np.uint8)
    lens = np.array([len(v) for v in vals])
    offsets = np.concatenate([[0], np.cumsum(lens)])
    w = shmcache.create(cache_name, memory="40MiB", max_value=64)
    try:
        for form in (vals, (offsets, data), (offsets[:-1], lens, data)):
            w.delete_many(keys)
            assert not w.contains_many(keys).any()
            w.apply(keys, np.zeros(5, np.uint8), form)
            assert w.get_many(keys) == vals, form
        with pytest.raises(shmcache.ValueTooLargeError, match="a value span is outside data"):
            w.apply(keys, np.zeros(5, np.uint8), (offsets[:-1], lens + 1, data))
    finally:
        w.close()


def test_stats_read_the_creation_time_and_the_write_batches(cache_name):
    import time

    t0 = time.time()
    w = shmcache.create(cache_name, memory="40MiB", max_value=64)
    try:
        s = w.stats()
        assert t0 - 1 <= s["created_s"] <= time.time() + 1 and s["write_batches"] == 0
        w.set_many([b"a" * 32, b"b" * 32], [b"x", b"y"])
        w.delete(b"a" * 32)
        assert w.stats()["write_batches"] == 2 and w.stats()["sets"] == 2
    finally:
        w.close()
