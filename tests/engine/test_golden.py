"""The golden segments (golden/, made by tests/lib/shmtest/golden_segments.py; docs/segment-format.md,
section 12): the committed files are exactly what the generator makes, and the Python
reader gives every answer they expect. Every other reader's tests (go/) run the same
files and expectations."""

from __future__ import annotations

import gzip
import json
import os
import struct
import time
import uuid

import pytest

import shmcache
from shmcache.engine import reader as R
from shmcache.errors import CorruptCacheError, LayoutVersionError, NotACacheError
from shmcache.ipc import liveness

from shmtest.golden_segments import GOLDEN
from shmtest.golden_cases import build, expectations

EXPECT = json.loads((GOLDEN / "expect.json").read_text())["cases"]
ERRORS = {"not_a_cache": NotACacheError, "version": LayoutVersionError, "corrupt": CorruptCacheError}


def test_committed_goldens_are_what_the_generator_makes():
    cases = build()
    assert (GOLDEN / "expect.json").read_text() == expectations(cases), "golden/expect.json is stale: rerun _golden.py"
    committed = sorted(p.name for p in GOLDEN.glob("*.shm.gz"))
    assert committed == sorted(f"{name}.shm.gz" for name in cases)
    for name, (data, _) in cases.items():
        assert gzip.decompress((GOLDEN / f"{name}.shm.gz").read_bytes()) == data, f"golden/{name}.shm.gz is stale"


@pytest.fixture
def golden_cache():
    """install(case) -> the name of a copy of the golden segment in /dev/shm; removed after."""
    made: list[str] = []

    def install(case: str, patch: dict[int, int] | None = None) -> str:
        data = bytearray(gzip.decompress((GOLDEN / EXPECT[case]["file"]).read_bytes()))
        for off, word in (patch or {}).items():
            struct.pack_into("<q", data, off, word)
        name = f"golden-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        fd = os.open(f"/dev/shm/{name}", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        made.append(name)
        try:
            os.write(fd, data)
        finally:
            os.close(fd)
        return name

    yield install
    for name in made:
        os.unlink(f"/dev/shm/{name}")


def _corruptions(r) -> int:
    return r.stats()["corruptions"]  # no companion: the handle's own count is in it


@pytest.mark.parametrize("case", sorted(c for c in EXPECT if "attach_error" in EXPECT[c]))
def test_damaged_headers_are_refused_by_name(golden_cache, case):
    exp = EXPECT[case]
    name = golden_cache(case)
    with pytest.raises(ERRORS[exp["attach_error"]]) as e:
        shmcache.attach(name)
    assert name in str(e.value)
    if exp["field"]:
        assert f"header field {exp['field']} is" in str(e.value)


@pytest.mark.parametrize("case", sorted(c for c in EXPECT if "keys" in EXPECT[c] and c != "live_holder"))
def test_every_key_answers_as_expected(golden_cache, case):
    exp = EXPECT[case]
    with shmcache.attach(golden_cache(case)) as r:
        if "entries" in exp:
            assert r.stats()["entries"] == exp["entries"]
        for k in exp["keys"]:
            before = _corruptions(r)
            got = r.get(bytes.fromhex(k["key"]))
            want = None if k["value"] is None else bytes.fromhex(k["value"])
            assert got == want, f"{case}: {k['why']}"
            assert (_corruptions(r) > before) == k["corrupt"], f"{case}: {k['why']}: corruption counted?"
        keys = [bytes.fromhex(k["key"]) for k in exp["keys"]]  # and all at once, as one batch
        assert r.get_many(keys) == [None if k["value"] is None else bytes.fromhex(k["value"]) for k in exp["keys"]]


def test_a_bucket_held_mid_write_by_a_live_process_is_given_up_after_the_bound(golden_cache):
    exp = EXPECT["live_holder"]
    name = golden_cache("live_holder", {exp["live_holder_offset"]: liveness.owner_word()})
    held = [k for k in exp["keys"] if k["corrupt"]]
    with shmcache.attach(name) as r:
        t0 = time.monotonic()
        got = r.get_many([bytes.fromhex(k["key"]) for k in held])
        took = time.monotonic() - t0
        assert got == [None] * len(held)
        assert _corruptions(r) == len(held)
        assert R.STUCK_GIVE_UP <= took < R.STUCK_GIVE_UP + 2, "one bound for the whole batch"
        for k in exp["keys"]:
            if not k["corrupt"]:
                assert r.get(bytes.fromhex(k["key"])) == (None if k["value"] is None else bytes.fromhex(k["value"]))
