"""At the command line a user's mistake is one line on stderr and exit 2, never a
traceback, and leaves nothing behind in /dev/shm. Every case runs through the
command's own main() (an exception it let through fails the test); a few of them
also as `python -m shmcache`, as a user would (a child process with a bound)."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

import shmcache
from shmcache import cli
from shmcache.engine import reader_stats

REPO = Path(__file__).resolve().parents[2]
NAME = f"t-cli-{os.getpid()}-{uuid.uuid4().hex[:8]}"


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "shmcache", *args], capture_output=True, text=True, timeout=90,
                          cwd=REPO, env={**os.environ, "CI": "true"})


@pytest.fixture(scope="module")
def cache():
    """One cache the cases may name; destroyed after."""
    with shmcache.create(f"{NAME}-c", memory="34MiB"):
        pass
    yield f"{NAME}-c"
    shmcache.destroy(f"{NAME}-c")


CASES = [
    (["create", NAME, "--memory", "1000TiB"], ["memory=1000.0 TiB", "does not fit in /dev/shm", "free"]),
    (["create", NAME, "--memory", "1" + "0" * 400], ["memory=", "more than any machine holds"]),
    (["create", NAME, "--memory=-5MiB"], ["memory='-5MiB' is not a size"]),
    (["create", NAME, "--memory", "-5MiB"], ["--memory", "expected one argument"]),
    (["create", NAME, "--memory", "1MiB"], ["is too small"]),
    (["create", NAME, "--mode", "999"], ["'999' is not an octal file mode"]),
    (["create", NAME, "--mode", "666"], ["mode=0o666", "no one else write"]),
    (["create", NAME, "--mode", "rw-------"], ["is not an octal file mode"]),
    (["create", NAME, "--key-size", "0"], ["key_size=0"]),
    (["create", NAME, "--key-size", "-1"], ["key_size=-1"]),
    (["create", NAME, "--key-size", "x"], ["--key-size", "invalid int value"]),
    (["create", NAME, "--max-value", "-1"], ["max_value=-1"]),
    (["create", "../etc"], ["cache name '../etc' is not valid"]),
    (["create", ".hidden"], ["is not valid"]),
    (["create", ""], ["is not valid"]),
    (["create"], ["the following arguments are required: name"]),
    (["stats", NAME], [f"shmcache: not-found: cache '{NAME}' does not exist"]),
    (["destroy", NAME], [f"cache '{NAME}' does not exist"]),
    (["destroy", "a/b"], ["is not valid"]),
    (["frobnicate"], ["invalid choice"]),
    (["get", "{cache}", "zz"], ["shmcache: bad-argument: key 0 'zz' is not hex"]),
    (["get", "{cache}", "abcd"], ["shmcache: bad-argument: ", "key 0 is 2 bytes; this cache's keys are 32 bytes"]),
    (["get", "{cache}"], ["shmcache: bad-argument: get: the following arguments are required: HEXKEY"]),
    (["frobnicate"], ["shmcache: bad-argument: argument command: invalid choice"]),
    ([], ["shmcache: bad-argument: the following arguments are required: command"]),
    (["get", "../x", "00"], ["shmcache: bad-argument: cache name '../x' is not valid"]),
    (["watch", "{cache}", "00" * 32, "soon"], ["shmcache: bad-argument: SECONDS 'soon' is not a number"]),
    (["wait-ready", "{cache}", "--timeout", "-1"], ["shmcache: bad-argument: --timeout '-1'"]),
    (["status", NAME], [f"shmcache: not-found: cache '{NAME}' does not exist"]),
    (["set", "{cache}", "00" * 32, "xyz"], ["value 'xyz' is not hex"]),
    (["run"], ["give --name, --bootstrap, --topic"]),
    (["run", "--name", NAME, "--bootstrap", "x:1", "--topic", "t", "--snapshot-keep", "0"], ["snapshot_keep=0"]),
    (["run", "--name", NAME, "--bootstrap", "x:1", "--topic", "t", "--snapshot-rate", "fast"],
     ["snapshot_rate='fast' is not a size"]),
    (["snapshot", NAME, "/tmp/x.snap"], [f"cache '{NAME}' does not exist"]),
    (["snapshot", "{cache}", "/tmp/x.snap", "--rate", "1 TB/s"], ["--rate='1 TB/s' is not a size"]),
    (["snapshot", "{cache}", "/tmp/x.snap.tmp"], ["ending in .tmp", "unfinished snapshot"]),
    (["snapshot", "{cache}", "/dev/shm/{cache}"], ["/dev/shm/", "a shmcache cache segment", "refusing to replace"]),
    (["snapshot", "{cache}", str(REPO)], [str(REPO), "a directory", "refusing to replace"]),
    (["run", "--name", NAME, "--bootstrap", "x:1", "--topic", "t", "--broker-wait", "1", "--snapshot-dir",
      str(REPO / "README.md")], [f"snapshot_dir {REPO / 'README.md'}", "exists and is not a directory"]),
    (["run", "--name", NAME, "--bootstrap", "x:1", "--topic", "t", "--broker-wait", "1", "--snapshot-dir",
      str(REPO / "README.md" / "snaps")], [f"snapshot_dir {REPO / 'README.md' / 'snaps'}", "cannot be made"]),
    (["restore", "/nonexistent/x.snap", NAME], ["No such file", "/nonexistent/x.snap"]),
    (["restore", str(REPO / "README.md"), NAME], ["README.md", "not a shmcache snapshot"]),
    (["restore", "/nonexistent/x.snap", NAME, "--mode", "999"], ["--mode", "'999' is not an octal file mode"]),
]


def _one_line(code, out: str, err: str, fragments: list[str]) -> None:
    assert code == 2, (code, err)
    assert "Traceback" not in err, err
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    for f in fragments:
        assert f in lines[0], lines[0]
    assert out == ""


def _id(argv: list[str]) -> str:
    """A case's test id: the same in every process (pytest-xdist's workers collect apart)."""
    return " ".join(argv).replace(NAME, "{name}")[:40]


@pytest.mark.parametrize("argv, fragments", CASES, ids=[_id(a) for a, _ in CASES])
def test_a_user_mistake_is_one_line_and_exit_2(cache, capsys, argv, fragments):
    try:
        code = cli.main([a.format(cache=cache) for a in argv])
    except SystemExit as e:  # argparse's own exit
        code = e.code
    got = capsys.readouterr()
    _one_line(code, got.out, got.err, fragments)


OVER_SEGMENT = next(i for i, (argv, _) in enumerate(CASES) if "/dev/shm/{cache}" in argv)


@pytest.mark.parametrize("i", [0, 3, OVER_SEGMENT, len(CASES) - 1], ids=lambda i: _id(CASES[i][0]))
def test_as_a_user_runs_it(cache, i):
    argv, fragments = CASES[i]
    res = _cli(*[a.format(cache=cache) for a in argv])
    _one_line(res.returncode, res.stdout, res.stderr, fragments)


@pytest.fixture(autouse=True)
def nothing_left():
    """No case leaves a cache (or its companion) behind; one that did is removed, and fails."""
    yield
    left = [p for p in (f"/dev/shm/{NAME}", reader_stats.path_of(NAME)) if os.path.lexists(p)]
    for p in left:
        os.unlink(p)
    assert not left, f"left behind: {left}"


@pytest.mark.parametrize("argv", [["status", "--json", "{cache}"], ["stats", "--json", "{cache}"], ["list"],
                                  ["get", "{cache}", "00" * 32]])
def test_a_closed_pipe_is_a_quiet_exit(cache, argv):
    """`shmcache status --json NAME | head -c 1`, at its hardest: the reader of stdout is gone
    before the command writes its first byte. Nothing on stderr, exit 128 + SIGPIPE, as a
    command killed by SIGPIPE would."""
    read, write = os.pipe()
    os.close(read)
    try:
        p = subprocess.run([sys.executable, "-m", "shmcache", *(a.format(cache=cache) for a in argv)],
                           stdout=write, stderr=subprocess.PIPE, text=True, timeout=90, cwd=REPO,
                           env={**os.environ, "CI": "true"})
    finally:
        os.close(write)
    assert (p.returncode, p.stderr) == (128 + 13, ""), p


@pytest.mark.parametrize("line", [
    ["wait-ready", "--max-lag", "-1", "x"],
    ["wait-ready", "--timeout", "1e3", "x"],
    ["get", "x", "zz"],
    ["watch", "x", "61", "-1"],
    ["status", "--bogus", "x"],
    ["stats"],
])
def test_a_line_refused_imports_neither_numpy_nor_numba(line):
    """A line the command line refuses is judged before the engine is imported: one line and
    exit 2 in the time Python starts in (the table's kernels, numpy and numba, took a
    second of every mistake, and of every refused line of the readers' contract suite)."""
    p = subprocess.run([sys.executable, "-X", "importtime", "-m", "shmcache", *line], capture_output=True,
                       text=True, timeout=90, cwd=REPO)
    said = [x for x in p.stderr.splitlines() if not x.startswith("import time:")]
    imported = {x.rsplit("|", 1)[-1].strip() for x in p.stderr.splitlines() if x.startswith("import time:")}
    assert p.returncode == 2 and len(said) == 1 and said[0].startswith("shmcache: bad-argument: "), p.stderr[-2000:]
    assert not {"numpy", "numba"} & imported, sorted({"numpy", "numba"} & imported)
