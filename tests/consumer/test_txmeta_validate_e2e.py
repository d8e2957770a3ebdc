"""End to end for the Teranode-shaped Go package (go/txmeta, issue 46): the load generator
sends Teranode-shaped txmeta to the real broker, `shmcache run` fills a cache from it, and
go/cmd/txmeta-validate, playing subtree validation's loop (batches of 1,024 from 2
goroutines), finds exactly what the load generator's ground truth says: a hit for every
live hash, with its fee and parents decoded (those whose value carries a block height too:
there is no horizon, docs/teranode.md), a miss for every deleted or never-sent hash.
Skipped, saying so, where `go` is not installed."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from shmtest.supervisors import harness  # noqa: F401
from shmtest.waits import wait_applied

GO = shutil.which("go")
GO_DIR = Path(__file__).resolve().parents[2] / "go"
PARTITIONS = 4


@pytest.fixture
def txmeta_validate(tmp_path) -> str:
    if GO is None:
        pytest.skip("go is not installed: go/cmd/txmeta-validate is not built")
    exe = tmp_path / "txmeta-validate"
    subprocess.run([GO, "build", "-o", str(exe), "./cmd/txmeta-validate"], cwd=GO_DIR, check=True,
                   env={**os.environ, "CGO_ENABLED": "0"}, timeout=300)
    return str(exe)


def _expected(path: str, absent: list[bytes]) -> tuple[list[bytes], str, dict]:
    """The hashes to look up (every hash sent, and `absent`), in a fixed shuffled order; the
    outcome letter each must get; and the hits' fee sum, parent count and how many of them
    carry a block height."""
    from shmcache.produce import loadgen

    state = loadgen.final_state(path).to_pydict()
    rows = []
    for h, deleted, height, fee, parents in zip(state["tx_hash"], state["deleted"], state["block_height"],
                                                state["fee"], state["parents"]):
        if deleted:
            rows.append((h, "m", 0, 0, False))
        else:
            rows.append((h, "h", fee, len(parents), height is not None))
    rows += [(h, "m", 0, 0, False) for h in absent]
    order = np.random.default_rng(46).permutation(len(rows))
    rows = [rows[i] for i in order]
    hits = [r for r in rows if r[1] == "h"]
    return [r[0] for r in rows], "".join(r[1] for r in rows), {
        "fee_sum": sum(r[2] for r in hits) % 2**64, "parents": sum(r[3] for r in hits),
        "with_height": sum(r[4] for r in hits)}


def _run(exe: str, *args: str, code: int = 0) -> subprocess.CompletedProcess:
    p = subprocess.run([exe, *args], capture_output=True, text=True, timeout=120)
    assert p.returncode == code, f"exit {p.returncode}: {p.stderr}"
    return p


def test_the_validation_loop_finds_what_the_load_generator_sent(harness, kafka_topic, txmeta_validate, tmp_path):
    from shmcache.produce import loadgen

    topic = kafka_topic(PARTITIONS)
    truth = str(tmp_path / "truth.parquet")
    sent = loadgen.produce(loadgen.LoadConfig(bootstrap=harness.bootstrap, topic=topic, count=6_000, format="v1",
                                              batch_size=500, delete_share=0.2, seed=46, ground_truth=truth))
    name = harness.cache_name("txmeta-validate")
    sup = harness.supervisor(name, topic, harness.group("txmeta-validate"))
    r = harness.attach(name, sup=sup)
    wait_applied(r, [sent.end_offsets.get(p, 0) for p in range(PARTITIONS)], 60, sup)

    absent = [hashlib.sha256(b"never sent %d" % i).digest() for i in range(700)]
    hashes, letters, sums = _expected(truth, absent)
    assert letters.count("h") > 300 and letters.count("m") > 300, letters
    assert 300 < sums["with_height"] < letters.count("h") - 300, sums  # hits with and without a height
    (tmp_path / "hashes.bin").write_bytes(b"".join(hashes))
    out = _run(txmeta_validate, "-cache", name, "-owner", str(os.getuid()), "-hashes", str(tmp_path / "hashes.bin"),
               "-goroutines", "2", "-wait", "60s", "-rounds", "2",
               "-outcomes", str(tmp_path / "outcomes"), "-json")
    rep = json.loads(out.stdout)
    assert (tmp_path / "outcomes").read_text() == letters  # hash by hash
    assert (rep["hits"], rep["misses"], rep["malformed"]) == (2 * letters.count("h"), 2 * letters.count("m"), 0)
    assert (rep["fee_sum"], rep["parents"]) == (2 * sums["fee_sum"] % 2**64, 2 * sums["parents"])
    assert rep["batch"] == 1024 and rep["hashes"] == len(hashes) and rep["hashes_per_s"] > 0
    assert rep["health"]["code"] == 200 and rep["health"]["message"].endswith(": ready"), rep["health"]
    live = letters.count("h")
    assert rep["stats"]["size"] == live and rep["stats"]["insertions"] >= live and rep["stats"]["evictions"] == 0
    assert (rep["stats"]["hits"], rep["stats"]["misses"]) == (rep["hits"], rep["misses"])

    # the same hashes as hex lines, one goroutine, batches of 100: the same outcomes
    (tmp_path / "hashes.hex").write_text("".join(h.hex() + "\n" for h in hashes))
    text = _run(txmeta_validate, "-cache", name, "-hashes", str(tmp_path / "hashes.hex"), "-format", "hex",
                "-goroutines", "1", "-batch", "100",
                "-outcomes", str(tmp_path / "outcomes-hex")).stdout
    assert (tmp_path / "outcomes-hex").read_text() == letters
    assert f"{letters.count('h')} hits, {letters.count('m')} misses, 0 malformed" in text

    # once the supervisor stops, the cache is not ready, and says why: exit 1
    assert sup.terminate() == 0
    late = _run(txmeta_validate, "-cache", name, "-generate", "10", "-wait", "0.3s", code=1)
    assert late.stderr.startswith("txmeta-validate: not-ready: ") and "no live supervisor" in late.stderr, late.stderr
