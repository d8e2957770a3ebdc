"""One supervisor per cache, taken by compare-and-swap, and a start that knows what it
created from the create itself (issue 39 item 11). The supervisor word was looked at
first and set after the wait for a dead supervisor's workers (up to 10 s): two `shmcache
run` started at once both passed the look and both ran. `created` was read from a look
at the name before create(exist_ok=True), which races with another creator: a failed
start could destroy a cache another process had made in between. Real processes, no
broker (the winner waits for one)."""

from __future__ import annotations

import subprocess
import sys
import uuid
from pathlib import Path

import pytest

import shmcache
from shmcache.engine.control import layout as C

from shmtest.waits import poll_until, stop_popen

REPO = Path(__file__).resolve().parents[3]

# a process that holds worker row 0 as a live worker of no supervisor (a dead supervisor's
# orphan that does not exit): each starting supervisor waits ORPHAN_WAIT_S for it, then kills it
_ORPHAN = """
import sys
import shmcache
from shmcache.engine.control import layout as C
from shmcache.ipc import liveness
w = shmcache.open(sys.argv[1])
w.control.worker_row(0).claim(liveness.owner_word())
print("holding", flush=True)
sys.stdin.read()
"""

_CREATE = """
import sys
import shmcache
sys.stdin.readline()  # the start, given to both at once
w = shmcache.create(sys.argv[1], memory="40MiB", exist_ok=True)
print(int(w.created), w.creation_id, flush=True)
sys.stdin.readline()  # both answered: the test destroys the cache
"""




def test_two_supervisors_started_at_once_one_runs(tmp_path):
    name = f"t-claim-{uuid.uuid4().hex[:8]}"
    shmcache.create(name, memory="40MiB").close()
    orphan = subprocess.Popen([sys.executable, "-c", _ORPHAN, name], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                              text=True)
    sups, logs = [], [tmp_path / "a.log", tmp_path / "b.log"]
    try:
        assert orphan.stdout.readline().strip() == "holding"
        for log in logs:  # back to back: both reach the cache within the orphan's wait
            sups.append(subprocess.Popen([sys.executable, "-m", "shmcache", "run", "--name", name, "--bootstrap",
                                          "127.0.0.1:1", "--topic", "t", "--memory", "40MiB"], cwd=REPO,
                                         stdin=subprocess.DEVNULL, stdout=open(log, "wb"), stderr=subprocess.STDOUT))

        def settled():  # one gave up, or both went past the cache's opening (its log line)
            gave_up = [p for p in sups if p.poll() is not None]
            opened = [log for log in logs if f"cache {name!r}: " in log.read_text() and "entries" in log.read_text()]
            return gave_up or len(opened) == 2

        poll_until(settled, 90, lambda: "a supervisor to give up or both to open the cache:\n"
                                   + "\n".join(log.read_text()[-1500:] for log in logs))
        running = [p for p in sups if p.poll() is None]
        assert len(running) == 1, "both supervisors run:\n" + "\n".join(log.read_text()[-1500:] for log in logs)
        (winner,) = running
        (loser,) = [p for p in sups if p is not winner]
        said = logs[sups.index(loser)].read_text()
        assert loser.returncode == 2 and f"already has a live supervisor, pid {winner.pid}" in said, said
        with shmcache.attach(name) as r:
            poll_until(lambda: r.status()["supervisor_pid"] == winner.pid, 30, "the winner in the supervisor word")
        stop_popen(winner)
        assert winner.returncode == 0
        with shmcache.attach(name) as r:
            assert r.control.word(C.H_SUPERVISOR) == 0  # released at its stop
    finally:
        for p in sups:
            stop_popen(p)
        if orphan.poll() is None:
            orphan.kill()
        orphan.wait()
        if shmcache.exists(name):
            shmcache.destroy(name, force=True)


@pytest.mark.parametrize("round_", range(4))
def test_of_two_creators_at_once_one_knows_it_created(round_):
    """create(exist_ok=True) by two processes given the start at once: both get a writer
    on the same cache, and exactly one's `created` is true."""
    name = f"t-created-{uuid.uuid4().hex[:8]}"
    ps = [subprocess.Popen([sys.executable, "-c", _CREATE, name], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                           text=True) for _ in range(2)]
    try:
        for p in ps:
            p.stdin.write("go\n")
        for p in ps:
            p.stdin.flush()
        answers = [p.stdout.readline().split() for p in ps]
        assert all(len(a) == 2 for a in answers), answers
        assert sorted(int(a[0]) for a in answers) == [0, 1], answers
        assert answers[0][1] == answers[1][1]  # one cache
    finally:
        for p in ps:
            if p.poll() is None:
                p.stdin.write("done\n")
                p.stdin.close()
                p.wait(30)
        if shmcache.exists(name):
            shmcache.destroy(name, force=True)
