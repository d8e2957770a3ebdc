"""/dev/shm is writable by every user: whatever sits at a cache's name (a FIFO, a
directory, a symlink, a file without the magic), no call blocks, and each refuses
with a named error that says what is there. `list_caches` skips them all.

Calls that used to block forever (a FIFO) run in a child process with a bound, so a
regression fails the test instead of hanging the suite; the child prints one JSON
line per call, so a hang names the call that hung.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path

import pytest

import shmcache
from shmcache.engine import layout as L
from shmcache.engine import reader_stats
from shmcache.ipc.segment import Segment, identity

REPO = Path(__file__).resolve().parents[2]
CHILD_TIMEOUT = 90.0  # a cold numba cache compiles the kernels in the child

_CALLS = """
    import json, sys
    import shmcache
    name, listed = sys.argv[1], sys.argv[2]
    calls = {
        "attach": lambda: shmcache.attach(name).close(),
        "open": lambda: shmcache.open(name).close(),
        "create_exist_ok": lambda: shmcache.create(name, memory="34MiB", exist_ok=True).close(),
        "destroy": lambda: shmcache.destroy(name),
        "list": lambda: [n for n in shmcache.list_caches() if n in (name, listed)],
        "exists": lambda: shmcache.exists(name),
    }
    for what, fn in calls.items():
        try:
            got = fn()
        except Exception as e:
            print(json.dumps([what, type(e).__name__, isinstance(e, shmcache.NotACacheError), str(e)]), flush=True)
        else:
            print(json.dumps([what, "ok", False, got]), flush=True)
"""


def _run(argv: list[str]) -> subprocess.CompletedProcess:
    """A child with a bound: TimeoutExpired (the child killed and reaped) if it hangs."""
    return subprocess.run(argv, capture_output=True, text=True, timeout=CHILD_TIMEOUT, cwd=REPO,
                          env={**os.environ, "CI": "true"})


def _calls(name: str, listed: str = "") -> dict[str, list]:
    res = _run([sys.executable, "-c", textwrap.dedent(_CALLS), name, listed])
    assert res.returncode == 0, res.stderr
    return {row[0]: row[1:] for row in map(json.loads, res.stdout.splitlines())}


def _cli(*args: str) -> subprocess.CompletedProcess:
    return _run([sys.executable, "-m", "shmcache", *args])


def _one_line_exit_2(res: subprocess.CompletedProcess, *fragments: str) -> None:
    assert res.returncode == 2, (res.returncode, res.stdout, res.stderr)
    assert "Traceback" not in res.stderr and len(res.stderr.strip().splitlines()) == 1, res.stderr
    for f in fragments:
        assert f in res.stderr, res.stderr


@pytest.fixture
def name():
    n = f"t-stranger-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    yield n
    path = f"/dev/shm/{n}"
    if os.path.isdir(path) and not os.path.islink(path):
        os.rmdir(path)
    elif os.path.lexists(path):
        os.unlink(path)
    reader_stats.unlink(n)


@pytest.fixture
def real_cache():
    """A cache with one entry; destroyed after."""
    n = f"t-stranger-real-{uuid.uuid4().hex[:8]}"
    with shmcache.create(n, memory="34MiB") as w:
        w.set(b"k" * 32, b"v")
    yield n
    if shmcache.exists(n):
        shmcache.destroy(n)


def _refused(out: dict, name: str, kind: str) -> None:
    for what in ("attach", "open", "create_exist_ok", "destroy"):
        cls, is_not_a_cache, msg = out[what]
        assert is_not_a_cache, (what, out[what])
        assert f"cache '{name}'" in msg and kind in msg, (what, msg)
    assert out["list"] == ["ok", False, []], out["list"]
    assert out["exists"] == ["ok", False, True]  # something is at the name: create() would fail


def test_a_fifo_at_the_name_blocks_nothing_and_is_refused(name):
    """The FIFO has no writer: a plain open(O_RDONLY) of it blocks forever."""
    os.mkfifo(f"/dev/shm/{name}", 0o600)
    out = _calls(name)
    _refused(out, name, "is a FIFO")
    assert os.path.exists(f"/dev/shm/{name}"), "destroy without force removed a FIFO"
    _one_line_exit_2(_cli("stats", name), f"cache '{name}'", "is a FIFO")
    _one_line_exit_2(_cli("destroy", name), f"cache '{name}'", "is a FIFO", "--force")
    res = _cli("list")
    assert res.returncode == 0 and name not in res.stdout.split(), res.stderr
    shmcache.destroy(name, force=True)
    assert not os.path.lexists(f"/dev/shm/{name}")


def test_a_directory_at_the_name_is_refused_and_never_removed(name):
    os.mkdir(f"/dev/shm/{name}", 0o700)
    _refused(_calls(name), name, "is a directory")
    with pytest.raises(shmcache.NotACacheError, match=f"cache '{name}': .* is a directory"):
        shmcache.destroy(name, force=True)
    assert os.path.isdir(f"/dev/shm/{name}")
    _one_line_exit_2(_cli("destroy", name, "--force"), "is a directory")
    _one_line_exit_2(_cli("stats", name), "is a directory")


def test_a_symlink_to_a_real_cache_is_not_followed(name, real_cache):
    """The hardest link: to a valid cache, which a following open would take as this name's."""
    os.symlink(f"/dev/shm/{real_cache}", f"/dev/shm/{name}")
    out = _calls(name, listed=real_cache)
    for what in ("attach", "open", "create_exist_ok", "destroy"):
        cls, is_not_a_cache, msg = out[what]
        assert is_not_a_cache and f"cache '{name}'" in msg and "is a symbolic link" in msg, (what, msg)
    assert out["list"] == ["ok", False, [real_cache]], out["list"]  # the target, never the link
    _one_line_exit_2(_cli("stats", name), "is a symbolic link")
    shmcache.destroy(name, force=True)  # removes the link, not what it points to
    assert not os.path.lexists(f"/dev/shm/{name}")
    with shmcache.attach(real_cache) as r:
        assert r.get(b"k" * 32) == b"v"


def test_list_caches_skips_every_stranger_and_lists_the_caches(name, real_cache):
    """A FIFO, a directory, a symlink to a cache, a socket and a file with the magic but an
    invalid cache name all at once: list returns (without blocking) exactly the real cache."""
    import socket

    base = f"/dev/shm/{name}"
    made = [base + "-fifo", base + "-dir", base + "-link", base + "-sock", f"/dev/shm/.{name}-magic"]
    os.mkfifo(made[0])
    os.mkdir(made[1])
    os.symlink(f"/dev/shm/{real_cache}", made[2])
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(made[3])
    with open(made[4], "wb") as f:
        f.write(L.MAGIC.to_bytes(8, "little") + bytes(8192))
    try:
        code = f"""
            import shmcache
            print(sorted(n for n in shmcache.list_caches() if n.startswith(({name!r}, {real_cache!r}, ".{name}"))))
        """
        res = _run([sys.executable, "-c", textwrap.dedent(code)])
        assert res.returncode == 0, res.stderr
        assert res.stdout.strip() == repr([real_cache])
        res = _cli("list")
        assert res.returncode == 0 and real_cache in res.stdout.split(), res.stderr
        assert not any(n.startswith((name, f".{name}")) for n in res.stdout.split()), res.stdout
    finally:
        sock.close()
        os.rmdir(made[1])
        for p in made[:1] + made[2:]:
            os.unlink(p)


_CREATE_AND_READ = """
    import shmcache
    with shmcache.create(NAME, memory="34MiB") as w:
        w.set(b"k" * 32, b"v")
    with shmcache.attach(NAME) as r:
        print(r.get(b"k" * 32), r.stats()["reader_hits"])
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="plants as root, creates as user nobody")
@pytest.mark.parametrize("plant", ["directory", "fifo", "another user's file"])
def test_whatever_is_planted_at_the_readers_companion_costs_only_the_counters(name, plant):
    """The companion's name is derived from the cache's, so another user can put something
    there first (issue 53, item 8): a directory, a FIFO, or a file of their own, which a
    non-root creator may not remove from the sticky /dev/shm. create() was refused ("permission
    denied removing the old ..."). The companion is optional: the cache is made, one warning
    says it is made without it, and it serves; only its readers' shared counters are off."""
    from shmtest.pods import NOBODY, NOGROUP, pod

    comp = reader_stats.path_of(name)
    if plant == "directory":
        os.mkdir(comp)
    elif plant == "fifo":
        os.mkfifo(comp)
    else:
        Path(comp).write_bytes(b"someone else's" * 100)
    try:
        code = textwrap.dedent(_CREATE_AND_READ).replace("NAME", repr(name))
        res = subprocess.run(pod([sys.executable, "-c", code], uid=NOBODY, gid=NOGROUP), capture_output=True,
                             text=True, timeout=300)
        assert res.returncode == 0 and res.stdout.split() == ["b'v'", "0"], res.stderr
        lines = res.stderr.strip().splitlines()
        assert len(lines) == 1 and "the cache is made without it" in lines[0] and comp in lines[0], res.stderr
        assert os.stat(f"/dev/shm/{name}").st_uid == NOBODY
    finally:
        if os.path.lexists(f"/dev/shm/{name}"):
            shmcache.destroy(name)
        if os.path.isdir(comp):
            os.rmdir(comp)
        elif os.path.lexists(comp):
            os.unlink(comp)


def test_a_fifo_at_the_readers_companion_costs_only_the_reader_counters(name):
    with shmcache.create(name, memory="34MiB") as w:
        w.set(b"k" * 32, b"v")
        os.unlink(reader_stats.path_of(name))
        os.mkfifo(reader_stats.path_of(name))
        code = f"""
            import shmcache
            with shmcache.attach({name!r}) as r:
                print(r.get(b"k" * 32), r.stats()["reader_hits"])
        """
        res = _run([sys.executable, "-c", textwrap.dedent(code)])
        assert res.returncode == 0, res.stderr
        assert res.stdout.split() == ["b'v'", "0"]
    shmcache.destroy(name)
    assert not os.path.lexists(reader_stats.path_of(name)), "the companion goes with the cache"


# -- a creator stopped or killed mid-create --------------------------------------------------------

_CREATOR = """
    import sys
    import numpy as np
    from shmcache.engine import layout as L
    from shmcache.ipc.segment import Segment
    seg = Segment(sys.argv[1], create_size=34 << 20, writable=True)  # create()'s first step
    np.frombuffer(seg.mm, np.int64, L.HEADER_WORDS)[L.H_MAGIC] = L.MAGIC  # and its header's last word
    print("built", flush=True)
    sys.stdin.readline()  # a SIGKILL here is the hardest moment: all built, only the name to give
    try:
        seg.finish_create()
    except Exception as e:
        print(type(e).__name__, e, flush=True)
    else:
        print("named", flush=True)
"""


def _creator(name: str) -> subprocess.Popen:
    child = subprocess.Popen([sys.executable, "-c", textwrap.dedent(_CREATOR), name], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
    assert child.stdout.readline().strip() == "built", child.stderr.read()
    return child


def _end(child: subprocess.Popen) -> None:
    if child.poll() is None:
        child.kill()
    child.wait(30)
    for f in (child.stdin, child.stdout, child.stderr):
        f.close()


def test_a_creator_killed_mid_create_leaves_nothing_at_the_name(name):
    """Killed (-9) with the segment sized, mapped and its header whole, one step before
    it is named: nothing is at the name (no half-made file for the next run to trip
    on), and a cache of that name can be created at once."""
    child = _creator(name)
    try:
        assert not shmcache.exists(name), "a cache being created has no name yet"
        with pytest.raises(shmcache.CacheNotFoundError):
            shmcache.attach(name)
        child.send_signal(signal.SIGKILL)
        assert child.wait(30) == -signal.SIGKILL
    finally:
        _end(child)
    assert not os.path.lexists(f"/dev/shm/{name}")
    with shmcache.create(name, memory="34MiB") as w:
        w.set(b"k" * 32, b"v")
    with shmcache.attach(name) as r:
        assert r.get(b"k" * 32) == b"v"
    shmcache.destroy(name)


def _win_while_paused(name: str, loser: str, *args: str) -> tuple[int, list[str]]:
    """Start the losing creator `loser`, create the winner (one entry) while the loser is
    paused where it says "building", then let it go on. The winner's creation id and
    the words the loser printed."""
    child = subprocess.Popen([sys.executable, "-c", textwrap.dedent(loser), name, *args], stdin=subprocess.PIPE,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=REPO)
    try:
        assert child.stdout.readline().strip() == "building", child.stderr.read()
        with shmcache.create(name, memory="64MiB") as w:
            w.set(b"w" * 32, b"the winner's")
            winner = w.creation_id
        out, err = child.communicate("\n", timeout=CHILD_TIMEOUT)
        assert child.returncode == 0, out + err
    finally:
        _end(child)
    return winner, out.split()


_LOSER = """
    import sys
    import shmcache
    from shmcache.engine import reader_stats
    made = reader_stats.create
    waited = []

    def late(*args):  # the race's worst order: the winner's companion is there, then this one replaces it
        if not waited:  # the loser's own companion; the one it gives back to the winner comes unhindered
            waited.append(print("building", flush=True))
            sys.stdin.readline()
        made(*args)

    reader_stats.create = late
    with shmcache.create(sys.argv[1], memory="34MiB", exist_ok=True) as w:
        print(w.creation_id, flush=True)
        w.set(b"l" * 32, b"the loser's write")
"""


def test_create_exist_ok_that_loses_the_race_opens_the_winner_and_gives_back_its_companion(name):
    """create(exist_ok=True) whose name is taken while it builds (here: after its check
    that the name was free, before it made its readers' companion): it returns a writer
    on the winner's cache, and the companion it had made in the winner's place is
    replaced by one of the winner's, so the winner's readers are counted."""
    winner, out = _win_while_paused(name, _LOSER)
    assert out == [str(winner)]
    assert reader_stats.belongs(name, winner)
    with shmcache.attach(name) as r:
        assert r.get_many([b"w" * 32, b"l" * 32]) == [b"the winner's", b"the loser's write"]
    with shmcache.attach(name) as r:
        assert r.stats()["reader_hits"] == 2, "the first reader's hits are in the winner's companion"
    shmcache.destroy(name)


_COMPANION_LOSER = """
    import sys
    import shmcache
    from shmcache.engine import reader_stats
    from shmcache.errors import CacheExistsError

    class Late(reader_stats.Segment):
        def finish_create(self):  # paused with its companion built, one step before naming it
            print("building", flush=True)
            sys.stdin.readline()
            super().finish_create()

    reader_stats.Segment = Late
    try:
        with shmcache.create(sys.argv[1], memory="34MiB", exist_ok=sys.argv[2] == "1") as w:
            print("writer", w.creation_id, flush=True)
    except CacheExistsError:
        print("CacheExistsError", flush=True)
"""


@pytest.mark.parametrize("exist_ok", [False, True], ids=["exist_ok=False", "exist_ok=True"])
def test_a_creator_beaten_to_its_companion_backs_out_without_removing_the_winners(name, exist_ok):
    """Two creators of one name: the loser is beaten to the readers' companion (the
    winner's companion, then the winner's cache, appear while the loser names its own
    companion). It backs out without removing the winner's companion, and the
    winner's readers are counted in it."""
    winner, out = _win_while_paused(name, _COMPANION_LOSER, str(int(exist_ok)))
    assert out == (["writer", str(winner)] if exist_ok else ["CacheExistsError"])
    assert reader_stats.belongs(name, winner), "the loser removed the winner's companion"
    with shmcache.attach(name) as r:
        assert r.get(b"w" * 32) == b"the winner's"
        assert r.stats()["reader_hits"] == 1
    shmcache.destroy(name)


_INTERRUPTED = """
    import os, signal, sys
    import shmcache
    from shmcache.engine import table

    def stop(*_):
        raise SystemExit(143)  # as `shmcache warm` and the supervisor turn a SIGTERM

    signal.signal(signal.SIGTERM, stop)
    adopt = table.Writer._adopt

    def late(name, seg):  # the name is given; a SIGTERM lands before the writer is handed over
        os.kill(os.getpid(), signal.SIGTERM)
        return adopt(name, seg)

    table.Writer._adopt = late
    shmcache.create(sys.argv[1], memory="34MiB")
"""


def test_a_create_stopped_after_naming_takes_the_name_back(name):
    """A SIGTERM turned into SystemExit after create() named the cache but before it
    returned the writer: the caller never gets a handle to clean up with, so create()
    itself removes the cache and its companion. Nothing is left at either name."""
    res = _run([sys.executable, "-c", textwrap.dedent(_INTERRUPTED), name])
    assert res.returncode == 143, res.stderr
    assert not os.path.lexists(f"/dev/shm/{name}") and not os.path.lexists(reader_stats.path_of(name))


def test_a_segment_is_named_once_and_only_by_its_creator(name):
    """finish_create on a handle that cannot name anything (a reader's, one already
    named, one closed before it was named) says so, instead of returning as if named."""
    seg = Segment(name, create_size=2 << 20, writable=True)
    seg.close()
    with pytest.raises(ValueError, match="cannot be named"):
        seg.finish_create()
    assert not os.path.lexists(f"/dev/shm/{name}")
    with shmcache.create(name, memory="34MiB"):
        pass
    for seg in (Segment(name, writable=False), Segment(name, writable=True)):
        with pytest.raises(ValueError, match="cannot be named"):
            seg.finish_create()
        seg.close()
    shmcache.destroy(name)


def test_destroy_removes_the_companion_a_creator_killed_before_naming_left(name):
    """create() makes the readers' companion just before it names the cache: a creator
    killed between the two leaves the companion alone. destroy() of the name says there
    is no cache and removes it; a directory at the companion's name is left alone."""
    reader_stats.create(name, 0o600, 12345)  # what such a creator leaves
    with pytest.raises(shmcache.CacheNotFoundError, match="removed its readers' companion"):
        shmcache.destroy(name)
    assert not os.path.lexists(reader_stats.path_of(name))
    os.mkdir(reader_stats.path_of(name))
    try:
        with pytest.raises(shmcache.CacheNotFoundError, match=f"cache '{name}' does not exist") as e:
            shmcache.destroy(name)
        assert "companion" not in str(e.value)
        assert os.path.isdir(reader_stats.path_of(name))
    finally:
        os.rmdir(reader_stats.path_of(name))


def test_two_creators_of_one_name_one_wins_the_other_touches_nothing(name):
    """A creator that finds the name taken when it comes to name its segment (here
    another create() ran meanwhile) fails with CacheExistsError and leaves the winner's
    cache as it is."""
    child = _creator(name)
    try:
        with shmcache.create(name, memory="34MiB") as w:
            w.set(b"k" * 32, b"the winner's")
        winner = identity(name)
        child.stdin.write("\n")
        child.stdin.flush()
        out = child.stdout.readline()
        assert out.startswith("CacheExistsError") and name in out, out + child.stderr.read()
        assert child.wait(30) == 0
    finally:
        _end(child)
    with shmcache.attach(name) as r:
        assert r.get(b"k" * 32) == b"the winner's"
        assert identity(name) == winner and os.path.getsize(f"/dev/shm/{name}") == r.stats()["memory"]
    shmcache.destroy(name)


def test_a_zeroed_header_is_refused_at_once(real_cache):
    """A live cache whose magic was overwritten: refused at once, saying how to remove it."""
    w = shmcache.open(real_cache)
    try:
        w._header[L.H_MAGIC] = 0
        for fn in (shmcache.attach, shmcache.open):
            with pytest.raises(shmcache.NotACacheError, match=f"cache '{real_cache}': .* no shmcache magic .* destroy --force"):
                fn(real_cache)
    finally:
        w._header[L.H_MAGIC] = L.MAGIC
        w.close()


# -- a stranger's sparse file: refused from its first page, never mapped -----------------------------

_SPARSE = 1 << 30  # a mapping populates its holes on tmpfs: 1 GiB of /dev/shm if it were mapped


def _allocated(path: str) -> int:
    return os.stat(path).st_blocks * 512


@pytest.mark.parametrize("first_page", ["holes", "a cache's header"])
def test_a_strangers_sparse_file_at_the_name_is_refused_without_being_mapped(name, real_cache, first_page):
    """attach and open read a file's first page before they map it: a sparse file of any size at
    the name is refused having allocated nothing. Before, each mapped it with MAP_POPULATE, which
    on tmpfs allocates every hole (a 2 GiB file cost 2 GiB of /dev/shm and 3 s), and only then
    looked for the magic. The hardest case carries a real cache's header, whole and valid, whose
    size word no longer matches the file's."""
    path = f"/dev/shm/{name}"
    fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    try:
        if first_page != "holes":
            with open(f"/dev/shm/{real_cache}", "rb") as f:
                os.write(fd, f.read(L.PAGE))
        os.ftruncate(fd, _SPARSE)
    finally:
        os.close(fd)
    before = _allocated(path)
    assert before <= L.PAGE
    want = "no shmcache magic" if first_page == "holes" else f"it should be {_SPARSE}, the size of the file"
    for fn in (shmcache.attach, shmcache.open):
        with pytest.raises(shmcache.NotACacheError, match=f"cache '{name}'.*{want}"):
            fn(name)
        assert _allocated(path) == before, f"{fn.__name__} allocated {_allocated(path) - before:,} bytes of the file"


def test_a_sparse_file_at_the_readers_companion_is_not_mapped(real_cache):
    """The readers' companion of a real cache replaced by a large sparse file: a reader neither
    maps it (allocating its holes) nor counts in it, and looks up as ever."""
    comp = reader_stats.path_of(real_cache)
    os.unlink(comp)
    fd = os.open(comp, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o600)
    try:
        os.ftruncate(fd, _SPARSE)
    finally:
        os.close(fd)
    with shmcache.attach(real_cache) as r:
        assert r.get(b"k" * 32) == b"v"
        assert r.stats()["reader_hits"] == 0  # no companion of ours to count in
    assert _allocated(comp) == 0
