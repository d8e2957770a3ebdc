"""End to end for the Go reader (go/, issue 41): `shmcache run` fills a cache from the
real broker, and `shmcache-go get` answers every key of the topic exactly as the Python
reader does; its `status` says ready when wait_ready does, its `stats` see the same
table, and its hits count in the readers' companion that the Python reader's stats()
sums. Skipped, saying so, where `go` is not installed."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from shmtest.supervisors import harness  # noqa: F401
from shmtest.topic_model import Model

GO = shutil.which("go")
GO_DIR = Path(__file__).resolve().parents[2] / "go"
PARTITIONS = 4


@pytest.fixture
def shmcache_go(tmp_path) -> str:
    if GO is None:
        pytest.skip("go is not installed: the Go reader is not built")
    exe = tmp_path / "shmcache-go"
    subprocess.run([GO, "build", "-o", str(exe), "./cmd/shmcache-go"], cwd=GO_DIR, check=True,
                   env={**os.environ, "CGO_ENABLED": "0"}, timeout=300)
    return str(exe)


def _run(exe: str, *args: str, exits: tuple[int, ...] = (0,)) -> str:
    p = subprocess.run([exe, *args], capture_output=True, text=True, timeout=60)
    assert p.returncode in exits, p.stderr
    return p.stdout


def test_go_reader_answers_every_key_of_the_topic_as_the_python_reader(harness, kafka_topic, shmcache_go):
    topic = kafka_topic(PARTITIONS)
    model = Model("v1", PARTITIONS, seed=41)
    name, _group, _ends, _sup, r = harness.caught_up(topic, model, PARTITIONS, "go", config={})
    expected = model.snapshot()
    assert sum(v is None for v in expected.values()) > 0 and sum(v is not None for v in expected.values()) > 50
    keys = list(expected)
    hits_before = r.stats()["reader_hits"]
    go_lines: list[str] = []
    for i in range(0, len(keys), 500):
        # exit 1: some keys missed (docs/reader-contract.md)
        go_lines += _run(shmcache_go, "get", name, *(k.hex() for k in keys[i:i + 500]), exits=(0, 1)).splitlines()
    py = r.get_many(keys)
    assert go_lines == ["-" if v is None else v.hex() for v in py]
    assert py == [expected[k] for k in keys]
    go_hits = sum(line != "-" for line in go_lines)
    assert r.stats()["reader_hits"] - hits_before >= go_hits  # the Go process's row, summed by Python

    status = json.loads(_run(shmcache_go, "status", name))
    assert status["ready"] and r.status()["ready"], status["why"]
    assert sorted(p["partition"] for p in status["assigned"]) == list(range(PARTITIONS))
    stats, py_stats = json.loads(_run(shmcache_go, "stats", name)), r.stats()
    for k in ("entries", "bytes_used", "capacity_bytes", "evictions", "sets", "deletes", "creation_id"):
        assert stats[k] == py_stats[k], k
