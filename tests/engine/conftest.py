"""Fixtures of the engine tests: child processes (tests/engine/_procs.py) that are all
stopped and reaped after (a fresh cache name is tests/conftest.py's `cache_name`)."""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _procs import Proc  # noqa: E402


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
