"""Where worker processes come from: a fork server (multiprocessing's "forkserver" start
method) that imports the workers' modules and, on a warm install, loads numba and the
decode kernels once (consumer/worker/_preload.py), and then forks each worker, first or
restarted, with all of that in place: a worker fetches soon after its start instead of
after imports of its own, and N workers do not pay them N times on a machine with few
cores.

The supervisor starts it first thing (`shmcache run` before it even imports numpy), so
it imports while the supervisor opens the cache and reaches the broker. It names itself
shmcache-fork and dies with the supervisor (die_with_supervisor: a dead supervisor's
workers are orphans at once, and exit, and nothing is left in /tmp);
consumer/supervisor/worker_handle.py forks from it and watches what it forked.

This module imports nothing heavy: cli/__init__.py calls prestart() before anything else.
"""

from __future__ import annotations

import atexit
import multiprocessing as mp
import os
import select
import shutil
import signal
import threading
import time

PRELOAD = "shmcache.consumer.worker._preload"


def context():
    """The multiprocessing context the workers are started with."""
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload([PRELOAD])
    return ctx


DIR_ENV = "SHMCACHE_FORKSERVER_DIR"  # where its socket is, for the fork server to remove (die_with_supervisor)
PARENT_ENV = "SHMCACHE_FORKSERVER_PARENT"  # the supervisor's pid
GONE_WAIT = 10.0  # seconds a fork server told of its supervisor's end waits for it to be gone


def prestart() -> None:
    """Start the fork server now, without waiting for it (a no-op once it runs)."""
    from multiprocessing import forkserver, util

    context()
    os.environ[DIR_ENV] = util.get_temp_dir()  # multiprocessing puts the server's socket there
    os.environ[PARENT_ENV] = str(os.getpid())  # the server's parent, should it be gone before the server looks
    forkserver.ensure_running()


def die_with_supervisor() -> None:
    """In the fork server: exit when the supervisor dies, having removed the supervisor's
    multiprocessing directory with the server's socket in it, which a supervisor killed by
    SIGKILL cannot remove itself. Two ways lead here:
    - while workers live they hold the server's "alive" pipe (multiprocessing passes it to
      each child), so only the kernel's PR_SET_PDEATHSIG, here SIGTERM, tells it; left
      alive, a dead supervisor's workers would stay its children, never adopted;
    - with none, the supervisor's exit closes that pipe and multiprocessing's loop ends
      the server by SystemExit: atexit.
    Both can come while the supervisor is still dying: the signal when the thread that
    started the server dies, before the rest of the process (the kernel's "parent" is a
    thread), the pipe's end when its files close. So the directory goes once the
    supervisor is gone, waited for (GONE_WAIT at most) on a pidfd opened now, which a
    reused pid cannot fool. A SIGTERM from anyone else while the supervisor lives ends the
    server after that wait, the directory kept (the supervisor starts another server);
    workers get the default SIGTERM back (consumer/worker/loop.py main)."""
    from shmcache.ipc import liveness  # numba, by its atomics: not for prestart's importers

    supervisor = int(os.environ.get(PARENT_ENV) or os.getppid())  # not getppid(): it may be init's already
    try:
        pidfd = os.pidfd_open(supervisor)
    except (AttributeError, OSError):  # gone already (then getppid() differs), or not Linux >= 5.3
        pidfd = -1

    def remove_once_gone() -> None:
        d = os.environ.get(DIR_ENV, "")
        gone = os.getppid() != supervisor
        if not gone and pidfd >= 0:
            gone = bool(select.select([pidfd], [], [], GONE_WAIT)[0])  # readable once it has exited
        if gone and os.path.basename(d).startswith("pymp-"):
            shutil.rmtree(d, ignore_errors=True)

    def terminated(signum, frame):
        remove_once_gone()
        os._exit(0)

    signal.signal(signal.SIGTERM, terminated)
    signal.signal(signal.SIGHUP, signal.SIG_IGN)  # a terminal's hangup: the supervisor stops us (multiprocessing ignores SIGINT)
    atexit.register(remove_once_gone)
    liveness.die_with_parent(signal.SIGTERM, supervisor)


NAME = "shmcache-fork"  # the fork server's process name (consumer/worker/_preload.py sets it)
KILLED_WAIT = 5.0  # seconds a start waits, once the fork server is killed, for the fork's wait to end


def start_within(proc: mp.Process, timeout: float, waiting=lambda: False) -> bool:
    """proc.start(), given `timeout` seconds; waiting() is called every 50 ms meanwhile and
    gives the wait up by returning True. multiprocessing asks the fork server to fork, then
    waits with no bound for it to send the new pid: a fork server that sends none (frozen by
    SIGSTOP, or hung) would hold the supervisor for ever. It is killed then (SIGKILL), which
    ends the wait, and the next start gets a fresh one (multiprocessing starts it again).
    False if the start failed so; a worker the killed server forked at the last moment is
    killed too (by pid: a fresh fork that nobody follows). An error of the start itself is
    raised here."""
    done = threading.Event()
    errors: list[BaseException] = []

    def fork() -> None:
        try:
            proc.start()
        except BaseException as e:  # noqa: BLE001 - handed to the caller's thread
            errors.append(e)
        finally:
            done.set()

    # a fork server (re)started now is started by this thread, which lives on: started from the
    # fork's thread, PR_SET_PDEATHSIG would end it when that thread ends (die_with_supervisor)
    from multiprocessing import forkserver

    forkserver.ensure_running()
    threading.Thread(target=fork, name="shmcache-fork-start", daemon=True).start()
    end = time.monotonic() + timeout
    while not done.wait(0.05):
        if waiting() or time.monotonic() >= end:
            _kill_server()
            done.wait(KILLED_WAIT)
            if proc.pid is not None:
                try:
                    os.kill(proc.pid, signal.SIGKILL)
                except OSError:
                    pass
            return False
    if errors:
        raise errors[0]
    return True


def _kill_server() -> None:
    """SIGKILL this process's fork server: its child named NAME, or, still importing before it
    names itself, the one multiprocessing started with `-c "from multiprocessing.forkserver
    import main; ..."`. (Its workers are its children, not this process's.)"""
    import psutil

    for child in psutil.Process().children():
        try:
            if child.name() == NAME or any("multiprocessing.forkserver" in a for a in child.cmdline()):
                child.kill()
        except psutil.Error:
            pass
