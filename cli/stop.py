"""The stop a signal asked of a command (SIGTERM, SIGHUP), kept so it can be asked again.

The dispatcher (cli/__init__.py) turns those signals into the KeyboardInterrupt that a
command's cleanup already handles, as Ctrl-C does. A handler that runs while a finalizer
runs (numba's and llvmlite's objects are freed in `__del__`) has its exception printed as
"Exception ignored in" and dropped, and the command went on to its end, exit 0: a
snapshot asked to stop replaced the file it should have left alone. `STOP.check()`, called
between a long command's steps (cli/progress.py, at each step of progress), raises the
stop again."""

from __future__ import annotations

import signal

from shmcache.ipc.liveness import StopRequest

STOP = StopRequest(lambda signum: KeyboardInterrupt())


def install(*sigs: int) -> StopRequest:
    """Each of `sigs` stops the command from now on, unless it is ignored (as under nohup: an
    ignored signal stays ignored); STOP.signum is the first that came, 0 until one did."""
    STOP.install(*(s for s in sigs if signal.getsignal(s) is not signal.SIG_IGN))
    return STOP
