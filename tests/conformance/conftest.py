"""The conformance suite's fixtures (the readers, a scene at a cache's name, the live
processes of a control golden's roles); its helpers are shmtest.readers and shmtest.scene."""

import os
import subprocess
import warnings

import pytest

from shmtest import readers as R
from shmtest import scene as S


@pytest.fixture(scope="session")
def readers() -> list[R.Reader]:
    """The readers to hold to the contract: all three (Java on JDK 17 and on JDK 25), less one
    whose toolchain is missing; SHMCACHE_CONFORMANCE_READERS=python,go narrows them (while one
    is being worked on)."""
    only = [n for n in os.environ.get("SHMCACHE_CONFORMANCE_READERS", "").split(",") if n]
    found, missing = [], []
    for name, make in (("python", R.python_reader), ("go", R.go_reader), ("java", R.java_reader),
                       ("java25", R.java25_reader)):
        if only and name not in only:
            continue
        r = make()
        (found if isinstance(r, R.Reader) else missing).append(r)
    for why in missing:
        warnings.warn(f"conformance: a reader is left out: {why}")
    return found


@pytest.fixture
def scene(request):
    made: list[S.Scene] = []

    def make(tag: str, name: str | None = None) -> S.Scene:
        s = S.Scene(tag, name)
        made.append(s)
        return s

    yield make
    for s in made:
        s.clear()


@pytest.fixture(scope="module")
def roles():
    """A live process for each role a control golden names, and its owner word."""
    procs = {role: subprocess.Popen(["sleep", "3600"]) for role in ("supervisor", "worker", "holder")}
    try:
        yield {role: (p.pid, S.live_owner(p.pid)) for role, p in procs.items()}
    finally:
        for p in procs.values():
            p.kill()
            p.wait()
