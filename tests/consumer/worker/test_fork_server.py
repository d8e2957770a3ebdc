"""Workers are forked from a fork server (consumer/supervisor/worker_handle.py) that imports their
modules and loads their kernels once, started first thing by the supervisor so that it
imports while the cache opens and the broker answers.

- While the broker does not answer, the fork server runs and no worker exists yet; a
  SIGTERM then ends the supervisor with exit 0, the fork server with it, and removes the
  cache this run created. A SIGKILL ends the fork server too, which removes the
  supervisor's multiprocessing directory (its socket) from /tmp.
- A fork server killed by hand makes multiprocessing report each of its workers gone
  (exit 255) while they still run. The trap's hardest case: the workers are stopped
  (SIGSTOP) at that moment, so they cannot notice anything themselves. The supervisor
  must kill them before it starts their successors (two writers on one partition could
  apply it out of order); the restarted workers come from a new fork server, and the
  table still ends equal to the model.
"""

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import textwrap

import psutil

import shmcache
from shmcache.consumer.worker import forkserver

from shmtest.private_broker import free_ports
from shmtest.supervisors import Harness, harness  # noqa: F401
from shmtest.topic_model import KafkaProbe, Model, check_table
from shmtest.waits import applied, poll_until, wait_applied

WAITING = "waiting for the broker"
PARTITIONS = 4


def _fork_servers(sup) -> list[psutil.Process]:
    return sup.named("shmcache-fork")


def _gone(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def _waiting_for_broker(sup, name: str) -> dict | None:
    """The cache's status once the supervisor has made it and waits for the broker, else None."""
    assert sup.running(), sup.log_text()[-3000:]
    try:
        with shmcache.attach(name) as r:
            st = r.status()
    except (OSError, shmcache.ShmcacheError):
        return None
    return st if st["broker"] == WAITING else None


@contextlib.contextmanager
def _without_broker(tmp_path, tag: str, workers: int):
    """(name, supervisor) of a supervisor started against an address nothing listens on;
    everything it made is removed on exit."""
    h = Harness(tmp_path, f"127.0.0.1:{free_ports(1)[0]}")
    try:
        name = h.cache_name(tag)
        yield name, h.supervisor(name, f"t-{tag}", h.group(tag), workers=workers)
    finally:
        h.close()


def test_the_fork_server_starts_before_the_broker_answers_and_stops_with_the_supervisor(tmp_path):
    with _without_broker(tmp_path, "fork", workers=2) as (name, sup):
        def waiting():
            st = _waiting_for_broker(sup, name)
            servers = _fork_servers(sup)
            return (st, servers) if st and servers else None

        st, servers = poll_until(waiting, 120, lambda: f"the fork server while waiting: {sup.log_text()[-2000:]}")
        assert st["workers"] == [] and sup.workers() == [], (st["workers"], sup.workers())

        sup.signal(signal.SIGTERM)
        assert sup.wait(60) == 0, sup.log_text()[-3000:]
        gone, alive = psutil.wait_procs(servers, timeout=30)
        assert not alive, [p.pid for p in alive]
        assert not shmcache.exists(name)  # this run created it and never joined the group


def test_a_killed_supervisor_takes_its_fork_server_and_its_socket_directory(tmp_path):
    """SIGKILL leaves the supervisor no chance to remove multiprocessing's directory (in
    /tmp, with the fork server's socket in it): the fork server, told by the kernel that
    its supervisor died, removes it and exits."""
    with _without_broker(tmp_path, "forkdir", workers=1) as (name, sup):
        def server_dir():
            if not _waiting_for_broker(sup, name):  # the run past its start: cache made, fork server up
                return None
            for server in _fork_servers(sup):
                try:
                    d = server.environ().get("SHMCACHE_FORKSERVER_DIR")
                except psutil.Error:
                    continue
                if d and os.path.isdir(d) and any(f.startswith("listener-") for f in os.listdir(d)):
                    return server, d
            return None

        server, d = poll_until(server_dir, 120, lambda: f"the fork server and its socket: {sup.log_text()[-2000:]}")
        assert os.path.basename(d).startswith("pymp-"), d
        sup.signal(signal.SIGKILL)
        assert sup.wait(30) == -signal.SIGKILL
        gone, alive = psutil.wait_procs([server], timeout=30)
        assert not alive, alive
        assert not os.path.exists(d), os.listdir(d)


_DIES_AT_ONCE = """
    import os, signal
    from multiprocessing import util
    from shmcache.consumer.worker import forkserver
    forkserver.prestart()  # what `shmcache run` does first thing; the server then imports for a while
    print(util.get_temp_dir(), flush=True)
    os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_supervisor_killed_before_its_fork_server_is_up_still_leaves_nothing():
    """The hardest moment: the supervisor dies right after starting the fork server,
    before the server has even looked at who its parent is (it is init's by then, not
    the supervisor's). It must still exit, and remove the directory with its socket."""
    child = subprocess.run([sys.executable, "-c", textwrap.dedent(_DIES_AT_ONCE)], capture_output=True, text=True,
                           timeout=120, env={**os.environ, "CI": "true"})
    assert child.returncode == -signal.SIGKILL, child.stderr
    d = child.stdout.strip()
    assert os.path.basename(d).startswith("pymp-"), child.stdout + child.stderr
    servers = []
    for p in psutil.process_iter():
        with contextlib.suppress(psutil.Error):
            if p.environ().get(forkserver.DIR_ENV) == d:
                servers.append(p)
    try:
        gone, alive = psutil.wait_procs(servers, timeout=90)  # its imports, then GONE_WAIT at most
        assert not alive, alive
        assert not os.path.exists(d), os.listdir(d)
    finally:
        for p in servers:
            with contextlib.suppress(psutil.Error):
                p.kill()
        shutil.rmtree(d, ignore_errors=True)


def test_a_killed_fork_server_never_leaves_a_worker_beside_its_successor(harness, kafka_topic):
    topic = kafka_topic(PARTITIONS)
    model = Model("v1", PARTITIONS, seed=11)
    name = harness.cache_name("forkkill")
    prod = harness.producer(topic, model, rate=40)
    prod.start()
    sup = harness.supervisor(name, topic, harness.group("forkkill"))
    r = harness.attach(name, sup=sup)
    r.wait_ready(60)
    poll_until(lambda: all(w["alive"] for w in r.status()["workers"]), 60, lambda: f"workers up: {r.status()}")
    old = {w["worker"]: (w["pid"], w["starts"]) for w in r.status()["workers"]}
    (server,) = _fork_servers(sup)
    before = applied(r, PARTITIONS)
    for pid, _ in old.values():
        os.kill(pid, signal.SIGSTOP)  # they cannot notice the fork server's death themselves
    server.kill()

    def restarted():
        ws = r.status()["workers"]
        fresh = [w for w in ws if w["alive"] and w["starts"] == old[w["worker"]][1] + 1]
        for w in fresh:  # a successor is up: its predecessor is gone, not stopped beside it
            pid = old[w["worker"]][0]
            assert _gone(pid), f"worker {w['worker']}'s old process {pid} still exists beside its successor: {ws}"
        return len(fresh) == len(old)

    try:
        poll_until(restarted, 120, lambda: f"both workers restarted: {r.status()['workers']}\n{sup.log_text()[-3000:]}",
                   interval=0.01)
    finally:
        for pid, _ in old.values():
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass
    assert "still running but its fork server is gone; killing it" in sup.log_text()
    assert len(_fork_servers(sup)) == 1 and _fork_servers(sup)[0].pid != server.pid
    poll_until(lambda: all(a > b for a, b in zip(applied(r, PARTITIONS), before)), 60,
               lambda: f"progress past {before}: {applied(r, PARTITIONS)}")
    prod.finish()
    probe = KafkaProbe(harness.bootstrap, topic, PARTITIONS)
    wait_applied(r, probe.end_offsets(), 60, sup)
    probe.close()
    check_table(r, model.snapshot())
    assert sup.terminate() == 0, sup.log_text()[-3000:]
