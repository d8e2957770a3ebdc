"""The golden control areas (golden/control/, made by tests/lib/shmtest/golden_control.py;
docs/segment-format.md section 14): the committed files are what the generator makes, and
the Python reader's status gives every case's expected ready, caught_up, reason and why, its
partitions' behind_s, and the why of each of its readiness bounds.
The conformance suite (tests/conformance/) asks the Go and Java readers the same."""

from __future__ import annotations

import gzip
import os
import re
import subprocess
import time
import uuid

import pytest

import shmcache
from shmcache.engine.control.bound import beyond
from shmcache.ipc import liveness

from shmtest import golden_control as G
from shmtest.golden_segments import GOLDEN

CASES = G.load()


def test_committed_control_goldens_are_what_the_generator_makes():
    cases = G.build(gzip.decompress((GOLDEN / "base.shm.gz").read_bytes()))
    assert (G.CONTROL / "expect.json").read_text() == G.expectations(cases), "golden/control/expect.json is stale"
    assert sorted(p.name for p in G.CONTROL.glob("*.shm.gz")) == sorted(f"{n}.shm.gz" for n in cases)
    for name, (data, _) in cases.items():
        assert gzip.decompress((G.CONTROL / f"{name}.shm.gz").read_bytes()) == data, f"{name} is stale"


@pytest.fixture(scope="module")
def roles():
    """A live process for each role a case names, and its owner word."""
    procs = {role: subprocess.Popen(["sleep", "600"]) for role in ("supervisor", "worker")}
    try:
        yield {role: (p.pid, liveness.owner_word(p.pid)) for role, p in procs.items()}
    finally:
        for p in procs.values():
            p.kill()
            p.wait()


@pytest.mark.parametrize("case", sorted(CASES))
def test_the_python_reader_gives_each_cases_status(case, roles):
    exp = CASES[case]
    name = f"golden-control-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    data = G.image(exp, {r: w for r, (_, w) in roles.items()}, time.monotonic_ns())
    fd = os.open(f"/dev/shm/{name}", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        os.write(fd, data)
        os.close(fd)
        held = G.hold_locks(f"/dev/shm/{name}", exp)
        try:
            with shmcache.attach(name) as r:
                st = r.status()
        finally:
            os.close(held)
        got = {k: st[k] for k in ("ready", "caught_up", "reason")}
        assert got == {k: exp["status"][k] for k in got}, (case, st["why"])
        assert re.match(G.why_pattern(exp, roles["supervisor"][0]), st["why"]), (case, st["why"])
        assert not G.behind_wrong(exp, st), (case, G.behind_wrong(exp, st))
        for b in exp.get("bounds", []):
            said = beyond(st, b.get("max_lag"), b.get("max_behind"))
            assert re.match(G.why_pattern(exp, 0, b["why"]), said), (case, b, said)
    finally:
        os.unlink(f"/dev/shm/{name}")
