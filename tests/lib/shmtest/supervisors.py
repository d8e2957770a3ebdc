"""The processes of the end-to-end pipeline tests (real broker, real `shmcache run`).

- `SupervisorProc`: one `python -m shmcache run` process, with its descendants by pid,
  signals and kill.
- `Harness` (fixture `harness`): starts supervisors as real processes, attaches
  readers, and at teardown (even on failure) stops every process it started by pid
  (SIGTERM, then SIGKILL; the supervisor's worker children too), closes readers and
  destroys every segment it named.

The data the tests send and check is shmtest/topic_model.py's; the waits, shmtest/waits.py's.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest

import shmcache
from shmtest.pods import ns_pid
from shmtest.topic_model import Model, StreamProducer, produce_and_wait
from shmtest.waits import poll_until, wait_applied, wait_gone
from shmcache.consumer.worker import forkserver
from shmcache.dev.run_process import SupervisorProcess
from shmcache.ipc import liveness

from shmtest import REPO  # noqa: F401 - REPO: the tests take it from here too


class SupervisorProc(SupervisorProcess):
    """One `python -m shmcache run` process (dev/run_process.py's, run from the log's
    folder), with what the tests need besides: its descendants by pid, signals, kill."""

    def __init__(self, log_path: Path, name: str, bootstrap: str, topic: str, group: str, *,
                 workers: int = 2, fmt: str = "v1", memory: str = "128MiB", commit_interval: float = 0.5,
                 assignment: str | None = None, max_rate: int | None = None, sets: tuple = (),
                 config: dict | None = None, args: tuple = (), env: dict | None = None,
                 wrap=None):
        self.name = name
        self.env = None if env is None else {**os.environ, **env}  # added to the test's own
        self.group = group
        argv = [sys.executable, "-m", "shmcache", "run", "--name", name, "--bootstrap", bootstrap,
                "--topic", topic, "--group", group, "--workers", str(workers), "--format", fmt,
                "--memory", memory, "--commit-interval", str(commit_interval)]
        if assignment:
            argv += ["--assignment", assignment]
        if max_rate:
            argv += ["--max-rate", str(max_rate)]
        for s in sets:
            argv += ["--set", s]
        argv += list(args)  # any other flags, as given
        if config:  # settings without a flag (e.g. batch_messages), through a TOML file
            path = log_path.with_suffix(".toml")
            path.write_text("".join(f"{k} = {v!r}\n" for k, v in config.items()))
            argv += ["--config", str(path)]
        if wrap is not None:  # run inside something (_pods.pod: a PID namespace of its own)
            argv = wrap(argv)
        super().__init__(argv, log_path)
        self.wrapped = wrap is not None
        self._inner: psutil.Process | None = None
        self._log = None
        self._seen: dict[int, psutil.Process] = {}  # every descendant ever seen, for cleanup

    def start(self) -> "SupervisorProc":
        self._log = open(self.log_path, "ab")
        self.proc = subprocess.Popen(self.argv, stdin=subprocess.DEVNULL, stdout=self._log,
                                     stderr=subprocess.STDOUT, cwd=str(self.log_path.parent), env=self.env)
        self._seen[self.proc.pid] = psutil.Process(self.proc.pid)
        return self

    def inner(self) -> psutil.Process:
        """The supervisor itself: the process started, or, wrapped in a pod, the pod's pid 1
        (the child of the unshare(1) process started)."""
        if self._inner is None:
            if not self.wrapped:
                self._inner = psutil.Process(self.proc.pid)
            else:
                def child():
                    self.check_running()
                    return next(iter(psutil.Process(self.proc.pid).children()), None)
                self._inner = poll_until(child, 30, "the pod's pid 1")
        return self._inner

    @property
    def status_pid(self) -> int:
        """Its pid as status shows it: in its own PID namespace (1 in a pod)."""
        return ns_pid(self.inner()) if self.wrapped else self.proc.pid

    def children(self) -> list[psutil.Process]:
        """The supervisor's live descendants (workers, multiprocessing's resource tracker); remembered."""
        try:
            kids = psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.Error:
            kids = []
        for k in kids:
            self._seen.setdefault(k.pid, k)
        return kids

    def named(self, prefix: str) -> list[psutil.Process]:
        """Its live descendants whose process name starts with `prefix`."""
        out = []
        for k in self.children():
            with contextlib.suppress(psutil.Error):
                if k.name().startswith(prefix) and k.status() != psutil.STATUS_ZOMBIE:
                    out.append(k)
        return out

    def workers(self) -> list[psutil.Process]:
        """Its worker processes: forked by its fork server, each names itself shmcache-w<index>
        (consumer/worker/loop.py main; the fork server is shmcache-fork)."""
        return self.named("shmcache-w")

    def check_running(self) -> bool:
        """True while it runs; once it has exited, fail saying its exit code and its log's end."""
        if not self.running():
            raise AssertionError(f"supervisor exited with {self.proc.returncode}:\n{self.log_text()[-3000:]}")
        return True

    def signal(self, sig: int) -> None:
        """`sig` to the supervisor (a pod's pid 1, not the unshare(1) process that waits for it:
        as a kubelet stops a container; a SIGKILL there ends every process of the pod)."""
        self.children()  # remember the workers before they may be orphaned
        if self.wrapped:
            with contextlib.suppress(psutil.NoSuchProcess):
                self.inner().send_signal(sig)
        else:
            self.proc.send_signal(sig)

    def wait(self, timeout: float) -> int | None:
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            return None

    def sigterm_timed(self, timeout: float) -> tuple[int | None, float]:
        """SIGTERM, then (its exit code, None if not within `timeout`; the seconds it took)."""
        t0 = time.monotonic()
        self.signal(signal.SIGTERM)
        code = self.wait(timeout)
        return code, time.monotonic() - t0

    def terminate(self, timeout: float = 60.0) -> int:
        """SIGTERM and wait for the exit code; SIGKILL (the whole tree) if it does not exit in time."""
        if self.running():
            self.signal(signal.SIGTERM)
        code = self.wait(timeout)
        if code is None:
            self.kill()
            code = self.proc.wait(10)
        self.reap_children(10)
        return code

    def kill(self) -> None:
        """SIGKILL the supervisor and everything it started, and remove the directory of its
        fork server's socket, which a fork server killed outright cannot."""
        if self.proc is None:
            return
        dirs = set()
        for p in self.children():  # the fork server, named or still importing, and what it forked
            with contextlib.suppress(psutil.Error):
                dirs.add(p.environ().get(forkserver.DIR_ENV))
        killed = []
        for p in self._seen.values():
            try:
                if p.is_running():
                    p.kill()
                    killed.append(p)
            except psutil.Error:
                pass
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            pass
        # SIGKILL is delivered, not done: a worker still runs until the kernel tears it down, and
        # its rows name a live process until then. Return when none of them does.
        wait_gone(killed, "SIGKILLed pids")
        for d in dirs:
            if d and Path(d).name.startswith("pymp-"):
                shutil.rmtree(d, ignore_errors=True)

    def reap_children(self, timeout: float) -> None:
        """After the supervisor exited: its children should be gone; terminate any that are not."""
        kids = [p for pid, p in self._seen.items() if pid != self.proc.pid]
        liveness.stop_processes(kids, timeout)

    def cleanup(self) -> None:
        if self.proc is None:
            return
        if self.running():
            self.signal(signal.SIGTERM)
            if self.wait(20) is None:
                self.kill()
        self.reap_children(5)
        if self._log is not None:
            self._log.close()
            self._log = None

    def log_text(self) -> str:
        if self._log is not None:
            self._log.flush()
        return self.log_path.read_text(errors="replace")


class Harness:
    def __init__(self, tmp_path: Path, bootstrap: str):
        self.tmp_path = tmp_path
        self.bootstrap = bootstrap
        self.names: list[str] = []
        self.sups: list[SupervisorProc] = []
        self.readers: list = []
        self.threads: list["StreamProducer"] = []

    def cache_name(self, tag: str) -> str:
        name = f"t-pipe-{tag}-{uuid.uuid4().hex[:10]}"
        self.names.append(name)
        return name

    def group(self, tag: str) -> str:
        return f"t-pipe-{tag}-{uuid.uuid4().hex[:10]}"

    def supervisor(self, name: str, topic: str, group: str, **kw) -> SupervisorProc:
        label = f"{name}-{sum(s.name == name for s in self.sups)}"
        sup = SupervisorProc(self.tmp_path / f"{label}.log", name, self.bootstrap, topic, group, **kw)
        self.sups.append(sup)
        return sup.start()

    def attach(self, name: str, timeout: float = 60.0, sup: SupervisorProc | None = None):
        """Attach once the supervisor has created the segment and published the topic."""

        def ready():
            if sup is not None:
                sup.check_running()
            if not shmcache.exists(name):
                return None
            try:
                r = shmcache.attach(name)
            except shmcache.ShmcacheError:
                return None
            if r.control.npartitions == 0:
                r.close()
                return None
            return r

        r = poll_until(ready, timeout, f"cache {name} to appear")
        self.readers.append(r)
        return r

    def caught_up(self, topic: str, model: "Model", partitions: int, tag: str, config: dict, workers: int = 2):
        """A supervisor of `workers` workers (with `config`) over what `model` produced to
        `topic` first (2 batches a partition), waited for until ready and applied up to the
        end: (cache name, group, the end offsets, the supervisor, a reader)."""
        ends = produce_and_wait(self, topic, model, partitions, rate=1000, max_batches=2 * partitions)
        name, group = self.cache_name(tag), self.group(tag)
        sup = self.supervisor(name, topic, group, workers=workers, config=config)
        r = self.attach(name, sup=sup)
        r.wait_ready(timeout=120)
        wait_applied(r, ends, 120, sup)
        return name, group, ends, sup, r

    def producer(self, topic: str, model: "Model", **kw) -> "StreamProducer":
        t = StreamProducer(self.bootstrap, topic, model, **kw)
        self.threads.append(t)
        return t

    def close(self) -> None:
        for t in self.threads:
            t.stop_event.set()
            t.wake.set()
        for t in self.threads:
            t.join(30)
        for sup in self.sups:
            sup.cleanup()
        for r in self.readers:
            try:
                r.close()
            except Exception:
                pass
        for name in self.names:
            try:
                shmcache.destroy(name)
            except (FileNotFoundError, shmcache.ShmcacheError):
                pass


@pytest.fixture
def harness(tmp_path, kafka_broker):
    h = Harness(tmp_path, kafka_broker.bootstrap)
    try:
        yield h
    finally:
        h.close()

