"""The deployment serves readers of other users (issue 39 item 1): `shmcache run` always
made its cache 0600 (no --mode; `mode =` in the TOML refused as unknown), so Spark
executors or services of any other user could not attach, and a cache made with
`shmcache create --mode 640` came back 0600 after a restore at start. Now `--mode` /
`mode =` and `--reader-group` / `reader_group =` hold at every start: for a cache the
run creates, one restored from a snapshot, and one it finds. Real `shmcache run`
processes (no broker: the cache is made before the broker is waited for) and readers
running as other uids, one in the reader group and one outside it. Needs root."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

import shmcache
from shmcache.consumer.supervisor import snapshot_dir as snapdir
from shmcache.consumer.config import RunConfig
from shmcache.engine import reader_stats
from shmcache import snapshots as S
from shmcache.ipc.segment import path_of

from shmtest.waits import poll_until, stop_popen

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="readers of other uids: needs root")

REPO = Path(__file__).resolve().parents[3]
GROUP = 43210  # the readers' group (a gid no user of the machine has)
MEMBER, STRANGER = 43211, 43212  # a reader in it; a reader outside it
KEY, VALUE = b"k" * 32, b"a value readers of the group may read"

# attaches as root first (its kernels loaded), then becomes `uid` with `groups`, and attaches
_READER = """
    import os, sys
    import shmcache
    name, uid, groups = sys.argv[1], int(sys.argv[2]), [int(g) for g in sys.argv[3].split(",")]
    with shmcache.attach(name) as r:
        r.get(b"x" * 32)
    os.setgroups(groups)
    os.setgid(groups[0])
    os.setuid(uid)
    try:
        with shmcache.attach(name) as r:
            print("ok", r.get(sys.argv[4].encode()), sep="|")
    except Exception as e:
        print(type(e).__name__, str(e), sep="|")
"""


def _read_as(name: str, uid: int, groups: list[int]) -> list[str]:
    p = subprocess.run([sys.executable, "-c", textwrap.dedent(_READER), name, str(uid), ",".join(map(str, groups)),
                        KEY.decode()], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert p.returncode == 0, p.stderr[-3000:]
    return p.stdout.strip().split("|")


def _run(name: str, snaps: Path, log: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "shmcache", "run", "--name", name, "--bootstrap", "127.0.0.1:1",
                             "--topic", "t", "--memory", "40MiB", "--mode", "640", "--reader-group", str(GROUP),
                             "--snapshot-dir", str(snaps)], cwd=REPO, stdin=subprocess.DEVNULL,
                            stdout=open(log, "wb"), stderr=subprocess.STDOUT)



def _supervised(name: str, p: subprocess.Popen) -> bool:
    assert p.poll() is None, f"the supervisor exited with {p.returncode}"
    try:
        with shmcache.attach(name) as r:
            return r.status()["supervisor_pid"] == p.pid and r.control.topic == "t"
    except (shmcache.ShmcacheError, OSError):
        return False



def _access(name: str) -> tuple:
    st, comp = os.stat(path_of(name)), os.stat(reader_stats.path_of(name))
    return st.st_mode & 0o777, st.st_gid, comp.st_mode & 0o777, comp.st_gid


def test_a_reader_group_attaches_to_the_runs_cache_and_its_restore(tmp_path):
    name = f"t-readers-{uuid.uuid4().hex[:8]}"
    snaps = tmp_path / "snaps"
    snaps.mkdir(mode=0o700)
    procs = []
    try:
        p = _run(name, snaps, tmp_path / "first.log")
        procs.append(p)
        poll_until(lambda: _supervised(name, p), 60, lambda: (tmp_path / "first.log").read_text()[-2000:])
        assert _access(name) == (0o640, GROUP, 0o660, GROUP)
        with shmcache.open(name) as w:  # the test writes what the readers read (this cache has no workers)
            w.set(KEY, VALUE)
            S.write(w, snapdir.path_for(snaps, name, 1))
        assert _read_as(name, MEMBER, [GROUP, MEMBER]) == ["ok", repr(VALUE)]
        kind, said = _read_as(name, STRANGER, [STRANGER])
        assert kind == "CachePermissionError" and f"cache {name!r}" in said and "permission denied" in said, said
        assert "0640" in said and re.search(rf"group {GROUP}|reader group", said), said
        stop_popen(p)
        if shmcache.exists(name):  # a run that never joined the group removes what it made
            shmcache.destroy(name)

        # the next start restores the snapshot: mode and group as before, the value there
        p = _run(name, snaps, tmp_path / "second.log")
        procs.append(p)
        poll_until(lambda: _supervised(name, p), 60, lambda: (tmp_path / "second.log").read_text()[-2000:])
        with shmcache.attach(name) as r:
            assert r.status()["restore"]["state"] == "restored"
        assert _access(name) == (0o640, GROUP, 0o660, GROUP)
        assert _read_as(name, MEMBER, [GROUP, MEMBER]) == ["ok", repr(VALUE)]
        assert _read_as(name, STRANGER, [STRANGER])[0] == "CachePermissionError"
    finally:
        for p in procs:
            stop_popen(p)
        if shmcache.exists(name):
            shmcache.destroy(name, force=True)


@pytest.mark.parametrize("line, said", [
    ("mode = 0o640", None), ('mode = "0640"', None), ('mode = "640"', None),
    ("mode = 640", "mode=0o1200 must give the owner read-write"),  # decimal 640: not what was meant
    ('mode = "0666"', "mode=0o666 must give the owner read-write, no one else write"),
    ('mode = "rw"', "mode='rw': expected octal digits"),
])
def test_the_toml_takes_an_octal_mode(tmp_path, line, said):
    f = tmp_path / "m.toml"
    f.write_text(f'name = "m"\nbootstrap = "b:1"\ntopic = "t"\n{line}\nreader_group = "4321"\n')
    if said is None:
        c = RunConfig.from_toml(str(f))
        assert c.file_mode == 0o640 and c.reader_gid == 4321
    else:
        with pytest.raises(ValueError, match=re.escape(said)):
            RunConfig.from_toml(str(f))


def test_a_reader_group_that_does_not_exist_stops_the_start_in_one_line(tmp_path):
    name = f"t-nogroup-{uuid.uuid4().hex[:8]}"
    p = subprocess.run([sys.executable, "-m", "shmcache", "run", "--name", name, "--bootstrap", "127.0.0.1:1",
                        "--topic", "t", "--memory", "40MiB", "--mode", "640", "--reader-group", "no-such-group-x"],
                       cwd=REPO, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2 and "reader_group='no-such-group-x': no such group" in p.stderr, p.stderr[-2000:]
    assert not shmcache.exists(name)


def test_a_new_cache_is_named_with_its_readers_group_already_given():
    """table.create(group=): the gid is the file's before it has its name, so that a reader
    of that group never finds it at the name without access (a reader in another pod met
    'permission denied' in that window when the supervisor gave the group after creating)."""
    from shmcache.engine import table

    name = f"t-group-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    with table.create(name, memory="34MiB", mode=0o640, group=GROUP) as w:
        assert w.created
        st = os.stat(path_of(name))
        assert (st.st_gid, st.st_mode & 0o777) == (GROUP, 0o640)
    shmcache.destroy(name)
