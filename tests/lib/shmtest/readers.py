"""The three readers as programs of the command contract (docs/reader-contract.md):
Python (`python -m shmcache`), Go (`shmcache-go`, built here from go/cmd/shmcache-go) and
Java (`java -jar jvm/target/shmcache-jvm-<version>.jar`, built by scripts/setup), the Java
reader twice: `java` on the default JDK (17: the Unsafe path) and `java25`, the same jar on a
JDK 25 with sun.misc.Unsafe's memory access denied (its META-INF/versions/22 classes: a
MemorySegment, open(2) with O_NONBLOCK). A JVM reader must print nothing of the JVM's own on
stderr (a deprecation or restricted-method warning): `run` and `run_all` fail if it does.

`run(reader, *args)` runs one command to its end; `start(reader, *args)` starts one
(a watch) whose stdout lines are read as they come, each with the time it arrived."""

from __future__ import annotations

import os
import queue
import re
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass

from shmtest import REPO
BIN = REPO / ".cache" / "bin"
# root without the capabilities that pass over file modes: a file another user owns with
# mode 0600 is then refused it as it is to any other user
NO_DAC = ["setpriv", "--inh-caps=-all", "--ambient-caps=-all", "--bounding-set=-all", "--"]


# the JVM's own warnings (sun.misc.Unsafe's deprecation, a restricted method), never the reader's log
JVM_WARNING = re.compile(r"^WARNING: (?!shmcache: )|VM warning", re.M)


@dataclass(frozen=True)
class Reader:
    name: str      # python | go | java | java25
    program: str   # the PROGRAM of its error lines
    argv: tuple[str, ...]
    jvm: bool = False  # its stderr must hold none of the JVM's own warnings

    def __str__(self) -> str:
        return self.name


def python_reader() -> Reader:
    return Reader("python", "shmcache", (sys.executable, "-m", "shmcache"))


def go_reader() -> Reader | str:
    """The Go reader, built now (a build is quick once the module cache is warm), or why not."""
    go = shutil.which("go")
    if go is None:
        return "go is not installed"
    BIN.mkdir(parents=True, exist_ok=True)
    out = BIN / "shmcache-go"
    p = subprocess.run([go, "build", "-o", str(out), "./cmd/shmcache-go"], cwd=REPO / "go", capture_output=True,
                       text=True, timeout=600, env={**os.environ, "CGO_ENABLED": "0"})
    if p.returncode != 0:
        raise AssertionError(f"go build ./cmd/shmcache-go failed:\n{p.stdout}\n{p.stderr}")
    return Reader("go", "shmcache-go", (str(out),))


def _jar() -> str:
    jars = sorted(p for p in (REPO / "jvm" / "target").glob("shmcache-jvm-*.jar") if "sources" not in p.name)
    if not jars:
        raise AssertionError("no jvm/target/shmcache-jvm-*.jar: scripts/setup builds it")
    return str(jars[-1])


def java_reader() -> Reader | str:
    java = shutil.which("java")
    if java is None:
        return "java is not installed"
    return Reader("java", "shmcache-jvm", (java, "-jar", _jar()), jvm=True)


def java25_reader() -> Reader | str:
    """The jar on a JDK 25 (jvm/find-jdk 25), as a user runs it there, Unsafe's memory access denied."""
    p = subprocess.run([str(REPO / "jvm" / "find-jdk"), "25"], capture_output=True, text=True)
    if not p.stdout.strip():
        return "no JDK 25 is installed (jvm/find-jdk 25)"
    java = f"{p.stdout.strip()}/bin/java"
    return Reader("java25", "shmcache-jvm", (java, "--sun-misc-unsafe-memory-access=deny", "-jar", _jar()), jvm=True)


def _quiet(reader: Reader, p: subprocess.CompletedProcess) -> subprocess.CompletedProcess:
    if reader.jvm and JVM_WARNING.search(p.stderr):
        raise AssertionError(f"{reader}: the JVM printed a warning of its own: {p.args}\n{p.stderr[-1000:]}")
    return p


def _env() -> dict[str, str]:
    return {**os.environ, "CI": "true"}


def run(reader: Reader, *args: str, no_dac: bool = False, timeout: float = 120) -> subprocess.CompletedProcess:
    argv = [*(NO_DAC if no_dac else []), *reader.argv, *args]
    return _quiet(reader, subprocess.run(argv, capture_output=True, text=True, timeout=timeout, env=_env(), cwd=REPO))


def run_all(readers: list[Reader], *args: str, no_dac: bool = False,
            timeout: float = 120) -> dict[str, subprocess.CompletedProcess]:
    """The same command from every reader at once (each its own process)."""
    return {r.name: p for (r, _), p in run_many(readers, [list(args)], no_dac=no_dac, timeout=timeout).items()}


def run_many(readers: list[Reader], commands: list[list[str]], *, width: int = 16, no_dac: bool = False,
             timeout: float = 120) -> dict[tuple[Reader, int], subprocess.CompletedProcess]:
    """Each command (an argv after the program) from every reader, `width` processes at a
    time: {(reader, the command's index): its result}."""
    todo = [(r, i) for i in range(len(commands)) for r in readers]
    out: dict[tuple[Reader, int], subprocess.CompletedProcess] = {}
    running: dict[tuple[Reader, int], subprocess.Popen] = {}
    try:
        while todo or running:
            while todo and len(running) < width:
                r, i = todo.pop(0)
                running[r, i] = subprocess.Popen([*(NO_DAC if no_dac else []), *r.argv, *commands[i]],
                                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                                 env=_env(), cwd=REPO)
            (r, i), p = next(iter(running.items()))  # the oldest: they end in about the order they started
            so, se = p.communicate(timeout=timeout)
            out[r, i] = _quiet(r, subprocess.CompletedProcess(p.args, p.returncode, so, se))
            del running[r, i]
    finally:
        for p in running.values():
            if p.poll() is None:
                p.kill()
                p.wait()
    return out


class Running:
    """A reader's command under way: its stdout lines, each with its arrival (monotonic)."""

    def __init__(self, reader: Reader, *args: str, wrap=None):
        """`wrap`: what the command line runs in (tests/lib/shmtest/pods.py's pod: a PID namespace)."""
        self.reader = reader
        argv = [*reader.argv, *args]
        self.proc = subprocess.Popen(argv if wrap is None else wrap(argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, env=_env(), cwd=REPO)
        self.lines: queue.Queue = queue.Queue()
        self.seen: list[tuple[float, str]] = []
        self._err: list[str] = []
        threading.Thread(target=self._pump, args=(self.proc.stdout, self.lines), daemon=True).start()
        threading.Thread(target=self._drain, daemon=True).start()

    @staticmethod
    def _pump(stream, q: queue.Queue) -> None:
        for line in stream:
            q.put((time.monotonic(), line.rstrip("\n")))
        q.put(None)

    def _drain(self) -> None:
        for line in self.proc.stderr:
            self._err.append(line)

    def next_line(self, timeout: float) -> tuple[float, str] | None:
        """The next line and when it came; None if the command ended first or `timeout` passed."""
        try:
            item = self.lines.get(timeout=timeout)
        except queue.Empty:
            return None
        if item is not None:
            self.seen.append(item)
        return item

    def stderr(self) -> str:
        return "".join(self._err)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


def error_line(reader: Reader, p: subprocess.CompletedProcess, kind: str, says=()) -> list[str]:
    """What is wrong with p's error, [] if nothing: exit 2 (1 for not-ready), one stderr line
    `PROGRAM: KIND: message`, the message holding each of `says`."""
    wrong = []
    want_exit = 1 if kind == "not-ready" else 2
    lines = p.stderr.strip().splitlines()
    if p.returncode != want_exit:
        wrong.append(f"exit {p.returncode}, not {want_exit}")
    if len(lines) != 1 or not lines[0].startswith(f"{reader.program}: {kind}: "):
        wrong.append(f"stderr is not one line '{reader.program}: {kind}: ...'")
    for s in says:
        if s not in p.stderr:
            wrong.append(f"the message does not say {s!r}")
    if p.stdout.strip():
        wrong.append("something on stdout")
    return wrong
