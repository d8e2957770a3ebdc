"""Which machine this process is on, as shmcache names it.

`machine()` is $SHMCACHE_MACHINE when set, else the host name. It names a machine in
the defaults that must differ per machine (a supervisor's consumer group and static
instance id, `shmcache-<machine>-<name>`), in its Kafka client id, and in the error an
executor raises when its machine has no cache. Several "machines" can share one host
(scripts/cluster runs each in its own mount namespace with a private /dev/shm): each
then needs its own identity, given by `--machine` or SHMCACHE_MACHINE.
"""

from __future__ import annotations

import os
import socket

ENV = "SHMCACHE_MACHINE"


def machine() -> str:
    """$SHMCACHE_MACHINE, else the host name."""
    return os.environ.get(ENV) or socket.gethostname()


def describe() -> str:
    """The machine for a message: 'm1' or, when it differs from the host name, 'm1' (host 'h')."""
    m, host = machine(), socket.gethostname()
    return repr(m) if m == host else f"{m!r} (host {host!r})"
