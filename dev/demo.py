"""`shmcache demo` (the README's first command, `scripts/demo`): the main job end to end.

1. Starts the project's local Kafka broker (scripts/kafka, free ports, its own run
   directory in a temporary directory), or uses `--bootstrap`.
2. Creates a fresh topic (8 partitions) and starts the supervisor daemon, `python
   -m shmcache run`, with 2 workers and enough memory that nothing is evicted;
   waits until every partition is assigned (`wait_ready`).
3. Produces 2,000,000 Teranode-shaped entries (produce/loadgen.py, 10% DELETEs of
   earlier hashes) with a ground-truth Parquet file, showing what was sent and
   what the cache applied, until every partition's applied offset reaches the
   end of what was sent.
4. A separate reader process attaches read-only, looks up a sample of the sent
   hashes and checks them against the ground truth: present ones must hit with
   the exact bytes sent, deleted ones must miss; then measures lookups/s.
5. Stops the supervisor with SIGTERM (it drains, makes its final commit and must
   exit 0) and prints a summary: entries/s applied, memory used, evictions.

It exits 1 if any check fails: a sampled lookup wrong, the table's entry count
not what the ground truth says, an eviction, a malformed message, a commit short
of what was applied, a supervisor exit code other than 0. Whatever happens,
also on Ctrl-C or SIGTERM, it stops what it started, by pid (the supervisor and
its workers, the broker), removes its temporary directory, the topic (on a
broker it did not start) and the cache segment (unless `--keep`). Every run
uses fresh names, so runs one after another (or side by side) do not meet.

Not guaranteed: the figures are this machine's, with the broker, the producer,
the supervisor and its workers all sharing its cores. The apply rate is bounded
by the produce rate, since the cache consumes while the topic is being filled:
"behind the producer" says how long the cache needed after the last entry was
acknowledged (near 0: it kept up, and the producer set the pace).
"""

from __future__ import annotations

import multiprocessing as mp
import queue
import shutil
import signal
import sys
import tempfile
import time
import uuid
from pathlib import Path

from rich.console import Console

from shmcache.formats import registry as wire_formats
from shmcache.dev.demo_report import CatchUpBars, summarize
from shmcache.dev.local_kafka import LocalBroker, LocalKafkaError
from shmcache.dev.run_process import SupervisorProcess, alive
from shmcache.engine import table
from shmcache.engine.units import format_bytes, parse_bytes
from shmcache.errors import CacheNotFoundError, CacheNotReadyError
from shmcache.ipc import liveness
from shmcache.produce.ground_truth import reader_main

BYTES_PER_ENTRY = 300  # ring + index per entry with room to spare (records average ~160 B)
MEMORY_FLOOR = 64 << 20
READY_TIMEOUT_S = 120.0
# Ctrl-C, SIGTERM and SIGHUP (its terminal closed: an ssh or tmux session that ended) all
# raise KeyboardInterrupt: the cleanup runs in run()'s finally. The
# stop is kept and raised again between steps and in every wait: a handler that ran inside
# a finalizer (numba's compiler, a library's __del__) had its exception swallowed.
_stop = liveness.StopRequest(lambda signum: KeyboardInterrupt())
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class DemoError(Exception):
    """A step could not be done (the demo stops and cleans up)."""


def auto_memory(entries: int) -> int:
    """Enough segment for `entries` entries that no bucket overflows (so nothing is evicted)."""
    return entries * BYTES_PER_ENTRY + MEMORY_FLOOR


# -- the processes it starts ------------------------------------------------------------------------


class Broker(LocalBroker):
    """The project's local broker (dev/local_kafka.py), its start's progress on the terminal."""

    def start(self) -> str:
        try:
            super().start(capture_stderr=False)
        except LocalKafkaError as e:
            if e.returncode is None:
                raise DemoError(f"{e}: give --bootstrap HOST:PORT to use an existing broker") from None
            raise DemoError(f"scripts/kafka start failed (exit {e.returncode}); see the lines above") from None
        return self.bootstrap


# -- the demo -------------------------------------------------------------------------------------


class Demo:
    def __init__(self, *, entries: int, workers: int, partitions: int, fmt: str, bootstrap: str | None,
                 memory: int, sample: int, delete_share: float, seed: int | None, name: str | None,
                 keep: bool, console: Console):
        self.entries, self.workers, self.partitions, self.fmt = entries, workers, partitions, fmt
        self.bootstrap, self.memory, self.sample, self.delete_share = bootstrap, memory, sample, delete_share
        self.seed, self.keep, self.console = seed, keep, console
        tag = uuid.uuid4().hex[:8]
        self.name = name or f"demo-{tag}"
        self.topic = f"shmcache-demo-{tag}"
        self.group = f"shmcache-demo-{tag}"
        self.tmp = Path(tempfile.mkdtemp(prefix="shmcache-demo-"))
        self.broker: Broker | None = None
        self.sup: SupervisorProcess | None = None
        self.reader = None  # our own read-only handle, for progress
        self.created_topic = False
        self.failures: list[str] = []
        self.rows: list[tuple[str, str]] = []  # the summary

    def check(self, ok: bool, what: str) -> None:
        if not ok:
            self.failures.append(what)

    # -- steps ---------------------------------------------------------------------------

    def start_broker(self) -> None:
        if self.bootstrap:
            self.console.print(f"using the Kafka broker at {self.bootstrap}")
            return
        self.console.print("starting the project's local Kafka broker (scripts/kafka; the first run fetches its jars)")
        self.broker = Broker(self.tmp / "kafka")
        t = time.monotonic()
        self.bootstrap = self.broker.start()
        self.console.print(f"Kafka broker pid {self.broker.pid} on {self.bootstrap}, "
                           f"ready in {time.monotonic() - t:.1f} s")

    def start_supervisor(self) -> None:
        from shmcache.kafka import topics

        if table.exists(self.name):  # the demo checks (and removes) a cache of its own only
            raise DemoError(f"a cache named {self.name!r} exists already: give another --name, "
                            f"or remove it with: shmcache destroy {self.name}")
        topics.create_topic(self.bootstrap, self.topic, self.partitions)
        self.created_topic = True
        argv = [sys.executable, "-m", "shmcache", "run", "--name", self.name, "--bootstrap", self.bootstrap,
                "--topic", self.topic, "--group", self.group, "--workers", str(self.workers),
                "--format", self.fmt, "--memory", str(self.memory), "--commit-interval", "1"]
        self.sup = SupervisorProcess(argv, self.tmp / "supervisor.log")
        self.sup.start()
        deadline = time.monotonic() + READY_TIMEOUT_S
        while self.reader is None:
            self._supervisor_alive()
            if table.exists(self.name):
                try:
                    self.reader = table.attach(self.name)
                except CacheNotFoundError:
                    pass  # removed again between the two looks
            if time.monotonic() > deadline:
                raise DemoError(f"cache {self.name} did not appear within {READY_TIMEOUT_S:.0f} s")
            time.sleep(0.05)
        while True:  # ready, and all of the topic assigned here, to workers that are up
            self._supervisor_alive()
            try:
                st = self.reader.wait_ready(timeout=1.0)
            except CacheNotReadyError:
                if time.monotonic() > deadline:
                    raise
                continue
            alive = [w for w in st["workers"] if w["alive"]]
            if len(st["assigned"]) == self.partitions and len(alive) == self.workers:
                break
            if time.monotonic() > deadline:
                raise DemoError(f"after {READY_TIMEOUT_S:.0f} s: {len(st['assigned'])} of {self.partitions} "
                                f"partitions assigned, {len(alive)} of {self.workers} workers up")
            time.sleep(0.05)
        self.sup.note_workers(st)
        pids = ", ".join(str(w["pid"]) for w in st["workers"])
        self.console.print(f"topic {self.topic!r} ({self.partitions} partitions); supervisor pid {self.sup.pid} with "
                           f"{self.workers} workers (pids {pids}), cache {self.name!r} of {format_bytes(self.memory)}: "
                           f"{len(st['assigned'])} partitions assigned, ready")

    def _supervisor_alive(self) -> None:
        """Every wait of the demo calls this: it raises when the demo was asked to stop (again
        after a handler's KeyboardInterrupt was swallowed, see _stop) or the supervisor exited."""
        _stop.check()
        if not self.sup.running():
            raise DemoError(f"the supervisor exited with code {self.sup.proc.returncode}; its log ends:\n"
                            f"{self.sup.log_tail()}")

    def _applied(self) -> tuple[int, dict]:
        st = self.reader.status()
        self.sup.note_workers(st)
        return sum(w["adds"] + w["deletes"] for w in st["workers"]), st

    def produce_and_catch_up(self) -> None:
        from shmcache.produce import loadgen

        cfg = loadgen.LoadConfig(bootstrap=self.bootstrap, topic=self.topic, count=self.entries, format=self.fmt,
                                 delete_share=self.delete_share, seed=self.seed, sole_writer=self.created_topic,
                                 ground_truth=str(self.tmp / "ground-truth.parquet"))
        c = self.console
        t0 = time.monotonic()
        with CatchUpBars(c, self.entries, t0) as bars:
            def show(st) -> None:
                now = time.monotonic()
                if not bars.due(now) and st.entries < st.total:
                    return
                self._supervisor_alive()
                n, _ = self._applied()
                bars.show(now, st.entries, n)

            self.sent = loadgen.produce(cfg, show)
            t_sent = time.monotonic()
            ends = self.sent.end_offsets
            deadline = t_sent + max(READY_TIMEOUT_S, self.entries / 10_000)
            while True:
                self._supervisor_alive()
                n, st = self._applied()
                now = time.monotonic()
                bars.show(now, self.sent.entries, n, produced_bar=False)
                at = {p["partition"]: p["applied"] for p in st["assigned"]}
                if all(at.get(p, -1) >= end for p, end in ends.items()):
                    break
                if now > deadline:
                    behind = {p: (at.get(p), end) for p, end in ends.items() if at.get(p, -1) < end}
                    raise DemoError(f"the cache did not catch up within {deadline - t_sent:.0f} s of the last "
                                    f"acknowledgement: (applied, end) by partition {behind}")
                time.sleep(0.05)
        t_done = time.monotonic()
        s = self.sent
        self.applied_entries, self.apply_seconds, self.behind_seconds = n, t_done - t0, t_done - t_sent
        c.print(f"produced {s.entries:,} entries ({s.adds:,} ADD, {s.deletes:,} DELETE) in {s.messages:,} "
                f"{self.fmt} messages in {s.seconds:.1f} s ({s.entries / max(s.seconds, 1e-9):,.0f} entries/s)")
        c.print(f"the cache applied them all {t_done - t0:.1f} s after the first was sent "
                f"({n / max(t_done - t0, 1e-9):,.0f} entries/s), {t_done - t_sent:.1f} s after the last was acknowledged")

    def read_back(self) -> None:
        ctx = mp.get_context("spawn")
        out = ctx.Queue()
        self.console.print(f"a reader process looks up {min(self.sample, self.sent.adds):,} of the sent hashes ...")
        p = ctx.Process(target=reader_main, args=(self.name, self.sent.ground_truth, self.sample, self.seed, out),
                        name="shmcache-demo-reader")
        p.start()
        try:
            while True:
                try:
                    kind, res = out.get(timeout=1.0)
                    break
                except queue.Empty:
                    _stop.check()
                    if not p.is_alive():  # died without a word (a signal, a crash)
                        raise DemoError(f"the reader process died with exit code {p.exitcode}") from None
        finally:
            p.join(30)
            if p.is_alive():
                p.kill()
                p.join()
        if kind != "ok":
            raise DemoError(f"the reader process failed: {res}")
        self.read = res

    def stop_supervisor(self) -> None:
        st = self.reader.status()
        self.sup.note_workers(st)
        code = self.sup.stop()
        self.check(code == 0, f"supervisor exit code {code} after SIGTERM (want 0)")
        left = [pid for pid in self.sup.worker_pids if alive(pid)]
        self.check(not left, f"worker processes still alive: {left}")
        rows = {p: c for p, c in self._committed().items()}
        short = {p: (rows.get(p), end) for p, end in self.sent.end_offsets.items() if rows.get(p) != end}
        self.check(not short, f"committed offsets short of the end (committed, end): {short}")
        self.console.print(f"supervisor pid {self.sup.pid} stopped with SIGTERM: exit code {code}, final commit "
                           f"{'at the end of every partition' if not short else 'SHORT'}")

    def _committed(self) -> dict[int, int]:
        from shmcache.engine.control import layout as C
        from shmcache.engine.control.rows import committed_of

        rows = self.reader.control.partitions
        return {p: committed_of(rows[p, C.P_COMMITTED]) for p in range(self.partitions)}

    def summarize(self) -> None:
        """The checks on what the table holds and the summary table (dev/demo_report.py)."""
        summarize(self)

    def cleanup(self) -> None:
        """Stop whatever is still running, by pid; remove what was made. Each step on its own."""
        steps = []
        if self.sup is not None and self.sup.running():
            steps.append(("supervisor", lambda: self.sup.stop()))
        if self.reader is not None:
            steps.append(("reader handle", self.reader.close))
        if self.broker is not None:
            steps.append(("broker", self.broker.stop))
        elif self.created_topic and not self.keep:
            steps.append(("topic", self._delete_topic))
        if not self.keep and self.sup is not None:  # the supervisor made it
            steps.append(("cache", lambda: table.destroy(self.name) if table.exists(self.name) else None))
        steps.append(("temporary directory", lambda: shutil.rmtree(self.tmp, ignore_errors=True)))
        for what, fn in steps:
            try:
                fn()
            except Exception as e:  # noqa: BLE001 - the other steps still run
                self.failures.append(f"cleanup of the {what} failed: {e}")
                self._say(f"[red]cleanup: {what}: {e}[/]")
        stopped = []
        if self.sup is not None:
            workers = ", ".join(map(str, sorted(self.sup.worker_pids))) or "-"
            stopped.append(f"supervisor pid {self.sup.pid} (workers {workers})")
        if self.broker is not None and self.broker.pid is not None:
            stopped.append(f"broker pid {self.broker.pid}")
        if stopped:
            self._say("stopped " + ", ".join(stopped))
        if self.sup is None:
            pass  # no cache was made
        elif self.keep:
            self._say(f"kept /dev/shm/{self.name}; read it with shmcache.attach({self.name!r}), "
                      f"remove it with: shmcache destroy {self.name}")
        else:
            self._say(f"removed cache {self.name}")

    def _delete_topic(self) -> None:
        from shmcache.kafka import topics

        topics.delete_topic(self.bootstrap, self.topic, groups=(self.group,))

    def run(self) -> int:
        try:
            for step in (self.start_broker, self.start_supervisor, self.produce_and_catch_up, self.read_back,
                         self.stop_supervisor, self.summarize):
                _stop.check()
                step()
            _stop.check()
        except DemoError as e:
            self.failures.append(str(e))
        except KeyboardInterrupt:
            self.failures.append("interrupted")
        except Exception as e:  # noqa: BLE001 - reported below, after the cleanup
            self.failures.append(f"{type(e).__name__}: {e}")
        finally:
            # a second Ctrl-C, SIGTERM or SIGHUP must not cut the cleanup short
            old = {sig: signal.signal(sig, signal.SIG_IGN) for sig in STOP_SIGNALS}
            try:
                self.cleanup()
            finally:
                for sig, handler in old.items():
                    signal.signal(sig, handler)
        if self.failures:
            self._say("[red]demo FAILED:[/] " + "; ".join(self.failures))
            return 130 if self.failures == ["interrupted"] else 1
        self._say("[green]demo passed:[/] every sampled hash hit with its exact value, every deleted one "
                  "missed, nothing evicted, every applied offset committed")
        return 0

    def _say(self, text: str) -> None:
        """A line of the end, where the terminal may be gone (SIGHUP): a write that fails is dropped."""
        try:
            self.console.print(text)
        except OSError:
            pass


def run(entries: int = 2_000_000, workers: int = 2, partitions: int = 8, fmt: str = "v1",
        bootstrap: str | None = None, memory: int | str = "auto", sample: int = 100_000,
        delete_share: float = 0.1, seed: int | None = None, name: str | None = None, keep: bool = False) -> int:
    """Run the demo; returns the exit code (0: every check held)."""
    if entries < 1:
        raise ValueError(f"entries={entries}: must be >= 1")
    if sample < 1:
        raise ValueError(f"sample={sample}: must be >= 1")
    wire_formats.get_spark(fmt).check_topic(partitions)
    mem = auto_memory(entries) if memory == "auto" else parse_bytes(memory)
    demo = Demo(entries=entries, workers=workers, partitions=partitions, fmt=fmt, bootstrap=bootstrap, memory=mem,
                sample=sample, delete_share=delete_share, seed=seed, name=name, keep=keep,
                console=Console(soft_wrap=True))  # long lines stay whole in logs (no terminal width)

    old = _stop.install(*(sig for sig in STOP_SIGNALS if signal.getsignal(sig) is not signal.SIG_IGN))  # nohup
    try:
        return demo.run()
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)
