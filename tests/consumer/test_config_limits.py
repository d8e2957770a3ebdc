"""`shmcache run`'s settings are checked at start for type, finiteness and range, each
refused in one line naming it (issue 39 item 9): `commit_interval = nan`, a negative or
NaN `drain_timeout`, `batch_messages` of 0, -1 (every consume() raised) or 10^9, a memory
that is no size (found only at the cache's creation) and timeouts past what an int64 of
nanoseconds holds were accepted. Every name librdkafka takes for a setting shmcache owns
is reserved: `[kafka] "metadata.broker.list"` silently replaced --bootstrap."""

from __future__ import annotations

import re
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

import shmcache
from shmcache.consumer.config import RESERVED_KAFKA, RunConfig

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
BASE = {"name": '"limits"', "bootstrap": '"127.0.0.1:1"', "topic": '"t"'}

BAD = [
    ("commit_interval = nan", "commit_interval=nan: expected more than 0 and at most 3,600"),
    ("commit_interval = inf", "commit_interval=inf: expected more than 0"),
    ("drain_timeout = -1.0", "drain_timeout=-1.0: expected more than 0 and at most 86,400"),
    ("drain_timeout = nan", "drain_timeout=nan: expected more than 0"),
    ("drain_timeout = 0", "drain_timeout=0: expected more than 0"),
    ("batch_messages = 0", "batch_messages=0: expected at least 1 and at most 100,000"),
    ("batch_messages = -1", "batch_messages=-1: expected at least 1"),
    ("batch_messages = 1000000000", "batch_messages=1000000000: expected at least 1 and at most 100,000"),
    ("worker_heartbeat_timeout = 1e300", "worker_heartbeat_timeout=1e+300: expected more than 0 and at most 86,400"),
    ("worker_start_timeout = -inf", "worker_start_timeout=-inf: expected more than 0"),
    ("stop_timeout = nan", "stop_timeout=nan: expected more than 0"),
    ("broker_wait = inf", "broker_wait=inf: expected at least 0 and at most 2,592,000 (0 = for ever)"),
    ("broker_wait = nan", "broker_wait=nan: expected at least 0"),
    ("snapshot_interval = nan", "snapshot_interval=nan: expected more than 0"),
    ("snapshot_keep = 0", "snapshot_keep=0: expected at least 1"),
    ("max_rate = -5", "max_rate=-5: expected at least 0 and at most 1,000,000,000,000 (0 = unlimited)"),
    ("metrics_port = 70000", "metrics_port=70000: expected at least 0 and at most 65,535 (0 = no endpoint)"),
    ("workers = 0", "workers=0: expected at least 1 and at most"),
    ("key_size = 0", "key_size=0: expected at least 1 and at most 1,024"),
    ('memory = "lots"', "memory='lots' is not a size"),
    ('memory = "0"', "memory='0' must be positive"),
    ('snapshot_rate = "fast"', "snapshot_rate='fast' is not a size"),
    ('memory_max = "huge"', "memory_max='huge' is not a size"),
    ('memory = "1GiB"\nmemory_max = "512MiB"', "memory_max='512MiB': less than memory='1GiB'; the cache only grows up"),
    ("grow_below = 0", "grow_below=0: expected more than 0"),
    ('[kafka]\n"metadata.broker.list" = "elsewhere:9092"',
     "kafka setting 'metadata.broker.list' is set by shmcache itself; use --bootstrap instead"),
    ('[kafka]\n"auto.commit.enable" = true', "kafka setting 'auto.commit.enable' is set by shmcache itself"),
    ('[kafka]\n"auto.offset.reset" = "latest"', "kafka setting 'auto.offset.reset' is set by shmcache itself"),
    ('[kafka]\n"default.topic.config" = {"auto.offset.reset" = "latest"}',
     "kafka setting 'default.topic.config' is set by shmcache itself"),
    ("[kafka]\nfetch.max.bytes = 1", "kafka setting 'fetch' = {'max': {'bytes': 1}}: a table, not a value; write a "
                                     'librdkafka name in quotes ("fetch.max" = ...)'),
    ('[kafka]\n"fetch.wait.max.ms" = nan', "kafka setting 'fetch.wait.max.ms' = nan: expected text, a number"),
    ('[kafka]\n"client.id" = [1, 2]', "kafka setting 'client.id' = [1, 2]: expected text"),
]


def _toml(tmp_path: Path, line: str) -> Path:
    key = line.split(" =")[0]
    f = tmp_path / "limits.toml"
    f.write_text("".join(f"{k} = {v}\n" for k, v in BASE.items() if k != key) + line + "\n")
    return f


@pytest.mark.parametrize("line, said", BAD, ids=[b[0].replace("\n", " ") for b in BAD])
def test_a_setting_out_of_range_is_refused_by_name(tmp_path, line, said):
    with pytest.raises(ValueError, match=re.escape(said)):
        RunConfig.from_toml(str(_toml(tmp_path, line)))


@pytest.mark.parametrize("line, said", [BAD[0], BAD[6], BAD[19], BAD[22]], ids=["nan", "batch -1", "memory", "alias"])
def test_shmcache_run_says_it_in_one_line_before_anything(tmp_path, line, said):
    """The start itself: one line on stderr, exit 2, no cache made (the memory was found
    only at the cache's creation, the alias never)."""
    name = f"t-limits-{uuid.uuid4().hex[:8]}"
    f = _toml(tmp_path, line)
    f.write_text(f.read_text().replace('"limits"', f'"{name}"'))
    p = subprocess.run([sys.executable, "-m", "shmcache", "run", "--config", str(f)], cwd=REPO,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and p.stderr.strip().startswith(f"shmcache: {said}"), p.stderr[-3000:]
    assert len(p.stderr.strip().splitlines()) == 1, p.stderr[-3000:]
    assert not shmcache.exists(name)


@pytest.mark.parametrize("key", sorted(RESERVED_KAFKA))
def test_every_reserved_name_is_refused_from_set_too(key):
    """--set KEY=VALUE of each reserved name and alias (as `shmcache run` builds its config)."""
    with pytest.raises(ValueError, match=re.escape(f"kafka setting {key!r} is set by shmcache itself")):
        RunConfig(name="x", bootstrap="127.0.0.1:1", topic="t", kafka={key: "1"})


def test_the_edges_and_the_example_are_taken():
    c = RunConfig(name="x", bootstrap="b:1", topic="t", batch_messages=1, drain_timeout=0.01, commit_interval=3600,
                  broker_wait=0, max_rate=0, metrics_port=0, snapshot_keep=10_000, memory="1MiB",
                  kafka={"fetch.max.bytes": 1, "enable.partition.eof": False, "fetch.wait.max.ms": 1.5})
    assert c.batch_messages == 1
    assert RunConfig(name="x", bootstrap="b:1", topic="t", batch_messages=100_000).batch_messages == 100_000
    assert RunConfig.from_toml(str(DEPLOY / "shmcache.toml")).name == "txmeta"
