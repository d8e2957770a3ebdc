"""Fixtures of the engine tests: a fresh cache name (its segment destroyed after), and
child processes (tests/engine/_procs.py) that are all stopped and reaped after."""

from __future__ import annotations

import os
import sys
import uuid

import pytest

import shmcache

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _procs import Proc  # noqa: E402


@pytest.fixture
def cache_name():
    name = f"t-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    yield name
    if shmcache.exists(name):
        shmcache.destroy(name)


@pytest.fixture
def procs(tmp_path):
    """start(role, *args) -> a running Proc; every one is closed and reaped at teardown."""
    started: list[Proc] = []

    def start(role, *args):
        p = Proc(role, *args, log_dir=str(tmp_path))
        started.append(p)
        return p

    yield start
    for p in started:
        p.close()
    for p in started:
        assert p.p.poll() is not None
