"""A reader can be told whose cache it reads (issue 39 item 2). Only writers checked a
segment's owner: a local user who created the name first (before the unit started at
boot, or after a destroy) served any values to every reader, Spark's lookup included,
which re-attaches to a re-created cache by itself. attach(name, owner=...), the same in
lookup and on the command line (--owner), refuse another owner's file with an error
naming both, before anything of it is read. The other user is a real process of another
uid (needs root)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pyarrow as pa
import pytest

import shmcache
from shmcache.engine import reader_stats
from shmcache.errors import CacheOwnerError
from shmcache.spark import _executor
from shmcache.spark._lookup import lookup_batches

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="a cache of another uid: needs root")

REPO = Path(__file__).resolve().parents[2]
SQUATTER = 43212
KEY = b"k" * 32
REAL, FAKE = b"the supervisor's value", b"a squatter's value"

# becomes SQUATTER (after loading the kernels as root) and makes the cache at the name first
_SQUAT = """
    import os, sys
    import shmcache
    name, value = sys.argv[1], sys.argv[2].encode()
    with shmcache.create(name + "-warm", memory="34MiB") as w:
        w.set(b"x" * 32, b"x")
    shmcache.destroy(name + "-warm")
    os.setgroups([])
    os.setgid(int(sys.argv[3]))
    os.setuid(int(sys.argv[3]))
    with shmcache.create(name, memory="34MiB", mode=0o644) as w:
        w.set(b"k" * 32, value)
"""


def _squat(name: str) -> None:
    p = subprocess.run([sys.executable, "-c", textwrap.dedent(_SQUAT), name, FAKE.decode(), str(SQUATTER)],
                       capture_output=True, text=True, timeout=120, cwd=REPO)
    assert p.returncode == 0, p.stderr[-3000:]
    assert os.stat(f"/dev/shm/{name}").st_uid == SQUATTER


@pytest.fixture
def name():
    n = f"t-owner-{uuid.uuid4().hex[:8]}"
    yield n
    _executor._drop(n)
    for extra in ("", "-warm"):
        if shmcache.exists(n + extra):
            shmcache.destroy(n + extra, force=True)


def test_attach_refuses_another_owners_cache_naming_both(name):
    _squat(name)
    with shmcache.attach(name) as r:  # without owner=: the squatter's value is served
        assert r.get(KEY) == FAKE
    for owner in ("root", 0, "0"):
        with pytest.raises(CacheOwnerError) as e:
            shmcache.attach(name, owner=owner)
        said = str(e.value)
        assert f"cache {name!r}" in said and f"belongs to uid {SQUATTER}" in said and "not to uid 0 (root)" in said
        assert isinstance(e.value, PermissionError)
    with shmcache.attach(name, owner=SQUATTER) as r:
        assert r.get(KEY) == FAKE
    with pytest.raises(ValueError, match="owner='no-such-user-x': no such user"):
        shmcache.attach(name, owner="no-such-user-x")


def test_the_command_line_refuses_it_in_one_line(name):
    _squat(name)
    for args in (["get", name, KEY.hex()], ["status", name], ["stats", name]):
        p = subprocess.run([sys.executable, "-m", "shmcache", *args, "--owner", "root"], capture_output=True,
                           text=True, timeout=60, cwd=REPO)
        assert p.returncode == 2 and "Traceback" not in p.stderr, p.stderr
        assert len(p.stderr.strip().splitlines()) == 1 and f"belongs to uid {SQUATTER}" in p.stderr, p.stderr
        assert FAKE.decode() not in p.stdout


def _lookup(name: str, owner) -> bool:
    batch = pa.RecordBatch.from_arrays([pa.array([KEY], pa.binary())], names=["tx_hash"])
    (out,) = lookup_batches([batch], cache=name, key_col="tx_hash", decode=None, value_col="value",
                            found_col="found", owner=owner)
    return out.column("value")[0].as_py()


def test_spark_lookup_refuses_a_cache_re_created_by_another_user(name):
    """An executor's worker looks keys up in root's cache; the cache is destroyed and a
    squatter creates the name again: the worker's next batch re-attaches by itself, and
    with owner= refuses the squatter's file instead of serving its values."""
    with shmcache.create(name, memory="34MiB") as w:
        w.set(KEY, REAL)
    assert _lookup(name, "root") == REAL
    shmcache.destroy(name)
    _squat(name)
    with pytest.raises(CacheOwnerError, match=f"belongs to uid {SQUATTER}"):
        _lookup(name, "root")
    with pytest.raises(CacheOwnerError):  # and again: never served, however often asked
        _lookup(name, "root")
    assert _lookup(name, None) == FAKE  # what a reader told nothing gets


def test_another_owners_companion_is_not_counted_in(name):
    """The cache is root's, its readers' companion another user's: the reader reads, and
    counts nothing into a file it was not told to trust."""
    with shmcache.create(name, memory="34MiB", mode=0o644) as w:
        w.set(KEY, REAL)
    os.chown(reader_stats.path_of(name), SQUATTER, -1)
    with shmcache.attach(name, owner="root") as r:
        assert r.get(KEY) == REAL
        assert r._shared_stats.rows is None
    with shmcache.attach(name) as r:  # told nothing: counted as before
        assert r._shared_stats.rows is not None


def test_a_supervisors_endpoint_reads_only_its_own_users_cache(name):
    """The metrics endpoint follows the cache's name: with the supervisor's owner (its own
    user) it serves no sample of a cache another user made there, and /ready says why."""
    import urllib.error
    import urllib.request

    from shmcache.consumer.supervisor.metrics import MetricsServer

    _squat(name)
    srv = MetricsServer(name, 0, owner=0)
    try:
        with pytest.raises(urllib.error.HTTPError) as e:
            urllib.request.urlopen(f"http://127.0.0.1:{srv.port}/ready", timeout=10)
        said = e.value.read().decode()
        assert e.value.code == 503 and f"belongs to uid {SQUATTER}" in said, said
        text = urllib.request.urlopen(f"http://127.0.0.1:{srv.port}/metrics", timeout=10).read().decode()
        assert "shmcache_table_entries" not in text
    finally:
        srv.close()
