"""A container's memory limit (issue 52, part 3): the pages of /dev/shm are charged to the
memory cgroup of the process that first touches them, so a cache past the limit of its
creator's cgroup got the creator OOM-killed partway (exit 137), where /dev/shm had room.
Now `create` and `run` refuse it at once: exit 2, one line naming the room there is and
the room needed, nothing left behind. Run in a memory cgroup of its own (v1 or v2, made
under this process's) with a /dev/shm of its own (a mount namespace, a tmpfs larger than
the limit); needs root."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from shmcache.ipc import memlimit

REPO = Path(__file__).resolve().parents[2]
LIMIT = 400 * 2**20


def _child_cgroup() -> Path | None:
    """A new memory cgroup under this process's (its directory), or None if none can be made."""
    levels = memlimit._levels()
    if os.geteuid() != 0 or not levels:
        return None
    d = Path(levels[0][0]) / f"shmcache-test-{uuid.uuid4().hex[:8]}"
    try:
        d.mkdir()
        (d / levels[0][1]).write_text(str(LIMIT))
    except OSError:
        if d.exists():
            d.rmdir()
        return None
    return d


@pytest.fixture
def cgroup():
    d = _child_cgroup()
    if d is None:
        pytest.skip("no memory cgroup can be made here (needs root and a memory controller)")
    yield d
    d.rmdir()


def _in(cgroup: Path, *commands: list[str]) -> list[subprocess.CompletedProcess]:
    """Each command in the cgroup, in one mount namespace with a 2 GiB tmpfs of its own at
    /dev/shm: its exit, stdout and stderr, and what /dev/shm holds after it (one line each)."""
    script = ["mount -t tmpfs -o size=2g shmtest /dev/shm", f"echo $$ > {cgroup}/cgroup.procs"]
    for argv in commands:
        script += [" ".join(argv) + " >/tmp/.o.$$ 2>/tmp/.e.$$; echo \"rc=$?\"", "cat /tmp/.e.$$ | sed 's/^/err: /'",
                   "echo \"shm: $(ls -A /dev/shm | tr '\\n' ' ')\"", "rm -f /tmp/.o.$$ /tmp/.e.$$"]
    p = subprocess.run(["unshare", "--mount", "--propagation", "private", "--", "sh", "-c", "\n".join(script)],
                       capture_output=True, text=True, timeout=600, cwd=REPO)
    assert p.returncode == 0, p.stderr
    return p.stdout


def test_a_cache_past_its_creators_memory_limit_is_refused_at_once(cgroup):
    py = [sys.executable, "-m", "shmcache"]
    # just past the room (the limit less what the creator itself holds), and well past it
    out = _in(cgroup, [*py, "create", "over", "--memory", "380MiB"],
              [*py, "run", "--name", "over", "--bootstrap", "127.0.0.1:1", "--topic", "t", "--memory", "1GiB"],
              [*py, "create", "fits", "--memory", "200MiB"])
    runs = out.split("rc=")[1:]
    assert len(runs) == 3, out
    for refused in runs[:2]:
        rc, *lines = refused.strip().splitlines()
        errs = [ln for ln in lines if ln.startswith("err: ") and "INFO" not in ln]
        assert rc == "2", out  # not 137: no OOM kill
        assert len(errs) == 1 and re.search(r"does not fit in this process's memory limit, which leaves .* "
                                            r"[\d,]+ bytes at .*shmcache-test-", errs[0]), out
        assert lines[-1].strip() == "shm:", f"something was left in /dev/shm: {out}"
    rc, *lines = runs[2].strip().splitlines()
    assert rc == "0" and "fits" in lines[-1], out  # under the limit: made, and charged to this cgroup
