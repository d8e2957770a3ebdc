"""`shmcache top` (cli/top_view.py): renders without a terminal (plain text, the cache's
figures), once or once per interval; rates are differences of the shared
counters; on a terminal it runs the rich Live view. A run against a live
supervisor is in tests/consumer/supervisor/test_metrics.py."""

import io
import os
import pty
import subprocess
import sys
import time
import uuid
from pathlib import Path

import numpy as np
import pytest
from rich.console import Console

import shmcache
from shmcache.cli import top_view


def poke(w, word: int, value: int) -> None:
    """Header word `word` of Writer w's segment, written by hand: a state the test plants
    (damage, a supervisor between two of its stores, words an earlier shmcache left) that
    no named write of ControlArea makes."""
    w.segment_arrays().header[word] = value

REPO = Path(__file__).resolve().parents[2]
ENV = {**os.environ, "CI": "true"}


@pytest.fixture
def cache():
    """A cache with 3000 entries, 1000 of them deleted again, and one reader's lookups."""
    name = f"t-top-{uuid.uuid4().hex[:10]}"
    keys = np.random.default_rng(4).integers(0, 256, (3000, 32), np.uint8)
    w = shmcache.create(name, memory="64MiB")
    try:
        w.set_many(keys, [b"x" * 90] * len(keys))
        w.delete_many(keys[:1000])
        yield name, w, keys
    finally:
        w.close()
        shmcache.destroy(name)


def _top(*args, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "shmcache", "top", *args], cwd=REPO, capture_output=True,
                          text=True, timeout=60, env=ENV, **kw)


def test_once_without_a_terminal_prints_the_figures_in_plain_text(cache):
    name, w, keys = cache
    with shmcache.attach(name) as r:
        hits = int(r.get_many_packed(keys).found.sum())
        s = r.stats()
    p = _top(name, "--once", "--interval", "0.1")
    assert p.returncode == 0, p.stderr
    out = p.stdout
    assert "\x1b" not in out  # no colours, no cursor movement
    assert f"cache {name}: no topic, no supervisor, not ready" in out
    assert f"{s['entries']:,}" in out and s["entries"] == 2000
    assert f"{hits:,}" in out and f"{len(keys) - hits:,}" in out and hits == 2000
    assert "66.67%" in out  # hit rate
    for title in ("applied", "table", "readers", "supervisor"):
        assert title in out


def test_one_plain_rendering_per_interval(cache):
    name, _, _ = cache
    t = time.monotonic()
    p = _top(name, "--count", "3", "--interval", "0.2")
    assert p.returncode == 0, p.stderr
    assert p.stdout.count(f"cache {name}:") == 3
    assert time.monotonic() - t >= 0.6
    assert "\x1b" not in p.stdout


def test_rates_are_differences_of_the_shared_counters_over_time(cache):
    name, _, keys = cache
    with shmcache.attach(name) as r, shmcache.attach(name) as looker:
        prev = top_view.Snapshot.read(r)
        assert top_view.rates(prev, None)["hits"] == 0
        looker.get_many_packed(keys)  # 2000 hits, 1000 misses, counted in the readers' companion
        time.sleep(0.2)
        cur = top_view.Snapshot.read(r)
    rate = top_view.rates(cur, prev)
    dt = cur.t - prev.t
    assert rate["hits"] == pytest.approx(2000 / dt) and rate["misses"] == pytest.approx(1000 / dt)
    assert rate["add"] == rate["delete"] == 0  # no workers: nothing applied
    buf = io.StringIO()
    Console(file=buf, width=160).print(top_view.render(name, cur, prev))
    assert f"{2000 / dt:,.0f}" in buf.getvalue()


def test_on_a_terminal_it_runs_the_live_view(cache):
    name, _, _ = cache
    leader, follower = pty.openpty()
    try:
        p = subprocess.Popen([sys.executable, "-m", "shmcache", "top", name, "--count", "2", "--interval", "0.2"],
                             cwd=REPO, stdin=follower, stdout=follower, stderr=follower,
                             env={k: v for k, v in os.environ.items() if k not in ("CI", "TERM")} | {"TERM": "xterm"})
        os.close(follower)
        follower = None
        out = b""
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # the child closed the terminal
                break
            if not chunk:
                break
            out += chunk
        assert p.wait(30) == 0
    finally:
        if follower is not None:
            os.close(follower)
        os.close(leader)
    text = out.decode(errors="replace")
    assert "\x1b[" in text  # a terminal gets the live display
    assert name in text and "no supervisor" in text


def test_a_missing_cache_is_an_error_naming_it():
    p = _top("t-top-no-such-cache", "--once")
    assert p.returncode == 2 and "t-top-no-such-cache" in p.stderr


def test_a_stale_supervisor_heartbeat_is_shown(cache):
    """A live supervisor (this process, by its owner word) whose heartbeat stopped a minute
    ago: the header line says how long ago, and that it is stale; a fresh one says nothing."""
    from shmcache.engine.control import layout as C
    from shmcache.ipc import liveness

    name, w, _ = cache
    w.control.claim_supervisor()
    w.control.beat()

    def header() -> str:
        buf = io.StringIO()
        with shmcache.attach(name) as r:
            Console(file=buf, width=200).print(top_view.render(name, top_view.Snapshot.read(r)))
        return buf.getvalue().splitlines()[0]

    assert "stale" not in header()
    poke(w, C.H_SUPERVISOR_HEARTBEAT, time.monotonic_ns() - 60 * 10**9)
    line = header()
    assert f"supervisor pid {os.getpid()}" in line and "heartbeat 60 s ago (stale)" in line, line
    poke(w, C.H_SUPERVISOR, 0)
