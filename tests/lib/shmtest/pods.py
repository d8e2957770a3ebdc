"""Pods on one machine: a process in a PID and mount namespace of its own, as a container
(a Kubernetes pod, a Docker container with --ipc=shareable or a hostPath /dev/shm) runs
it, and optionally as another user. Needs root (unshare(1), setpriv(1)).

`pod(argv, uid=..., gid=...)` is the command line that runs argv there: it is pid 1 of
its namespace (so a pid it publishes means nothing anywhere else), /proc is its
namespace's, and /dev/shm is the machine's (the pods share it, as a hostPath or an IPC
namespace shares it). With `--kill-child`, the pod's processes go with the unshare(1)
process that started it: killing that one kills the pod (as another user too: setpriv's
`--pdeathsig keep` restores the parent-death signal the kernel clears at the change of
user).

The other user must be able to run the program. Where the interpreter sits under a
directory only root may enter (a pyenv under /root on this machine), the pod lays that
directory open in its own mount namespace only (`expose`): a bind mount of the
interpreter's tree over a tmpfs at its parent, as an image of its own would have it.
"""

from __future__ import annotations

import os
import shutil
import signal
import stat
import subprocess
import sys
from pathlib import Path

import psutil

from shmtest.waits import poll_until

NOBODY, NOGROUP = 65534, 65534

# run by sh as the pod's pid 1 (root): lay `expose` open, then become the user and exec argv
_INIT = r"""
set -e
uid="$1"; gid="$2"; groups="$3"; expose="$4"; shift 4
if [ -n "$expose" ]; then
    keep=$(mktemp -d)
    mount --bind "$expose" "$keep"
    mount -t tmpfs -o mode=0755,size=1m pod "$(dirname "$expose")"
    mkdir -p "$expose"
    mount --move "$keep" "$expose"
    rmdir "$keep"
fi
if [ "$uid" = - ]; then
    exec "$@"
fi
if [ -n "$groups" ]; then
    exec setpriv --pdeathsig keep --reuid "$uid" --regid "$gid" --groups "$groups" -- "$@"
fi
exec setpriv --pdeathsig keep --reuid "$uid" --regid "$gid" --clear-groups -- "$@"
"""


def available() -> str | None:
    """Why pods cannot run here, or None."""
    if os.geteuid() != 0:
        return "a pod (unshare --pid --mount) needs root"
    for tool in ("unshare", "setpriv", "mount"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed"
    return None


def ns_pid(p: psutil.Process) -> int:
    """p's pid in its own PID namespace (the last of /proc/PID/status's NSpid): what it
    publishes, and what a status shows of it (1 for a pod's pid 1)."""
    with open(f"/proc/{p.pid}/status") as f:
        for line in f:
            if line.startswith("NSpid:"):
                return int(line.split()[-1])
    return p.pid  # a kernel without NSpid (before 4.1): no namespaces of its own here


def _closed_dir(path: Path) -> Path | None:
    """The directory under the first directory on `path`'s way that others may not enter
    (/root/.pyenv for /root/.pyenv/versions/3.11/bin/python), or None."""
    parts = path.parts
    for i in range(1, len(parts) - 1):
        d = Path(*parts[:i + 1])
        if not os.stat(d).st_mode & stat.S_IXOTH:
            return Path(*parts[:i + 2])
    return None


def pod(argv: list[str], *, uid: int | None = None, gid: int | None = None, groups: tuple[int, ...] = ()) -> list[str]:
    """The command line that runs argv as pid 1 of a pod of its own (as `uid`:`gid` with
    the supplementary `groups`, a pod's securityContext.supplementalGroups, when uid is
    given)."""
    expose = ""
    if uid is not None:
        closed = _closed_dir(Path(os.path.realpath(sys.executable)))
        expose = str(closed) if closed is not None else ""
    who = ["-", "-"] if uid is None else [str(uid), str(gid if gid is not None else uid)]
    return ["unshare", "--pid", "--fork", "--mount-proc", "--kill-child", "--", "sh", "-c", _INIT, "pod", *who,
            ",".join(map(str, groups)), expose, *argv]


class Pod:
    """argv running in a pod of its own (`pod`), started at once, and stopped as a kubelet
    or Docker stops a container: SIGTERM to its pid 1, SIGKILL (the whole namespace) after
    the grace period. `cgroup`: a memory cgroup's directory the pod runs in from its first
    instruction. Its output goes to `log`."""

    def __init__(self, argv: list[str], *, log: Path, env: dict | None = None, cgroup: Path | None = None,
                 uid: int | None = None, gid: int | None = None, groups: tuple[int, ...] = ()):
        line = pod(argv, uid=uid, gid=gid, groups=groups)
        if cgroup is not None:
            line = ["sh", "-c", f'echo $$ > "{cgroup}/cgroup.procs" && exec "$@"', "join", *line]
        self.log = log
        with open(log, "ab") as out:
            self.proc = subprocess.Popen(line, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                         env=None if env is None else {**os.environ, **env})
        self.pid1: psutil.Process | None = None

    def init(self) -> psutil.Process:
        """The pod's pid 1 (the child of the unshare(1) process), once it runs."""
        if self.pid1 is None:
            def child():
                if self.proc.poll() is not None:
                    raise AssertionError(f"the pod exited with {self.proc.returncode}: {self.log.read_text()[-2000:]}")
                return next(iter(psutil.Process(self.proc.pid).children()), None)
            self.pid1 = poll_until(child, 30, "the pod's pid 1")
        return self.pid1

    def running(self) -> bool:
        return self.proc.poll() is None

    def stop(self, grace: float) -> int | None:
        """SIGTERM to pid 1, then its exit code within `grace` seconds; None (and SIGKILL) if it
        did not exit in time."""
        if self.running():
            try:
                self.init().send_signal(signal.SIGTERM)
            except psutil.NoSuchProcess:
                pass
        try:
            return self.proc.wait(grace)
        except subprocess.TimeoutExpired:
            self.kill()
            return None

    def kill(self) -> None:
        """SIGKILL pid 1: the kernel kills every process of the namespace; wait for all of them."""
        if self.running():
            pid1 = self.init()
            try:
                procs = [pid1, *pid1.children(recursive=True)]
                pid1.kill()
            except psutil.NoSuchProcess:
                procs = []
            psutil.wait_procs(procs, 30)
        self.proc.wait(30)
